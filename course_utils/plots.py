"""The course's pictures: bars of throughput, time breakdowns, scaling curves.

Every function draws on a Matplotlib ``Axes`` (a new figure when none is given) and returns it,
so a lesson can add to it or lay several side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "bar_chart",
    "draw_data_parallelism",
    "draw_gradient_accumulation",
    "draw_loss_scaling",
    "draw_mixed_precision_step",
    "draw_model_split",
    "draw_multi_worker",
    "draw_number_formats",
    "draw_parameter_server",
    "draw_pipeline_schedule",
    "draw_pipeline_timeline",
    "draw_sharded_dense",
    "draw_tpu_host_loop",
    "draw_training_step",
    "epoch_orders",
    "line_chart",
    "PALETTE",
    "PIPELINE_MODES",
    "pipeline_schedule",
    "scaling_curve",
    "STEP_PARTS",
    "time_breakdown",
]

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


def draw_gradient_accumulation(accumulation_steps: int = 4, ax: Any = None) -> Any:
    """Diagram: k micro-batches, one at a time -> k gradients, summed -> one optimizer update."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be at least 1, got {accumulation_steps}")
    k = accumulation_steps
    ax = _axes(ax, (8.0, 0.9 + 0.7 * k))
    height = 0.7 * k

    def box(x: float, y: float, width: float, text: str, color: str) -> None:
        ax.add_patch(FancyBboxPatch((x, y - 0.22), width, 0.44, boxstyle="round,pad=0.02",
                                    facecolor=color, edgecolor="black", linewidth=0.8,
                                    alpha=0.9))
        ax.text(x + width / 2, y, text, ha="center", va="center", fontsize=8)

    def arrow(start: tuple[float, float], end: tuple[float, float]) -> None:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10,
                                     color="black", linewidth=0.8))

    middle = (height - 0.7) / 2
    for index in range(k):
        y = height - 0.7 * (index + 1)
        box(0.0, y, 1.7, f"micro-batch {index + 1}", PALETTE[5])
        arrow((1.75, y), (2.35, y))
        box(2.4, y, 2.0, f"loss / {k} → gradients", PALETTE[1])
        arrow((4.45, y), (5.15, middle))
        ax.text(-0.1, y, f"t{index + 1}", ha="right", va="center", fontsize=7, color="grey")
    box(5.2, middle, 1.3, "sum", PALETTE[2])
    arrow((6.55, middle), (7.05, middle))
    box(7.1, middle, 1.9, "one optimizer\nupdate", PALETTE[0])
    ax.text(4.6, height + 0.05, f"one update from {k} micro-batches = one batch {k}× larger;"
            " one micro-batch's activations in memory at a time", ha="center", fontsize=8)
    ax.set_xlim(-0.5, 9.2)
    ax.set_ylim(-0.5, height + 0.35)
    ax.set_axis_off()
    ax.set_title("Gradient accumulation", fontsize=10)
    return ax


def draw_number_formats(formats: Sequence[str] = ("float32", "float16", "bfloat16")) -> Any:
    """Lesson 08: each format's bits (sign, exponent, mantissa) and its range on a log2 scale.

    Left: one bar per format, one box per bit. Right: the magnitudes each format holds, from its
    smallest subnormal (light) through its normal range (dark) to its largest value.
    """
    import math

    import matplotlib.pyplot as plt

    from course_utils.mixed_precision import number_format

    specs = [number_format(name) for name in formats]
    fig, (bits_ax, range_ax) = plt.subplots(
        1, 2, figsize=(11, 0.9 + 0.7 * len(specs)), gridspec_kw={"width_ratios": [1.2, 1]})
    parts = (("sign", PALETTE[3]), ("exponent", PALETTE[0]), ("mantissa", PALETTE[2]))
    for row, spec in enumerate(specs):
        y = len(specs) - 1 - row
        left = 0
        for (part, color), width in zip(parts, (1, spec.exponent_bits, spec.mantissa_bits),
                                        strict=True):
            bits_ax.barh(y, width, left=left, color=color, edgecolor="white", height=0.6,
                         label=part if row == 0 else None)
            if width >= 3:
                bits_ax.annotate(f"{width}", (left + width / 2, y), ha="center", va="center",
                                 color="white", fontsize=8)
            left += width
        low = math.log2(spec.smallest_subnormal)
        normal = math.log2(spec.smallest_normal)
        high = math.log2(spec.max)
        range_ax.barh(y, normal - low, left=low, color=PALETTE[5], height=0.5,
                      label="subnormal" if row == 0 else None)
        range_ax.barh(y, high - normal, left=normal, color=PALETTE[0], height=0.5,
                      label="normal" if row == 0 else None)
        range_ax.annotate(f"max {spec.max:.3g}, eps 2^{math.log2(spec.epsilon):.0f}",
                          (high, y + 0.32), ha="right", fontsize=8)
    for ax in (bits_ax, range_ax):
        ax.set_yticks(range(len(specs)), [s.name for s in reversed(specs)])
        ax.spines[["top", "right", "left"]].set_visible(False)
    bits_ax.set_xlabel("bits")
    bits_ax.set_title("Bits: sign, exponent (range), mantissa (precision)")
    bits_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, frameon=False,
                   fontsize=8)
    range_ax.axvline(0, color="grey", linewidth=0.8, linestyle=":")
    range_ax.set_xlabel("log2 of the magnitude")
    range_ax.set_title("Range: what each format can hold")
    range_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False,
                    fontsize=8)
    fig.tight_layout()
    return fig


