"""Lesson 04's measured picture: every step of a parameter-server job on its worker's time line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = ["draw_step_timeline"]

_NEEDED = ("worker", "began", "ended", "applied", "stale_by")


def draw_step_timeline(steps: Sequence[Mapping[str, Any]], ax: Any = None,
                       title: str = "steps on each worker") -> Any:
    """Draw each step as a bar on its worker's lane, from its start to its update, coloured by
    how many other updates landed after it read the weights (``stale_by``).

    ``steps`` are mappings with ``worker``, ``began`` and ``ended`` (seconds, one clock),
    ``applied`` (the version its update got) and ``stale_by``.
    """
    from matplotlib.patches import Patch

    if not steps:
        raise ValueError("no steps to draw")
    missing = [key for key in _NEEDED if key not in steps[0]]
    if missing:
        raise ValueError(f"each step needs {list(_NEEDED)}; missing {missing}")
    ax = axes_for(ax, (10.0, 2.4))
    start = min(float(step["began"]) for step in steps)
    workers = sorted({int(step["worker"]) for step in steps})
    for step in steps:
        lane = workers.index(int(step["worker"]))
        began, ended = float(step["began"]) - start, float(step["ended"]) - start
        stale = int(step["stale_by"]) > 0
        ax.barh(lane, max(ended - began, 1e-4), left=began, height=0.6,
                color=PALETTE[3] if stale else PALETTE[0], edgecolor="black", linewidth=0.3)
        ax.text(began + (ended - began) / 2, lane, str(int(step["applied"])), ha="center",
                va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(workers)), [f"worker {w}" for w in workers])
    ax.set_xlabel("seconds since the first step began (number: the version its update made)")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=PALETTE[0], label="fresh: no other update in between"),
                       Patch(color=PALETTE[3], label="stale: computed from older weights")],
              loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=2, fontsize=8,
              frameon=False)
    ax.invert_yaxis()
    return ax
