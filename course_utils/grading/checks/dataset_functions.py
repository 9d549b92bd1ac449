"""What a dataset step's functions hold (a ``map``'s, a ``flat_map``'s, an ``interleave``'s, a
``group_by_window``'s ``reduce_func``), read from the graph where the dataset is made, for lesson
04's ``check_make_dataset_fn``: :func:`function_ops` (their op types, the functions they call
included), :func:`calls_a_shuffle` (the shuffles and random draws among them) and
:func:`seeded_in_function` (a shuffle made with a fixed seed at every call)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["SHUFFLES", "calls_a_shuffle", "function_ops", "seeded_in_function"]

#: The dataset ops that shuffle.
SHUFFLES = frozenset(("ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
                      "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2"))
# random draws (op types): ``tf.random.shuffle``, ``tf.random.uniform`` (``tf.argsort`` of one),
# ``normal``, ``truncated_normal``, ``categorical``, their stateless forms, a
# ``tf.random.Generator``'s
_DRAWS = ("Random", "Stateless", "Stateful", "Rng", "TruncatedNormal",
          "ParameterizedTruncatedNormal", "Multinomial")
# not draws: ``tf.cond``, ``tf.while_loop``, ``tf.switch_case``, a ``tf.function`` call (read into)
_NOT_DRAWS = frozenset(("StatelessIf", "StatelessWhile", "StatelessCase",
                        "StatefulPartitionedCall"))


def _definitions(op: Any, attr: str | None) -> Iterator[Any]:
    """The ``FunctionDef``s of ``op``'s function ``attr`` (all of its functions where None) and of
    every function they call (``tf.cond`` branches, loop bodies, ``tf.function`` calls)."""
    if attr is None:
        todo = [name for value in op.node_def.attr.values() for name in (
            [value.func.name] if value.HasField("func") else [each.name for each in
                                                                value.list.func])]
    else:
        try:
            todo = [op.get_attr(attr).name]
        except (ValueError, AttributeError):
            return
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            function = op.graph._get_function(name)
            definition = getattr(function, "cached_definition", None) or function.definition
        except (AttributeError, KeyError, ValueError):
            continue
        for node in definition.node_def:
            for value in node.attr.values():
                if value.HasField("func"):
                    todo.append(value.func.name)
                todo.extend(each.name for each in value.list.func)
        yield definition


def function_ops(op: Any, attr: str | None = "f") -> frozenset[str]:
    """The op types of the function of ``op`` (a ``map``, a ``flat_map``, an ``interleave``; a
    ``group_by_window``'s ``reduce_func``), read into the functions it calls (``tf.cond``
    branches, loop bodies, ``tf.function`` calls); with ``attr`` None, of all its functions (a
    ``group_by_window``'s ``reduce_func`` and ``key_func``, a snapshot's ``reader_func``)."""
    return frozenset(node.op for definition in _definitions(op, attr)
                     for node in definition.node_def)


def seeded_in_function(op: Any) -> bool:
    """Whether a function of ``op`` makes a shuffle with a fixed seed (``seed=7``, or any seed
    once ``tf.random.set_seed`` set one): each call makes it anew with that seed, so that it
    replays the same orders at every call (``flat_map(lambda _: d.shuffle(n, seed=7)
    .repeat(32)).repeat()``: 32 passes, then the same 32). A seed computed from the function's
    arguments (a counter's, drawn per call) is not read."""
    tf = _tf()
    for definition in _definitions(op, None):
        nodes = {node.name: node for node in definition.node_def}
        for node in definition.node_def:
            if node.op not in SHUFFLES or len(node.input) < 4:
                continue
            seeds = [nodes.get(each.split(":")[0]) for each in node.input[2:4]]
            if all(_of_constants(each, nodes) for each in seeds) and not all(
                    each.op == "Const" and not tf.make_ndarray(each.attr["value"].tensor).any()
                    for each in seeds):  # (0, 0): drawn anew at each call
                return True
    return False


def _of_constants(node: Any, nodes: dict[str, Any]) -> bool:
    """Whether ``node`` of a function's body is computed from constants alone (not from the
    function's arguments nor its captured tensors)."""
    if node is None:
        return False
    if node.op == "Const":
        return True
    return all(_of_constants(nodes.get(each.split(":")[0]), nodes) for each in node.input
               if not each.startswith("^"))


def calls_a_shuffle(op: Any) -> frozenset[str]:
    """The shuffles (``ShuffleDataset``) that any function of ``op`` makes (a
    ``group_by_window``'s ``reduce_func`` too) and the random draws (``tf.random.shuffle``,
    say) that its ``f`` makes, by op type, the functions they call included."""
    return frozenset(kind for kind in function_ops(op, None) if kind in SHUFFLES) | frozenset(
        kind for kind in function_ops(op) if kind.startswith(_DRAWS) and kind not in _NOT_DRAWS)
