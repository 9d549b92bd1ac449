"""A benchmark over a grid of options (strategy × precision × batch size, ...), done properly.

Every combination is built once and its first call (tracing, warm-up) timed on its own; then
all combinations are timed in interleaved turns (``cu.bench.time_interleaved``), so a busy
moment slows them alike, and each keeps its median and spread. ``result_rows`` makes the table,
``plot_grid`` the picture, ``axis_evidence`` the ratios and the noise a verdict rests on, and
``contradictions`` the measurements a choice goes against. The helpers measure, draw and
flag; choosing an option and writing the verdicts are the learner's (09).

Example::

    results = cu.grid.run_grid({"strategy": ["default", "mirrored"], "batch": [64, 128]},
                               make_step, examples_per_call=lambda o: o["batch"])
    cu.show_table(cu.grid.result_rows(results))
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from course_utils.bench import Timing, time_function, time_interleaved

__all__ = [
    "GridResult",
    "axis_effects",
    "axis_evidence",
    "combinations",
    "contradictions",
    "noise",
    "plot_grid",
    "result_rows",
    "run_grid",
]

@dataclasses.dataclass(frozen=True)
class GridResult:
    """One combination of options, measured: its first call, its steady calls, its output."""

    options: Mapping[str, Any]
    first_call_s: float
    timing: Timing
    examples_per_call: int
    output: Any = None

    @property
    def median_s(self) -> float:
        """Median seconds per call, first call excluded."""
        return self.timing.median

    @property
    def spread_s(self) -> float:
        """Slowest minus fastest repetition, in seconds."""
        return max(self.timing.times) - min(self.timing.times)

    @property
    def examples_per_s(self) -> float:
        """Examples per second at the median."""
        return self.examples_per_call / self.median_s

    def label(self, keys: Sequence[str] | None = None) -> str:
        """The option values, joined: ``"mirrored · float32 · 64"``."""
        keys = list(self.options) if keys is None else keys
        return " · ".join(str(self.options[key]) for key in keys)


def combinations(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the last key varying fastest."""
    if not grid or any(len(values) == 0 for values in grid.values()):
        raise ValueError(f"every option needs at least one value, got {dict(grid)}")
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]


def _plain(value: Any) -> Any:
    """Tensors (anything with ``.numpy()``) as NumPy values, inside dicts, lists and tuples."""
    numpy = getattr(value, "numpy", None)
    if callable(numpy):
        result = numpy()
        return result.item() if getattr(result, "shape", None) == () else result
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


def run_grid(
    grid: Mapping[str, Sequence[Any]],
    make_step: Callable[..., Callable[[], Any]],
    examples_per_call: Callable[[Mapping[str, Any]], int],
    *,
    repeats: int = 5,
    calls_per_repeat: int = 1,
    warmup: int = 1,
) -> list[GridResult]:
    """Build ``make_step(**options)`` for every combination and time its calls.

    The first call of each step is timed alone (it traces); ``warmup`` more calls follow
    untimed; then ``repeats`` interleaved turns of ``calls_per_repeat`` calls each. The first
    call's return value is kept (as NumPy) in ``output``, so that a caller can check what each
    combination computed on, e.g. that every strategy saw the same global batch.
    """
    steps: dict[str, Callable[[], Any]] = {}
    first: dict[str, tuple[float, Any]] = {}
    options_by_key: dict[str, dict[str, Any]] = {}
    for index, options in enumerate(combinations(grid)):
        key = str(index)
        step = make_step(**options)
        outputs: list[Any] = []
        first_timing = time_function(lambda step=step, outputs=outputs: outputs.append(step())
                                     or outputs[-1], repeats=1, warmup=0)
        steps[key], options_by_key[key] = step, options
        first[key] = (first_timing.median, _plain(outputs[0]))
    timings = time_interleaved(steps, repeats=repeats, warmup=warmup,
                               calls_per_repeat=calls_per_repeat)
    return [GridResult(options_by_key[key], first[key][0], timings[key],
                       int(examples_per_call(options_by_key[key])), first[key][1])
            for key in steps]


def result_rows(results: Sequence[GridResult]) -> list[dict[str, Any]]:
    """One table row per combination: its options, then median, spread, first call, examples/s."""
    fastest = max(result.examples_per_s for result in results)
    return [{**result.options,
             "ms per step (median)": round(result.median_s * 1e3, 1),
             "spread (ms)": round(result.spread_s * 1e3, 1),
             "first call (s)": round(result.first_call_s, 2),
             "examples/s": round(result.examples_per_s),
             "vs fastest": f"×{result.examples_per_s / fastest:.2f}"}
            for result in results]


