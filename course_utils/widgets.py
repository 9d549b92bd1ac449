"""Knobs for the lessons' experiments: ipywidgets front ends on pure functions.

Each ``*_widget`` function returns a ``VBox`` of sliders (or a number box) and an ``HTML`` view;
building it computes the default once and shows it, so a notebook run without a browser (nbval,
``make html``) executes the same code a learner's slider does. Turning a knob recomputes the
pure function behind it (``pipeline_throughput``, ``data_parallel_numbers``,
``gpipe_numbers``, ``accumulation_numbers``, ``precision_neighbours``) and replaces the view's
content.

Only APIs that ipywidgets 7.7 (Colab) and 8 (the course's JupyterLab) share are used:
``IntSlider``, ``FloatLogSlider``, ``FloatText``, ``Checkbox``, ``HTML``, ``VBox``/``HBox`` and
``observe``. The result is an ``HTML`` widget's value, not an ``Output``: classic Notebook's
widgetsnbextension 3.6.7-3.6.10 (3.6.10 is Colab's pin) never draws an ``Output``
("_deserialize_state is not a function"), and an ``HTML`` value needs no kernel to update.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

__all__ = [
    "accumulation_numbers",
    "accumulation_widget",
    "data_parallel_numbers",
    "data_parallel_widget",
    "gpipe_numbers",
    "gpipe_widget",
    "pipeline_throughput",
    "pipeline_widget",
    "precision_neighbours",
    "precision_widget",
    "show_html",
]


def show_html(view: Any, body: str, text: str) -> None:
    """Show one HTML block in an ``ipywidgets.HTML`` view, replacing what it showed; ``text``,
    its plain form, is kept as ``view.plain_text`` (for tests and logs)."""
    view.plain_text = text
    view.value = body


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><td style='padding-right:1em'>{html.escape(name)}</td>"
                    f"<td style='text-align:right'><b>{html.escape(value)}</b></td></tr>"
                    for name, value in rows)
    return f"<table>{cells}</table>"


def _text(rows: list[tuple[str, str]]) -> str:
    return "\n".join(f"{name}: {value}" for name, value in rows)


def _wire(controls: list[Any], output: Any, render: Any) -> Any:
    """Render once now, again on every change of a control; the ``VBox`` of both."""
    import ipywidgets

    def update(_change: Any = None) -> None:
        render(output)

    for control in controls:
        control.style.description_width = "initial"  # whole labels, on 7.7 and 8
        control.observe(update, names="value")
    update()
    return ipywidgets.VBox([*controls, output])


# --- lesson 01: pipeline knobs -------------------------------------------------------------

def pipeline_throughput(
    parallel_calls: int = 1, prefetch: bool = False, cache: bool = False, *,
    num_elements: int = 16, epochs: int = 2, read_s: float = 0.04, step_s: float = 0.01,
    cached_read_s: float = 0.001,
) -> dict[str, float]:
    """Modelled elements per second of a pipeline over ``epochs`` (``cu.plots.pipeline_schedule``).

    ``parallel_calls > 1`` is the ``"parallel map"`` schedule (it runs ahead of the consumer),
    else ``prefetch`` picks ``"prefetch"`` over ``"sequential"``; with ``cache`` every epoch after
    the first reads at ``cached_read_s`` instead of ``read_s``. Returns the throughput, the
    total time, and the ideal (the training step alone).
    """
    from course_utils.plots import pipeline_schedule

    if parallel_calls < 1 or epochs < 1:
        raise ValueError("parallel_calls and epochs must be >= 1")
    mode = ("parallel map" if parallel_calls > 1 else "prefetch" if prefetch else "sequential")
    total = 0.0
    for epoch in range(epochs):
        produce_s = cached_read_s if cache and epoch > 0 else read_s
        schedule = pipeline_schedule(mode, num_elements, produce_s, step_s, parallel_calls)
        total += max(end for *_, end in schedule)
    elements = num_elements * epochs
    return {"mode": mode, "seconds": total, "elements_per_s": elements / total,
            "ideal_elements_per_s": 1.0 / step_s}


def pipeline_widget(read_s: float = 0.04, step_s: float = 0.01) -> Any:
    """Parallel calls, prefetch and cache → modelled throughput bar against the ideal."""
    import ipywidgets

    calls = ipywidgets.IntSlider(value=1, min=1, max=8, description="parallel calls")
    prefetch = ipywidgets.Checkbox(value=False, description="prefetch")
    cache = ipywidgets.Checkbox(value=False, description="cache")
    output = ipywidgets.HTML()

    def render(out: Any) -> None:
        result = pipeline_throughput(calls.value, prefetch.value, cache.value,
                                     read_s=read_s, step_s=step_s)
        share = result["elements_per_s"] / result["ideal_elements_per_s"]
        rows = [("schedule", result["mode"]),
                ("throughput", f"{result['elements_per_s']:.0f} elements/s"),
                ("ideal (training step alone)", f"{result['ideal_elements_per_s']:.0f} elements/s")]
        bar = (f"<div style='width:300px;border:1px solid #444'><div style='width:"
               f"{300 * min(share, 1.0):.0f}px;height:14px;background:#4c72b0'></div></div>")
        note = (f"<i>modelled, not measured: read {read_s * 1000:.0f} ms per element, training "
                f"step {step_s * 1000:.0f} ms, two epochs (cu.plots.pipeline_schedule)</i>")
        show_html(out, _table(rows) + bar + note, _text(rows) + f"\n{share:.0%} of the ideal")

    return _wire([calls, prefetch, cache], output, render)


# --- lesson 02: data parallelism -----------------------------------------------------------

def data_parallel_numbers(
    replicas: int, per_replica_batch: int, base_learning_rate: float = 1e-3,
    examples: int = 60_000,
) -> dict[str, float]:
    """Global batch, the linearly (SGD) and √N (Adam) scaled learning rates, and the steps
    per epoch with ``drop_remainder=True`` (the short last batch dropped)."""
    if replicas < 1 or per_replica_batch < 1 or examples < 1:
        raise ValueError("replicas, per_replica_batch and examples must be >= 1")
    global_batch = replicas * per_replica_batch
    return {"global_batch": global_batch,
            "lr_linear": base_learning_rate * replicas,
            "lr_sqrt": base_learning_rate * math.sqrt(replicas),
            "steps_per_epoch": examples // global_batch}


def data_parallel_widget(examples: int = 60_000, base_learning_rate: float = 1e-3) -> Any:
    """Replicas and per-replica batch → global batch, scaled learning rates, steps per epoch."""
    import ipywidgets

    replicas = ipywidgets.IntSlider(value=2, min=1, max=16, description="replicas")
    batch = ipywidgets.IntSlider(value=64, min=8, max=512, step=8,
                                 description="batch/replica")
    lr = ipywidgets.FloatLogSlider(value=base_learning_rate, base=10, min=-5, max=-1,
                                   description="base LR")
    output = ipywidgets.HTML()

    def render(out: Any) -> None:
        n = data_parallel_numbers(replicas.value, batch.value, lr.value, examples)
        rows = [("global batch", f"{n['global_batch']}"),
                ("SGD: learning rate, linear scaling", f"{n['lr_linear']:.2e}"),
                ("Adam: learning rate, √N scaling (Malladi et al. "
                 "also change β₁, β₂, ε)", f"{n['lr_sqrt']:.2e}"),
                (f"steps per epoch ({examples:,} examples, drop_remainder=True)",
                 f"{n['steps_per_epoch']}")]
        show_html(out, _table(rows), _text(rows))

    return _wire([replicas, batch, lr], output, render)


# --- lesson 06: pipeline schedule and bubble -----------------------------------------------

def gpipe_numbers(num_stages: int, num_micro_batches: int,
                  schedule: str = "gpipe") -> dict[str, Any]:
    """A pipeline schedule ("gpipe" or "1f1b") as a grid (stage × slot: "F3", "B0" or "").

    ``bubble`` is the formula (K−1)/(M+K−1); ``counted_bubble`` the empty cells over all cells of
    the schedule (``cu.parallel.schedules``); ``activations_in_flight`` the most micro-batches
    whose activations stage 0 keeps at once, counted from the schedule (M for GPipe, at most K
    for 1F1B).
    """
    from course_utils.parallel.schedules import (
        bubble_fraction,
        gpipe_schedule,
        one_f_one_b_schedule,
        peak_in_flight,
        schedule_bubble,
    )

    build = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}[schedule]
    tasks = build(num_stages, num_micro_batches)
    slots = max(task.slot for task in tasks) + 1
    grid = [[""] * slots for _ in range(num_stages)]
    for task in tasks:
        grid[task.stage][task.slot] = f"{task.phase}{task.micro_batch}"
    return {"slots": slots, "grid": grid, "busy_cells": len(tasks),
            "bubble": bubble_fraction(num_stages, num_micro_batches),
            "counted_bubble": schedule_bubble(tasks, num_stages),
            "activations_in_flight": peak_in_flight(tasks, num_stages)[0]}


def gpipe_widget(num_stages: int = 4, num_micro_batches: int = 4) -> Any:
    """Stages K, micro-batches M, GPipe or 1F1B → the schedule, its bubble, activations kept."""
    import ipywidgets

    stages = ipywidgets.IntSlider(value=num_stages, min=1, max=8, description="stages K")
    micro = ipywidgets.IntSlider(value=num_micro_batches, min=1, max=16,
                                 description="micro-batches M")
    one_f_one_b = ipywidgets.Checkbox(value=False, description="1F1B (else GPipe)")
    output = ipywidgets.HTML()
    colours = {"F": "#4c72b0", "B": "#dd8452", "": "#dddddd"}

    def render(out: Any) -> None:
        k, m = stages.value, micro.value
        name = "1F1B" if one_f_one_b.value else "GPipe"
        n = gpipe_numbers(k, m, "1f1b" if one_f_one_b.value else "gpipe")
        rows = "".join(
            f"<tr><td style='padding-right:0.5em'>stage {s}</td>" + "".join(
                f"<td style='background:{colours[cell[:1]]};color:white;font-size:9px;"
                f"text-align:center;width:22px;height:16px'>{cell}</td>" for cell in row)
            + "</tr>" for s, row in enumerate(n["grid"]))
        summary = [("slots", f"{n['slots']} = 2 × (M + K − 1)"),
                   ("bubble (K−1)/(M+K−1)", f"{n['bubble']:.3f} = {k - 1}/{m + k - 1}"),
                   ("idle cells counted", f"{n['counted_bubble']:.3f}"),
                   (f"micro-batches' activations stage 0 keeps ({name})",
                    f"{n['activations_in_flight']}")]
        text = "\n".join(f"stage {s}: " + " ".join(cell or "." for cell in row)
                         for s, row in enumerate(n["grid"]))
        note = "<i>F: forward, B: backward of micro-batch n; grey: the stage idles</i>"
        show_html(out, f"<table style='border-spacing:1px'>{rows}</table>{note}"
                  + _table(summary), text + "\n" + _text(summary))

    return _wire([stages, micro, one_f_one_b], output, render)


# --- lesson 07: gradient accumulation ------------------------------------------------------

def accumulation_numbers(
    micro_batch: int, steps: int, activation_bytes_per_example: int, examples: int = 60_000,
) -> dict[str, int]:
    """Effective batch, activation bytes alive at once, micro-steps and updates per epoch.

    Only one micro-batch's activations are alive at a time; an update needs ``steps`` full
    micro-batches, so a trailing partial group makes no update.
    """
    if micro_batch < 1 or steps < 1 or examples < 1:
        raise ValueError("micro_batch, steps and examples must be >= 1")
    micro_steps = math.ceil(examples / micro_batch)
    return {"effective_batch": micro_batch * steps,
            "activation_bytes": micro_batch * activation_bytes_per_example,
            "micro_steps_per_epoch": micro_steps,
            "updates_per_epoch": micro_steps // steps}


def accumulation_widget(
    model: Any = None, *, activation_bytes_per_example: int | None = None,
    examples: int = 60_000,
) -> Any:
    """Micro-batch size and k → effective batch, activation memory, updates per epoch.

    The activation bytes per example come from ``cu.memory.activation_bytes_per_example(model)``
    unless given directly.
    """
    import ipywidgets

    if activation_bytes_per_example is None:
        if model is None:
            raise ValueError("give a model or activation_bytes_per_example")
        from course_utils.memory import activation_bytes_per_example as count

        activation_bytes_per_example = count(model)
    per_example = int(activation_bytes_per_example)
    micro = ipywidgets.IntSlider(value=64, min=8, max=1024, step=8, description="micro-batch")
    steps = ipywidgets.IntSlider(value=4, min=1, max=32, description="k (steps)")
    output = ipywidgets.HTML()

    def render(out: Any) -> None:
        n = accumulation_numbers(micro.value, steps.value, per_example, examples)
        rows = [("effective batch", f"{n['effective_batch']}"),
                ("activations alive at once", f"{n['activation_bytes'] / 2**20:.2f} MiB"),
                ("same batch without accumulation",
                 f"{n['effective_batch'] * per_example / 2**20:.2f} MiB"),
                (f"updates per epoch ({examples:,} examples)", f"{n['updates_per_epoch']}")]
        show_html(out, _table(rows), _text(rows))

    return _wire([micro, steps], output, render)


# --- lesson 08: number formats -------------------------------------------------------------

def _dtype(name: str) -> Any:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _from_bits(bits: int, dtype: Any) -> float:
    unsigned = np.dtype(f"uint{dtype.itemsize * 8}")
    return float(np.array(bits, dtype=unsigned).view(dtype))


def precision_neighbours(x: float) -> dict[str, dict[str, float]]:
    """``x`` rounded to float32, float16 and bfloat16, its two neighbours and relative error.

    For each format: ``value`` (the nearest representable number, ``inf`` past the range, 0 below
    it), ``below`` and ``above`` (the representable numbers next to it) and ``relative_error``
    (``|value - x| / |x|``, ``0`` for ``x == 0``).
    """
    x = float(x)
    result = {}
    for name in ("float32", "float16", "bfloat16"):
        dtype = _dtype(name)
        with np.errstate(over="ignore"):
            rounded = np.array(x, dtype=np.float64).astype(dtype)
        value = float(rounded)
        if math.isfinite(value):
            bits = int(rounded.reshape(1).view(f"uint{dtype.itemsize * 8}")[0])
            magnitude = bits & ~(1 << (dtype.itemsize * 8 - 1))
            sign = -1.0 if math.copysign(1.0, value) < 0 else 1.0
            up = sign * _from_bits(magnitude + 1, dtype)  # one step away from zero
            down = (sign * _from_bits(magnitude - 1, dtype) if magnitude
                    else -sign * _from_bits(1, dtype))
            below, above = sorted((up, down))
        else:
            below = above = math.nan
        error = 0.0 if x == 0 else abs(value - x) / abs(x)
        result[name] = {"value": value, "below": below, "above": above, "relative_error": error}
    return result


def precision_widget(value: float = 0.1) -> Any:
    """A number → its float32, float16 and bfloat16 values, neighbours and relative error."""
    import ipywidgets

    number = ipywidgets.FloatText(value=value, description="x")
    output = ipywidgets.HTML()

    def render(out: Any) -> None:
        table = precision_neighbours(number.value)
        head = "".join(f"<th style='padding:0 1em'>{h}</th>" for h in
                       ("format", "stored value", "next below", "next above", "relative error"))
        rows, text = [], []
        for name, n in table.items():
            cells = [name, repr(n["value"]), repr(n["below"]), repr(n["above"]),
                     f"{n['relative_error']:.2e}"]
            rows.append("<tr>" + "".join(f"<td style='padding:0 1em'>{c}</td>"
                                         for c in cells) + "</tr>")
            text.append("  ".join(cells))
        show_html(out, f"<table><tr>{head}</tr>{''.join(rows)}</table>", "\n".join(text))

    return _wire([number], output, render)
