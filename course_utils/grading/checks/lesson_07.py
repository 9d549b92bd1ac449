"""Checks of lesson 07's exercises (registered by name with ``@register``).

* ``check_train_with_accumulation(train_with_accumulation)`` (``padded_accumulation``): on
  fresh random models and padded data behind a simulated memory of one micro-batch, the
  weights equal plain SGD on batches ``k`` times larger whose loss is the mean over the real
  examples of the whole group (a short last group included), the work checked as the module
  says.
* ``check_largest_batch_that_fits(largest_batch_that_fits)``: the largest batch whose step
  (weights, gradients, optimizer slots, activations) fits a memory budget, on fresh random
  models and budgets, compared with a count made here from the layers' shapes; counted by the
  learner, not by the course's memory counters (refused by code identity while it runs).
* ``check_diagnose_accumulation(diagnose_accumulation)`` (``suspect_loops``): given an
  accumulation loop, name what it does (right, applies every micro-batch, or sums without
  dividing), for loops written here whose names, code, defaults and closures are the same for
  every kind; a loop's kind is drawn when it is first called and kept in a forked copy of the
  process that decides each update (a black box), so an answer must run it; an answer whose
  code reads a loop's closure or the check's plans is refused.
* ``check_train_mirrored_with_accumulation(train_mirrored_with_accumulation)``: under a
  MirroredStrategy of 2 replicas whose cross-device ops count every tensor they all-reduce, and
  behind a per-replica memory of one micro-batch's share (a larger batch, or one tape over
  several micro-batches, persistent or not, fails like out of memory; the model's counted
  layers must see only what went through that limit, on the replicas: ``reach_around``), the
  weights equal plain SGD on batches ``k`` times larger (a short last group included) whose
  loss adds the model's L2 penalty (``model.losses``, which the lesson's step had none of) once
  per update, every example trained once, with exactly one all-reduce of the gradients per
  update; a penalty ignored, added per micro-batch or on every replica whole is named.
* ``check_segment_gradients(segment_gradients)``: on a fresh flat stack of Dense layers, the
  plain stack's gradients, made with one ``tf.recompute_grad`` per segment of ``segment_size``
  layers (counted in the traced step) and every layer's forward run again, its matrix
  products feeding the gradients through data edges (not tied on by control dependencies),
  and each weight read at most ``READS_PER_WEIGHT`` times on that path (a plain path kept
  beside the recomputed one reads them again). Still unseen: the memory itself (no peak is
  measured).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.grading.checks.memory_budget import check_largest_batch_that_fits
from course_utils.grading.checks.padded_accumulation import (
    ACCUMULATION_TOLERANCE,
    FLOW_TOLERANCE,
    _keras,
    _loss_fn,
    _model,
    _problem,
    _without_the_trainer,
    check_train_with_accumulation,
)
from course_utils.grading.checks.reach_around import (
    WRITTEN_OUTSIDE,
    UpdatesWatched,
    applied_from_calls,
    reached_around,
)
from course_utils.grading.checks.recompute import check_segment_gradients
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.replica_memory import counting_mirrored_strategy, replica_limit
from course_utils.grading.checks.suspect_loops import (
    DIAGNOSES,
    check_diagnose_accumulation,
    suspect_loop,
)
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = [
    "ACCUMULATION_TOLERANCE",
    "DIAGNOSES",
    "check_diagnose_accumulation",
    "check_largest_batch_that_fits",
    "check_segment_gradients",
    "PENALTY_MISTAKES",
    "check_train_mirrored_with_accumulation",
    "check_train_with_accumulation",
    "counting_mirrored_strategy",
    "suspect_loop",
]

# --- Exercise 4 · accumulation under MirroredStrategy, one all-reduce per update ---------------


#: How often each wrong penalty enters an update (the right one: once), as a function of the
#: update's micro-batches ``g`` and the replicas ``r``, and what the message says of it.
PENALTY_MISTAKES = {
    "ignored": (lambda g, r: 0, "the weights match the data loss alone: the model's L2 penalty "
                "(model.losses) never entered an update"),
    "every micro-batch": (lambda g, r: g, "the penalty entered each update once per "
                          "micro-batch, not once per update as in one large batch"),
    "every replica": (lambda g, r: r, "each replica added the whole penalty, and the "
                      "optimizer sums the replicas' gradients: {r}× the penalty"),
    "every micro-batch and replica": (lambda g, r: g * r, "the penalty entered once per "
                                      "micro-batch on every replica: {r}× per micro-batch"),
}


def _large_batch_weights(problem: dict[str, Any], group: int,
                         penalty_times: Callable[[int], float] = lambda g: 1.0
                         ) -> list[np.ndarray]:
    """Plain SGD on batches of ``group`` micro-batches (a short last batch averaged over its
    own examples) whose loss is the mean data loss plus the model's penalty
    ``penalty_times(g)`` times, ``g`` the micro-batches in that batch."""
    tf = _tf()
    model = _model(problem)
    optimizer = _keras().optimizers.SGD(learning_rate=problem["learning_rate"])
    loss_fn, micro = _loss_fn(), problem["micro"]
    data = tf.data.Dataset.from_tensor_slices((problem["features"], problem["labels"]))
    for x, y in data.batch(micro * group):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            if model.losses:
                loss += penalty_times(-(-int(x.shape[0]) // micro)) * tf.add_n(model.losses)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables, strict=True))
    return [np.asarray(w) for w in model.get_weights()]


def _penalty_mistake(problem: dict[str, Any], weights: list[np.ndarray], replicas: int
                     ) -> str | None:
    """What the weights match: applying every micro-batch (with any penalty), or one of
    ``PENALTY_MISTAKES`` with one update per group; None when neither."""
    mistakes = {name: (lambda g, times=times: times(g, replicas), says)
                for name, (times, says) in PENALTY_MISTAKES.items()}
    for times, says in mistakes.values():  # one update per group, the penalty wrong
        if largest_difference(weights, _large_batch_weights(problem, problem["steps"], times)
                              ) <= ACCUMULATION_TOLERANCE:
            return says.format(r=replicas)
    for times in [lambda g: 1.0, mistakes["ignored"][0]]:  # every micro-batch applied
        if largest_difference(weights, _large_batch_weights(problem, 1, times)
                              ) <= ACCUMULATION_TOLERANCE:
            return "they match applying every micro-batch, not one update per group"
    return None


@register
def check_train_mirrored_with_accumulation(fn: Any) -> bool:
    """Check ``train_mirrored_with_accumulation(strategy, model, optimizer, loss_object,
    micro_batches, accumulation_steps, global_batch_size)`` under 2 counting replicas, each
    one's peak alive at once within a micro-batch's share (unseen: ``replica_memory``)."""
    keras, tf = _keras(), _tf()
    rng = fresh_rng()
    try:
        counting_mirrored_strategy(2)
    except ValueError as error:
        raise AssertionError(f"train_mirrored_with_accumulation needs 2 devices: {error}. Run "
                             "the set-up cell with cu.setup(logical_devices=2) first, in a "
                             "fresh kernel.") from error

    def case(short_group: bool) -> Case:
        problem = _problem(rng)  # micro-batches of 4, 6 or 8: split over 2 replicas
        problem["penalty"] = rng.choice([0.01, 0.02, 0.04])  # model.losses: an L2 penalty
        problem["steps"] = rng.choice([3, 4])  # k = 2 = replicas: two mistakes would agree
        extra = rng.randint(1, problem["steps"] - 1) if short_group else 0
        strategy, counter = counting_mirrored_strategy(2)  # its own count, from 0
        n = problem["micro"] * (problem["steps"] * 3 + extra)
        data = np.random.default_rng(problem["seed"])
        problem["features"] = data.normal(size=(n, problem["features"].shape[1])).astype(
            "float32")
        problem["labels"] = data.integers(0, problem["classes"], size=n).astype("int32")
        with strategy.scope():
            model = _model(problem, counted=True, flows=True)
            # each replica's memory holds one micro-batch's share: accumulating is necessary
            limited, counts = replica_limit(model, problem["micro"] // 2)
            optimizer = keras.optimizers.SGD(learning_rate=problem["learning_rate"])
            optimizer.build(model.trainable_variables)
            watch = UpdatesWatched(optimizer, model)  # each replica's copy of the weights
            # each replica's applied gradients against what flowed back through its calls
            worst = applied_from_calls(optimizer, model)
        updates, per_update = 3 + (1 if extra else 0), len(model.trainable_variables)
        micro_batches = tf.data.Dataset.from_tensor_slices(
            (problem["features"], problem["labels"])).batch(problem["micro"])
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction=None)

        def verify(_: Any) -> str | None:
            if (around := reached_around(model, limited, most=problem["micro"] // 2)):
                return around
            if watch.written_outside():
                return WRITTEN_OUTSIDE
            all_reduced = int(counter.numpy())
            weights = [np.asarray(w) for w in model.get_weights()]
            error = largest_difference(weights, _large_batch_weights(problem, problem["steps"]))
            if error > ACCUMULATION_TOLERANCE:
                why = _penalty_mistake(problem, weights, strategy.num_replicas_in_sync) or (
                    "each update is the mean over its whole group's examples (a short "
                    "last group has fewer): what does your loss divide by?")
                return (f"the weights differ from plain SGD on batches {problem['steps']}× "
                        f"larger, its loss the mean plus the model's L2 penalty once, by "
                        f"{error:.2e}: {why}")
            trained = int(counts["trained"].numpy())
            if trained != n:
                return (f"{trained} examples went forward through the model you were given in "
                        f"training mode, not {n} (each once): was it that model, through its "
                        "memory limit, that saw every micro-batch?")
            if all_reduced == 0:
                return ("the weights are right but no gradient crossed the replicas: where "
                        "did your micro-batches run? (section 5)")
            if all_reduced != updates * per_update:
                return (f"the weights are right, but the replicas all-reduced "
                        f"{all_reduced / (updates * per_update):.3g} times the gradients per "
                        f"update ({all_reduced} tensors for {updates} updates of {per_update} "
                        "variables): when do your gradients cross the replicas? (section 5)")
            left = max(float(w.numpy()) for w in strategy.experimental_local_results(worst))
            if left > FLOW_TOLERANCE:
                return (f"the weights are right, but the gradients a replica applied at an "
                        f"update are not those that flowed back through the model you were "
                        f"given on that replica since the update before, plus the penalty's "
                        f"(left after the best fit: {left:.2g} of their size): apply the sum "
                        "of each micro-batch's gradients through that model (a forward by "
                        "hand from the variables keeps the whole group's activations; "
                        "gradients made elsewhere are not accumulation)")
            return None

        return Case(args=(strategy, limited, optimizer, loss_object, micro_batches,
                          problem["steps"], problem["micro"]), verify=verify,
                    label=f"({n // problem['micro']} micro-batches of {problem['micro']}, "
                          f"accumulation_steps={problem['steps']}, 2 replicas)")

    return run_check(
        "train_mirrored_with_accumulation", _without_the_trainer(fn), [case(False), case(True)],
        hint="lesson 07, section 5 (accumulation under MirroredStrategy, the way that "
             "works) and section 7 (a partial last group): where does each micro-batch's "
             "gradient wait until the update, and how often must it cross the replicas?")
