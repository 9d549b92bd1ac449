"""Lesson 07, exercise 1: accumulate gradients over padded micro-batches, under a memory limit.

The check, registered by name (``lesson_07`` imports it, with the helpers exercise 4 shares:
the problems, the model, ``_without_the_trainer``). On a fresh random model and data, behind a
simulated memory of one micro-batch (``cu.memory.limit_batch_size``: a larger batch, or a
second micro-batch's activations alive, fails like out of memory; a forward pass in training
mode is alive, with or without a tape, until a backward pass through it, and one
back-propagated twice, as by a persistent tape asked again, frees nothing). The data is
padded: every micro-batch holds a run of real examples and then padding (label ``PAD``), their
numbers drawn per micro-batch (one case holds a micro-batch of padding only, and ends with a
short group); the loss the answer gets (``ignore_class=PAD``) is the mean over a batch's real
examples. The weights must equal plain SGD with that loss on batches ``k`` times larger (the
last short): each update the mean over the real examples of its whole group, which section 2's
loss / k (and the lesson's eager loop's loss / len(group)) gets wrong as soon as micro-batches
hold different numbers of real examples; that loop, a mean over every slot (padding counted),
the two popular wrong loops and a loop that drops the short group are named. Every micro-batch,
its padding included, went through the limited model once in training mode: the examples
counted, the training-mode calls counted (one per micro-batch: no smaller pieces) and the sum of
their input rows compared with the features' (``fed_in_training``: a skipped micro-batch, or its
padding cut off, made up by a forward of zeros, differs; xf07 L1-L3). The model's
layers run only through the limit (``reach_around``: counted, their kernel read only inside
their own call). ``cu.Trainer`` is refused here and in exercise 4, by file, and the check's own
loops (``suspect_loops.accumulate``, the references here and in ``lesson_07``) by identity and
content. Each update applies (a multiple of) the sum of the gradients that flowed back through
the counted calls since the last (``applied_from_calls``: a forward by hand is named), at the
learning rate given (``rate_moves``); ``optimizer.apply`` runs once per group (its calls
counted: ``iterations`` counts k applies as one under Keras's option) and no weight changes
outside it (``UpdatesWatched``: weights trained elsewhere and written in), nor inside it
(``sgd_steps_off``). Unseen: a hand forward applied after counted calls made the same
gradients. Refused though right (xf07 R1, stated in the exercise): weights applied to each
micro-batch's gradients after ``tape.gradient`` (not one factor for the update): accepting them
would accept a hand forward after counted passes of the plain loss, equal in value.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.grading.checks.reach_around import (
    WRITTEN_OUTSIDE,
    UpdatesWatched,
    applied_from_calls,
    counted_dense,
    fed_in_training,
    rate_moves,
    reached_around,
    sgd_steps_off,
)
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["ACCUMULATION_TOLERANCE", "PAD", "check_train_with_accumulation"]

#: Largest weight difference from the large-batch reference that counts as equal (float32).
ACCUMULATION_TOLERANCE = 1e-5
#: Largest part of an update's gradients (relative) not from the counted calls (float32 sums).
FLOW_TOLERANCE = 1e-4
#: The module that imports this one, whose functions are refused too.
_LESSON = "course_utils.grading.checks.lesson_07"
#: The label of a padding example: the loss ignores it (``ignore_class``).
PAD = -1


def _keras() -> Any:
    _tf()
    import keras

    return keras


def _problem(rng: Any) -> dict[str, Any]:
    """A fresh random classification problem and model sizes, with their micro-batching."""
    micro, steps = rng.choice([4, 6, 8]), rng.choice([2, 3, 4])
    groups = rng.randint(3, 5)
    features_n, classes = rng.randint(5, 12), rng.randint(2, 5)
    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    n = micro * steps * groups
    return {
        "features": data.normal(size=(n, features_n)).astype("float32"),
        "labels": data.integers(0, classes, size=n).astype("int32"),
        "hidden": rng.randint(8, 24), "classes": classes, "micro": micro, "steps": steps,
        "learning_rate": rng.choice([0.05, 0.1, 0.2]), "seed": rng.randint(0, 2**31 - 1),
    }


def _model(problem: dict[str, Any], counted: bool = False, flows: bool = False) -> Any:
    """The problem's model, its initial weights drawn from the problem's seed (no global seed);
    ``counted``: its layers count the examples they run on (``reach_around``), and with
    ``flows`` the gradients back through their calls; where the problem has a ``"penalty"``,
    an L2 penalty of that weight on both kernels (``model.losses``)."""
    keras = _keras()
    dense = functools.partial(counted_dense, flows=flows) if counted else keras.layers.Dense
    penalty = problem.get("penalty")
    extra = {"kernel_regularizer": keras.regularizers.L2(penalty)} if penalty else {}
    inputs = keras.Input(shape=(problem["features"].shape[1],))
    model = keras.Model(inputs, dense(problem["classes"], **extra)(dense(
        problem["hidden"], activation="tanh", **extra)(inputs)))
    weights = np.random.default_rng(problem["seed"])
    model.set_weights([weights.normal(scale=0.5, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    return model


def _without_the_trainer(fn: Any) -> Any:
    """``fn`` refusing ``cu.Trainer`` and its replica step (by file: identity and content)
    while it runs: lesson 07 shows the Trainer applying a short last group (section 7), the
    answer of exercises 1 and 4, which ask for the loop itself; and the check's own loops (the
    functions of this module, of ``lesson_07`` and of ``suspect_loops``: ``accumulate``, the
    references, called under the answer's name passed before), by identity and content
    (``counting_mirrored_strategy``, whose all-reduce runs in exercise 4's answer, is
    ``replica_memory``'s)."""
    import sys

    from course_utils.grading.checks import suspect_loops
    from course_utils.grading.checks.refusals import own_functions, refusing
    from course_utils.training import replica_step, trainer

    # lesson_07 (exercise 4's references) imports this module: read, not imported, here
    modules = [sys.modules[__name__], suspect_loops, sys.modules.get(_LESSON)]
    own = [function for module in modules if module for function in own_functions(module)]
    return refusing(fn, [trainer.__file__, replica_step.__file__, *own],
                    "write the accumulation loop yourself (cu.Trainer's accumulation, shown in "
                    "section 7, and the check's own loops are the course's answer: not yours "
                    "to call)")


def _loss_fn(padded: bool = False) -> Any:
    """The mean loss of a batch; ``padded``: over its real examples only (``PAD`` ignored:
    Keras masks them and divides by the rest, ``keras/src/losses/loss.py``, ``apply_mask``)."""
    return _keras().losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=PAD if padded else None)


