"""Lesson 07, exercise 2: the largest batch whose training step fits a memory budget.

The check, registered by name (``lesson_07`` imports it): on fresh random models (one with
weights that have no gradients) and budgets (for each model, one exactly full at a random
batch and one a byte short of it: "fits" is "at most", off by one either way fails), the
learner's batch equals a count made here from
the layers' shapes with the course's one budget (``cu.memory.step_budget``); the learner counts
by hand: an answer that runs the course's memory counters, or a copy of them, is refused
(``refusals.refusing``: by code identity and by content), and so is one that runs
``mixed_precision.model_memory`` or ``parallel.zero_bytes_per_device`` (by identity).
"""

from __future__ import annotations

import math
from typing import Any

from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_largest_batch_that_fits"]


def _keras() -> Any:
    _tf()
    import keras

    return keras


# --- Exercise 2 · the largest batch that fits -------------------------------------------------


def _count(shape: Any) -> int:
    return math.prod(int(d) for d in shape)


def _largest_batch(model: Any, budget_bytes: int, optimizer_slots: int) -> int:
    """The reference, from the course's one budget (``cu.memory.step_budget``): the fixed terms
    of a one-example step without accumulation, then whole examples of activations."""
    from course_utils.memory import activation_bytes_per_example, step_budget

    per_example = activation_bytes_per_example(model)
    fixed = step_budget(model, global_batch=1, optimizer_slots=optimizer_slots).total - per_example
    return max(0, (int(budget_bytes) - fixed) // per_example)


def _normalized_mlp(rng: Any) -> Any:
    """An MLP with batch normalization: its moving mean and variance are weights without
    gradients."""
    keras = _keras()
    inputs = keras.Input(shape=(rng.randint(8, 48),), name="features")
    hidden = keras.layers.Dense(rng.randint(16, 128), activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    outputs = keras.layers.Dense(rng.randint(2, 10))(hidden)
    return keras.Model(inputs, outputs, name="normalized_mlp")


def _counted_by_hand(fn: Any) -> Any:
    """``fn``, failing when it runs the course's memory counters (this exercise is the count):
    ``refusing`` matches them by identity (an alias, a wrapper, a lambda) and by content (an
    ``exec``'d copy of ``course_utils/memory.py``, shifted by any number of lines)."""
    from course_utils import memory, mixed_precision
    from course_utils.grading.checks.refusals import refusing
    from course_utils.parallel import zero

    # the whole file: its private counters too (``_layer_output_bytes``, ``_tensor_bytes``);
    # lesson 06's ZeRO counter at stage 0 counts the fixed terms (weights, gradients, slots)
    helpers = [memory.__file__, mixed_precision.model_memory, zero.zero_bytes_per_device]
    return refusing(fn, helpers, "count the bytes yourself from model.weights, "
                    "model.trainable_weights and the layers' output shapes")


def _budget(model: Any, slots: int, rng: Any, spare: int) -> int:
    """A budget with room for a random number of examples and ``spare`` bytes more (-1: one
    byte short of the next example; forgotten when this returns: the answer is counted again
    after the learner's call, never kept where it could be read)."""
    from course_utils.memory import activation_bytes_per_example, variable_bytes

    per_example = activation_bytes_per_example(model)
    fixed = variable_bytes(model) + (1 + slots) * sum(
        _count(v.shape) * 4 for v in model.trainable_weights)
    return fixed + rng.randint(5, 3000) * per_example + spare


def _verifier(model: Any, budget: int, slots: int) -> Any:
    """The case's verdict, counted after the learner's function returned."""

    def verify(got: Any) -> str | None:
        from course_utils.grading.framework import compare

        want = _largest_batch(model, budget, slots)
        reason = compare(want, got)
        return f"{reason}: expected {want}, got {got!r}" if reason else None

    return verify


@register
def check_largest_batch_that_fits(fn: Any) -> bool:
    """Check ``largest_batch_that_fits(model, budget_bytes, optimizer_slots)`` on fresh models."""
    from course_utils.memory import variable_bytes
    from course_utils.models import cnn, mlp

    rng = fresh_rng()
    models = [
        mlp(rng.randint(8, 64), rng.randint(2, 10), hidden_units=(rng.randint(16, 256),) * 2),
        cnn((rng.choice([8, 12, 16]),) * 2 + (1,), rng.randint(2, 10),
            filters=(rng.randint(4, 16), rng.randint(8, 32))),
        _normalized_mlp(rng),
    ]
    cases = []
    for model in models:  # each at a boundary: exactly full, and one byte short of an example
        spares = [0, -1]
        rng.shuffle(spares)
        for slots, spare in zip((0, 2), spares, strict=True):
            budget = _budget(model, slots, rng, spare)
            cases.append(Case(args=(model, budget, slots), verify=_verifier(model, budget, slots),
                              label=f"({model.name} with {model.count_params():,} weights, "
                                    f"budget_bytes={budget:,}, optimizer_slots={slots})"))
        tiny = variable_bytes(model)  # not even the weights and gradients fit
        cases.append(Case(args=(model, tiny, 0), verify=_verifier(model, tiny, 0),
                          label=f"({model.name}, budget_bytes={tiny:,}: only the weights)"))
    return run_check(
        "largest_batch_that_fits", _counted_by_hand(fn), cases,
        hint="lesson 07, sections 1 and 9 (the memory budget of a step): which terms are "
             "fixed, which grow with every example, and did your count miss one, or one "
             "layer's output? Return an int, 0 when nothing fits.")