def draw_loss_scaling(magnitudes: Sequence[float], scale: float, ax: Any = None) -> Any:
    """Lesson 08: gradient magnitudes on a log2 axis, before and after loss scaling.

    The float16 limits are drawn: values left of its smallest subnormal become 0, values
    between it and the smallest normal keep only a few bits. Zeros in ``magnitudes`` are left out.
    """
    import numpy as np

    from course_utils.mixed_precision import number_format

    values = np.abs(np.asarray(magnitudes, dtype=np.float64).ravel())
    values = values[values > 0]
    if values.size == 0 or scale <= 0:
        raise ValueError("need some non-zero magnitudes and a positive scale")
    ax = _axes(ax, (8.0, 3.0))
    logs = np.log2(values)
    shift = np.log2(scale)
    low, high = min(logs.min(), -25.0), max(logs.max() + shift, 17.0)
    bins = np.arange(np.floor(low), np.ceil(high) + 1)
    ax.hist(logs, bins=bins, color=PALETTE[0], alpha=0.7, label="gradients")
    ax.hist(logs + shift, bins=bins, color=PALETTE[1], alpha=0.7,
            label=f"gradients × loss scale 2^{shift:.0f}")
    half = number_format("float16")
    for value, text in ((half.smallest_subnormal, "float16: below this, 0"),
                        (half.smallest_normal, "float16: smallest normal"),
                        (half.max, "float16: above this, inf")):
        ax.axvline(np.log2(value), color=PALETTE[3], linestyle="--", linewidth=1)
        ax.annotate(text, (np.log2(value), ax.get_ylim()[1] * 0.92), rotation=90,
                    ha="right", va="top", fontsize=8, color=PALETTE[3])
    ax.set_xlabel("log2 of the gradient's magnitude")
    ax.set_ylabel("count")
    ax.set_title("Loss scaling shifts small gradients into float16's range")
    ax.legend(frameon=False, fontsize=8, loc="upper right")
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


def draw_mixed_precision_step(ax: Any = None) -> Any:
    """Lesson 08: one mixed-precision training step with loss scaling, as a flow of boxes.

    float32 weights are cast to float16 for the forward and backward passes; the loss is
    computed in float32 and multiplied by the scale; the gradients are divided by it in float32
    and, when finite, update the float32 weights – otherwise the step is skipped.
    """
    ax = _axes(ax, (11.0, 3.2))
    boxes = [  # (x, y, text, colour): float32 in blue, float16 in orange
        (0.07, 0.72, "weights\nfloat32", PALETTE[0]),
        (0.27, 0.72, "cast\nto float16", PALETTE[1]),
        (0.47, 0.72, "forward\nfloat16", PALETTE[1]),
        (0.67, 0.72, "logits, loss\nfloat32", PALETTE[0]),
        (0.88, 0.72, "loss × scale\nfloat32", PALETTE[0]),
        (0.88, 0.22, "backward\nfloat16", PALETTE[1]),
        (0.65, 0.22, "gradients ÷ scale\nfloat32", PALETTE[0]),
        (0.40, 0.22, "all finite?", PALETTE[7]),
        (0.13, 0.22, "yes: update weights\nno: skip, scale ÷ 2", PALETTE[2]),
    ]
    for x, y, text, color in boxes:
        ax.annotate(text, (x, y), ha="center", va="center", fontsize=9,
                    color="white" if color != PALETTE[6] else "black",
                    bbox={"boxstyle": "round,pad=0.5", "facecolor": color, "edgecolor": color})
    arrow = {"arrowstyle": "->", "color": "grey", "lw": 1.5}
    for (x0, y0, *_), (x1, y1, *_) in zip(boxes[:-1], boxes[1:], strict=True):
        if y0 == y1:
            x0, x1 = (x0 + 0.07, x1 - 0.07) if x1 > x0 else (x0 - 0.08, x1 + 0.08)
        else:
            y0, y1 = y0 - 0.12, y1 + 0.12
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=arrow)
    ax.annotate("", (0.07, 0.60), (0.07, 0.34), arrowprops=arrow)  # the update, back to weights
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    ax.set_title("A mixed-precision step: float16 where it is fast, float32 where it must be exact"
                 " (blue float32, orange float16)", fontsize=10)
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


