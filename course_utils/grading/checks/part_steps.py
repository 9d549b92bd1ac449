"""Lesson 06, exercise 2: the colleague's micro-batched step over many parts, fixed.

``check_fixed_part_step(fixed_part_step)``: a model split into two and three parts on devices
the check chooses (never the default first), trained on micro-batches of unequal size (the
last one short, as a dataset's remainder). Judged, in this order:

* the values: the loss and gradients of the **batch's** mean loss (every example once), the
  unsplit model's on all the micro-batches at once; the colleague's mean of the micro-batches'
  means is named when that is what came back;
* where the backward ran: the answer traced in a ``tf.function`` and its graph read by
  ``backward_placement.placement_of_the_backward`` (each part's weight gradients, the gradient
  it passes back through its weights, the sums over micro-batches: on its part's device; one
  backward per micro-batch; its known limits are that module's);
* called eagerly, each returned gradient on its part's device;
* what is alive: called eagerly, ``loss_fn`` (a ``TapeWatch``) runs once per micro-batch and,
  each time, reads which ``GradientTape``\\ s the answer made so far (each one noted as it is
  made: the guard's profiler sees ``GradientTape.__init__`` run, by code identity) and which
  it holds in its frames' locals; a tape alive at one call that still holds its recording at
  the next (not yet used by ``gradient``, or persistent) keeps an earlier micro-batch's
  activations alive while the next one runs: the colleague's all-forwards-first, wherever
  the tapes are kept (a local, a global, an object's attribute, a closure: xf06 L2; tapes
  left only in a reference cycle are collected first: garbage is not held). Known limit:
  activations kept as plain tensors (a forward run again under a tape later) are not seen.

``tf.gradients``, ``cu.parallel.split_step`` and the lesson's pipelines are refused by code
identity and content (``refusals``), and so are this module's and lesson 06's functions.
"""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.grading.checks.backward_placement import placement_of_the_backward
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["TapeWatch", "check_fixed_part_step"]

_WATCHES = ("_tapes_in", "_recording", "_tape_init")  # run inside the answer, by TapeWatch
_COURSE = str(Path(__file__).resolve().parent.parent.parent)  # course_utils/


def _lesson_module_functions() -> list[Any]:
    """``lesson_06``'s own functions (the module that imports this one, so read from
    ``sys.modules`` rather than imported: no import circle), refused like this module's."""
    lesson = sys.modules.get(__name__.rsplit(".", 1)[0] + ".lesson_06")
    return own_functions(lesson) if lesson is not None else []


def _short(name: str) -> str:
    return name.rsplit("device:", 1)[-1]


def _tapes_in(value: Any, depth: int, found: dict[int, Any], tape_type: type) -> None:
    if isinstance(value, tape_type):
        found[id(value)] = value
    elif depth and isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _tapes_in(item, depth - 1, found, tape_type)
    elif depth and isinstance(value, dict):
        for item in value.values():
            _tapes_in(item, depth - 1, found, tape_type)


def _tape_init() -> Any:
    """The code of ``tf.GradientTape.__init__``: run once for every tape made."""
    return _tf().GradientTape.__init__.__code__


def _recording(tape: Any) -> bool:
    """Whether ``tape`` still holds what it recorded: a non-persistent tape lets go of it in
    ``gradient`` (``self._tape = None``, ``tensorflow/python/eager/backprop.py``, line 1077);
    a persistent one keeps it as long as it lives."""
    return getattr(tape, "_tape", None) is not None


