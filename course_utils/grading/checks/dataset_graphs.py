"""What a worker's dataset graph holds, for lesson 04's dataset checks: Python called back
(:func:`runs_python`), steps hidden in a function call, control flow or another dataset's
element (:func:`made_hidden`), an infinite cardinality asserted over a finite input
(``ASSERTED``), and what to tell a learner whose ``dataset_fn`` no worker could run
(:func:`unmade_dataset_message`)."""

from __future__ import annotations

from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["ASSERTED", "HiddenDataset", "RunsPython", "endless_steps", "graph_ops", "made_hidden",
           "runs_python", "unmade_dataset_message"]


_PYTHON = frozenset(("PyFunc", "PyFuncStateless", "EagerPyFunc"))


class RunsPython(Exception):
    """A worker's dataset calls back into Python (``Dataset.from_generator``,
    ``tf.py_function``, ``tf.numpy_function``)."""


class HiddenDataset(Exception):
    """A worker's dataset comes out of a function call or control flow (a ``tf.function`` or
    ``tf.cond`` that ``dataset_fn`` calls), another dataset's element (``get_single_element``,
    an iterator's), a serialized graph or the tf.data service, whose steps its graph does not
    show."""


def unmade_dataset_message(failure: Exception) -> str | None:
    """What to tell a learner whose ``dataset_fn`` no worker could run (None: another
    failure): one that calls Python, comes out of a function call or control flow, or that a
    worker failed to make (TF's first line of why; a dataset made on the coordinator, which
    cannot be copied to a worker, named)."""
    if isinstance(failure, RunsPython):
        return ("a worker's dataset calls Python (Dataset.from_generator, tf.py_function or "
                "tf.numpy_function): a real job's workers cannot run it (it runs only in the "
                "process of the Python program that made it: TensorFlow's from_generator and "
                "py_function docs). Make it of tf.data steps and TensorFlow ops")
    if isinstance(failure, HiddenDataset):
        return ("a worker's dataset comes out of a tf.function, tf.cond or loop that dataset_fn "
                "calls, another dataset's element, a serialized graph or the tf.data service: "
                "the check reads the "
                "steps of a dataset made in dataset_fn itself (its shuffles, caches, branches). "
                "Make the dataset's steps there")
    if type(failure).__name__ != "ClosureInputError":
        return None
    said = [line.strip() for line in str(failure).split("error message is ")[-1].splitlines()
            if line.strip() and not line.strip().startswith(
                ("Graph execution", "Detected at", "File ", "[["))]
    said = (said or [""])[0][:160]
    if "Failed copying input tensor" not in said:
        return f"a worker could not make its dataset: {said}"
    return (f"a worker could not make its dataset ({said}): is every step of it made inside "
            "dataset_fn? A dataset made here, on the coordinator, cannot be copied to a "
            "worker (lesson 04: datasets are made inside a dataset_fn, once per worker)")


_HIDES = frozenset(("PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "Case",
                    "StatelessCase", "While", "StatelessWhile", "DatasetFromGraph",
                    "DatasetToSingleElement", "DataServiceDataset", "DataServiceDatasetV2",
                    "DataServiceDatasetV3", "DataServiceDatasetV4"))
# a dataset op's type ends so (``TensorSliceDataset``, ``ShuffleDatasetV3``)
_DATASET_OPS = ("Dataset", "DatasetV2", "DatasetV3", "DatasetV4", "DatasetV5")


def made_hidden(dataset: Any) -> bool:
    """Whether a step on the ways from ``dataset`` down to its sources is a function call or
    control flow, another dataset's element (``get_single_element``; an iterator's, a
    variable's or a queue's: no dataset op), a serialized graph (``DatasetFromGraph``) or the
    tf.data service's elements (``distribute``: ``DataServiceDataset``, its dataset registered
    by id): the dataset steps inside it are not read. A dataset captured from outside ``dataset_fn``
    (``Placeholder``) is left to fail when a worker makes it."""
    tf = _tf()
    todo, seen = [dataset._variant_tensor.op], set()
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        inputs = [tensor.op for tensor in op.inputs if tensor.dtype == tf.variant]
        if op.type in _HIDES or not inputs and op.type != "Placeholder" and not (
                op.type.endswith(_DATASET_OPS)):
            return True
        todo.extend(inputs)
    return False


def runs_python(graph: Any) -> bool:
    """Whether ``graph`` (where a ``dataset_fn`` or a step was traced) or a function it calls
    holds an op that runs Python code."""
    return any(op.type in _PYTHON for op in graph_ops(graph))


def graph_ops(graph: Any) -> Any:
    """Every op of ``graph`` and of the functions it calls (a ``tf.cond``'s branches, a
    ``tf.while_loop``'s body, a nested ``tf.function``), each function's body read once; a
    body's node is read like an op (``type``, ``node_def``)."""
    todo = [graph.get_operations()]
    seen: set[str] = set()
    while todo:
        for op in todo.pop():
            yield op
            for value in op.node_def.attr.values():
                for name in [value.func.name] * value.HasField("func") + [
                        each.name for each in value.list.func]:
                    if name in seen:
                        continue
                    seen.add(name)
                    try:
                        function = graph._get_function(name)
                        body = getattr(function, "cached_definition", None) or function.definition
                    except (AttributeError, KeyError, ValueError):
                        continue
                    todo.append([_Node(node, graph) for node in body.node_def])


