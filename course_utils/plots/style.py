"""The course's look: one colour-blind-safe palette, and axes to draw on."""

from __future__ import annotations

from typing import Any

__all__ = ["PALETTE", "axes_for"]

#: A colour-blind-safe palette (Okabe-Ito), used in every picture of the course.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000")


def axes_for(ax: Any, figsize: tuple[float, float]) -> Any:
    """``ax`` itself, or the axes of a new figure of ``figsize`` when ``ax`` is None."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax
