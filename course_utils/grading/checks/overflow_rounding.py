"""Lesson 08, exercise 3: two batches on which the model's own float16 arithmetic and an exact
(float64 or float32) recomputation disagree, drawn in every run of the check. An answer that
recomputes the layers in float64 and compares each float16 layer's value with float16's range
(65504, or 65520 where it rounds to inf) passed 5 runs in 6 before (nb27-08).

One model, two pass-through paths from the input, each through the first two hidden layers:
- a row whose exact first-layer value, 65510, is at least 65504, yet in float16 the input
  rounds to 65504, finite (the second layer halves it): every layer is finite, the answer is
  None; an answer reading 65504 off an exact recomputation names the first layer;
- a row of 65457 (rounds to 65472 in float16) times a weight 1.000489 (rounds to 1.000977):
  exactly 65489, below 65504, but in float16 65535.9, which rounds to inf: the second layer
  overflows; an answer reading 65520 (or 65504) off an exact recomputation misses it.
No threshold on an exact recomputation passes both. Later layers' kernels are divided by their
width, so no later value grows. ``overflow.py``'s check wraps each case in its verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["rounding_cases"]

#: (input value, second layer's weight): exact value at least 65504 but float16-finite, then
#: exact value below 65504 but float16 inf.
ROUNDS_DOWN, ROUNDS_UP = (65510.0, 0.5), (65457.0, 1.0 + 0.501 * 2.0 ** -10)


def rounding_cases(model: Any, x: np.ndarray, rng: Any,
                   verifier: Callable[..., Callable[[Any], str | None]],
                   ) -> list[tuple[Any, np.ndarray, Callable[[Any], str | None]]]:
    """``model`` (a mixed_float16 MLP of at least 3 hidden Dense layers, zero biases) rewired
    in place; (model, batch, verify) for each row kind. ``verifier(batch, order, decoy,
    scale, scaled)`` is the check's verdict for ``batch``."""
    from course_utils.grading.checks.overflow_rows import outputs_model

    dense = [layer for layer in model.layers if layer.weights]
    width = dense[0].kernel.shape[1]
    features = rng.sample(range(dense[0].kernel.shape[0]), 2)
    units = rng.sample(range(width), 2)
    first, second = dense[0].kernel.numpy(), dense[1].kernel.numpy()
    for feature, unit, (_, weight) in zip(features, units, (ROUNDS_DOWN, ROUNDS_UP),
                                          strict=True):
        first[feature, :], first[:, unit] = 0.0, 0.0
        first[feature, unit] = 1.0
        second[unit, :], second[:, unit] = 0.0, 0.0
        second[unit, unit] = weight
    dense[0].kernel.assign(first)
    dense[1].kernel.assign(second)
    for layer in dense[2:]:
        layer.kernel.assign(layer.kernel / layer.kernel.shape[0])
    cases = []
    for feature, (value, _), why in zip(features, (ROUNDS_DOWN, ROUNDS_UP), (
            f"its exact value {ROUNDS_DOWN[0]:.0f} is above 65504, yet in float16 it "
            "rounds to 65504, finite",
            f"exactly {ROUNDS_UP[0] * ROUNDS_UP[1]:.0f}, below 65504, yet in float16 its "
            "operands round up and the product is inf"), strict=True):
        batch = x.copy()
        row = rng.randrange(len(batch))
        batch[row] = 0.0
        batch[row, feature] = value
        base = verifier(batch, [layer.name for layer in outputs_model(model)[0]], None, 1.0,
                        f"one row set to {value:.0f} in one feature,")

        def verify(got: Any, base: Any = base, why: str = why) -> str | None:
            problem = base(got)
            return problem and (f"{problem}. One row's value: {why}: run the model in its "
                                "own dtypes, not an exact recomputation against float16's "
                                "range")
        cases.append((model, batch, verify))
    return cases