class _Node:  # a function body's node, read like an op
    def __init__(self, node: Any, graph: Any) -> None:
        self.type, self.node_def, self.graph = node.op, node, graph


#: The cardinality read for a dataset that ``assert_cardinality(INFINITE_CARDINALITY)`` says is
#: endless over an input that tf.data counts finite: it runs dry after that input's elements
#: (more passes, ``repeat(40)``, than the check reads), with an error in place of OutOfRange.
ASSERTED = -4


def _asserted_infinite(dataset: Any) -> list[Any]:
    """The ``AssertCardinalityDataset`` ops on the ways from ``dataset`` down to its sources
    that assert an infinite cardinality."""
    tf = _tf()
    todo, seen, found = [dataset._variant_tensor.op], set(), []
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "AssertCardinalityDataset" and tf.get_static_value(op.inputs[1]) == int(
                tf.data.INFINITE_CARDINALITY):
            found.append(op)
        todo.extend(tensor.op for tensor in op.inputs if tensor.dtype == tf.variant)
    return found


#: Steps after which an endless input may stop yielding (run dry, or wait for ever): a count
#: (``take``), a condition (``take_while``) or a filter that may keep nothing from then on.
_MAY_END = ("TakeDataset", "TakeWhileDataset", "FilterDataset")
_READS_FUNCTION = ("InterleaveDataset", "FlatMapDataset", "ParallelInterleaveDataset",
                   "LegacyParallelInterleaveDataset")


class _Step:  # one dataset step of a graph or of a function body: its type, inputs, count
    def __init__(self, kind: str, inputs: list[Any], count: Any, functions: list[str]) -> None:
        self.kind, self.inputs, self.count, self.functions = kind, inputs, count, functions


def _graph_step(op: Any) -> _Step:
    tf = _tf()
    count = tf.get_static_value(op.inputs[1]) if op.type in ("RepeatDataset",
                                                              "TakeDataset") else None
    return _Step(op.type, [t.op for t in op.inputs if t.op.type.endswith(_DATASET_OPS)],
                 count, [v.func.name for v in op.node_def.attr.values() if v.HasField("func")])


def _through(node: Any, nodes: dict) -> Any:  # a function body's Identity: what it passes on
    while node is not None and node.op in ("Identity", "IdentityN") and node.input:
        node = nodes.get(node.input[0].split(":")[0])
    return node


def _body_step(node: Any, nodes: dict) -> _Step:
    tf = _tf()
    named = [_through(nodes.get(name.split(":")[0]), nodes) for name in node.input
             if not name.startswith("^")]
    count = None
    if node.op in ("RepeatDataset", "TakeDataset") and len(named) > 1 and named[1] is not None \
            and named[1].op == "Const":
        count = int(tf.make_ndarray(named[1].attr["value"].tensor))
    return _Step(node.op, [n for n in named if n is not None and n.op.endswith(_DATASET_OPS)],
                 count, [v.func.name for v in node.attr.values() if v.HasField("func")])


def endless_steps(dataset: Any) -> bool:
    """Whether ``dataset``'s steps (or a dataset op's), read from its output down to its
    sources, make it endless:
    a ``repeat()`` without a constant count, with no ``take``, ``take_while`` or ``filter``
    after it, a zip of endless datasets only, an interleave or flat_map over an endless input
    or whose function returns an endless dataset (``Dataset.cardinality`` says -2, unknown,
    after an interleave or filter: this reads what can end it)."""
    top = getattr(dataset, "_variant_tensor", dataset)
    top = getattr(top, "op", top)
    graph = top.graph

    def body_endless(name: str, depth: int) -> bool:
        try:
            function = graph._get_function(name)
            body = getattr(function, "cached_definition", None) or function.definition
        except (AttributeError, KeyError, ValueError):
            return False
        nodes = {node.name: node for node in body.node_def}
        outputs = [_through(nodes.get(ret.split(":")[0]), nodes) for ret in body.ret.values()]
        return any(out is not None and out.op.endswith(_DATASET_OPS) and endless(
            _body_step(out, nodes), nodes, depth + 1) for out in outputs)

    def endless(step: _Step, nodes: dict | None, depth: int) -> bool:
        if depth > 64:
            return False
        inputs = [_body_step(n, nodes) if nodes is not None else _graph_step(n)
                  for n in step.inputs]
        if step.kind == "RandomDataset":  # sample_from_datasets' endless choices
            return True
        if step.kind == "RepeatDataset":
            return step.count == -1 or (step.count not in (None, 0) and all(
                endless(each, nodes, depth + 1) for each in inputs))
        if step.kind.startswith(_MAY_END):
            return step.count == -1 and all(endless(each, nodes, depth + 1) for each in inputs)
        if step.kind == "ConcatenateDataset":
            return any(endless(each, nodes, depth + 1) for each in inputs)
        if step.kind.startswith(_READS_FUNCTION) and any(
                body_endless(name, depth) for name in step.functions):
            return True
        return bool(inputs) and all(endless(each, nodes, depth + 1) for each in inputs)

    return endless(_graph_step(top), None, 0)
