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
