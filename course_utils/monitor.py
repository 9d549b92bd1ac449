"""A device-utilization monitor: per logical CPU (psutil) and per GPU (nvidia-smi), sampled in
a background thread while a block of code runs, and a picture of what it saw.

Example::

    with cu.monitor.UtilizationMonitor(interval=0.1) as monitor:
        model.fit(dataset, epochs=2)
    monitor.mean_cpu_percent()      # one number per logical CPU
    cu.monitor.plot_utilization(monitor.samples)

GPUs are sampled with ``nvidia-smi --query-gpu=utilization.gpu,memory.used
--format=csv,noheader,nounits`` when that command exists; elsewhere only the CPU threads
(logical CPUs) are.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["NVIDIA_SMI_QUERY", "Sample", "query_gpus", "UtilizationMonitor", "plot_utilization"]

#: The query the monitor sends to ``nvidia-smi`` (one line per GPU: "util, memory MiB").
NVIDIA_SMI_QUERY = ("--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits")


@dataclasses.dataclass(frozen=True)
class Sample:
    """What the monitor saw at one moment (``time`` in seconds since it started)."""

    time: float
    cpu_percent: tuple[float, ...]
    gpu_percent: tuple[float, ...] = ()
    gpu_memory_mb: tuple[float, ...] = ()


def query_gpus(nvidia_smi: str | None = "nvidia-smi",
               timeout: float = 5.0) -> list[tuple[float, float]] | None:
    """``[(utilization %, memory used MiB), ...]`` per GPU from ``nvidia-smi``; None without it.

    Returns None when the command is missing, fails, times out or prints something unexpected.
    """
    if not nvidia_smi:
        return None
    executable = shutil.which(nvidia_smi)
    if executable is None:
        return None
    try:
        result = subprocess.run([executable, *NVIDIA_SMI_QUERY], capture_output=True, text=True,
                                timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    gpus = []
    for line in result.stdout.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 2:
            return None
        try:
            gpus.append((float(parts[0]), float(parts[1])))
        except ValueError:  # "[N/A]" on some boards
            return None
    return gpus or None


class UtilizationMonitor:
    """Sample the utilization of each logical CPU (and GPU) every ``interval`` seconds in a
    background thread.

    Use it as a context manager (or call ``start()``/``stop()``). ``samples`` holds one
    :class:`Sample` per tick. ``nvidia_smi`` names the command used for GPUs: ``"auto"`` uses
    ``nvidia-smi`` when it is on the PATH, ``None`` samples CPUs only. Stopping is prompt (it
    does not wait for a whole interval) and always joins the thread.
    """

    def __init__(self, interval: float = 0.1, nvidia_smi: str | None = "auto") -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.interval = float(interval)
        if nvidia_smi == "auto":
            nvidia_smi = "nvidia-smi" if shutil.which("nvidia-smi") else None
        self.nvidia_smi = nvidia_smi
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_time = 0.0
        self._gpus = nvidia_smi is not None
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ running
    @property
    def running(self) -> bool:
        """True while the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def elapsed(self) -> float:
        """Seconds since the monitor first started, on the clock of the samples' ``time``."""
        return time.perf_counter() - self._start_time if self._start_time else 0.0

    def start(self) -> UtilizationMonitor:
        """Start sampling (a monitor can be started again after it stopped: samples are kept)."""
        import psutil

        if self.running:
            raise RuntimeError("the monitor is already running")
        self._stop.clear()
        psutil.cpu_percent(percpu=True)  # the first call only sets the reference point
        if not self.samples:
            self._start_time = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="UtilizationMonitor",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        """Stop sampling, wait for the thread to end and return the samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.samples

    def __enter__(self) -> UtilizationMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        import psutil

        try:
            while not self._stop.wait(self.interval):
                cpu = tuple(float(p) for p in psutil.cpu_percent(percpu=True))
                gpu_percent: tuple[float, ...] = ()
                gpu_memory: tuple[float, ...] = ()
                if self._gpus:
                    gpus = query_gpus(self.nvidia_smi)
                    if gpus is None:
                        self._gpus = False  # say it once by having no GPU columns
                    else:
                        gpu_percent = tuple(g[0] for g in gpus)
                        gpu_memory = tuple(g[1] for g in gpus)
                self.samples.append(Sample(time.perf_counter() - self._start_time, cpu,
                                           gpu_percent, gpu_memory))
        except BaseException as error:  # noqa: BLE001 - keep it for the caller, never hang
            self.error = error

    # ------------------------------------------------------------------ summaries
    @property
    def num_cores(self) -> int:
        """How many CPU threads (logical CPUs) the samples cover."""
        return len(self.samples[0].cpu_percent) if self.samples else 0

    def samples_between(self, start: float, end: float) -> list[Sample]:
        """The samples taken from ``start`` to ``end`` (seconds, the clock of ``elapsed()``)."""
        return [sample for sample in self.samples if start <= sample.time <= end]

    def mean_cpu_percent(self) -> list[float]:
        """Mean utilization of each logical CPU over the samples (0-100)."""
        return _column_means([s.cpu_percent for s in self.samples])

    def mean_gpu_percent(self) -> list[float]:
        """Mean utilization of each GPU over the samples (empty without GPUs)."""
        return _column_means([s.gpu_percent for s in self.samples if s.gpu_percent])

    def plot(self, ax: Any = None, title: str = "Device utilization") -> Any:
        """Draw the samples (see :func:`plot_utilization`)."""
        return plot_utilization(self.samples, ax=ax, title=title)


def _column_means(rows: Sequence[Sequence[float]]) -> list[float]:
    rows = [row for row in rows if row]
    if not rows:
        return []
    width = min(len(row) for row in rows)
    return [sum(row[i] for row in rows) / len(rows) for i in range(width)]


def plot_utilization(samples: Sequence[Sample], ax: Any = None,
                     title: str = "Device utilization") -> Any:
    """Utilization over time: one line per logical CPU, and one dashed line per GPU when sampled.

    Returns the Matplotlib ``Axes``. Raises ValueError when there is nothing to plot.
    """
    from course_utils.plots import PALETTE

    if not samples:
        raise ValueError("no samples to plot: was the monitored block long enough?")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6.5, 3.2))
    times = [s.time for s in samples]
    cores = min(len(s.cpu_percent) for s in samples)
    for core in range(cores):
        ax.plot(times, [s.cpu_percent[core] for s in samples], color=PALETTE[core % 8],
                linewidth=1.2, label=f"logical CPU {core}")
    with_gpu = [s for s in samples if s.gpu_percent]
    if with_gpu:
        gpus = min(len(s.gpu_percent) for s in with_gpu)
        for gpu in range(gpus):
            ax.plot([s.time for s in with_gpu], [s.gpu_percent[gpu] for s in with_gpu],
                    "--", color=PALETTE[(cores + gpu) % 8], linewidth=1.5, label=f"GPU {gpu}")
    ax.set_ylim(0, 105)
    ax.set_xlabel("seconds")
    ax.set_ylabel("utilization (%)")
    ax.set_title(title)
    ax.legend(frameon=False, fontsize=8, loc="lower right", ncol=2)
    ax.spines[["top", "right"]].set_visible(False)
    return ax
