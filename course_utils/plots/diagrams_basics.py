"""Diagrams of lessons 00-02: a training step, the input pipeline's timeline, data parallelism."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = [
    "STEP_PARTS",
    "draw_training_step",
    "PIPELINE_MODES",
    "pipeline_schedule",
    "draw_pipeline_timeline",
    "draw_data_parallelism",
]


#: The five parts of a training step that lesson 00 names, in the order a step meets them.
STEP_PARTS = ("input", "host→device transfer", "compute", "communication", "synchronisation")

#: One step of two replicas, as (row, part, start, duration) in arbitrary time units.
_TRAINING_STEP = (
    ("host (CPU)", "input", 0.0, 3.0),
    ("host (CPU)", "host→device transfer", 3.0, 1.0),
    ("host (CPU)", "synchronisation", 4.0, 7.0),
    ("device 0", "host→device transfer", 3.0, 1.0),
    ("device 0", "compute", 4.0, 4.0),
    ("device 0", "synchronisation", 8.0, 1.0),
    ("device 0", "communication", 9.0, 2.0),
    ("device 1", "host→device transfer", 3.0, 1.0),
    ("device 1", "compute", 4.0, 5.0),
    ("device 1", "communication", 9.0, 2.0),
)

def draw_training_step(ax: Any = None) -> Any:
    """Draw one data-parallel training step: where input, transfer, compute, communication and
    synchronisation happen, on the host and on two devices (a diagram, not a measurement)."""
    ax = axes_for(ax, (8.0, 2.6))
    rows = list(dict.fromkeys(row for row, *_ in _TRAINING_STEP))
    colors = {part: PALETTE[index] for index, part in enumerate(STEP_PARTS)}
    notes = {"input": "read, decode,\naugment", "host→device transfer": "copy",
             "compute": "forward,\nbackward", "communication": "all-reduce\ngradients",
             "synchronisation": "waits for the devices (e.g. to read the loss)"}
    labelled: set[str] = set()
    for row, part, start, duration in _TRAINING_STEP:
        y = len(rows) - 1 - rows.index(row)
        waiting = part == "synchronisation"
        ax.barh([y], [duration], left=start, height=0.6, edgecolor="black", linewidth=0.5,
                color="white" if waiting else colors[part], hatch="//" if waiting else None,
                label=None if part in labelled else part)
        labelled.add(part)
        if duration >= 1.5 or row == "device 0":
            ax.text(start + duration / 2, y, notes[part] if duration >= 1.5 else "",
                    ha="center", va="center", fontsize=7,
                    bbox={"facecolor": "white", "edgecolor": "none"} if waiting else None)
    ax.set_yticks(range(len(rows)), list(reversed(rows)))
    ax.set_xlabel("time within one step →")
    ax.set_xticks([])
    ax.set_title("One training step with two replicas")
    handles = dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    ax.legend([handles[part] for part in STEP_PARTS], STEP_PARTS, loc="upper center",
              bbox_to_anchor=(0.5, -0.22), ncol=len(STEP_PARTS), frameon=False, fontsize=7)
    ax.spines[["top", "right"]].set_visible(False)
    return ax

#: The pipelines ``pipeline_schedule`` knows: one element at a time, with ``prefetch(1)``, and
#: with a parallel ``map`` (which keeps its results ready like a prefetch buffer).
PIPELINE_MODES = ("sequential", "prefetch", "parallel map")

def pipeline_schedule(
    mode: str, num_elements: int = 6, produce_s: float = 2.0, consume_s: float = 1.0,
    parallel_calls: int = 2,
) -> list[tuple[str, str, int, float, float]]:
    """When each element is produced (input) and consumed (training step) in an ideal pipeline.

    Returns ``(lane, kind, element, start, end)`` tuples, ``kind`` being ``"produce"`` or
    ``"consume"``. ``"sequential"``: the consumer asks, the producer makes one element, the
    consumer uses it. ``"prefetch"``: a buffer of one lets the producer make the next element
    while the consumer works. ``"parallel map"``: ``parallel_calls`` workers produce elements
    side by side, at most that many ahead of the consumer, handed out in order.
    """
    if mode not in PIPELINE_MODES:
        raise ValueError(f"mode must be one of {PIPELINE_MODES}, got {mode!r}")
    if num_elements < 1 or parallel_calls < 1 or produce_s <= 0 or consume_s <= 0:
        raise ValueError("need num_elements, parallel_calls >= 1 and positive durations")
    workers = parallel_calls if mode == "parallel map" else 1
    ahead = {"sequential": 0, "prefetch": 1, "parallel map": parallel_calls}[mode]
    produce_end: list[float] = []
    consume_start: list[float] = []
    consume_end: list[float] = []
    schedule = []
    for element in range(num_elements):
        start = produce_end[element - workers] if element >= workers else 0.0
        if mode == "sequential":  # nothing is made before the consumer asks for it
            start = max(start, consume_end[-1] if consume_end else 0.0)
        elif element >= ahead:  # at most `ahead` elements made before the consumer takes them
            start = max(start, consume_start[element - ahead])
        produce_end.append(start + produce_s)
        lane = f"worker {element % workers + 1}" if workers > 1 else "input"
        schedule.append((lane, "produce", element, start, produce_end[-1]))
        taken = max(produce_end[-1], consume_end[-1] if consume_end else 0.0)
        consume_start.append(taken)
        consume_end.append(taken + consume_s)
        schedule.append(("training step", "consume", element, taken, consume_end[-1]))
    return schedule

def draw_pipeline_timeline(
    num_elements: int = 6, produce_s: float = 2.0, consume_s: float = 1.0,
    parallel_calls: int = 2, axes: Sequence[Any] | None = None,
) -> Any:
    """Draw the ``pipeline_schedule`` of each mode as a timeline, one panel per mode.

    Returns the array of three ``Axes``; each panel's title gives the time the whole run takes.
    """
    if axes is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(len(PIPELINE_MODES), 1, figsize=(8.0, 5.4), sharex=True)
    colors = {"produce": PALETTE[1], "consume": PALETTE[0]}
    names = {"produce": "input (read, decode)", "consume": "training step"}
    for ax, mode in zip(axes, PIPELINE_MODES, strict=True):
        schedule = pipeline_schedule(mode, num_elements, produce_s, consume_s, parallel_calls)
        lanes = sorted(dict.fromkeys(lane for lane, *_ in schedule), key=lambda name: (
            name == "training step", name))  # the input's lanes first, the consumer's last
        for lane, kind, element, start, end in schedule:
            y = len(lanes) - 1 - lanes.index(lane)
            ax.barh([y], [end - start], left=start, height=0.6, color=colors[kind],
                    edgecolor="black", linewidth=0.5, label=names[kind])
            ax.text((start + end) / 2, y, str(element), ha="center", va="center",
                    fontsize=7, color="white")
        ax.set_yticks(range(len(lanes)), list(reversed(lanes)), fontsize=8)
        total = max(end for *_, end in schedule)
        ax.set_title(f"{mode}: {num_elements} elements in {total:g} time units", fontsize=9,
                     loc="left")
        ax.spines[["top", "right"]].set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes[0].legend(unique.values(), unique.keys(), loc="lower right", fontsize=7, frameon=False,
                   bbox_to_anchor=(1.0, 1.0), ncol=2)
    axes[-1].set_xlabel("time (units)")
    return axes

def draw_data_parallelism(num_replicas: int = 4, ax: Any = None) -> Any:
    """Draw one step of data parallelism: the global batch split over ``num_replicas`` replicas,
    each computing its gradient, one all-reduce summing them, and the same update everywhere
    (a diagram, not a measurement)."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    ax = axes_for(ax, (10.0, 1.0 + 0.9 * num_replicas))
    row_height, gap = 1.0, 0.25
    height = num_replicas * row_height
    columns = {"batch": (0.0, 1.6), "replica": (2.6, 2.6), "reduce": (6.1, 1.5),
               "update": (8.5, 2.2)}

    def box(column: str, y: float, h: float, text: str, color: str, **style: Any) -> None:
        x, width = columns[column]
        ax.add_patch(Rectangle((x, y), width, h, facecolor=style.get("facecolor", "white"),
                               edgecolor=color, linewidth=style.get("linewidth", 1.5),
                               label=column))
        ax.text(x + width / 2, y + h / 2, text, ha="center", va="center",
                fontsize=style.get("fontsize", 8), color=style.get("textcolor", "black"))

    def arrow(start: str, end: str, y_start: float, y_end: float) -> None:
        x0 = columns[start][0] + columns[start][1]
        ax.add_patch(FancyArrowPatch((x0 + 0.05, y_start), (columns[end][0] - 0.05, y_end),
                                     arrowstyle="-|>", mutation_scale=10, color="0.35"))

    reduce_y = height / 2
    for index in range(num_replicas):
        color = PALETTE[index % len(PALETTE)]
        y = height - (index + 1) * row_height
        middle = y + row_height / 2
        box("batch", y, row_height, f"slice {index}\n(per-replica\nbatch)", color,
            facecolor=color, textcolor="white", linewidth=0.8)
        box("replica", y + gap / 2, row_height - gap,
            f"replica {index} (device {index})\nforward + backward\non its slice → g{index}",
            color)
        box("update", y + gap / 2, row_height - gap, "w ← w − η·g\n(the same update)", "0.2")
        arrow("batch", "replica", middle, middle)
        arrow("replica", "reduce", middle, reduce_y + (middle - reduce_y) * 0.8)
        arrow("reduce", "update", reduce_y + (middle - reduce_y) * 0.8, middle)
    terms = [f"g{index}" for index in range(num_replicas)]
    if num_replicas > 4:
        terms = [terms[0], "…", terms[-1]]
    box("reduce", gap / 2, height - gap, "all-reduce\n(sum)\n\ng = " + "\n   + ".join(terms),
        "black", fontsize=9)
    titles = {"batch": "global batch", "replica": "replicas: one model copy each",
              "reduce": "communication", "update": "optimizer, every replica"}
    for column, title in titles.items():
        x, width = columns[column]
        ax.text(x + width / 2, height + 0.15, title, ha="center", va="bottom", fontsize=8,
                fontweight="bold")
    ax.text(0.0, -0.2, "gᵢ: gradient of slice i's summed loss ÷ the global batch size, so g "
            "is the gradient of the mean loss over the global batch",
            ha="left", va="top", fontsize=8, style="italic")
    ax.set_xlim(-0.1, columns["update"][0] + columns["update"][1] + 0.1)
    ax.set_ylim(-0.6, height + 0.6)
    ax.set_axis_off()
    ax.set_title(f"One step of data parallelism with {num_replicas} replica"
                 f"{'s' if num_replicas > 1 else ''}", fontsize=10)
    return ax
