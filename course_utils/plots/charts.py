"""Measurement charts: throughput bars, time breakdowns, scaling curves, lines, epoch orders."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = [
    "bar_chart",
    "time_breakdown",
    "scaling_curve",
    "line_chart",
    "line_charts",
    "epoch_orders",
    "grouped_bars",
]


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
    ax = axes_for(ax, (max(4.0, 1.3 * len(values)), 3.2))
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
    ax = axes_for(ax, (8.0, 2.2))
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
    ax = axes_for(ax, (4.5, 3.2))
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
    ax = axes_for(ax, (5.5, 3.2))
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

def line_charts(
    panels: Mapping[str, Mapping[str, Sequence[float]]], xlabel: str = "", ylabel: str = "",
) -> Any:
    """Line charts side by side, one per titled panel of named curves, sharing the y axis.

    Returns the panels' ``Axes``; a curve keeps its colour in every panel it appears in.
    """
    if not panels or not all(panels.values()):
        raise ValueError("nothing to plot")
    import matplotlib.pyplot as plt

    _, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.4), sharey=True,
                           squeeze=False)
    names = list(dict.fromkeys(name for series in panels.values() for name in series))
    for ax, (title, series) in zip(axes[0], panels.items(), strict=True):
        for name, values in series.items():
            ax.plot(range(len(values)), list(values), label=name,
                    color=PALETTE[names.index(name) % len(PALETTE)])
        ax.set(title=title, xlabel=xlabel)
        ax.legend(frameon=False, fontsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0][0].set_ylabel(ylabel)
    return axes[0]


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


def grouped_bars(
    values: Mapping[str, Mapping[str, float]],
    ranges: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
    title: str = "", ylabel: str = "", xlabel: str = "", ax: Any = None,
) -> Any:
    """Bars in groups: ``values[group][bar]``, one colour per bar name, each labelled with its
    value; ``ranges[group][bar] = (low, high)`` draws a line over a bar (e.g. the repetitions)."""
    if not values:
        raise ValueError("nothing to plot")
    bars = list(dict.fromkeys(bar for group in values.values() for bar in group))
    groups = list(values)
    width = 0.8 / len(bars)
    ax = axes_for(ax, (max(5.0, 1.2 * len(groups) * len(bars) ** 0.5 + 2), 3.4))
    top = 0.0
    for index, bar in enumerate(bars):
        xs = [g + (index - (len(bars) - 1) / 2) * width for g in range(len(groups))]
        heights = [values[group].get(bar, 0.0) for group in groups]
        ax.bar(xs, heights, width=width * 0.95, color=PALETTE[index % len(PALETTE)], label=bar)
        for x, group, height in zip(xs, groups, heights, strict=True):
            low, high = (ranges or {}).get(group, {}).get(bar, (height, height))
            if high > low:
                ax.plot([x, x], [low, high], color="black", linewidth=1.2)
            ax.annotate(f"{height:,.0f}", (x, max(height, high)), ha="center", va="bottom",
                        fontsize=7)
            top = max(top, height, high)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, top * 1.2 or 1.0)
    ax.set(title=title, ylabel=ylabel, xlabel=xlabel)
    ax.legend(frameon=False, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    return ax