# ----------------------------------------------------------------------------- lesson 02 diagram


def draw_data_parallelism(num_replicas: int = 4, ax: Any = None) -> Any:
    """Draw one step of data parallelism: the global batch split over ``num_replicas`` replicas,
    each computing its gradient, one all-reduce summing them, and the same update everywhere
    (a diagram, not a measurement)."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    ax = _axes(ax, (10.0, 1.0 + 0.9 * num_replicas))
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


def draw_multi_worker(num_workers: int = 2, ax: Any = None) -> Any:
    """Diagram: workers (one process each, own TF_CONFIG) on a ring all-reduce; the chief saves."""
    import math

    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    ax = _axes(ax, (7.5, 3.6))
    radius = 1.5 if num_workers > 1 else 0.0
    centres = [(radius * math.cos(math.pi / 2 + 2 * math.pi * i / num_workers),
                radius * math.sin(math.pi / 2 + 2 * math.pi * i / num_workers))
               for i in range(num_workers)]
    for index, (x, y) in enumerate(centres):
        color = PALETTE[0] if index == 0 else PALETTE[5]
        ax.add_patch(FancyBboxPatch((x - 0.95, y - 0.38), 1.9, 0.76, boxstyle="round,pad=0.02",
                                    facecolor=color, edgecolor="black", linewidth=0.8,
                                    alpha=0.85))
        role = "chief: saves checkpoints" if index == 0 else "writes to a scratch dir"
        ax.text(x, y + 0.12, f"worker {index} (process)", ha="center", fontsize=8)
        ax.text(x, y - 0.15, f'TF_CONFIG task {{"worker", {index}}}\n{role}', ha="center",
                va="center", fontsize=6.5)
    for index in range(num_workers if num_workers > 1 else 0):
        start, end = centres[index], centres[(index + 1) % num_workers]
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                     connectionstyle="arc3,rad=0.35", color=PALETTE[3],
                                     linewidth=1.2, shrinkA=28, shrinkB=28))
    ax.text(0, 0, "ring all-reduce\nof gradients\n(every step)", ha="center", va="center",
            fontsize=8, color=PALETTE[3])
    ax.text(0, -2.35, "every worker: same script, same model, its shard of each global batch",
            ha="center", fontsize=8)
    ax.set_xlim(-3.2, 3.2)
    ax.set_ylim(-2.6, 2.3)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.set_title("MultiWorkerMirroredStrategy", fontsize=10)
    return ax


def draw_parameter_server(num_workers: int = 3, num_ps: int = 2, ax: Any = None) -> Any:
    """Lesson 04: a coordinator schedules steps on workers, which read and update parameter servers.

    Every worker pulls the variables from the parameter servers, computes a gradient on its own
    batches and pushes an update, on its own clock: the updates are asynchronous.
    """
    ax = _axes(ax, (10.0, 4.2))
    style = {"ha": "center", "va": "center", "fontsize": 9, "color": "white"}

    def box(x: float, y: float, text: str, color: str) -> None:
        ax.annotate(text, (x, y), **style,
                    bbox={"boxstyle": "round,pad=0.5", "facecolor": color, "edgecolor": color})

    box(0.5, 0.88, "coordinator (this Python process)\nschedule · join · fetch", PALETTE[7])
    workers = [(i + 0.5) / num_workers for i in range(num_workers)]
    servers = [(i + 0.5) / num_ps for i in range(num_ps)]
    for i, x in enumerate(workers):
        box(x, 0.52, f"worker {i}\nforward, backward\non its own batches", PALETTE[0])
        ax.annotate("", (x, 0.62), (0.5, 0.80),
                    arrowprops={"arrowstyle": "->", "color": "grey", "lw": 1.2})
        for xs in servers:
            ax.annotate("", (xs - 0.02, 0.21), (x - 0.02, 0.42),
                        arrowprops={"arrowstyle": "->", "color": PALETTE[3], "lw": 1.0})
            ax.annotate("", (x + 0.02, 0.42), (xs + 0.02, 0.21),
                        arrowprops={"arrowstyle": "->", "color": PALETTE[2], "lw": 1.0})
    for i, x in enumerate(servers):
        box(x, 0.12, f"parameter server {i}\nholds variables (or shards)", PALETTE[1])
    ax.text(0.5, 0.70, "closures: each step runs on whichever worker is free", ha="center",
            fontsize=8, color="grey")
    ax.text(0.01, 0.30, "green: read variables\nred: push updates\n(no barrier: asynchronous)",
            fontsize=8, va="center")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    ax.set_title("Parameter-server training: coordinator → workers ↔ parameter servers",
                 fontsize=10)
    return ax


def draw_tpu_host_loop(steps: int = 8, steps_per_execution: int = 4) -> Any:
    """Lesson 05: host ↔ TPU round-trips for ``steps`` steps, one step per call (top) and
    ``steps_per_execution`` steps per call (bottom): each call is a launch and a wait."""
    import matplotlib.pyplot as plt

    if steps < 1 or steps_per_execution < 1:
        raise ValueError("steps and steps_per_execution must be at least 1")
    fig, axes = plt.subplots(2, 1, figsize=(11.0, 3.6), sharex=True)
    overhead, step = 0.6, 1.0
    for ax, per_call in zip(axes, (1, steps_per_execution), strict=True):
        t, calls = 0.0, 0
        for first in range(0, steps, per_call):
            in_call = min(per_call, steps - first)
            ax.broken_barh([(t, overhead)], (1.1, 0.8), color=PALETTE[1])  # host: launch, wait
            t += overhead
            for k in range(in_call):
                ax.broken_barh([(t + k * step, step * 0.95)], (0.1, 0.8), color=PALETTE[0])
                ax.text(t + k * step + step / 2, 0.5, str(first + k + 1), ha="center",
                        va="center", color="white", fontsize=8)
            ax.annotate("", (t, 0.9), (t - overhead / 2, 1.1),
                        arrowprops={"arrowstyle": "->", "color": "grey"})
            t += in_call * step
            calls += 1
        ax.set_yticks([0.5, 1.5], ["TPU", "host"])
        ax.set_ylim(0, 2)
        ax.set_title(f"steps_per_execution={per_call}: {calls} round-trips for {steps} steps, "
                     f"{t:.1f} time units", fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel("time (orange: the host launches a call and waits for its result; "
                        "blue: training steps on the TPU)")
    fig.tight_layout()
    return axes


def draw_pipeline_schedule(num_stages: int = 4, num_micro_batches: int = 4,
                           ax: Any = None) -> Any:
    """Diagram: the GPipe schedule, one row per stage, F then B, bubbles grey."""
    from matplotlib.patches import Rectangle

    from course_utils.parallel.pipeline import bubble_fraction, gpipe_schedule

    tasks = gpipe_schedule(num_stages, num_micro_batches)
    slots = max(task.slot for task in tasks) + 1
    ax = _axes(ax, (min(14.0, 1.5 + 0.45 * slots), 0.8 + 0.5 * num_stages))
    busy = {(task.stage, task.slot) for task in tasks}
    for stage in range(num_stages):
        for slot in range(slots):
            if (stage, slot) not in busy:
                ax.add_patch(Rectangle((slot, stage), 1, 1, facecolor="#dddddd",
                                       edgecolor="white"))
    for task in tasks:
        color = PALETTE[0] if task.phase == "F" else PALETTE[1]
        ax.add_patch(Rectangle((task.slot, task.stage), 1, 1, facecolor=color,
                               edgecolor="white"))
        ax.text(task.slot + 0.5, task.stage + 0.5, f"{task.phase}{task.micro_batch + 1}",
                ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, slots)
    ax.set_ylim(num_stages, 0)
    ax.set_yticks([s + 0.5 for s in range(num_stages)],
                  [f"stage {s} (device {s})" for s in range(num_stages)])
    ax.set_xlabel("time slot")
    ax.set_title(f"GPipe: {num_stages} stages × {num_micro_batches} micro-batches; grey = bubble "
                 f"(K−1)/(M+K−1) = {bubble_fraction(num_stages, num_micro_batches):.0%}",
                 fontsize=10)
    return ax


def draw_model_split(num_layers: int = 4, cut: int = 2, ax: Any = None) -> Any:
    """Diagram: a chain of layers cut in two, each part on its device, activations crossing over."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    if not 0 < cut < num_layers:
        raise ValueError(f"cut must be between 1 and num_layers - 1, got {cut}")
    ax = _axes(ax, (1.6 + 1.3 * num_layers, 2.4))
    for part, (first, last) in enumerate([(0, cut), (cut, num_layers)]):
        ax.add_patch(Rectangle((first * 1.3 - 0.1, -0.1), (last - first) * 1.3 - 0.1, 1.2,
                               facecolor=PALETTE[5 if part else 2], alpha=0.25, edgecolor="grey"))
        ax.text((first + last) * 0.65 - 0.15, 1.2, f"CPU:{part}: its layers' weights,\n"
                "gradients and optimizer slots", ha="center", fontsize=8)
    for index in range(num_layers):
        ax.add_patch(Rectangle((index * 1.3 + 0.1, 0.3), 0.9, 0.5, facecolor=PALETTE[0],
                               edgecolor="black", linewidth=0.8))
        ax.text(index * 1.3 + 0.55, 0.55, f"layer {index}", ha="center", va="center",
                fontsize=8, color="white")
        if index < num_layers - 1:
            crossing = index == cut - 1
            ax.add_patch(FancyArrowPatch((index * 1.3 + 1.0, 0.62), (index * 1.3 + 1.4, 0.62),
                                         arrowstyle="-|>", mutation_scale=10,
                                         color=PALETTE[3] if crossing else "black"))
            ax.add_patch(FancyArrowPatch((index * 1.3 + 1.4, 0.45), (index * 1.3 + 1.0, 0.45),
                                         arrowstyle="-|>", mutation_scale=10,
                                         color=PALETTE[3] if crossing else "grey"))
    ax.text(cut * 1.3 - 0.15, -0.35, "activations →   ← their gradients (device to device)",
            ha="center", fontsize=8, color=PALETTE[3])
    ax.set_xlim(-0.3, num_layers * 1.3 + 0.1)
    ax.set_ylim(-0.5, 1.7)
    ax.set_axis_off()
    ax.set_title("Manual placement: one model, two devices, one busy at a time", fontsize=10)
    return ax


