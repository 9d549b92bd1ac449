"""Timing helpers: steps, functions and pipelines, throughput, scaling and JSON results
(result tables: :mod:`course_utils.tables`).

Lessons measure on the learner's own machine with these; benchmarks under ``benchmarks/`` use
them to write JSON. Tests never assert on times.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "compare_throughput",
    "dataset_throughput",
    "machine_info",
    "scaling_efficiency",
    "Throughput",
    "time_function",
    "time_interleaved",
    "Timing",
    "write_results",
]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call of repeated measurements."""

    times: tuple[float, ...]

    @property
    def mean(self) -> float:
        """Mean seconds per call."""
        return statistics.fmean(self.times)

    @property
    def best(self) -> float:
        """Fastest call: the least disturbed by other work on the machine."""
        return min(self.times)

    @property
    def median(self) -> float:
        """Median seconds per call."""
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """The middle 80 % of the calls (10th to 90th percentile) as a share of the median."""
        if len(self.times) < 2:
            return 0.0
        deciles = statistics.quantiles(self.times, n=10, method="inclusive")
        return (deciles[-1] - deciles[0]) / self.median

    @property
    def stdev(self) -> float:
        """Standard deviation (0 for a single measurement)."""
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

    def __str__(self) -> str:
        return f"{_human(self.median)} median ({_human(self.best)} best, n={len(self.times)})"


