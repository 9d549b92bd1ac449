"""Diagrams of lessons 06-07: a model split over devices, pipeline schedules (planned and as
measured), a sharded layer, ZeRO's sharded state, gradient accumulation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = [
    "draw_model_split",
    "draw_pipeline_events",
    "draw_pipeline_schedule",
    "draw_zero_stages",
    "draw_sharded_dense",
    "draw_gradient_accumulation",
]


def draw_model_split(num_layers: int = 4, cut: int = 2, ax: Any = None,
                     layer_names: Sequence[str] | None = None,
                     device_names: Sequence[str] = ("CPU:0", "CPU:1")) -> Any:
    """Diagram: a chain of layers cut in two, each part on its device, activations crossing over."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    if not 0 < cut < num_layers:
        raise ValueError(f"cut must be between 1 and num_layers - 1, got {cut}")
    names = list(layer_names) if layer_names else [f"layer {i}" for i in range(num_layers)]
    if len(names) != num_layers or len(device_names) != 2:
        raise ValueError("give one name per layer and two device names")
    ax = axes_for(ax, (1.6 + 1.3 * num_layers, 2.4))
    for part, (first, last) in enumerate([(0, cut), (cut, num_layers)]):
        ax.add_patch(Rectangle((first * 1.3 - 0.1, -0.1), (last - first) * 1.3 - 0.1, 1.2,
                               facecolor=PALETTE[5 if part else 2], alpha=0.25, edgecolor="grey"))
        ax.text((first + last) * 0.65 - 0.15, 1.2, f"{device_names[part]}: its layers' weights,\n"
                "gradients and optimizer slots", ha="center", fontsize=8)
    for index in range(num_layers):
        ax.add_patch(Rectangle((index * 1.3 + 0.1, 0.3), 0.9, 0.5, facecolor=PALETTE[0],
                               edgecolor="black", linewidth=0.8))
        ax.text(index * 1.3 + 0.55, 0.55, names[index], ha="center", va="center",
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

def draw_pipeline_schedule(num_stages: int = 4, num_micro_batches: int = 4,
                           ax: Any = None, schedule: str = "gpipe", chunks: int = 2,
                           tasks: Sequence[Any] | None = None) -> Any:
    """Diagram: a pipeline schedule, one row per stage, F and B, bubbles grey.

    ``schedule`` is "gpipe", "1f1b" or "interleaved" (1F1B with ``chunks`` model chunks per
    stage: each cell is one chunk's pass, 1/``chunks`` as long, the later chunks paler). Time is
    in whole-stage passes, so schedules drawn one above the other compare. Each row is labelled
    with the most micro-batches whose activations that stage keeps at once. ``tasks`` draws a
    schedule of your own (e.g. ``schedule_from_orders`` of your orders), titled ``schedule``.
    """
    from matplotlib.patches import Rectangle

    from course_utils.parallel.schedules import (
        gpipe_schedule,
        interleaved_schedule,
        one_f_one_b_schedule,
        peak_in_flight,
        schedule_bubble,
    )

    builders = {"gpipe": ("GPipe", gpipe_schedule), "1f1b": ("1F1B", one_f_one_b_schedule),
                "interleaved": (f"Interleaved 1F1B, v = {chunks}",
                                lambda k, m: interleaved_schedule(k, m, chunks))}
    if tasks is not None:
        tasks, name = list(tasks), schedule
        if not tasks:
            raise ValueError("tasks is empty: nothing to draw")
    elif schedule not in builders:
        raise ValueError(f"schedule must be one of {sorted(builders)}, got {schedule!r}")
    else:
        name, build = builders[schedule]
        tasks = build(num_stages, num_micro_batches)
    chunks = max(task.chunk for task in tasks) + 1
    width = 1 / chunks  # a chunk's pass is 1/chunks of a whole stage's pass
    peaks = peak_in_flight(tasks, num_stages)
    slots = max(task.slot for task in tasks) + 1
    ax = axes_for(ax, (min(14.0, 2.5 + 0.45 * slots * width), 0.8 + 0.5 * num_stages))
    busy = {(task.stage, task.slot) for task in tasks}
    for stage in range(num_stages):
        for slot in range(slots):
            if (stage, slot) not in busy:
                ax.add_patch(Rectangle((slot * width, stage), width, 1, facecolor="#dddddd",
                                       edgecolor="white"))
    for task in tasks:
        color = PALETTE[0] if task.phase == "F" else PALETTE[1]
        ax.add_patch(Rectangle((task.slot * width, task.stage), width, 1, facecolor=color,
                               alpha=1.0 - 0.45 * task.chunk / max(chunks - 1, 1),
                               edgecolor="white"))
        ax.text((task.slot + 0.5) * width, task.stage + 0.5, f"{task.phase}{task.micro_batch}",
                ha="center", va="center", fontsize=7 if width == 1 else 5, color="white")
    unit = "chunk" if width < 1 else "micro-batch"
    ax.set_xlim(0, slots * width)
    ax.set_ylim(num_stages, 0)
    ax.set_yticks([s + 0.5 for s in range(num_stages)],
                  [f"stage {s}: keeps ≤ {peaks[s]}" for s in range(num_stages)])
    ax.set_xlabel("time (one stage's pass of a micro-batch = 1)")
    ax.set_title(f"{name}: {num_stages} stages × {num_micro_batches} micro-batches; grey = "
                 f"bubble, {schedule_bubble(tasks, num_stages):.0%} of the cells; "
                 f"keeps = {unit} activations", fontsize=10)
    return ax


def draw_pipeline_events(events: Sequence[Any], num_stages: int, ax: Any = None,
                         title: str = "") -> Any:
    """Timeline of a measured pipeline run: one row per stage, a bar per task from its events.

    ``events`` are ``cu.parallel.Event``s (stage, micro_batch, phase, start, end in seconds);
    time is drawn in milliseconds from the first start. Gaps in a row are that stage's idle time.
    """
    if not events:
        raise ValueError("no events to draw")
    origin = min(e.start for e in events)
    span_ms = (max(e.end for e in events) - origin) * 1e3
    ax = axes_for(ax, (10.0, 0.8 + 0.5 * num_stages))
    for event in events:
        start, width = (event.start - origin) * 1e3, (event.end - event.start) * 1e3
        color = PALETTE[0] if event.phase == "F" else PALETTE[1]
        ax.barh(event.stage + 0.5, width, left=start, height=0.8, color=color,
                edgecolor="white", linewidth=0.5)
        if width > span_ms / 40:
            ax.text(start + width / 2, event.stage + 0.5, f"{event.phase}{event.micro_batch}",
                    ha="center", va="center", fontsize=6, color="white")
    ax.set_xlim(0, span_ms)
    ax.set_ylim(num_stages, 0)
    ax.set_yticks([s + 0.5 for s in range(num_stages)],
                  [f"stage {s}" for s in range(num_stages)])
    ax.set_xlabel("milliseconds since the first task started (measured)")
    ax.set_title(title or "The run as measured: blue forward, orange backward, gaps idle",
                 fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    return ax


def draw_zero_stages(num_replicas: int = 4, ax: Any = None) -> Any:
    """Diagram: what each replica keeps under ZeRO 0-3 (parameters, gradients, optimizer state).

    One block per stage, one column per replica; a full bar is a whole copy, a short coloured bar
    the replica's 1/N shard.
    """
    from matplotlib.patches import Rectangle

    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    n = num_replicas
    parts = [("parameters", 1.0, PALETTE[0]), ("gradients", 1.0, PALETTE[1]),
             ("optimizer state", 2.0, PALETTE[2])]
    ax = axes_for(ax, (11.0, 3.0))
    width = 0.7
    for stage in range(4):
        x0 = stage * (n + 1.2)
        for replica in range(n):
            y = 0.0
            for index, (_name, height, color) in enumerate(parts):
                sharded = {0: stage >= 3, 1: stage >= 2, 2: stage >= 1}[index]
                ax.add_patch(Rectangle((x0 + replica, y), width, height, facecolor="white",
                                       edgecolor=color, linewidth=0.8))
                if sharded:
                    ax.add_patch(Rectangle((x0 + replica, y + replica * height / n), width,
                                           height / n, facecolor=color, edgecolor=color))
                else:
                    ax.add_patch(Rectangle((x0 + replica, y), width, height, facecolor=color,
                                           alpha=0.8, edgecolor=color))
                y += height + 0.1
            ax.text(x0 + replica + width / 2, -0.25, f"r{replica}", ha="center", fontsize=7)
        ax.text(x0 + n / 2 - 0.15, 4.55, f"ZeRO-{stage}", ha="center", fontsize=9,
                fontweight="bold")
        ax.text(x0 + n / 2 - 0.15, 4.3, ["shards nothing", "shards optimizer state",
                                         "+ gradients", "+ parameters"][stage],
                ha="center", fontsize=7)
    for index, (name, _height, color) in enumerate(parts):
        ax.text(4 * (n + 1.2) - 0.3, [0.5, 1.6, 3.2][index], name, color=color, fontsize=8,
                va="center")
    ax.set_xlim(-0.3, 4 * (n + 1.2) + 1.6)
    ax.set_ylim(-0.5, 4.8)
    ax.set_axis_off()
    ax.set_title(f"What each of {n} data-parallel replicas keeps: full bars are copies, short "
                 "bars its 1/N shard", fontsize=10)
    return ax


def draw_sharded_dense(by: str = "columns", num_devices: int = 4, ax: Any = None) -> Any:
    """Diagram: y = x·W with W split by columns or rows across devices, and the communication."""
    from matplotlib.patches import Rectangle

    if by not in ("columns", "rows"):
        raise ValueError(f"by must be 'columns' or 'rows', got {by!r}")
    n = num_devices
    ax = axes_for(ax, (8.0, 2.8))

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

def draw_gradient_accumulation(accumulation_steps: int = 4, ax: Any = None) -> Any:
    """Diagram: k micro-batches, one at a time -> k gradients, summed -> one optimizer update."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be at least 1, got {accumulation_steps}")
    k = accumulation_steps
    ax = axes_for(ax, (8.0, 0.9 + 0.7 * k))
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
