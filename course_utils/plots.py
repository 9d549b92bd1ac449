"""The course's pictures: bars of throughput, time breakdowns, scaling curves.

Every function draws on a Matplotlib ``Axes`` (a new figure when none is given) and returns it,
so a lesson can add to it or lay several side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: A colour-blind-safe palette (Okabe-Ito), used in every picture of the course.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000")


def _axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax


def bar_chart(
    values: Mapping[str, float],
    title: str = "",
    ylabel: str = "",
    ax: Any = None,
    annotate: str = "{:,.0f}",
    baseline: str | None = None,
) -> Any:
    """Bars of ``values`` (e.g. throughput per pipeline variant), labelled with their values.

    With ``baseline``, each bar is also labelled with its ratio to that bar ("×2.1").
    """
    if not values:
        raise ValueError("nothing to plot")
    ax = _axes(ax, (max(4.0, 1.3 * len(values)), 3.2))
    names = list(values)
    heights = [values[name] for name in names]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
    bars = ax.bar(names, heights, color=colors)
    for bar, name in zip(bars, names, strict=True):
        label = annotate.format(values[name])
        if baseline is not None and values.get(baseline):
            label += f"\n×{values[name] / values[baseline]:.2f}"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, max(heights) * 1.25)
    ax.tick_params(axis="x", labelrotation=20)
    ax.spines[["top", "right"]].set_visible(False)
    return ax


def time_breakdown(
    parts: Mapping[str, float], title: str = "Where a training step's time goes",
    unit: str = "ms", scale: float = 1e3, ax: Any = None,
    measured_total: float | None = None,
) -> Any:
    """One horizontal stacked bar: how a step's time splits into parts (seconds given).

    ``measured_total`` (seconds) draws a line where the whole step, timed as one, ends.
    """
    if not parts:
        raise ValueError("nothing to plot")
    ax = _axes(ax, (8.0, 2.2))
    total = sum(parts.values())
    left = 0.0
    for index, (name, seconds) in enumerate(parts.items()):
        width = seconds * scale
        ax.barh([0], [width], left=left, color=PALETTE[index % len(PALETTE)],
                label=f"{name}: {width:.1f} {unit} ({seconds / total:.0%})" if total else name)
        left += width
    if measured_total is not None:
        ax.axvline(measured_total * scale, color="black", linestyle="--", linewidth=1.5)
        ax.annotate(f"whole step, timed: {measured_total * scale:.1f} {unit}",
                    (measured_total * scale, 0.42), ha="right", va="bottom", fontsize=8)
        ax.set_xlim(0, max(left, measured_total * scale) * 1.05)
        ax.set_ylim(-0.5, 0.7)
    ax.set_yticks([])
    ax.set_xlabel(unit)
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=min(3, len(parts)),
              frameon=False, fontsize=8)
    ax.spines[["top", "right", "left"]].set_visible(False)
    return ax


def scaling_curve(
    throughput_by_replicas: Mapping[int, float], title: str = "Scaling",
    ylabel: str = "examples / s", ax: Any = None, label: str = "measured",
) -> Any:
    """Measured throughput against the number of replicas, with the ideal linear line."""
    if not throughput_by_replicas:
        raise ValueError("nothing to plot")
    ax = _axes(ax, (4.5, 3.2))
    replicas = sorted(throughput_by_replicas)
    measured = [throughput_by_replicas[n] for n in replicas]
    per_replica = measured[0] / replicas[0]
    ax.plot(replicas, [n * per_replica for n in replicas], "--", color="grey", label="ideal")
    ax.plot(replicas, measured, "o-", color=PALETTE[0], label=label)
    ax.set_xticks(replicas)
    ax.set_xlabel("replicas")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return ax


def line_chart(
    series: Mapping[str, Sequence[float]], title: str = "", xlabel: str = "",
    ylabel: str = "", ax: Any = None, x: Sequence[float] | None = None,
) -> Any:
    """Several named curves on one set of axes (losses, learning rates, utilisation)."""
    if not series:
        raise ValueError("nothing to plot")
    ax = _axes(ax, (5.5, 3.2))
    for index, (name, values) in enumerate(series.items()):
        xs = list(x) if x is not None else list(range(len(values)))
        ax.plot(xs, list(values), label=name, color=PALETTE[index % len(PALETTE)])
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend(frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return ax


# ----------------------------------------------------------------------------- diagrams
# Explanatory drawings (not measurements): each draws one idea of a lesson from code, so no
# image file has to be kept in sync with the text.

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
    ax = _axes(ax, (8.0, 2.6))
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


def epoch_orders(orders: Mapping[str, Sequence[int]], axes: Sequence[Any] | None = None) -> Any:
    """Where each example lands in an epoch: one scatter panel per named order (e.g. shuffling
    examples vs shuffling batches). Returns the panels' ``Axes``."""
    if not orders:
        raise ValueError("nothing to plot")
    if axes is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(1, len(orders), figsize=(4.5 * len(orders), 3.2), sharey=True,
                               squeeze=False)
        axes = axes[0]
    for ax, (name, order) in zip(axes, orders.items(), strict=True):
        values = list(order)
        ax.scatter(range(len(values)), values, s=4, color=PALETTE[0])
        ax.set(title=name, xlabel="position in the epoch")
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("example number")
    return axes
