"""Diagram of lesson 09: the capstone job, from the dataset to the report, and its
measure-then-fix loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = ["CAPSTONE_STAGES", "draw_capstone_job"]

#: The stages of the capstone job (top row) and of its measurement loop (bottom row), in order.
CAPSTONE_STAGES = (
    ("job", "dataset", "tfds.load"),
    ("job", "pipeline", "map · cache · shuffle\nbatch · prefetch"),
    ("job", "pre-train", "a small CNN\non part of the task"),
    ("job", "choices", "strategy · precision\naccumulation"),
    ("job", "fine-tune", "the whole network,\nwarm-up + decay"),
    ("measure", "profile", "trace a few steps"),
    ("measure", "bottleneck", "input, compute or\ncommunication?"),
    ("measure", "fix", "remove the largest\nshare"),
    ("measure", "benchmark", "every option, same\nbatches, medians"),
    ("measure", "report", "written from\nthe numbers"),
)


def draw_capstone_job(choices: Mapping[str, str] | None = None, ax: Any = None) -> Any:
    """The capstone as two rows of boxes: the job (dataset to fine-tuning) and the loop that
    measures it (profile, bottleneck, fix, benchmark, report), with the fix feeding back into
    the pipeline. ``choices`` replaces a stage's second line (e.g. what this machine chose)."""
    ax = axes_for(ax, (11.0, 3.4))
    rows = {"job": 0.72, "measure": 0.24}
    colors = {"job": PALETTE[0], "measure": PALETTE[2]}
    places: dict[str, tuple[float, float]] = {}
    for row in rows:
        stages = [stage for stage in CAPSTONE_STAGES if stage[0] == row]
        for index, (_, name, detail) in enumerate(stages):
            x, y = (index + 0.5) / len(stages), rows[row]
            places[name] = (x, y)
            detail = (choices or {}).get(name, detail)
            ax.annotate(f"{name}\n{detail}", (x, y), ha="center", va="center", fontsize=8,
                        color="white", bbox={"boxstyle": "round,pad=0.5",
                                             "facecolor": colors[row], "edgecolor": colors[row]})
            if index:
                ax.annotate("", (x - 0.095, y), (x - 0.2 + 0.095, y),
                            arrowprops={"arrowstyle": "->", "color": "grey", "lw": 1.5})
    arrow = {"arrowstyle": "->", "color": "grey", "lw": 1.5, "connectionstyle": "arc3,rad=0.0"}
    ax.annotate("", (places["profile"][0], 0.36), (places["fine-tune"][0], 0.60),
                arrowprops=arrow)
    ax.annotate("", (places["pipeline"][0] + 0.03, 0.60), (places["fix"][0] - 0.03, 0.36),
                arrowprops={**arrow, "color": PALETTE[3], "linestyle": "--"})
    ax.annotate("the fix changes the job", ((places["pipeline"][0] + places["fix"][0]) / 2,
                                            0.50), ha="center", fontsize=8, color=PALETTE[3])
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.set_axis_off()
    ax.set_title("The capstone: a real job (blue), and the loop that measures it (green)",
                 fontsize=10)
    return ax
