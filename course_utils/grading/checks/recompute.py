"""Lesson 07, exercise 5: recompute a flat stack of layers in segments (``tf.recompute_grad``).

The check, registered by name (``lesson_07`` imports it): on a fresh flat stack of Dense layers,
the plain stack's gradients, made with one ``tf.recompute_grad`` per segment of
``segment_size`` layers (counted on the gradients' path of the traced step), every layer's
forward run again, and the segments the backward pass recomputes exactly ``segment_size``
consecutive layers from the first (read from the order in which the layers ran: a near-equal
split of the same count fails, and so does no recomputation); every case's last segment is
shorter. The recomputed matrix products are counted on the gradients' data path only: layers
run again beside a plain tape and tied on by control dependencies feed nothing. A second,
plain path computed from the weights beside the recomputed one (every activation kept on the
tape, whatever ops it uses) reads the weights more often on the gradients' data path than
``READS_PER_WEIGHT`` each, and fails. While the check runs, ``tf.recompute_grad`` marks the
layers its functions run (public name only, no TensorFlow internals): every layer call must be
inside one, and as many calls of them must run layers as the segments' forward and
recomputation (a layer run again after the loss beside a plain tape, or an identity wrapped
for the count, is named; an answer holding ``tf.recompute_grad`` from before the check is
refused). Still unseen: memory itself (no peak is measured), and
a second path built from read values smuggled out of the recomputed function.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["READS_PER_WEIGHT", "check_segment_gradients"]

#: Reads of each weight on the gradients' data path of a step with one ``tf.recompute_grad``
#: per segment (TensorFlow 2.21: the forward pass, the recomputation and the backward pass's
#: two; the plain step: one); a path of its own computed from the weights reads them more.
READS_PER_WEIGHT = 4


def _keras() -> Any:
    _tf()
    import keras

    return keras


# --- Exercise 5 · recompute in segments of a flat stack of layers ---------------------------


class _Calls(list):
    """The layers' positions in the order they ran; ``outside``: calls made outside every
    function given to ``tf.recompute_grad``; ``runs``: calls of such functions, outermost,
    that ran at least one layer (each segment's forward and its recomputation)."""

    outside = runs = 0


_INSIDE: list[Any] = [0, None, 0]  # depth in the functions given; last stack; layer calls


def _watched_recompute(original: Any) -> Any:
    """``tf.recompute_grad`` (public) whose functions mark the layers they run as inside: a
    layer run again outside them is no recomputation, and a function that runs no layer is
    no segment. An answer must call ``tf.recompute_grad`` by that name while it runs."""
    def recompute_grad(f: Any) -> Any:
        def marked(*args: Any, **kwargs: Any) -> Any:
            _INSIDE[0] += 1
            before = _INSIDE[2]
            try:
                return f(*args, **kwargs)
            finally:
                _INSIDE[0] -= 1
                if not _INSIDE[0] and _INSIDE[2] > before:
                    _INSIDE[1].runs += 1

        return original(marked)

    return recompute_grad


def _segment_stack(rng: Any) -> tuple[list[Any], Any, list[int]]:
    """A fresh flat stack of Dense layers (random width and depth), a batch for it, and the
    order in which the layers' forward passes ran (each call appends the layer's position)."""
    keras, tf = _keras(), _tf()
    width, depth = rng.randint(6, 16), rng.randint(5, 8)
    seed = rng.randint(0, 2**31 - 1)
    calls = _Calls()

    class Dense(keras.layers.Dense):
        def call(self, inputs: Any) -> Any:
            calls.append(self.position)
            calls.outside += not _INSIDE[0]
            _INSIDE[1], _INSIDE[2] = calls, _INSIDE[2] + 1
            return super().call(inputs)

    layers = [Dense(width, activation=rng.choice(["relu", "tanh"]),
                    kernel_initializer=keras.initializers.GlorotNormal(seed + i))
              for i in range(depth)]
    for position, layer in enumerate(layers):
        layer.position = position
        layer.build((None, width))
    x = tf.random.stateless_normal([rng.randint(3, 9), width], seed=[seed, 1])
    return layers, x, calls


def _recomputed_segments(calls: list[int], depth: int) -> list[int] | None:
    """The sizes of the segments the backward pass ran again, first segment first, from the
    layers' call order (a forward of 0 .. depth-1, then each segment again, last first); None
    when the calls are not one forward pass followed by ascending runs."""
    if calls[:depth] != list(range(depth)):
        return None
    runs: list[list[int]] = []
    for position in calls[depth:]:
        if runs and position == runs[-1][-1] + 1:
            runs[-1].append(position)
        else:
            runs.append([position])
    return [len(run) for run in sorted(runs)]


def _plain_segment_gradients(layers: list[Any], x: Any) -> list[Any]:
    tf = _tf()
    with tf.GradientTape() as tape:
        for layer in layers:
            x = layer(x)
        loss = tf.reduce_mean(tf.square(x))
    return tape.gradient(loss, [v for layer in layers for v in layer.trainable_variables])


def _traced_ops(fn: Any, layers: list[Any], x: Any, segment_size: int,
                data_only: bool = False) -> dict[str, int]:
    """The op types on the gradients' path of ``fn(layers, x, segment_size)`` traced into one
    ``tf.function`` graph: the ops its outputs depend on (through inputs and control inputs;
    ``data_only``: through inputs alone, so that an op tied on by a control dependency only
    feeds nothing), so that an op made and left unused counts for nothing."""
    from collections import Counter

    tf = _tf()
    traced = tf.function(lambda t: fn(layers, t, segment_size)).get_concrete_function(
        tf.TensorSpec(x.shape, x.dtype))
    pending = [tensor.op for tensor in traced.outputs]
    seen: set[Any] = set()
    while pending:
        op = pending.pop()
        if op in seen:
            continue
        seen.add(op)
        pending.extend(tensor.op for tensor in op.inputs)
        if not data_only:
            pending.extend(op.control_inputs)
    return dict(Counter(op.type for op in seen))


@register
def check_segment_gradients(fn: Any) -> bool:
    """Check ``segment_gradients(layers, x, segment_size)``: the plain gradients, made with one
    ``tf.recompute_grad`` per segment of ``segment_size`` consecutive layers (the traced step
    holds one recompute per segment and runs every layer's forward again)."""
    rng = fresh_rng()
    cases = []
    for _ in range(2):
        layers, x, calls = _segment_stack(rng)
        # a size that leaves a shorter last segment: an answer that drops it cannot pass
        segment_size = rng.choice([size for size in range(2, len(layers) - 1)
                                   if len(layers) % size])
        segments = math.ceil(len(layers) / segment_size)

        def verify(got: Any, layers: list[Any] = layers, x: Any = x,
                   segment_size: int = segment_size, segments: int = segments,
                   calls: list[int] = calls) -> str | None:
            ran = list(calls)  # the learner's call alone, before the check's own runs
            outside, runs = calls.outside, calls.runs
            expected = _plain_segment_gradients(layers, x)
            if not isinstance(got, (list, tuple)) or len(got) != len(expected):
                return (f"expected a list of {len(expected)} gradients (kernel and bias of "
                        f"each of the {len(layers)} layers, in order), got {type(got).__name__}"
                        + (f" of {len(got)}" if isinstance(got, (list, tuple)) else ""))
            if any(g is None for g in got):
                return "a gradient is None: every layer must be on the tape's path"
            for index, (g, e) in enumerate(zip(got, expected, strict=True)):
                if tuple(np.shape(g)) != tuple(e.shape):
                    return (f"gradient {index} has shape {tuple(np.shape(g))}, expected "
                            f"{tuple(e.shape)}: the gradients differ from the plain stack's "
                            "order (kernel and bias of each layer, first layer first)")
            error = largest_difference([np.asarray(g) for g in got],
                                       [np.asarray(g) for g in expected])
            if error > 1e-5:
                return (f"the gradients differ from the plain stack's by {error:.2e}: "
                        "recomputing changes memory, never gradients. Which layer saw another "
                        "input, or which loss differs from the exercise's?")
            depth = len(layers)
            want = [segment_size] * (depth // segment_size) + (
                [depth % segment_size] if depth % segment_size else [])
            found = _recomputed_segments(ran, depth)
            if found is None:
                return (f"the layers ran in the order {ran}: the forward pass runs each "
                        "layer once, first to last, and the backward pass each segment again")
            if not found:
                return ("no layer ran again in the backward pass: nothing was recomputed "
                        "(section 8: what does tf.recompute_grad run again, and when?)")
            if found != want:  # runs of the layers: recomputed segments, or a second pass
                longer = [size for size in found if size > segment_size]
                return (f"after the forward pass, the layers ran again in consecutive runs "
                        f"of {found}" + (
                            f" (a run of {max(longer)} is longer than a segment: a second "
                            "pass beside the recomputed one, or segments larger than asked?)"
                            if longer else "") + f"; segment_size={segment_size} asks the "
                        f"backward pass to recompute segments of {want}: consecutive "
                        f"segments of {segment_size} from the first layer, only the last "
                        "shorter, and no other pass")
            ops = _traced_ops(fn, layers, x, segment_size)
            recomputes = ops.get("IdentityN", 0) // 2  # tf.recompute_grad: 2 per call, used
            if recomputes != segments:
                return (f"the traced step holds {recomputes} tf.recompute_grad call(s), not "
                        f"{segments}: {len(layers)} layers in segments of {segment_size} "
                        f"(the last may be shorter), one tf.recompute_grad per segment")
            plain = _traced_ops(lambda ls, t, _: _plain_segment_gradients(ls, t), layers, x,
                                segment_size, data_only=True).get("MatMul", 0)
            traced = _traced_ops(fn, layers, x, segment_size, data_only=True)
            feeding = traced.get("MatMul", 0)
            if feeding < plain + len(layers):
                return (f"the traced step has {feeding} matrix products whose results feed "
                        f"the gradients, plain {plain}: every layer's forward must run again "
                        "in the backward pass and its recomputed activations make the "
                        "gradients (a layer run again beside the gradients, tied on by a "
                        "control dependency, saves nothing: is each layer called inside what "
                        "is recomputed?)")
            weights = sum(len(layer.trainable_variables) for layer in layers)
            if traced.get("ReadVariableOp", 0) > READS_PER_WEIGHT * weights:
                return (f"the gradients' data path reads the {weights} weights "
                        f"{traced['ReadVariableOp']} times, more than {READS_PER_WEIGHT} each "
                        "(the forward pass, the recomputation and its backward pass, as "
                        "tf.recompute_grad reads them): a second path computed from the "
                        "weights beside the recomputed one keeps its activations on the tape, "
                        "and recomputing then saves nothing")
            if outside or runs != 2 * segments:
                return (f"{outside} layer call(s) ran outside the functions given to "
                        f"tf.recompute_grad, and {runs} call(s) of those functions ran layers, "
                        f"not {2 * segments} ({segments} segments, each run forward and "
                        "recomputed in the backward pass): call every layer inside one, by "
                        "tf.recompute_grad while your function runs (a layer run again "
                        "beside it, or a function that runs no layer, recomputes nothing)")
            return None

        cases.append(Case(args=(layers, x, segment_size), verify=verify,
                          label=f"({len(layers)} Dense layers of {x.shape[1]}, x of shape "
                                f"{tuple(x.shape)}, segment_size={segment_size})"))
    tf = _tf()
    original, tf.recompute_grad = tf.recompute_grad, _watched_recompute(tf.recompute_grad)
    try:
        return _run_segment_cases(fn, cases)
    finally:
        tf.recompute_grad = original


def _run_segment_cases(fn: Any, cases: list[Case]) -> bool:
    return run_check(
        "segment_gradients", fn, cases,
        hint="lesson 07, section 8 (activation recomputation): which layers form each "
             "segment, what runs again in the backward pass, and which layers does each "
             "function made in your loop call when it finally runs (late binding)?")
