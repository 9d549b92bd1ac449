"""Diagrams of lesson 05: a TPU host and chip (cores, MXUs, HBM), and padding to 8×128 tiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = ["draw_tile_padding", "draw_tpu_system"]


def _box(ax: Any, x: float, y: float, width: float, height: float, color: str, label: str = "",
         text_color: str = "white", fontsize: int = 8, alpha: float = 1.0) -> None:
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), width, height, facecolor=color, edgecolor="white",
                           alpha=alpha))
    if label:
        ax.text(x + width / 2, y + height / 2, label, ha="center", va="center",
                color=text_color, fontsize=fontsize)


def draw_tpu_system(chip: str = "v5e", ax: Any = None) -> Any:
    """Lesson 05: the host (a CPU machine running Python and tf.data) beside one TPU chip of
    generation ``chip`` (``cu.tpu.TPU_CHIPS``): its TensorCores, each with its MXUs and a vector
    unit, and the chip's high-bandwidth memory. Each TensorCore is one replica where the chip has
    a device per core; where its cores form one device (megacore) the chip is one replica."""
    from course_utils.tpu import TPU_CHIPS

    if chip not in TPU_CHIPS:
        raise ValueError(f"chip must be one of {sorted(TPU_CHIPS)}, got {chip!r}")
    spec = TPU_CHIPS[chip]
    ax = axes_for(ax, (11.0, 3.8))
    _box(ax, 0.0, 0.15, 0.24, 0.7, PALETTE[1], "")
    ax.text(0.12, 0.78, "host (CPU machine)", ha="center", fontsize=9, color="white")
    for row, line in enumerate(("runs Python", "reads and batches data (tf.data)",
                                "launches compiled programs", "runs ops XLA cannot compile")):
        ax.text(0.12, 0.64 - row * 0.12, line, ha="center", fontsize=8, color="white")
    ax.annotate("", (0.31, 0.5), (0.245, 0.5),
                arrowprops={"arrowstyle": "<->", "color": "grey", "linewidth": 1.5})
    ax.text(0.277, 0.56, "host\nlink", ha="center", fontsize=8, color="grey")
    chip_left, chip_width = 0.32, 0.67
    _box(ax, chip_left, 0.02, chip_width, 0.96, "#DDDDDD", "")
    ax.text(chip_left + 0.01, 0.92, f"TPU {spec.name} chip", fontsize=9, va="center")
    if spec.tensor_cores > spec.devices_per_chip:
        ax.text(chip_left + chip_width / 2, 0.92,
                f"{spec.tensor_cores} TensorCores = 1 replica (megacore: JAX's account)",
                fontsize=9, va="center", ha="center")
    _box(ax, chip_left + 0.02, 0.06, chip_width - 0.04, 0.12, PALETTE[5],
         f"HBM: {spec.hbm_gb} {spec.hbm_unit} (weights, activations, the batch)", fontsize=8)
    core_width = (chip_width - 0.04 - 0.02 * (spec.tensor_cores - 1)) / spec.tensor_cores
    cores_per_device = spec.tensor_cores // spec.devices_per_chip
    core_label = "TensorCore {core} (one replica)" if cores_per_device == 1 else "TensorCore {core}"
    for core in range(spec.tensor_cores):
        left = chip_left + 0.02 + core * (core_width + 0.02)
        _box(ax, left, 0.22, core_width, 0.64, PALETTE[0], "")
        ax.text(left + core_width / 2, 0.81, core_label.format(core=core), ha="center",
                fontsize=8, color="white")
        columns = min(spec.mxus_per_core, 4)
        rows = math.ceil(spec.mxus_per_core / columns)
        mxu_width = (core_width - 0.02 * (columns + 1)) / columns
        mxu_height = 0.36 / rows
        for mxu in range(spec.mxus_per_core):
            x = left + 0.02 + (mxu % columns) * (mxu_width + 0.02)
            y = 0.38 + (rows - 1 - mxu // columns) * mxu_height
            _box(ax, x, y, mxu_width, mxu_height * 0.9, PALETTE[2],
                 f"MXU\n{spec.mxu_size}×{spec.mxu_size}", fontsize=7)
        _box(ax, left + 0.02, 0.25, core_width - 0.04, 0.1, PALETTE[4],
             "vector + scalar units", fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    ax.set_title(f"A host and one TPU {spec.name} chip: {spec.tensor_cores} TensorCore(s) × "
                 f"{spec.mxus_per_core} MXUs of {spec.mxu_size}×{spec.mxu_size} "
                 "multiply-accumulates", fontsize=10)
    return ax


def draw_tile_padding(shape: Sequence[int], tile: tuple[int, int] = (8, 128),
                      ax: Any = None) -> Any:
    """Lesson 05: an array of ``shape`` (rows × columns) laid out in ``tile``-sized tiles: the
    data (dark), the padding the TPU computes and throws away (hatched), the tile borders."""
    from course_utils.tpu import padded_fraction

    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be two positive sizes (rows, columns), got {shape!r}")
    rows, cols = shape
    padded_rows = math.ceil(rows / tile[0]) * tile[0]
    padded_cols = math.ceil(cols / tile[1]) * tile[1]
    ax = axes_for(ax, (8.0, 3.6))
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((0, 0), padded_cols, padded_rows, facecolor="white",
                           edgecolor=PALETTE[3], hatch="///", label="padding"))
    ax.add_patch(Rectangle((0, padded_rows - rows), cols, rows, facecolor=PALETTE[0],
                           label="data"))
    for x in range(0, padded_cols + 1, tile[1]):
        ax.axvline(x, color="grey", linewidth=0.8)
    for y in range(0, padded_rows + 1, tile[0]):
        ax.axhline(y, color="grey", linewidth=0.3)
    ax.set_xlim(0, padded_cols)
    ax.set_ylim(0, padded_rows)
    ax.set_xlabel(f"columns (lanes): {cols} padded to {padded_cols}")
    ax.set_ylabel(f"rows: {rows} padded to {padded_rows}")
    ax.set_title(f"{rows} × {cols} in {tile[0]} × {tile[1]} tiles: "
                 f"{padded_fraction((rows, cols), tile):.0%} of the work is padding", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    return ax