class TapeWatch:
    """The ``loss_fn`` the answer gets: while ``active`` and eager, each call counts and reads
    the tapes that the answer's frames hold (up to the first frame of the course's code); a
    tape seen at one call that still holds its recording at the next is held across a
    micro-batch (``held``: the call at which it was first found, and how many)."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn = loss_fn
        self.reset(active=False)

    def reset(self, active: bool) -> None:
        self.active, self.calls, self.held = active, 0, None
        self.seen: list[Any] = []
        self.made: list[Any] = []  # a weak reference to each tape made while it is active

    def note(self, frame: Any, c_function: Any) -> None:
        """The guard's ``also``: a tape made (``GradientTape.__init__`` entered) while
        active is noted, wherever the answer then keeps it."""
        if c_function is None and self.active and frame.f_code is _tape_init():
            tape = frame.f_locals.get("self")
            if tape is not None:
                self.made.append(weakref.ref(tape))

    def _still(self) -> list[Any]:
        return [t for t in (ref() for ref in self.seen) if t is not None and _recording(t)]

    def __call__(self, y: Any, logits: Any, *args: Any, **kwargs: Any) -> Any:
        tf = _tf()
        if self.active and tf.executing_eagerly():
            # first the frames' locals: reading f_locals refreshes the snapshot the frame keeps
            # (Python 3.11), so the last call's snapshot holds no tape the answer let go
            found: dict[int, Any] = {}
            frame = sys._getframe(1)
            while frame is not None and not frame.f_code.co_filename.startswith(_COURSE):
                for value in frame.f_locals.values():
                    _tapes_in(value, 3, found, tf.GradientTape)
                frame = frame.f_back
            still = self._still()
            if still:  # garbage in a reference cycle is not held: collected, then asked again
                gc.collect()
                still = self._still()
            if still and self.held is None:
                self.held = (self.calls, len(still))
            found.update((id(t), t) for t in still)
            # then every tape made so far that is still alive, wherever it is kept (a global,
            # an attribute, a closure): taken after the frames' snapshots were refreshed
            found.update((id(t), t) for t in (ref() for ref in self.made) if t is not None)
            self.seen = [weakref.ref(t) for t in found.values() if _recording(t)]
            self.calls += 1
        return self.loss_fn(y, logits, *args, **kwargs)


def _problem(rng: Any, num_parts: int) -> dict[str, Any]:
    import keras

    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    width, classes = rng.randint(3, 7), rng.randint(2, 4)
    full, count = rng.randint(4, 7), rng.randint(2, 3)
    sizes = [full] * (count - 1) + [rng.randint(1, full - 2)]  # the last one short
    widths = [width] + [rng.randint(4, 10) for _ in range(num_parts - 1)] + [classes]
    parts = [keras.Sequential([keras.Input((widths[i],)),
                               keras.layers.Dense(widths[i + 1],
                                                  "tanh" if i < num_parts - 1 else None)])
             for i in range(num_parts)]
    micro_batches = [(data.normal(size=(n, width)).astype("float32"),
                      data.integers(0, classes, size=(n,)).astype("int32")) for n in sizes]
    return {"parts": parts, "micro_batches": micro_batches}


def _reference(tf: Any, parts: Any, batches: Any, loss_fn: Any, mean_of_means: bool) -> Any:
    """The unsplit model's loss and gradients: the batch's mean loss (all the examples at
    once), or the colleague's mean of the micro-batches' means."""
    variables = [v for part in parts for v in part.trainable_variables]
    with tf.GradientTape() as tape:
        losses = []
        for x, y in (batches if mean_of_means else [(np.concatenate([x for x, _ in batches]),
                                                     np.concatenate([y for _, y in batches]))]):
            value = x
            for part in parts:
                value = part(value)
            losses.append(loss_fn(y, value))
        loss = tf.add_n(losses) / len(losses)
    return float(loss), [g.numpy() for g in tape.gradient(loss, variables)]


def _values(tf: Any, parts: Any, loss_fn: Any) -> Any:
    def values(batches: Any) -> Any:
        """A verifier of (loss, grads) on ``batches``, its expected values computed when it
        runs (after the answer returned)."""
        def verify_values(got: Any) -> str | None:
            count = sum(len(p.trainable_variables) for p in parts)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                return "return (loss, grads): the gradients of every part's weights, in order"
            loss, grads = got
            if not isinstance(grads, (tuple, list)) or len(grads) != count:
                return f"grads must hold {count} gradients, one per trainable variable"

            def error(expected: Any) -> float:
                return max(abs(float(loss) - expected[0]),
                           *(float(np.abs(np.asarray(g) - e).max())
                             for g, e in zip(grads, expected[1], strict=True)))

            if error(_reference(tf, parts, batches, loss_fn, False)) <= 1e-5:
                return None
            sizes = [len(y) for _, y in batches]
            if error(_reference(tf, parts, batches, loss_fn, True)) <= 1e-5:
                return (f"loss and gradients are the mean of the micro-batches' means (sizes "
                        f"{sizes}): with a short micro-batch its examples count more than "
                        "the others'; the batch's mean loss counts every example once")
            return (f"loss or gradients differ from the unsplit model's on the whole batch "
                    f"(micro-batches of sizes {sizes}, every example counted once)")
        return verify_values
    return values


@register
def check_fixed_part_step(fn: Any) -> bool:
    """Check ``fixed_part_step(parts, micro_batches, loss_fn, devices)``: values, where the
    backward ran, what stays alive."""
    import keras

    from course_utils.grading.checks import backward_placement
    from course_utils.parallel import pipeline, placement

    tf = _tf()
    rng = fresh_rng()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 3:
        raise AssertionError("this check needs at least 3 logical devices: run the set-up cell "
                             "(cu.setup(logical_devices=4, ...)) first, in a fresh kernel")
    from tensorflow.python.ops import gradients_util  # tf.gradients, tf.compat.v1.gradients

    guarded = refusing(fn, [placement.split_step, pipeline.run_pipeline, pipeline.run_gpipe,
                            gradients_util._GradientsHelper,
                            *own_functions(sys.modules[__name__], but=_WATCHES),
                            *own_functions(backward_placement), *_lesson_module_functions()],
                       "write the backward pass yourself, one GradientTape per part (the "
                       "lesson's split_step and run_pipeline already hold it)",
                       also=lambda frame, c_function: current[-1].note(frame, c_function))
    current = [TapeWatch(None)]  # the case's watch: it notes each tape the answer makes

    def watched(parts: Any, micro_batches: Any, watch: Any, chosen: Any) -> Any:
        watch.reset(active=True)
        current.append(watch)
        try:
            return guarded(parts, micro_batches, watch, chosen)
        finally:
            watch.active = False

    watched.__wrapped__ = fn  # type: ignore[attr-defined]  # the framework reads the answer

    def case(chosen: list[str]) -> Case:
        problem = _problem(rng, len(chosen))
        parts, micro_batches = problem["parts"], problem["micro_batches"]
        watch = TapeWatch(keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        values = _values(tf, parts, watch.loss_fn)

        def eager_devices(got: Any) -> str | None:
            home = [i for i, part in enumerate(parts) for _ in part.trainable_variables]
            for g, i in zip(got[1], home, strict=True):
                where = _short(getattr(g, "device", "") or "")
                if where != _short(chosen[i]):
                    return (f"called eagerly, a gradient of part {i}'s weights is on "
                            f"{where or 'the host'}, expected {_short(chosen[i])}")
            return None

        def alive() -> str | None:
            calls, held = watch.calls, watch.held
            if calls != len(micro_batches):
                return (f"called eagerly, it called loss_fn {calls} time(s) for "
                        f"{len(micro_batches)} micro-batches: run them one at a time")
            if held is not None:
                return (f"when micro-batch {held[0]}'s loss was computed, it still held "
                        f"{held[1]} tape(s) recorded for an earlier micro-batch (not yet used "
                        "by gradient, or persistent): every micro-batch's activations stay "
                        "alive at once. Finish a micro-batch's backward, and let its tapes "
                        "go, before the next one's forward")
            return None

        def verify(got: Any) -> str | None:
            return (values(micro_batches)(got)
                    or placement_of_the_backward(guarded, problem, watch.loss_fn, chosen,
                                                 values)
                    or eager_devices(got) or alive())

        return Case(args=(parts, micro_batches, watch, list(chosen)), verify=verify,
                    label=f"({len(chosen)} parts on {[_short(d) for d in chosen]}, "
                          f"micro-batches of {[len(y) for _, y in micro_batches]})")

    chosen = [[devices[2], devices[1]], [devices[-1], devices[1], devices[2]]]  # never CPU:0 first
    return run_check(
        "fixed_part_step", watched, [case(c) for c in chosen],
        hint="lesson 06, section 2 (each part's backward on its own device): which of the "
             "colleague's gradient calls runs outside its part's device, how long does each "
             "tape live, and how much does a short micro-batch's example weigh in the "
             "batch's mean?")
