"""Equal to a one-device reference: the course's signature check, in one place.

A distributed run is correct when its weights (or gradients, or losses) equal those of the same
training on one device from the same start, up to float32 rounding in another order of sums.
Lessons, exercise checks, the what-works-where table and the Trainer's tests all ask it here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["FLOAT32_TOLERANCE", "Comparison", "compare_with_reference", "largest_difference"]

#: Largest difference that still counts as equal in float32: the same sums in another order.
FLOAT32_TOLERANCE = 1e-5


def largest_difference(arrays_a: Sequence[Any], arrays_b: Sequence[Any]) -> float:
    """The largest absolute element difference between two lists of arrays (e.g. weights).

    ``inf`` when an element of either list is NaN or infinite: a non-finite result is never
    equal to anything, whichever way the caller compares (``<= tolerance`` is False,
    ``> tolerance`` is True), where a NaN would pass ``> tolerance`` and drop out of ``max``.
    """
    if len(arrays_a) != len(arrays_b):
        raise ValueError(f"{len(arrays_a)} arrays against {len(arrays_b)}: compare like with like")
    differences = []
    for a, b in zip(arrays_a, arrays_b, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            raise ValueError(f"shapes {a.shape} and {b.shape} differ: compare like with like")
        finite = np.isfinite(a).all() and np.isfinite(b).all()
        differences.append(float(np.max(np.abs(a - b), initial=0.0)) if finite else np.inf)
    return max(differences, default=0.0)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How far a result is from its one-device reference, and whether that counts as equal."""

    error: float
    tolerance: float

    @property
    def equal(self) -> bool:
        """True when the largest difference is within the tolerance."""
        return self.error <= self.tolerance

    def __bool__(self) -> bool:
        return self.equal

    def __str__(self) -> str:
        if self.error == float("inf"):
            return "not finite (NaN or inf): a non-finite result never equals the reference"
        verdict = "equal to" if self.equal else "differs from"
        return (f"{verdict} the one-device reference (max |Δ| {self.error:.1e}, "
                f"tolerance {self.tolerance:.0e})")


def compare_with_reference(got: Sequence[Any], reference: Sequence[Any],
                           tolerance: float = FLOAT32_TOLERANCE) -> Comparison:
    """Compare ``got`` (a list of arrays) with the one-device ``reference``."""
    if tolerance < 0:
        raise ValueError(f"tolerance {tolerance}: a tolerance is not negative")
    return Comparison(largest_difference(got, reference), tolerance)
