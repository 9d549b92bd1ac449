"""Diagrams of lessons 03-05: a multi-worker cluster, parameter servers, the TPU host loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = [
    "allreduce_cost_chart",
    "draw_failure_paths",
    "draw_multi_worker",
    "draw_replication",
    "draw_parameter_server",
    "draw_tpu_host_loop",
]


def draw_multi_worker(num_workers: int = 2, ax: Any = None) -> Any:
    """Diagram: workers (one process each, own TF_CONFIG) on a ring all-reduce; the chief saves."""
    import math

    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    ax = axes_for(ax, (7.5, 3.6))
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


def draw_replication(num_devices: int = 2, ax: Any = None) -> Any:
    """Lesson 03: in-graph replication (one process, one graph with a copy per device: Mirrored)
    beside between-graph replication (one process and one graph per worker: MultiWorkerMirrored).

    Both are synchronous data parallelism: every step all-reduces the gradients.
    """
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    ax = axes_for(ax, (10.0, 3.8))
    style = {"ha": "center", "va": "center", "fontsize": 8}
    slot = 0.44 / num_devices                     # each worker's share of the right half

    def frame(x: float, w: float, label: str, color: str) -> None:
        from matplotlib.patches import FancyBboxPatch

        ax.add_patch(FancyBboxPatch((x, 0.18), w, 0.62, boxstyle="round,pad=0.01",
                                    facecolor=color, alpha=0.25, edgecolor=color))
        ax.text(x + w / 2, 0.74, label, **style)

    def replica(x: float, label: str) -> None:
        ax.annotate(label, (x, 0.42), **style, color="white",
                    bbox={"boxstyle": "round,pad=0.4", "facecolor": PALETTE[0],
                          "edgecolor": PALETTE[0]})

    frame(0.02, 0.44, "in-graph: 1 process, 1 graph\n(MirroredStrategy)", PALETTE[5])
    for i in range(num_devices):
        replica(0.02 + (i + 0.5) * 0.44 / num_devices, f"replica {i}\ndevice {i}")
    for i in range(num_devices):
        x, width = 0.54 + i * slot + 0.02, slot - 0.04   # a gap: separate processes
        frame(x, width, f"worker {i}: 1 process,\nits own graph", PALETTE[2])
        replica(x + width / 2, f"replica {i}\nits devices")
    for x0, x1 in ((0.02, 0.46), (0.54, 0.98)):
        ax.annotate("", (x1 - 0.02, 0.27), (x0 + 0.02, 0.27),
                    arrowprops={"arrowstyle": "<->", "color": PALETTE[3], "lw": 1.2})
        ax.text((x0 + x1) / 2, 0.22, "all-reduce of gradients, every step", color=PALETTE[3],
                **{**style, "va": "top"})
    ax.text(0.76, 0.08, "between-graph: one process per worker, same script, TF_CONFIG says who",
            **style)
    ax.text(0.24, 0.08, "one Python program drives every device", **style)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 0.9)
    ax.axis("off")
    ax.set_title("Two ways to replicate one synchronous data-parallel step", fontsize=10)
    return ax


def allreduce_cost_chart(
    message_bytes: Sequence[float], seconds: Sequence[float], latency: float,
    seconds_per_byte: float, ax: Any = None,
) -> Any:
    """Lesson 03: measured all-reduce times against message size on log-log axes, with the
    fitted model ``latency + bytes * seconds_per_byte`` and its two terms."""
    import numpy as np

    if len(message_bytes) != len(seconds) or not len(seconds):
        raise ValueError("need one time per message size, and at least one")
    ax = axes_for(ax, (6.0, 3.6))
    sizes = np.asarray(message_bytes, dtype=float)
    grid = np.geomspace(sizes.min(), sizes.max(), 100)
    ax.loglog(sizes, 1e3 * np.asarray(seconds), "o", color=PALETTE[0], label="measured (median)")
    ax.loglog(grid, 1e3 * (latency + grid * seconds_per_byte), color=PALETTE[3],
              label="fit: α + n·β")
    ax.loglog(grid, np.full_like(grid, 1e3 * latency), ":", color="grey", label="α (latency)")
    ax.loglog(grid, 1e3 * grid * seconds_per_byte, "--", color="grey", label="n·β (bandwidth)")
    ax.set_ylim(bottom=0.3 * 1e3 * min(min(seconds), latency))
    ax.set_xlabel("bytes all-reduced (n)")
    ax.set_ylabel("ms")
    ax.set_title("one all-reduce between 2 workers on this machine", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    return ax


def draw_parameter_server(num_workers: int = 3, num_ps: int = 2, ax: Any = None) -> Any:
    """Lesson 04: a coordinator schedules steps on workers, which read and update parameter servers.

    Every worker pulls the variables from the parameter servers, computes a gradient on its own
    batches and pushes an update, on its own clock: the updates are asynchronous.
    """
    ax = axes_for(ax, (10.0, 4.2))
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
    """Lesson 05: Python's calls for ``steps`` steps, one step per call (top) and
    ``steps_per_execution`` steps per call (bottom): each call is a dispatch and a wait
    (illustrative durations)."""
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
        ax.set_yticks([0.5, 1.5], ["TPU", "Python"])
        ax.set_ylim(0, 2)
        ax.set_title(f"steps_per_execution={per_call}: {calls} calls for {steps} steps, "
                     f"{t:.1f} time units (illustrative durations, not measured)", fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel("time (orange: Python calls the function and waits for its result; "
                        "blue: training steps on the TPU)")
    fig.tight_layout()
    return axes


def draw_failure_paths(ax: Any = None) -> Any:
    """Lesson 03: how a survivor learns that worker 1 failed, and what it raises each way."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    ax = axes_for(ax, (8.5, 3.8))
    boxes = {"worker 0": (-2.6, 0.9, PALETTE[0], "worker 0 (survivor)\nin an all-reduce"),
             "worker 1": (2.6, 0.9, PALETTE[5], "worker 1\nkilled, stalled or SIGTERM"),
             "service": (0.0, -1.3, PALETTE[2], "coordination service\n(run by worker 0;\n"
                         "heartbeats of every task)")}
    for x, y, color, label in boxes.values():
        ax.add_patch(FancyBboxPatch((x - 1.25, y - 0.42), 2.5, 0.84, boxstyle="round,pad=0.02",
                                    facecolor=color, edgecolor="black", linewidth=0.8,
                                    alpha=0.85))
        ax.text(x, y, label, ha="center", va="center", fontsize=8)
    paths = [((-1.35, 1.1), (1.35, 1.1), "(killed) its call to the peer's port:\n"
              "Connection refused -> UnavailableError", (0, 1.75)),
             ((1.9, 0.45), (0.6, -0.85), "no heartbeat: 'tasks are unhealthy'\n"
              "-> UnavailableError in every worker", (2.9, -0.55)),
             ((-0.6, -0.85), (-1.9, 0.45), "", (0, 0))]
    for start, end, label, where in paths:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                     color=PALETTE[3], linewidth=1.2))
        if label:
            ax.text(*where, label, ha="center", va="center", fontsize=7.5, color=PALETTE[3])
    ax.text(-2.6, 2.0, "timeout_seconds runs out first:\nDeadlineExceededError", ha="center",
            fontsize=7.5)
    ax.text(-2.9, -0.55, "SIGTERM with a\nPreemptionCheckpointHandler:\nthrough the service, "
            "all\nsave at one step and exit",
            ha="center", va="center", fontsize=7.5)
    ax.set_xlim(-4.3, 4.3)
    ax.set_ylim(-2.0, 2.5)
    ax.set_axis_off()
    ax.set_title("How a survivor learns that a peer failed", fontsize=10)
    return ax
