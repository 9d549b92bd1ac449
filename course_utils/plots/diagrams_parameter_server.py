"""Lesson 04's measured picture: every step of a parameter-server job on its worker's time line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = ["draw_failure_recovery", "draw_step_timeline"]

_NEEDED = ("worker", "began", "ended", "applied", "stale_by")


def draw_step_timeline(steps: Sequence[Mapping[str, Any]], ax: Any = None,
                       title: str = "steps on each worker") -> Any:
    """Draw each step as a bar on its worker's lane, from its start to its update, coloured by
    whether other updates landed between its read and its own (``stale_by``, counted by the
    lesson's version counter).

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
                       Patch(color=PALETTE[3], label="stale: another update landed in between")],
              loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=2, fontsize=8,
              frameon=False)
    ax.invert_yaxis()
    return ax


def draw_failure_recovery(ax: Any = None) -> Any:
    """Lesson 04: what a lost worker costs (its step, re-run elsewhere) against what a lost
    parameter server costs (the job, restarted from the coordinator's checkpoint)."""
    ax = axes_for(ax, (10.0, 3.6))
    style = {"ha": "center", "va": "center", "fontsize": 8, "color": "white"}

    def box(x: float, y: float, text: str, color: str) -> None:
        ax.annotate(text, (x, y), **style,
                    bbox={"boxstyle": "round,pad=0.4", "facecolor": color, "edgecolor": color})

    def arrow(start: tuple[float, float], end: tuple[float, float], color: str) -> None:
        ax.annotate("", end, start, arrowprops={"arrowstyle": "->", "color": color, "lw": 1.2})

    # left: a worker lost
    box(0.25, 0.85, "coordinator", PALETTE[7])
    box(0.12, 0.50, "worker 0", PALETTE[0])
    box(0.38, 0.50, "worker 1 ✗\n(killed mid-step)", PALETTE[3])
    box(0.25, 0.13, "parameter servers\n(variables intact)", PALETTE[1])
    arrow((0.33, 0.78), (0.37, 0.58), PALETTE[3])
    arrow((0.22, 0.78), (0.13, 0.58), PALETTE[2])
    ax.text(0.25, 0.68, "its step re-queued,\nrun again on worker 0", ha="center", fontsize=7)
    ax.text(0.25, 0.32, "join carries on: the job loses one step's work", ha="center",
            fontsize=7)
    # right: a parameter server lost
    box(0.75, 0.85, "coordinator: reading a variable\nof ps 1 raises UnavailableError", PALETTE[7])
    box(0.62, 0.50, "parameter server 0", PALETTE[1])
    box(0.88, 0.50, "parameter server 1 ✗\n(its variables gone)", PALETTE[3])
    box(0.75, 0.13, "checkpoint written by the coordinator\n→ new coordinator restores it",
        PALETTE[2])
    arrow((0.75, 0.77), (0.75, 0.22), PALETTE[2])
    ax.text(0.75, 0.32, "restart ps 1 and the coordinator", ha="center", fontsize=7)
    ax.axvline(0.5, color="grey", lw=0.6, ls=":")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    ax.set_title("A lost worker costs a step; a lost parameter server costs a restart",
                 fontsize=10)
    return ax
