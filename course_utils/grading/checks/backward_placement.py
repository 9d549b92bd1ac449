"""Lesson 06, exercise 2: which ops of a traced ``split_gradients`` are each part's backward
pass, found from the graph's edges (what they consume and produce), not from op names or how
a weight was read, and whether each asked for its part's device."""

from __future__ import annotations

from typing import Any

__all__ = ["LossRecording", "backward_misplaced"]


def _short(name: str) -> str:
    """``CPU:1`` of a full device name."""
    return name.rsplit("device:", 1)[-1]


_CARRY = {"Identity", "Cast", "AddV2", "Add", "Sub", "Mul", "RealDiv", "Neg", "Reshape"}
_INPUTS = {"Const", "Placeholder", "ReadVariableOp", "NoOp"}


def _weight_read(tensor: Any, owner: dict[Any, int]) -> int | None:
    """The part whose weight ``tensor`` is (a read of it, through copies, casts and
    arithmetic with constants: ``W + 0.0`` is still ``W``), or None."""
    op = tensor.op
    for _ in range(32):
        if op.type == "ReadVariableOp":
            return owner.get(op.inputs[0].ref())
        live = [t for t in op.inputs if t.op.type != "Const"]
        if op.type not in _CARRY or len(live) != 1:
            return None
        op = live[0].op
    return None


class LossRecording:
    """The check's ``loss_fn`` as the traced answer gets it: it keeps each call's ``(y,
    logits, result)``. The forward ends at what ``loss_fn`` returned, not at the loss the
    answer returns, which it can make depend on its own gradients (``+ 0 · Σ g``: nb31-06
    L2-1)."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn, self.calls = loss_fn, []

    def __call__(self, y: Any, logits: Any, *args: Any, **kwargs: Any) -> Any:
        out = self.loss_fn(y, logits, *args, **kwargs)
        self.calls.append((y, logits, out))
        return out


def _forward(graph: Any, calls: list[Any], batch_inputs: list[tuple[Any, Any]]
             ) -> tuple[set[str], str | None]:
    """The forward (every op ``loss_fn``'s results in ``graph`` were computed from), or why
    it cannot be told: ``loss_fn`` called fewer times than there are micro-batches in the
    traced function itself, an inner ``tf.function`` (one call op: the ops inside it, part
    0's backward among them, are not in ``graph``: nb31-06 L2-2), or ``loss_fn`` given a value
    made from a micro-batch's features and labels both (a gradient's: a backward pass)."""
    inner = {"PartitionedCall", "StatefulPartitionedCall"}
    if any(op.type in inner for op in graph.get_operations()):
        return set(), ("it calls another tf.function, whose ops the check cannot place: "
                       "write the backward pass in your function itself")
    if any(op.type.startswith(("ResourceScatter", "ResourceApply", "ResourceSparseApply",
                               "ResourceStridedSliceAssign"))
           for op in graph.get_operations()):
        return set(), ("it writes a variable other than by assign, which hides what a value "
                       "was computed from: return the gradients you compute")
    made = [call for call in calls if getattr(call[2], "graph", None) is graph]
    if len(made) < len(batch_inputs):
        return set(), (f"{len(made)} call(s) of loss_fn in it for {len(batch_inputs)} "
                       "micro-batches: call it on each micro-batch's logits in your function "
                       "itself (one batch made of them all?)")
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


_WRITES = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}
_written: dict[Any, dict[str, list[Any]]] = {}  # graph -> variable handle -> values written


def _inputs(op: Any) -> list[Any]:
    """What ``op`` reads: its inputs, and for a read of a variable every value the graph
    writes to that variable (``v.assign(g)`` then ``v.read_value()``: the read is made from
    ``g``, though no edge says so)."""
    if op.type != "ReadVariableOp":
        return list(op.inputs)
    if op.graph not in _written:
        writes: dict[str, list[Any]] = {}
        for other in op.graph.get_operations():
            if other.type in _WRITES:
                writes.setdefault(other.inputs[0].name, []).append(other.inputs[1])
        _written[op.graph] = writes
    return [*op.inputs, *_written[op.graph].get(op.inputs[0].name, [])]


def _ancestors(tensors: Any) -> set[str]:
    stack, seen = [t.op for t in tensors], set()
    while stack:
        op = stack.pop()
        if op.name not in seen:
            seen.add(op.name)
            stack.extend(t.op for t in _inputs(op))
    return seen


def backward_misplaced(graph: Any, calls: list[Any], grads: list[Any], expected_part: list[int],
                       owner: dict[Any, int], devices: list[str],
                       batch_inputs: list[tuple[Any, Any]]) -> str | None:
    """None when every op that computes part ``i``'s weight gradients asked for ``devices[i]``,
    found by what it consumes and produces, whatever its name: the ops the returned gradients
    of part ``i`` were computed from that ``loss_fn``'s results (the forward, ``calls``: see
    ``LossRecording``, ``_forward``) and the gradients of the later parts were not; an op
    among them that reads a later part's weight (``dy · Wⱼᵀ``) belongs to part ``j`` and must
    ask for ``devices[j]``. And each gradient made from every
    micro-batch's own backward (``batch_inputs``: the traced ``(x, y)`` of each micro-batch):
    ``_one_backward_per_micro_batch``."""
    by_name = {op.name: op for op in graph.get_operations()}
    _written.clear()
    forward, reason = _forward(graph, calls, batch_inputs)
    if reason:
        return reason
    parts = max(expected_part) + 1
    later: set[str] = set()
    for index in reversed(range(parts)):
        mine = [g for g, p in zip(grads, expected_part, strict=True) if p == index]
        region = _ancestors(mine) - forward - later
        for name in sorted(region):
            op = by_name.get(name)
            if op is None or op.type in _INPUTS or op.type == "Identity":
                continue  # a copy is found where what it copies was computed
            reads = {_weight_read(t, owner) for t in op.inputs} - {None, index}
            home = min(reads) if reads else index
            if _short(op.device) != _short(devices[home]):
                role = ("the gradient it passes back, through its weights"
                        if home != index else "its weights' gradients")
                return (f"part {home}'s backward pass ({op.type}, computing {role}) ran on "
                        f"{_short(op.device) or 'no device (the default one)'}, expected "
                        f"{_short(devices[home])}, where its weights live")
        later |= _ancestors(mine)
    return _one_backward_per_micro_batch(graph, forward, grads, expected_part, batch_inputs)


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
        for t in _inputs(op):
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
                stack.extend(t.op for t in _inputs(op))
        missing = sorted(set(range(len(batch_inputs))) - served)
        if missing:
            return (f"a gradient of part {index}'s weights has no backward op of micro-batch "
                    f"{missing[0]} alone (one that depends on its labels and on no other "
                    "micro-batch's inputs): one backward served several micro-batches (one "
                    "batch made of them all?), not one per micro-batch")
    return None