# --- the references: large batches, and the wrong loops ----------------------------------


def _pad(problem: dict[str, Any], rng: Any, *, empty: bool) -> None:
    """Pad ``problem``'s micro-batches in place: each keeps its first ``r`` examples, ``r``
    drawn in 1 .. micro (the first group's first two: micro and at most half of it, so that
    section 2's recipe is off); ``empty``: one micro-batch of the first group padding only."""
    micro, labels = problem["micro"], problem["labels"]
    counts = [rng.randint(1, micro) for _ in range(len(labels) // micro)]
    counts[0], counts[1] = micro, rng.randint(1, micro // 2)
    if empty:
        counts[rng.randint(1, problem["steps"] - 1)] = 0
    for index, real in enumerate(counts):
        labels[index * micro + real:(index + 1) * micro] = PAD


def _plain_sgd(problem: dict[str, Any], examples: int, batch: int) -> list[np.ndarray]:
    """Plain SGD with the padded loss on batches of ``batch`` of the first ``examples``."""
    tf = _tf()
    model, loss_fn = _model(problem), _loss_fn(padded=True)
    optimizer = _keras().optimizers.SGD(learning_rate=problem["learning_rate"])
    data = tf.data.Dataset.from_tensor_slices((problem["features"][:examples],
                                               problem["labels"][:examples]))
    for x, y in data.batch(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables, strict=True))
    return [np.asarray(w) for w in model.get_weights()]


#: The wrong loops named, each as (micro-batches per update, a micro-batch's loss from the sum
#: of its per-example losses, its real examples, the group's real examples, the group's slots
#: and micro-batches) and what the message says of it.
_WRONG = {
    "applies every micro-batch": (False, lambda s, r, rg, slots, g: s / max(r, 1), (
        "your weights match applying every micro-batch: the loop updates after each "
        "micro-batch instead of once per group of accumulation_steps")),
    "sums without dividing": (True, lambda s, r, rg, slots, g: s / max(r, 1), (
        "your weights match summing the micro-batches' mean losses without dividing: "
        "each update is about {k}× too large")),
    "averages the means": (True, lambda s, r, rg, slots, g: s / max(r, 1) / g, (
        "your weights match averaging the micro-batches' mean losses (each divided by the "
        "micro-batches in its group, as lesson 07's loops divide): a micro-batch of 1 real "
        "example then weighs as much as one of {micro}, but the large batch's loss is the "
        "mean over the real examples of the whole group")),
    "counts the padding": (True, lambda s, r, rg, slots, g: s / slots, (
        "your weights match a mean over every example slot of the group, padding included: "
        "the loss you were given, and the large batch's, averages over the real examples "
        "only")),
}


def _wrong_loop(problem: dict[str, Any], grouped: bool, weigh: Any) -> list[np.ndarray]:
    """One of ``_WRONG``'s loops on the problem (eager, no memory limit); its weights."""
    tf, keras = _tf(), _keras()
    model, micro = _model(problem), problem["micro"]
    optimizer = keras.optimizers.SGD(learning_rate=problem["learning_rate"])
    x, y = problem["features"], problem["labels"]
    batches = [(x[i:i + micro], y[i:i + micro]) for i in range(0, len(y), micro)]
    size = problem["steps"] if grouped else 1
    for start in range(0, len(batches), size):
        group, sums = batches[start:start + size], None
        real_group = sum(int(np.sum(labels != PAD)) for _, labels in group)
        for features, labels in group:
            with tf.GradientTape() as tape:
                total = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(
                    labels, model(features, training=True), from_logits=True,
                    ignore_class=PAD))
                loss = weigh(total, int(np.sum(labels != PAD)), real_group,
                             len(group) * micro, len(group))
            grads = tape.gradient(loss, model.trainable_variables)
            sums = grads if sums is None else [a + b for a, b in zip(sums, grads, strict=True)]
        optimizer.apply_gradients(zip(sums, model.trainable_variables, strict=True))
    return [np.asarray(w) for w in model.get_weights()]


def _references(problem: dict[str, Any]) -> dict[str, list[np.ndarray]]:
    labels = problem["labels"]
    return {"correct": _plain_sgd(problem, len(labels), problem["micro"] * problem["steps"]),
            **{name: _wrong_loop(problem, grouped, weigh)
               for name, (grouped, weigh, _) in _WRONG.items()}}


def _matched(weights: list[np.ndarray], references: dict[str, list[np.ndarray]]) -> str | None:
    """The reference the weights equal (within the tolerance), if any."""
    return next((name for name, reference in references.items()
                 if largest_difference(weights, reference) <= ACCUMULATION_TOLERANCE), None)


# --- the check ---------------------------------------------------------------------------------


def _right_but(problem: dict[str, Any], worst: Any, moved: Any, off: Any, calls: int,
               updates: int) -> str | None:
    """With the right weights: what the work did wrong, if anything."""
    if float(worst.numpy()) > FLOW_TOLERANCE:
        return ("the weights are right, but the gradients applied at an update are not those "
                "that flowed back through the model you were given since the update before "
                f"(left after the best scaling: {float(worst.numpy()):.2g} of their size): "
                "apply the sum of each micro-batch's gradients through that model, under its "
                "memory limit (a forward by hand keeps the whole group's activations), each "
                "micro-batch weighed inside its tape, in its loss: a weight applied to its "
                "gradients after tape.gradient is not one factor for the whole update, and "
                "the check cannot tell it from a forward by hand")
    if float(moved.numpy()) > 1e-6 * problem["learning_rate"]:
        return ("the weights are right, but the learning rate was changed at an update: "
                "weigh the gradients, not the rate (the same weights under plain SGD only: "
                "lesson 07, section 3)")
    if calls != updates:
        return (f"the weights are right, but the optimizer applied gradients {calls} times "
                f"for {updates} groups: one apply_gradients per group, of the running sum you "
                "keep (section 2; Keras's gradient_accumulation_steps, section 4, is not the "
                "answer)")
    if float(off.numpy()) > 1e-3:
        return (f"the weights are right, but an update moved them by other than the learning "
                f"rate times the gradients applied (off by {float(off.numpy()):.2g} of a "
                "step): leave the optimizer's update as it is (weights trained elsewhere, "
                "written in?)")
    return None


def _fed_wrongly(problem: dict[str, Any], fed: tuple[int, Any] | None) -> str | None:
    """Why what went forward in training mode (``fed_in_training``: calls, the sum of their
    rows) is not the micro-batches of the features, each once; None when it is."""
    micro, features = problem["micro"], problem["features"]
    calls, rows = fed if fed is not None else (0, np.zeros(features.shape[1]))
    if calls != len(features) // micro:
        return (f"the model you were given ran {calls} times in training mode for "
                f"{len(features) // micro} micro-batches: run it once on each micro-batch of "
                "micro_batch_size examples (no smaller pieces, no extra passes)")
    expected = features.astype(np.float64).sum(axis=0)
    if np.max(np.abs(rows - expected)) > 1e-6 * max(1.0, float(np.max(np.abs(expected)))):
        return ("the examples that went forward in training mode are not the micro-batches "
                "of features you were given, each once (one skipped, even one of padding "
                "only, its padding cut off, or other examples run in its place?): run every "
                "micro-batch as it is, padding included")
    return None


def _case(problem: dict[str, Any]) -> Case:
    from course_utils.memory import limit_batch_size

    micro, steps, n = problem["micro"], problem["steps"], len(problem["labels"])
    model = _model(problem, counted=True, flows=True)
    limited = limit_batch_size(model, micro)  # shares model's weights
    optimizer = _keras().optimizers.SGD(learning_rate=problem["learning_rate"])
    worst, moved = applied_from_calls(optimizer, model), rate_moves(optimizer)
    off = sgd_steps_off(optimizer)  # an update replaced inside apply
    watch = UpdatesWatched(optimizer, model)  # its calls; weights written outside it
    references: dict[str, list[np.ndarray]] = {}  # built on first use: a stub costs nothing
    extra = problem.get("extra", 0)
    updates = n // (micro * steps) + bool(extra)

    def verify(_: Any) -> str | None:
        if (around := reached_around(model, limited, most=micro)) is not None:
            return around
        if watch.written_outside():
            return WRITTEN_OUTSIDE
        trained = limited.get_layer("activations_on_tape").examples_trained
        if trained != n:
            if extra and trained == n - extra * micro and largest_difference(
                    model.get_weights(), _plain_sgd(problem, trained, micro * steps)
            ) <= ACCUMULATION_TOLERANCE:
                return (f"the last {extra} micro-batch(es), a short group, were never applied "
                        "(nor run): the exercise trains on every example (section 7, a "
                        "partial last group)")
            return (f"{trained} examples went forward through the model you were given in "
                    f"training mode (training=True), not {n}: every micro-batch, its padding "
                    "included, goes through that model once, through its memory limit")
        if (fed := _fed_wrongly(problem, fed_in_training(model))) is not None:
            return fed
        if not references:
            references.update(_references(problem))
        weights = [np.asarray(w) for w in model.get_weights()]
        error = largest_difference(weights, references["correct"])
        if error <= ACCUMULATION_TOLERANCE:
            return _right_but(problem, worst, moved, off, watch.calls, updates)
        closest = _matched(weights, references)
        reason = _WRONG[closest][2].format(k=steps, micro=micro) if closest in _WRONG else (
            "the weights differ from plain SGD with the loss you were given on batches "
            f"{steps}× larger" + (f" (the data ends with a short group of {extra} "
                                 "micro-batch(es))" if extra else ""))
        return f"{reason} (max |Δw| = {error:.2e}, at most {ACCUMULATION_TOLERANCE:g} allowed)"

    return Case(args=(limited, optimizer, _loss_fn(padded=True), problem["features"],
                      problem["labels"], micro, steps), verify=verify,
                label=f"({n} examples, {int(np.sum(problem['labels'] != PAD))} of them real, "
                      f"micro_batch_size={micro}, accumulation_steps={steps}"
                      + (f", a short last group of {extra}" if extra else "") + ")")


@register
def check_train_with_accumulation(fn: Any) -> bool:
    """Check ``train_with_accumulation(model, optimizer, loss_fn, features, labels,
    micro_batch_size, accumulation_steps)`` on padded data: weights equal to batches k times
    larger, each update's loss the mean over its group's real examples."""
    rng = fresh_rng()
    problems = [_problem(rng) for _ in range(2)]
    short = problems[1]  # its data ends with a short group of 1 .. k-1 micro-batches
    short["extra"] = rng.randint(1, short["steps"] - 1)
    n = short["micro"] * (short["steps"] * (len(short["labels"]) // (
        short["micro"] * short["steps"])) + short["extra"])
    data = np.random.default_rng(short["seed"])
    short["features"] = data.normal(size=(n, short["features"].shape[1])).astype("float32")
    short["labels"] = data.integers(0, short["classes"], size=n).astype("int32")
    for problem in problems:
        _pad(problem, rng, empty=problem is short)
    return run_check(
        "train_with_accumulation", _without_the_trainer(fn), [_case(p) for p in problems],
        hint="lesson 07, section 2 (accumulate, then apply once) and section 7 (masked or "
             "variable-length batches; a partial last group): each update must equal one step "
             "on its whole group, whose loss is a mean over the group's real examples: what "
             "share of it is each micro-batch's? (The model you are given counts what it "
             "trains on in training mode, training=True: each such forward pass, with or "
             "without a tape, until a tape.gradient through it.)")