def axis_effects(results: Sequence[GridResult], axis: str) -> dict[Any, list[float]]:
    """For each value of ``axis`` after the first: its examples/s divided by the first value's,
    once for every combination of the other options (like compared with like)."""
    values = list(dict.fromkeys(result.options[axis] for result in results))
    if len(values) < 2:
        return {}

    def others(result: GridResult) -> tuple[Any, ...]:
        return tuple((k, v) for k, v in result.options.items() if k != axis)

    reference = {others(r): r for r in results if r.options[axis] == values[0]}
    effects: dict[Any, list[float]] = {}
    for value in values[1:]:
        effects[value] = [r.examples_per_s / reference[others(r)].examples_per_s
                          for r in results if r.options[axis] == value and others(r) in reference]
    return effects


def noise(results: Sequence[GridResult]) -> float:
    """How far a run typically strays from its median, relative to it: the median over the
    results of each one's median absolute deviation divided by its median."""
    return statistics.median(
        statistics.median(abs(t - r.median_s) for t in r.timing.times) / r.median_s
        for r in results)


def axis_evidence(results: Sequence[GridResult], axis: str) -> list[dict[str, Any]]:
    """The numbers a verdict on ``axis`` rests on, one row per value after the first: its
    examples/s divided by the first value's, like with like (the smallest and the largest
    ratio over the other options' combinations), and the noise (``noise``) beside them.
    It states no verdict: reading the numbers is the learner's (lesson 09)."""
    values = list(dict.fromkeys(result.options[axis] for result in results))
    band = noise(results)
    return [{"option": f"{axis} = {value}", "against": f"{axis} = {values[0]}",
             "ratios, like for like": f"×{min(ratios):.2f} to ×{max(ratios):.2f}",
             "comparisons": len(ratios), "noise (±)": f"{band:.1%}"}
            for value, ratios in axis_effects(results, axis).items()]


def contradictions(results: Sequence[GridResult], choice: Mapping[str, Any],
                   axes: Sequence[str]) -> list[dict[str, Any]]:
    """Where the measurements contradict ``choice`` (one value per option of the grid): for
    each of ``axes``, every other value that was faster like with like (the other options
    as chosen) by more than twice the ``noise``. One row each, with both numbers; [] when
    nothing contradicts it. A choice that was not measured is a row too."""
    by_options = {tuple(r.options.items()): r for r in results}
    chosen = by_options.get(tuple(choice.items()))
    if chosen is None:
        return [{"option": "all", "yours": str(dict(choice)), "examples/s (yours)": None,
                 "faster": "not measured: add it to GRID", "examples/s (faster)": None,
                 "ratio": None}]
    band, rows = noise(results), []
    for axis in axes:
        for result in results:
            others_same = all(result.options[k] == v for k, v in choice.items() if k != axis)
            ratio = result.examples_per_s / chosen.examples_per_s
            if others_same and result.options[axis] != choice[axis] and ratio > 1 + 2 * band:
                rows.append({"option": axis, "yours": choice[axis],
                             "examples/s (yours)": round(chosen.examples_per_s),
                             "faster": result.options[axis],
                             "examples/s (faster)": round(result.examples_per_s),
                             "ratio": f"×{ratio:.2f} (noise ±{band:.1%})"})
    return rows


def plot_grid(results: Sequence[GridResult], hue: str, ax: Any = None,
              title: str = "Examples per second (median; bars: fastest to slowest run)") -> Any:
    """Grouped bars of examples/s: one group per combination of the other options, one bar per
    value of ``hue``, with the range of the repetitions drawn on each bar."""
    from course_utils.plots import grouped_bars

    keys = [key for key in results[0].options if key != hue]
    values: dict[str, dict[str, float]] = {}
    ranges: dict[str, dict[str, tuple[float, float]]] = {}
    for result in results:
        group, bar = result.label(keys) or "all", str(result.options[hue])
        values.setdefault(group, {})[bar] = result.examples_per_s
        ranges.setdefault(group, {})[bar] = (result.examples_per_call / max(result.timing.times),
                                             result.examples_per_call / min(result.timing.times))
    return grouped_bars(values, ranges=ranges, title=title, ylabel="examples / s",
                        xlabel=" · ".join(keys), ax=ax)
