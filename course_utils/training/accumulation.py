"""Gradient accumulation: one optimizer update from several micro-batches.

With ``accumulation_steps=k`` a replica step takes ``k`` batches, adds up their gradients and
applies the sum once: one update on a batch ``k`` times larger, with ``1/k`` of its
activations alive at once (and one gradient-sized running sum more).
Keras 3's own ``gradient_accumulation_steps`` fails under MirroredStrategy (keras-team/keras#20582),
so the sum is made inside one replica step, where no cross-replica ``merge_call`` is needed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_gradients", "split_into_calls"]


def split_into_calls(
    batches: int, accumulation_steps: int, steps_per_execution: int
) -> list[tuple[int, int]]:
    """Split ``batches`` into calls of ``(micro-batches per update, updates)``.

    Each call makes up to ``steps_per_execution`` updates of ``accumulation_steps`` batches; a
    last group of fewer than ``accumulation_steps`` batches makes one more update, from fewer
    examples.
    """
    full, rest = divmod(batches, accumulation_steps)
    calls = [
        (accumulation_steps, min(steps_per_execution, full - first))
        for first in range(0, full, steps_per_execution)
    ]
    if rest:
        calls.append((rest, 1))
    return calls


def add_gradients(total: list[Any], gradients: list[Any]) -> list[Any]:
    """Add one micro-batch's gradients to the running sum (None: a variable without gradient)."""
    return [
        new if old is None else (old if new is None else old + new)
        for old, new in zip(total, gradients, strict=True)
    ]
