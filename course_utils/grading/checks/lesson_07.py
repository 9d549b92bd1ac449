"""Checks of lesson 07's exercises (registered by name with ``@register``).

* ``check_train_with_accumulation(train_with_accumulation)``: on a fresh random model and data,
  behind a simulated memory of one micro-batch (``cu.memory.limit_batch_size``: a larger batch,
  or a second micro-batch's activations alive, fails like out of memory; a forward pass in
  training mode is alive, with or without a tape, until a backward pass through it, and one
  back-propagated twice, as by a persistent tape asked again, frees nothing), the
  weights equal plain SGD on batches ``k`` times larger (one case ends with a short group, which
  must make one more update averaged over its own examples) and every example went through the
  limited model once in training mode; the two popular wrong loops, and a loop that drops the
  short group, are named when the weights match theirs instead. The model's layers must run
  only through the limit (``reach_around``: counted, their kernel read only inside their own
  call). ``cu.Trainer`` (section 7 shows it applying a short group) is refused here and in
  exercise 4, by file, and the check's own loops (``suspect_loops.accumulate``, the
  reference) by identity and content. Each update applies (a multiple of) the sum of the
  gradients that flowed back through the counted calls since the last (``applied_from_calls``:
  a forward by hand is named), at the learning rate given (``rate_moves``); ``optimizer.apply``
  runs once per group (its calls counted: ``iterations`` counts k applies as one under Keras's
  option) and no weight changes outside it (``UpdatesWatched``, also in exercise 4: weights
  trained elsewhere and written in), nor inside it (``sgd_steps_off``: plain SGD's step, a
  weight listed twice refused by ``applied_from_calls``). Unseen: a hand forward applied after
  counted calls made the same gradients; any in exercise 4.
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

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.grading.checks.memory_budget import check_largest_batch_that_fits
from course_utils.grading.checks.reach_around import (
    WRITTEN_OUTSIDE,
    UpdatesWatched,
    applied_from_calls,
    counted_dense,
    rate_moves,
    reached_around,
    sgd_steps_off,
)
from course_utils.grading.checks.recompute import check_segment_gradients
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.replica_memory import counting_mirrored_strategy, replica_limit
from course_utils.grading.checks.suspect_loops import (
    DIAGNOSES,
    check_diagnose_accumulation,
    suspect_loop,
)
from course_utils.grading.checks.suspect_loops import accumulate as _train
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

#: Largest weight difference from the large-batch reference that counts as equal (float32).
ACCUMULATION_TOLERANCE = 1e-5
#: Largest part of an update's gradients (relative) not from the counted calls (float32 sums).
FLOW_TOLERANCE = 1e-4


def _keras() -> Any:
    _tf()
    import keras

    return keras


# --- the references: large batches, and the two wrong loops ----------------------------------


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
    functions of this module and of ``suspect_loops``: ``accumulate``, the reference, called
    under the answer's name passed before), by identity and content
    (``counting_mirrored_strategy``, whose all-reduce runs in exercise 4's answer, is
    ``replica_memory``'s)."""
    import sys

    from course_utils.grading.checks import suspect_loops
    from course_utils.grading.checks.refusals import own_functions, refusing
    from course_utils.training import replica_step, trainer

    own = [*own_functions(sys.modules[__name__]), *own_functions(suspect_loops)]
    return refusing(fn, [trainer.__file__, replica_step.__file__, *own],
                    "write the accumulation loop yourself (cu.Trainer's accumulation, shown in "
                    "section 7, and the check's own loops are the course's answer: not yours "
                    "to call)")


def _loss_fn() -> Any:
    return _keras().losses.SparseCategoricalCrossentropy(from_logits=True)


def _sgd_loop(problem: dict[str, Any], batch_size: int, steps: int, divisor: float,
              learning_rate: float) -> list[np.ndarray]:
    """The problem's model trained by :func:`_train`; its weights."""
    model = _model(problem)
    optimizer = _keras().optimizers.SGD(learning_rate=learning_rate)
    _train(model, optimizer, _loss_fn(), problem["features"], problem["labels"], batch_size,
           steps, divisor)
    return [np.asarray(w) for w in model.get_weights()]


def _references(problem: dict[str, Any]) -> dict[str, list[np.ndarray]]:
    micro, steps, rate = problem["micro"], problem["steps"], problem["learning_rate"]
    return {
        "correct": _sgd_loop(problem, micro * steps, 1, 1.0, rate),
        "applies every micro-batch": _sgd_loop(problem, micro, 1, 1.0, rate),
        "sums without dividing": _sgd_loop(problem, micro, steps, 1.0, rate),
    }


def _closest(weights: list[np.ndarray], references: dict[str, list[np.ndarray]]) -> str:
    return min(references, key=lambda name: largest_difference(weights, references[name]))


# --- Exercise 1 · accumulate under a memory limit --------------------------------------------


