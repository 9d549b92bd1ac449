"""Lesson 07, exercise 2: the largest batch whose training step fits a memory budget.

The check, registered by name (``lesson_07`` imports it): on fresh random models (one with
weights that have no gradients) and budgets, the learner's batch equals a count made here from
the layers' shapes with the course's one budget (``cu.memory.step_budget``); the learner counts
by hand: an answer that runs the course's memory counters is refused (by code identity).
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


class _CountedByHand:
    """``fn``, failing when it runs the course's memory counters: this exercise is the count.

    A guard by identity of what runs (``sys.setprofile``): whatever name a counter is bound to
    (an alias made before the check, a wrapper, a lambda), its code object is seen when it is
    entered. Has no ``__code__`` (the framework then trusts a ``NotImplementedError``, so only
    the learner's own stub raise is let through as one) and names ``fn`` as ``__wrapped__``.
    """

    def __init__(self, fn: Any) -> None:
        from course_utils import memory, mixed_precision

        self.__wrapped__ = fn
        helpers = [memory.activation_bytes_per_example, memory.trainable_bytes,
                   memory.variable_bytes, memory.step_budget, memory.smallest_accumulation,
                   mixed_precision.model_memory]
        self.codes: dict[Any, str] = {}
        for helper in helpers:
            stack = [helper.__code__]
            while stack:
                code = stack.pop()
                self.codes[code] = f"{helper.__module__}.{helper.__name__}"
                stack.extend(c for c in code.co_consts if hasattr(c, "co_code"))

    def __call__(self, *args: Any) -> Any:
        import sys

        entered: list[str] = []

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and not entered and frame.f_code in self.codes:
                entered.append(self.codes[frame.f_code])

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            result = self.__wrapped__(*args)
        except NotImplementedError as error:
            tb, last = error.__traceback__, None
            while tb is not None:
                last, tb = tb, tb.tb_next
            if last is not None and last.tb_frame.f_code is getattr(self.__wrapped__,
                                                                     "__code__", None):
                raise
            raise RuntimeError(f"NotImplementedError from inside a library call: {error}"
                               ) from error
        finally:
            sys.setprofile(previous)
        if entered:
            raise AssertionError(
                f"your function ran the course's {entered[0]}: count the bytes yourself from "
                "model.weights, model.trainable_weights and the layers' output shapes")
        return result


@register
def check_largest_batch_that_fits(fn: Any) -> bool:
    """Check ``largest_batch_that_fits(model, budget_bytes, optimizer_slots)`` on fresh models."""
    from course_utils.memory import activation_bytes_per_example, variable_bytes
    from course_utils.models import cnn, mlp

    rng = fresh_rng()
    models = [
        mlp(rng.randint(8, 64), rng.randint(2, 10), hidden_units=(rng.randint(16, 256),) * 2),
        cnn((rng.choice([8, 12, 16]),) * 2 + (1,), rng.randint(2, 10),
            filters=(rng.randint(4, 16), rng.randint(8, 32))),
        _normalized_mlp(rng),
    ]
    cases = []
    for model in models:
        per_example = activation_bytes_per_example(model)
        for slots in (0, 2):
            expected = rng.randint(5, 3000)
            fixed = variable_bytes(model) + (1 + slots) * sum(
                _count(v.shape) * 4 for v in model.trainable_weights)
            budget = fixed + expected * per_example + rng.randint(0, per_example - 1)
            cases.append(Case(args=(model, budget, slots), expected=_largest_batch(
                model, budget, slots), label=f"({model.name} with {model.count_params():,} "
                f"weights, budget_bytes={budget:,}, optimizer_slots={slots})"))
        tiny = variable_bytes(model)  # not even the weights and gradients fit
        cases.append(Case(args=(model, tiny, 0), expected=0,
                          label=f"({model.name}, budget_bytes={tiny:,}: only the weights)"))
    return run_check(
        "largest_batch_that_fits", _CountedByHand(fn) if callable(fn) else fn, cases,
        hint="the fixed part is every weight + one gradient per trainable weight + "
             "optimizer_slots copies of the trainable weights; each example adds the input "
             "and every layer's output (model.layers, the input layer included; float32 = 4 "
             "bytes). Return an int, 0 when nothing fits (lesson 07, sections 1 and 9).")