def draw_sharded_dense(by: str = "columns", num_devices: int = 4, ax: Any = None) -> Any:
    """Diagram: y = x·W with W split by columns or rows across devices, and the communication."""
    from matplotlib.patches import Rectangle

    if by not in ("columns", "rows"):
        raise ValueError(f"by must be 'columns' or 'rows', got {by!r}")
    n = num_devices
    ax = _axes(ax, (8.0, 2.8))

    def matrix(x0: float, width: float, height: float, label: str, split: str | None) -> None:
        for part in range(n):
            if split == "columns":
                box = (x0 + part * width / n, 0.0, width / n, height)
            elif split == "rows":
                box = (x0, height - (part + 1) * height / n, width, height / n)
            else:
                box = (x0, 0.0, width, height) if part == 0 else None
            if box:
                color = PALETTE[part % len(PALETTE)] if split else "#dddddd"
                ax.add_patch(Rectangle(box[:2], box[2], box[3], facecolor=color, alpha=0.7,
                                       edgecolor="black", linewidth=0.6))
        ax.text(x0 + width / 2, height + 0.1, label, ha="center", fontsize=9)

    x_split = "columns" if by == "rows" else None
    matrix(0.0, 1.6, 1.0, "x (batch × in)\n" + ("split by features" if x_split else
                                                "whole on every device"), x_split)
    ax.text(1.9, 0.5, "·", fontsize=18, ha="center", va="center")
    matrix(2.2, 1.6, 1.6, f"W (in × out), split by {by}", by)
    ax.text(4.1, 0.5, "=", fontsize=14, ha="center", va="center")
    matrix(4.4, 1.6, 1.0, "y (batch × out)", "columns" if by == "columns" else None)
    note = ("each device: its columns of y;\nno communication (all-gather\nif y is needed whole)"
            if by == "columns" else
            "each device: a partial sum of all of y;\nall-reduce (sum) across devices")
    ax.text(6.2, 0.5, note, fontsize=8, va="center")
    ax.set_xlim(-0.1, 8.4)
    ax.set_ylim(-0.2, 2.0)
    ax.set_axis_off()
    ax.set_title(f"Tensor parallelism: a dense kernel split by {by} over {n} devices",
                 fontsize=10)
    return ax