@register
def check_train_with_accumulation(fn: Any) -> bool:
    """Check ``train_with_accumulation(model, optimizer, loss_fn, features, labels,
    micro_batch_size, accumulation_steps)``: weights equal to batches k times larger."""
    from course_utils.memory import limit_batch_size

    keras = _keras()
    rng = fresh_rng()
    problems = [_problem(rng) for _ in range(2)]
    short = problems[1]  # its data ends with a short group of 1 .. k-1 micro-batches
    short["extra"] = rng.randint(1, short["steps"] - 1)
    n = short["micro"] * (short["steps"] * (len(short["labels"]) // (
        short["micro"] * short["steps"])) + short["extra"])
    data = np.random.default_rng(short["seed"])
    short["features"] = data.normal(size=(n, short["features"].shape[1])).astype("float32")
    short["labels"] = data.integers(0, short["classes"], size=n).astype("int32")

    def case(problem: dict[str, Any]) -> Case:
        model = _model(problem, counted=True, flows=True)
        limited = limit_batch_size(model, problem["micro"])  # shares model's weights
        optimizer = keras.optimizers.SGD(learning_rate=problem["learning_rate"])
        worst, moved = applied_from_calls(optimizer, model), rate_moves(optimizer)
        off = sgd_steps_off(optimizer)  # an update replaced inside apply
        watch = UpdatesWatched(optimizer, model)  # its calls; weights written outside it
        references: dict[str, list[np.ndarray]] = {}  # built on first use: a stub costs nothing
        extra = problem.get("extra", 0)
        updates = len(problem["labels"]) // (problem["micro"] * problem["steps"]) + bool(extra)

        def verify(_: Any) -> str | None:
            if (around := reached_around(model, limited, most=problem["micro"])) is not None:
                return around
            if watch.written_outside():
                return WRITTEN_OUTSIDE
            on_tape = limited.get_layer("activations_on_tape")
            if extra and on_tape.examples_trained == len(problem["labels"]) - extra * problem[
                    "micro"]:
                return (f"the last {extra} micro-batch(es), a short group, were never applied "
                        "(nor run): the exercise trains on every example (section 7, a "
                        "partial last group)")
            if on_tape.examples_trained != len(problem["labels"]):
                return (f"{on_tape.examples_trained} examples went forward through the model "
                        f"you were given in training mode (training=True), not "
                        f"{len(problem['labels'])} (each once): was it that model, through its "
                        "memory limit, that saw every example?")
            if not references:
                references.update(_references(problem))
            weights = [np.asarray(w) for w in model.get_weights()]
            error = largest_difference(weights, references["correct"])
            if error <= ACCUMULATION_TOLERANCE:
                if float(worst.numpy()) > FLOW_TOLERANCE:
                    return ("the weights are right, but the gradients applied at an update "
                            "are not those that flowed back through the model you were given "
                            f"since the update before (left after the best scaling: "
                            f"{float(worst.numpy()):.2g} of their size): apply the sum of each "
                            "micro-batch's gradients through that model, under its memory "
                            "limit (a forward by hand keeps the whole group's activations)")
                if float(moved.numpy()) > 1e-6 * problem["learning_rate"]:
                    return ("the weights are right, but the learning rate was changed at an "
                            "update: average the gradients, not the rate (the same weights "
                            "under plain SGD only: lesson 07, section 3)")
                if watch.calls != updates:
                    return (f"the weights are right, but the optimizer applied gradients "
                            f"{watch.calls} times for {updates} groups: one apply_gradients "
                            "per group, of the running sum you keep (section 2; Keras's "
                            "gradient_accumulation_steps, section 4, is not the answer)")
                if float(off.numpy()) > 1e-3:
                    return (f"the weights are right, but an update moved them by other than "
                            f"the learning rate times the gradients applied (off by "
                            f"{float(off.numpy()):.2g} of a step): leave the optimizer's "
                            "update as it is (weights trained elsewhere, written in?)")
                return None
            if extra:
                full = len(problem["labels"]) - extra * problem["micro"]
                dropped = _sgd_loop({**problem, "features": problem["features"][:full],
                                     "labels": problem["labels"][:full]},
                                    problem["micro"] * problem["steps"], 1, 1.0,
                                    problem["learning_rate"])
                if largest_difference(weights, dropped) <= ACCUMULATION_TOLERANCE:
                    return (f"your weights match the full groups alone: the last {extra} "
                            "micro-batch(es), a short group, were never applied (section 7, "
                            "a partial last group)")
            closest = _closest(weights, references)
            reason = {
                "applies every micro-batch": "your weights match applying every micro-batch: "
                "the loop updates after each micro-batch instead of once per group of "
                "accumulation_steps",
                "sums without dividing": "your weights match summing the micro-batches' "
                "gradients without dividing by accumulation_steps: the update is "
                f"{problem['steps']}× too large",
            }.get(closest, "the weights differ from the large-batch reference" + (
                f" (the data ends with a short group of {extra} micro-batch(es): over how "
                "many micro-batches is its update averaged?)"
                if extra else ""))
            return f"{reason} (max |Δw| = {error:.2e}, at most {ACCUMULATION_TOLERANCE:g} allowed)"

        n = len(problem["labels"])
        return Case(args=(limited, optimizer, _loss_fn(), problem["features"], problem["labels"],
                          problem["micro"], problem["steps"]), verify=verify,
                    label=f"({n} examples, micro_batch_size={problem['micro']}, "
                          f"accumulation_steps={problem['steps']}"
                          + (f", a short last group of {extra}" if extra else "") + ")")

    return run_check(
        "train_with_accumulation", _without_the_trainer(fn), [case(p) for p in problems],
        hint="lesson 07, section 2 (accumulate, then apply once) and section 7 (a partial "
             "last group): which large-batch step should each update equal, and how much "
             "of the batch may be alive at once under the memory limit? (The model you are "
             "given counts what it trains on in training mode, training=True: each such "
             "forward pass, with or without a tape, until a tape.gradient through it.)")


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
            model = _model(problem, counted=True)
            # each replica's memory holds one micro-batch's share: accumulating is necessary
            limited, counts = replica_limit(model, problem["micro"] // 2)
            optimizer = keras.optimizers.SGD(learning_rate=problem["learning_rate"])
            optimizer.build(model.trainable_variables)
            watch = UpdatesWatched(optimizer, model)  # each replica's copy of the weights
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
