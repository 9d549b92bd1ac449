"""Lesson 06, exercise 2: which ops of a traced ``fixed_part_step`` are each part's backward
pass, found from the graph's edges (what they consume and produce), not from op names or how
a weight was read, and whether each asked for its part's device."""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["LossRecording", "backward_misplaced", "placement_of_the_backward"]


def _short(name: str) -> str:
    """``CPU:1`` of a full device name."""
    return name.rsplit("device:", 1)[-1]


_INPUTS = {"Const", "Placeholder", "ReadVariableOp", "NoOp"}
#: stateful ops that may run in the step: reads of variables (none is written in it: what they
#: read was there before the step) and ops with no output to read back
_READS = {"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
          "VarIsInitializedOp", "PrintV2", "Assert", "NoOp"}


class LossRecording:
    """The check's ``loss_fn`` as the traced answer gets it: it keeps each call's ``(y,
    logits, result)``. The forward ends at what ``loss_fn`` returned, not at the loss the
    answer returns, which it can make depend on its own gradients (``+ 0 · Σ g``: nb31-06
    L2-1)."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn, self.calls = loss_fn, []

    def __call__(self, y: Any, logits: Any, *args: Any, **kwargs: Any) -> Any:
        out = self.loss_fn(y, logits, *args, **kwargs)
        self.calls.append((y, logits, out, [*map(type, args), *kwargs]))
        return out


def _unreadable(graph: Any) -> str | None:
    """Why the check cannot follow every value of ``graph`` through its edges, or None: an op
    with a body of its own (an inner ``tf.function``, ``tf.cond``, ``tf.while_loop``: its ops
    are not in ``graph``, part 0's backward could be among them: nb31-06 L2-2, x06 L7-L8), or
    a stateful op that could carry a value past the edges (a variable written, then read back;
    a queue: x06 L4-L6). Reads of variables stay: nothing is written in the step."""
    for op in graph.get_operations():
        if any(value.HasField("func") or value.list.func for value in op.node_def.attr.values()):
            return (f"it runs a {op.type} op (an inner tf.function, tf.cond or tf.while_loop), "
                    "whose body the check cannot place: write the backward pass in your "
                    "function itself, with Python's own loops and ifs")
        if op.op_def.is_stateful and op.type not in _READS:
            return (f"it runs a stateful op ({op.type}: a variable written, a queue, ...), "
                    "through which a value travels where no edge of the graph shows it: "
                    "return the gradients you compute")
    return None


def _forward(graph: Any, calls: list[Any], batch_inputs: list[tuple[Any, Any]]
             ) -> tuple[set[str], str | None]:
    """The forward (every op ``loss_fn``'s results in ``graph`` were computed from), or why
    it cannot be told: an op whose values the check cannot follow (``_unreadable``),
    ``loss_fn`` called fewer times than there are micro-batches in the traced function
    itself, ``loss_fn`` given anything but the labels and the logits (``sample_weight=w``,
    ``w`` made from the gradients: x06 L3), or a value made from a micro-batch's features and
    labels both (a gradient's: a backward pass)."""
    reason = _unreadable(graph)
    if reason:
        return set(), reason
    made = [call for call in calls if getattr(call[2], "graph", None) is graph]
    if len(made) < len(batch_inputs):
        return set(), (f"{len(made)} call(s) of loss_fn in it for {len(batch_inputs)} "
                       "micro-batches: call it on each micro-batch's logits in your function "
                       "itself (one batch made of them all?)")
    extra = [what for call in made for what in call[3]]
    if extra:
        given = ", ".join(w if isinstance(w, str) else w.__name__ for w in extra)
        return set(), (f"loss_fn was given more than the labels and the logits ({given}): "
                       "call it as loss_fn(y, logits), the last part's output")
    features = {x.op.name for x, _ in batch_inputs}
    labels = {y.op.name for _, y in batch_inputs}
    for call in made:
        for value in call[:2]:
            if getattr(value, "graph", None) is graph:
                seen = _ancestors([value])
                if seen & features and seen & labels:
                    return set(), ("loss_fn was given a value computed from a micro-batch's "
                                   "features and labels both (a gradient's?): give it the "
                                   "labels and the last part's output")
    return _ancestors([call[2] for call in made]), None


def _ancestors(tensors: Any) -> set[str]:
    stack, seen = [t.op for t in tensors], set()
    while stack:
        op = stack.pop()
        if op.name not in seen:
            seen.add(op.name)
            stack.extend(t.op for t in op.inputs)
    return seen


def _read_parts(graph: Any, forward: set[str], owner: dict[Any, int],
                batch_inputs: list[tuple[Any, Any]]) -> dict[str, tuple[str, int]]:
    """What values of ``graph`` are, by their ancestors, whatever ops made them:
    ``("weight", j)``, made from part ``j``'s weights alone (a read, ``transpose(transpose(W))``:
    x06 L9), or ``("activation", j)``, a value of the forward (or an Identity copy of one)
    made from the features and the weights of parts up to ``j`` (``-1``: of none, the
    features themselves). Values of labels and constants alone are neither."""
    handles = {r.deref().op.name: part for r, part in owner.items()}
    features = {x.op.name for x, _ in batch_inputs}
    known: dict[str, tuple[bool, frozenset]] = {}  # op -> made from features?, weights' parts
    kinds: dict[str, tuple[str, int]] = {}
    for op in graph.get_operations():  # in creation order: an op's inputs come first
        feat, parts = op.name in features, {handles[op.name]} if op.name in handles else set()
        for t in op.inputs:
            f, w = known.get(t.op.name, (False, frozenset()))
            feat, parts = feat or f, parts | w
        known[op.name] = (feat, frozenset(parts))
        copied = kinds.get(op.inputs[0].op.name) if op.type == "Identity" else None
        if feat and (op.name in forward or copied):
            kinds[op.name] = copied or ("activation", max(parts, default=-1))
        elif parts and not feat:
            kinds[op.name] = ("weight", max(parts))
    return kinds


def backward_misplaced(graph: Any, calls: list[Any], grads: list[Any], expected_part: list[int],
                       owner: dict[Any, int], devices: list[str],
                       batch_inputs: list[tuple[Any, Any]]) -> str | None:
    """None when every op that computes part ``i``'s weight gradients asked for ``devices[i]``,
    found by what it consumes and produces, whatever its name: the ops the returned gradients
    of part ``i`` were computed from that ``loss_fn``'s results (the forward, ``calls``: see
    ``LossRecording``, ``_forward``) and the gradients of the later parts were not; an op
    among them that reads a later part's weight (``dy · Wⱼᵀ``, a value made from ``Wⱼ``
    alone, ``_read_parts``) belongs to part ``j`` and must ask for ``devices[j]``. Each such
    op of part ``i`` reads no activation but part ``i``'s own and its input (part ``i − 1``'s
    output): an earlier part's backward tied into a later part's gradient (``+ 0 · Σ g₀``),
    to be placed with it, reads an earlier part's input (x06 L9). And each gradient made from
    every micro-batch's own backward (``batch_inputs``: the traced ``(x, y)`` of each
    micro-batch): ``_one_backward_per_micro_batch``."""
    by_name = {op.name: op for op in graph.get_operations()}
    forward, reason = _forward(graph, calls, batch_inputs)
    if reason:
        return reason
    kinds = _read_parts(graph, forward, owner, batch_inputs)
    parts = max(expected_part) + 1
    later: set[str] = set()
    for index in reversed(range(parts)):
        mine = [g for g, p in zip(grads, expected_part, strict=True) if p == index]
        region = _ancestors(mine) - forward - later
        homes = _homes(graph, region, kinds, index)
        for name in sorted(region):
            op = by_name.get(name)
            if op is None or op.type in _INPUTS or op.type == "Identity":
                continue  # a copy is found where what it copies was computed
            read = [kinds[t.op.name] for t in op.inputs if t.op.name in kinds]
            home = homes[name]
            where = _short(op.device) or "no device (the default one)"
            if _short(op.device) != _short(devices[home]):
                role = ("the gradient it passes back" if home != index
                        else "its weights' gradients")
                return (f"part {home}'s backward pass ({op.type}, computing {role}) ran on "
                        f"{where}, expected {_short(devices[home])}, where its weights live")
            foreign = sorted({j for kind, j in read if kind == "activation"} - {home - 1, home})
            if foreign:
                what = ("the micro-batch's features" if foreign[0] < 0
                        else f"part {foreign[0]}'s activations")
                return (f"part {home}'s backward pass has an op ({op.type}, on {where}) that "
                        f"reads {what}: a part's backward reads only its own activations and "
                        "its input, and its gradients are computed from no earlier part's "
                        "backward (is one part's gradient tied into a later one's?)")
        later |= _ancestors(mine)
    return _one_backward_per_micro_batch(graph, forward, grads, expected_part, batch_inputs)


def _homes(graph: Any, region: set[str], kinds: dict[str, tuple[str, int]],
           index: int) -> dict[str, int]:
    """The part whose backward each op of part ``index``'s region is: a later part ``j``'s
    when it reads ``j``'s weight or activation (the gradient ``j`` passes back, or a
    persistent tape's second call recomputing ``j``'s backward for it), or when it reads
    neither and every op of the region it feeds is a later part's (that call's first ops,
    the loss's gradient); else part ``index``'s."""
    homes: dict[str, int] = {}
    for op in reversed([op for op in graph.get_operations() if op.name in region]):
        read = [kinds[t.op.name] for t in op.inputs if t.op.name in kinds]
        reads = ({j for kind, j in read if kind == "weight"} - {index}) | {
            j for kind, j in read if kind == "activation" and j > index}
        users = [homes[c.name] for t in op.outputs for c in t.consumers() if c.name in homes]
        if reads:
            homes[op.name] = min(reads)
        elif users and min(users) > index:
            homes[op.name] = min(users)
        else:
            homes[op.name] = index
    return homes


def _one_backward_per_micro_batch(graph: Any, forward: set[str], grads: list[Any],
                                  expected_part: list[int],
                                  batch_inputs: list[tuple[Any, Any]]) -> str | None:
    """None when each gradient has, for every micro-batch ``j``, a backward op (not the
    forward: not an ancestor of the loss) that depends on ``j``'s labels and on no other
    micro-batch's inputs: that micro-batch's own backward. After a concatenation of the
    micro-batches every op depends on all of them, so one big batch has none, however its
    gradient is then split into shares. What is found is what each op depends on, not what it
    adds: an op built for show from ``y_j`` alone (``0 · y_j``) would count; the values are
    checked separately."""
    batch_of = {}
    for j, (x, y) in enumerate(batch_inputs):
        batch_of[x.op.name], batch_of[y.op.name] = ("x", j), ("y", j)
    depends: dict[str, frozenset] = {}  # op -> the micro-batch inputs it depends on
    for op in graph.get_operations():  # in creation order: an op's inputs come first
        found = {batch_of[op.name]} if op.name in batch_of else set()
        for t in op.inputs:
            found |= depends.get(t.op.name, frozenset())
        depends[op.name] = frozenset(found)
    own = {}  # op -> the micro-batch whose backward it is alone
    for name, found in depends.items():
        batches = {j for _, j in found}
        if name not in forward and len(batches) == 1 and ("y", min(batches)) in found:
            own[name] = min(batches)
    for output, index in zip(grads, expected_part, strict=True):
        stack, seen, served = [output.op], set(), set()
        while stack:
            op = stack.pop()
            if op.name not in seen:
                seen.add(op.name)
                if op.name in own:
                    served.add(own[op.name])
                stack.extend(t.op for t in op.inputs)
        missing = sorted(set(range(len(batch_inputs))) - served)
        if missing:
            return (f"a gradient of part {index}'s weights has no backward op of micro-batch "
                    f"{missing[0]} alone (one that depends on its labels and on no other "
                    "micro-batch's inputs): one backward served several micro-batches (one "
                    "batch made of them all?), not one per micro-batch")
    return None


def placement_of_the_backward(fn: Any, problem: dict[str, Any], loss_fn: Any,
                               devices: list[str], values: Any) -> str | None:
    """None when, traced (``fn`` is the guarded answer: the helpers are refused while it is
    traced too), each part's gradient ops, and the sums over micro-batches, ask for that
    part's device, and the traced function's own results pass ``values`` (an answer that
    computes its values one way eagerly and another way in a graph fails either).

    Which ops are part ``i``'s backward is found from the graph's edges, not from op names
    (``tf.name_scope("gradient_tape")`` fakes those) nor from how a weight was read
    (``W + 0.0`` is still ``W``): see ``backward_misplaced``.
    """
    tf = _tf()
    parts = problem["parts"]
    micro_batches = problem["micro_batches"]
    recording = LossRecording(loss_fn)  # the forward ends at what loss_fn returned

    def traced(pairs: Any) -> Any:
        recording.calls.clear()
        return fn(parts, [tuple(pair) for pair in pairs], recording, devices)

    specs = [(tf.TensorSpec(x.shape, tf.float32), tf.TensorSpec(y.shape, tf.int32))
             for x, y in micro_batches]
    try:
        concrete = tf.function(traced).get_concrete_function(specs)
    except AssertionError as error:  # the guard: a helper was run while it was traced
        return f"traced in a tf.function: {str(error).strip().splitlines()[-1].strip()[:300]}"
    except Exception as error:  # noqa: BLE001 - the learner's to see
        return ("the check traces your function in a tf.function to read where each "
                f"gradient op was placed, and tracing failed: {type(error).__name__}: "
                f"{str(error).strip().splitlines()[0][:160]}")
    # called on fresh micro-batches of the same shapes, drawn only now: numbers kept from the
    # eager call (or read from the check) cannot pass for this call's gradients
    draw = np.random.default_rng()
    classes = int(parts[-1].output_shape[-1])
    fresh = [(draw.normal(size=x.shape).astype("float32"),
              draw.integers(0, classes, size=y.shape).astype("int32")) for x, y in micro_batches]
    reason = values(fresh)(concrete([tuple(pair) for pair in fresh]))
    if reason:
        return f"traced in a tf.function, called on fresh micro-batches: {reason}"
    graph = concrete.graph
    if {op.type for op in graph.get_operations()} & {"EagerPyFunc", "PyFunc",
                                                     "PyFuncStateless"}:
        return ("traced in a tf.function, it runs Python (tf.py_function or "
                "tf.numpy_function), whose ops no graph shows: compute each part's backward "
                "with TensorFlow ops, one GradientTape per part")
    owner = {}  # the traced graph's handle of each weight -> its part
    for external, internal in graph.captures:
        for index, part in enumerate(parts):
            if any(external is v.handle for v in part.trainable_variables):
                owner[internal.ref()] = index
    flat = tf.nest.flatten(graph.structured_outputs)
    expected_part = [i for i, part in enumerate(parts) for _ in part.trainable_variables]
    if len(flat) - 1 != len(expected_part):
        return "return (loss, grads): one gradient per trainable variable, parts in order"
    count = 2 * len(micro_batches)  # the traced (x, y) of each micro-batch, in order
    batch_inputs = list(zip(graph.inputs[:count:2], graph.inputs[1:count:2], strict=True))
    reason = backward_misplaced(graph, recording.calls, flat[1:], expected_part, owner,
                                devices, batch_inputs)
    return reason and f"traced in a tf.function, {reason}"