def _human(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _block(result: Any) -> None:
    """Wait until TensorFlow has finished computing ``result`` (ops run asynchronously on GPUs).

    It waits by reading each tensor into host memory (``.numpy()``), also each replica's tensor
    of a distributed value: on a GPU every timed call therefore includes a device→host copy
    of its result.
    """
    numpy = getattr(result, "numpy", None)
    if callable(numpy):
        numpy()
    elif isinstance(result, (list, tuple)):
        for item in result:
            _block(item)
    elif isinstance(result, dict):
        for item in result.values():
            _block(item)
    elif "tensorflow" in sys.modules:  # a distributed value (PerReplica): its tensors
        parts = sys.modules["tensorflow"].nest.flatten(result, expand_composites=True)
        if len(parts) != 1 or parts[0] is not result:
            for item in parts:
                _block(item)


def time_function(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> Timing:
    """Time ``fn()`` ``repeats`` times after ``warmup`` untimed calls (tracing, caches).

    Tensor results are waited for, so asynchronous GPU work is counted.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(max(warmup, 0)):
        _block(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _block(fn())
        times.append(time.perf_counter() - start)
    return Timing(tuple(times))


@dataclasses.dataclass(frozen=True)
class Throughput:
    """How fast a dataset (or a training loop) delivers elements."""

    elements: int
    batches: int
    seconds: float

    @property
    def elements_per_second(self) -> float:
        """Elements (examples) per second."""
        return self.elements / self.seconds if self.seconds else float("inf")

    @property
    def batches_per_second(self) -> float:
        """Batches per second."""
        return self.batches / self.seconds if self.seconds else float("inf")

    def __str__(self) -> str:
        return (f"{self.elements_per_second:,.0f} examples/s "
                f"({self.batches} batches in {self.seconds:.2f} s)")


def _batch_size(batch: Any) -> int:
    first = batch
    while isinstance(first, (tuple, list, dict)):
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    shape = getattr(first, "shape", ())
    return int(shape[0]) if len(shape) else 1


def dataset_throughput(
    dataset: Iterable[Any], num_batches: int | None = None, warmup_batches: int = 1,
    consume: Callable[[Any], Any] | None = None,
) -> Throughput:
    """Iterate over ``dataset`` and measure examples per second (elements of batches).

    The first ``warmup_batches`` are read untimed (pipeline start-up). ``consume`` is called on
    each batch, e.g. to simulate a training step.
    """
    iterator = iter(dataset)
    for _ in range(warmup_batches):
        try:
            next(iterator)
        except StopIteration:
            break
    elements = batches = 0
    start = time.perf_counter()
    for batch in iterator:
        if consume is not None:
            _block(consume(batch))
        elements += _batch_size(batch)
        batches += 1
        if num_batches is not None and batches >= num_batches:
            break
    seconds = time.perf_counter() - start
    if batches == 0:
        raise ValueError("the dataset produced no batch to time (after the warm-up batches)")
    return Throughput(elements=elements, batches=batches, seconds=seconds)


def scaling_efficiency(throughput_by_replicas: Mapping[int, float]) -> dict[int, float]:
    """Throughput with N replicas divided by N times the throughput with the fewest replicas.

    1.0 is perfect linear scaling; replicas that share the same cores stay well below it.
    """
    if not throughput_by_replicas:
        raise ValueError("no measurements")
    smallest = min(throughput_by_replicas)
    per_replica = throughput_by_replicas[smallest] / smallest
    return {n: value / (n * per_replica) for n, value in sorted(throughput_by_replicas.items())}


def machine_info() -> dict[str, Any]:
    """What a benchmark ran on: CPU count, platform, Python and TensorFlow versions."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
        info["gpus"] = len(tf.config.list_physical_devices("GPU"))
    except ImportError:  # pragma: no cover
        pass
    return info


def write_results(results: Mapping[str, Any], path: str | os.PathLike) -> pathlib.Path:
    """Write benchmark ``results`` as JSON with the machine's description; return the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine_info(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "results": dict(results)}
    path.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    return path


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1,
    calls_per_repeat: int = 1, slow_ratio: float | None = None,
) -> dict[str, Timing]:
    """Seconds per call of each function, timed in turns (a b c, b c a, c a b, ...).

    A busy machine slows whatever runs at that moment; taking turns spreads the disturbance
    over every function, and each turn starts with the next function so that none always goes
    first: compare the medians. Each function is called ``warmup`` times first; each of the
    ``repeats`` times is the mean of ``calls_per_repeat`` calls. Tensor results are waited for.

    ``slow_ratio``: after the warm-up, each function is called once more, timed; one slower
    than ``slow_ratio`` times the fastest of those calls is called again, and if the faster
    of its two calls is still that slow, it is timed by that call alone (its ``Timing`` holds
    one time) and left out of the turns, so that a pathological variant costs two calls, not
    ``repeats * calls_per_repeat``, and one stalled call cannot move a fast one out. Keep the
    ratio far above the noise (say 20 or more): such a difference needs no median to be seen.
    """
    if repeats < 1 or calls_per_repeat < 1:
        raise ValueError(f"repeats and calls_per_repeat must be at least 1, got {repeats} "
                         f"and {calls_per_repeat}")
    if not fns:
        raise ValueError("nothing to time")
    if slow_ratio is not None and slow_ratio <= 1:
        raise ValueError(f"slow_ratio must be above 1, got {slow_ratio}")
    for fn in fns.values():
        for _ in range(warmup):
            _block(fn())
    alone: dict[str, Timing] = {}
    if slow_ratio is not None:
        first = {name: _seconds_of_one_call(fn) for name, fn in fns.items()}
        fastest = min(first.values())
        for name, seconds in first.items():
            if seconds > slow_ratio * fastest:   # confirmed by a second call
                seconds = min(seconds, _seconds_of_one_call(fns[name]))
                if seconds > slow_ratio * fastest:
                    alone[name] = Timing((seconds,))
    names = [name for name in fns if name not in alone]
    times: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(repeats):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            for _ in range(calls_per_repeat):
                _block(fns[name]())
            times[name].append((time.perf_counter() - start) / calls_per_repeat)
    return {name: alone[name] if name in alone else Timing(tuple(times[name]))
            for name in fns}


def _seconds_of_one_call(fn: Callable[[], Any]) -> float:
    """Seconds of one call of ``fn``, its tensor results waited for."""
    start = time.perf_counter()
    _block(fn())
    return time.perf_counter() - start


def compare_throughput(
    make_datasets: Mapping[str, Callable[[], Iterable[Any]]], repeats: int = 2,
    consume: Callable[[Any], Any] | None = None, num_batches: int | None = None,
) -> dict[str, float]:
    """Best examples per second of each variant, over ``repeats`` runs taken in turns.

    ``make_datasets`` maps a name to a function that builds a fresh dataset (one epoch); each
    run iterates a new one, calling ``consume`` on every batch (see ``dataset_throughput``).
    The best run is the one least disturbed by other programs.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    best: dict[str, float] = dict.fromkeys(make_datasets, 0.0)
    for _ in range(repeats):
        for name, make in make_datasets.items():
            run = dataset_throughput(make(), num_batches=num_batches, consume=consume)
            best[name] = max(best[name], run.elements_per_second)
    return best
