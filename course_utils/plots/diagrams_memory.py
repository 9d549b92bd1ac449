"""Lesson 07's drawings: accumulation on every replica with one all-reduce per update, the
memory budget of one training step split into its terms, and what recomputation keeps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = ["draw_accumulation_on_replicas", "draw_memory_budget", "draw_recomputation"]


def draw_accumulation_on_replicas(num_replicas: int = 2, accumulation_steps: int = 4,
                                  ax: Any = None) -> Any:
    """Diagram: each replica runs k micro-batches and adds their gradients locally; one
    all-reduce per update joins the replicas' sums, then every replica applies the same update."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    if num_replicas < 1 or accumulation_steps < 1:
        raise ValueError(f"num_replicas and accumulation_steps must be at least 1, got "
                         f"{num_replicas} and {accumulation_steps}")
    n, k = num_replicas, accumulation_steps
    ax = axes_for(ax, (1.6 + 1.0 * k + 3.0, 0.9 + 0.8 * n))
    for replica in range(n):
        y = n - 1 - replica
        ax.text(-0.1, y, f"replica {replica + 1}", ha="right", va="center", fontsize=8)
        for step in range(k):
            ax.add_patch(Rectangle((step, y - 0.3), 0.9, 0.6, facecolor=PALETTE[5],
                                   edgecolor="black", linewidth=0.6))
            ax.text(step + 0.45, y, f"μ{step + 1}\n+= g", ha="center", va="center", fontsize=7)
        ax.add_patch(Rectangle((k + 1.4, y - 0.3), 1.3, 0.6, facecolor=PALETTE[0],
                               edgecolor="black", linewidth=0.6, alpha=0.85))
        ax.text(k + 2.05, y, "apply", ha="center", va="center", fontsize=8, color="white")
    ax.add_patch(FancyBboxPatch((k + 0.15, -0.4), 1.0, n - 0.2, boxstyle="round,pad=0.05",
                                facecolor=PALETTE[1], edgecolor="black", linewidth=0.8))
    ax.text(k + 0.65, (n - 1) / 2, "all-\nreduce\n×1", ha="center", va="center", fontsize=8)
    ax.text((k + 2.7) / 2, n - 0.35, f"{k} micro-batches per replica, no communication; one "
            f"all-reduce per update (not {k})", ha="center", va="bottom", fontsize=8)
    ax.set_xlim(-1.4, k + 3.0)
    ax.set_ylim(-0.6, n + 0.1)
    ax.set_axis_off()
    ax.set_title("Accumulation under a data-parallel strategy", fontsize=10)
    return ax


def draw_memory_budget(terms: Mapping[str, Mapping[str, float]], unit: str = "MiB",
                       ax: Any = None) -> Any:
    """Stacked horizontal bars: one bar per set-up (``terms[set_up][term] = size``), one colour
    per term (parameters, gradients, optimizer slots, activations), so a shrunken term shows."""
    if not terms:
        raise ValueError("terms is empty: give at least one set-up")
    names = list(terms)
    kinds = list(dict.fromkeys(kind for sizes in terms.values() for kind in sizes))
    ax = axes_for(ax, (8.0, 0.9 + 0.45 * len(names)))
    for row, name in enumerate(reversed(names)):
        left = 0.0
        for index, kind in enumerate(kinds):
            size = float(terms[name].get(kind, 0.0))
            ax.barh(row, size, left=left, color=PALETTE[index % len(PALETTE)],
                    edgecolor="white", label=kind if row == 0 else None)
            left += size
    ax.set_yticks(range(len(names)), list(reversed(names)), fontsize=8)
    ax.set_xlabel(unit)
    ax.legend(fontsize=8, ncols=len(kinds), loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    ax.set_title("Memory of one training step, term by term", fontsize=10, pad=22)
    return ax


def draw_recomputation(blocks: int = 3, depth: int = 4, ax: Any = None) -> Any:
    """Diagram: one box per layer output, ``blocks`` blocks of ``depth`` layers, in three rows.

    Row 1, plain: the forward pass keeps every output. Row 2, ``tf.recompute_grad`` per block:
    the forward pass keeps only each block's input (dark), the rest is dropped (white). Row 3,
    the backward pass at the last block: it runs that block's forward again from the kept input
    (hatched), so at most one block's inside is alive beside the kept inputs.
    """
    from matplotlib.patches import Rectangle

    if blocks < 1 or depth < 1:
        raise ValueError(f"blocks and depth must be at least 1, got {blocks} and {depth}")
    width = blocks * depth
    ax = axes_for(ax, (1.8 + 0.45 * width, 2.9))
    kept, dropped, again = PALETTE[0], "white", PALETTE[1]
    rows = [("plain forward:\nkeeps every output", lambda b, i: (kept, "")),
            ("recomputed forward:\nkeeps block inputs",
             lambda b, i: (kept if i == 0 else dropped, "")),
            (f"backward at block {blocks}:\nits forward again",
             lambda b, i: (kept if i == 0 else (again if b == blocks - 1 else dropped),
                           "//" if b == blocks - 1 and i else ""))]
    for row, (label, style) in enumerate(rows):
        y = 2 - row
        ax.text(-0.3, y, label, ha="right", va="center", fontsize=8)
        for b in range(blocks):
            for i in range(depth):
                colour, hatch = style(b, i)
                x = b * (depth + 0.5) + i
                ax.add_patch(Rectangle((x, y - 0.3), 0.85, 0.6, facecolor=colour, hatch=hatch,
                                       edgecolor="black", linewidth=0.6))
    for b in range(blocks):
        ax.text(b * (depth + 0.5) + depth / 2 - 0.1, 2.45, f"block {b + 1}", ha="center",
                va="bottom", fontsize=8)
    right = blocks * (depth + 0.5)
    ax.add_patch(Rectangle((0, -0.95), 0.5, 0.3, facecolor=kept, edgecolor="black"))
    ax.text(0.6, -0.8, "kept for the backward pass", va="center", fontsize=8)
    ax.add_patch(Rectangle((right / 2, -0.95), 0.5, 0.3, facecolor=again, hatch="//",
                           edgecolor="black"))
    ax.text(right / 2 + 0.6, -0.8, "computed again, then freed", va="center", fontsize=8)
    ax.set_xlim(-4.2, right)
    ax.set_ylim(-1.1, 2.9)
    ax.set_axis_off()
    ax.set_title("Recomputation: keep block inputs, run each block's forward again", fontsize=10)
    return ax
