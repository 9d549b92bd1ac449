"""Diagrams of lesson 08: number formats, loss scaling, a mixed-precision step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = [
    "draw_number_formats",
    "draw_loss_scaling",
    "draw_mixed_precision_step",
]


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

    The float16 limits are drawn: rounding to nearest sends values up to half its smallest
    subnormal (2^-25) to 0 and values from 65520 to inf; values between the smallest subnormal
    and the smallest normal keep only a few bits. Zeros in ``magnitudes`` are left out.
    """
    import numpy as np

    from course_utils.mixed_precision import number_format

    values = np.abs(np.asarray(magnitudes, dtype=np.float64).ravel())
    values = values[values > 0]
    if values.size == 0 or scale <= 0:
        raise ValueError("need some non-zero magnitudes and a positive scale")
    ax = axes_for(ax, (8.0, 3.0))
    logs = np.log2(values)
    shift = np.log2(scale)
    low, high = min(logs.min(), -25.0), max(logs.max() + shift, 17.0)
    bins = np.arange(np.floor(low), np.ceil(high) + 1)
    ax.hist(logs, bins=bins, color=PALETTE[0], alpha=0.7, label="gradients")
    ax.hist(logs + shift, bins=bins, color=PALETTE[1], alpha=0.7,
            label=f"gradients × loss scale 2^{shift:.0f}")
    half = number_format("float16")
    for value, text in ((half.smallest_subnormal, "float16's smallest (half of it: 0)"),
                        (half.smallest_normal, "float16: smallest normal"),
                        (half.max, "float16's largest (from 65520: inf)")):
        ax.axvline(np.log2(value), color=PALETTE[3], linestyle="--", linewidth=1)
        ax.annotate(text, (np.log2(value), ax.get_ylim()[1] * 0.92), rotation=90,
                    ha="right", va="top", fontsize=8, color=PALETTE[3],
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                          "edgecolor": "none", "alpha": 0.85})
    ax.set_xlabel("log2 of the gradient's magnitude")
    ax.set_ylabel("count")
    ax.set_title("Loss scaling shifts small gradients into float16's range")
    ax.legend(frameon=False, fontsize=8, loc="upper right")
    ax.spines[["top", "right"]].set_visible(False)
    return ax

def draw_mixed_precision_step(ax: Any = None) -> Any:
    """Lesson 08: one mixed-precision training step with loss scaling, as a flow of boxes.

    float32 weights are cast to float16 for the forward and backward passes; the loss is
    computed in float32 and multiplied by the scale; the scaled gradients (float32: the
    backward pass casts them back to the variables' dtype) are checked first:
    when all are finite they are divided by the scale and update the float32 weights, otherwise
    the step is skipped and the scale halved (Keras's ``LossScaleOptimizer``).
    """
    ax = axes_for(ax, (11.0, 3.8))
    boxes = [  # (x, y, text, colour): float32 in blue, float16 in orange
        (0.07, 0.72, "weights\nfloat32", PALETTE[0]),
        (0.27, 0.72, "cast\nto float16", PALETTE[1]),
        (0.47, 0.72, "forward\nfloat16", PALETTE[1]),
        (0.67, 0.72, "logits, loss\nfloat32", PALETTE[0]),
        (0.88, 0.72, "loss × scale\nfloat32", PALETTE[0]),
        (0.88, 0.22, "backward\nfloat16", PALETTE[1]),
        (0.62, 0.22, "scaled gradients, float32\n(cast back): all finite?", PALETTE[7]),
        (0.36, 0.22, "yes: ÷ scale\nfloat32", PALETTE[0]),
        (0.11, 0.22, "update weights\nfloat32", PALETTE[2]),
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
    ax.annotate("no: skip the step, scale ÷ 2", (0.62, -0.12), ha="center", va="center",
                fontsize=9, color="white", bbox={"boxstyle": "round,pad=0.5",
                                                  "facecolor": "dimgray", "edgecolor": "dimgray"})
    ax.annotate("", (0.62, -0.03), (0.62, 0.10), arrowprops=arrow)  # not finite
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.25, 1)
    ax.axis("off")
    ax.set_title("A mixed-precision step: float16 in the hidden layers,\n"
                 "float32 where range or precision matter (blue float32, orange float16)",
                 fontsize=10)
    return ax
