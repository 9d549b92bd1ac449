"""course_utils.monitor: utilization per logical CPU and per GPU, sampled in a background thread."""

from __future__ import annotations

import os
import stat
import threading
import time

import psutil
import pytest

from course_utils import monitor


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i * i for i in range(1000))


def _fake_nvidia_smi(tmp_path, output: str, code: int = 0) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_samples_every_core_during_the_block():
    with monitor.UtilizationMonitor(interval=0.05, nvidia_smi=None) as watch:
        _busy(0.6)
    assert len(watch.samples) >= 3
    assert watch.num_cores == psutil.cpu_count()
    assert all(0.0 <= p <= 100.0 for s in watch.samples for p in s.cpu_percent)
    times = [s.time for s in watch.samples]
    assert times == sorted(times) and times[0] > 0
    assert len(watch.mean_cpu_percent()) == psutil.cpu_count()


def test_busy_work_shows_up_as_utilization():
    with monitor.UtilizationMonitor(interval=0.1, nvidia_smi=None) as watch:
        _busy(1.0)
    # One Python thread keeps at least one core busy: the busiest sample is far above idle
    # (other programs on a shared machine can only add to it).
    assert max(sum(s.cpu_percent) for s in watch.samples) > 30.0


def test_stop_is_prompt_and_leaves_no_thread():
    before = threading.active_count()
    watch = monitor.UtilizationMonitor(interval=5.0, nvidia_smi=None).start()
    assert watch.running
    start = time.perf_counter()
    watch.stop()
    assert time.perf_counter() - start < 1.0, "stop() must not wait for a whole interval"
    assert not watch.running
    assert threading.active_count() == before
    assert watch.samples == []


def test_stops_even_when_the_block_raises():
    with pytest.raises(ZeroDivisionError):
        with monitor.UtilizationMonitor(interval=0.05, nvidia_smi=None) as watch:
            time.sleep(0.15)
            1 / 0  # noqa: B018
    assert not watch.running
    assert watch.samples


def test_cannot_start_twice_and_rejects_bad_interval():
    watch = monitor.UtilizationMonitor(interval=0.05, nvidia_smi=None).start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            watch.start()
    finally:
        watch.stop()
    with pytest.raises(ValueError, match="interval"):
        monitor.UtilizationMonitor(interval=0)


def test_gpus_are_read_from_nvidia_smi(tmp_path):
    fake = _fake_nvidia_smi(tmp_path, "37, 1024\\n52, 2048\\n")
    assert monitor.query_gpus(fake) == [(37.0, 1024.0), (52.0, 2048.0)]
    with monitor.UtilizationMonitor(interval=0.05, nvidia_smi=fake) as watch:
        time.sleep(0.4)
    assert watch.samples
    assert all(s.gpu_percent == (37.0, 52.0) for s in watch.samples)
    assert all(s.gpu_memory_mb == (1024.0, 2048.0) for s in watch.samples)
    assert watch.mean_gpu_percent() == pytest.approx([37.0, 52.0])


@pytest.mark.parametrize("output, code", [("garbage\\n", 0), ("[N/A], 12\\n", 0),
                                          ("10, 20\\n", 1), ("", 0)])
def test_a_broken_nvidia_smi_means_no_gpu_columns(tmp_path, output, code):
    fake = _fake_nvidia_smi(tmp_path, output, code)
    assert monitor.query_gpus(fake) is None
    with monitor.UtilizationMonitor(interval=0.05, nvidia_smi=fake) as watch:
        time.sleep(0.2)
    assert watch.samples and all(s.gpu_percent == () for s in watch.samples)
    assert watch.mean_gpu_percent() == []


def test_missing_nvidia_smi_is_none():
    assert monitor.query_gpus("no-such-command-for-sure") is None
    assert monitor.query_gpus(None) is None
    auto = monitor.UtilizationMonitor(nvidia_smi="auto")
    has_smi = any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK)
                  for d in os.environ.get("PATH", "").split(os.pathsep))
    assert (auto.nvidia_smi is not None) == has_smi


def test_plot_draws_a_line_per_core_and_per_gpu():
    import matplotlib

    matplotlib.use("Agg")
    samples = [monitor.Sample(t * 0.1, (10.0 * t, 50.0), (90.0,), (100.0,)) for t in range(5)]
    ax = monitor.plot_utilization(samples)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["logical CPU 0", "logical CPU 1", "GPU 0"]
    assert ax.get_ylim() == (0, 105)
    with pytest.raises(ValueError, match="no samples"):
        monitor.plot_utilization([])


def test_monitor_plot_method_uses_its_samples():
    import matplotlib

    matplotlib.use("Agg")
    watch = monitor.UtilizationMonitor(nvidia_smi=None)
    watch.samples = [monitor.Sample(0.1, (5.0,)), monitor.Sample(0.2, (7.0,))]
    ax = watch.plot(title="t")
    assert ax.get_title() == "t" and len(ax.get_lines()) == 1


def test_elapsed_runs_on_the_samples_clock():
    watch = monitor.UtilizationMonitor(interval=0.05, nvidia_smi=None)
    assert watch.elapsed() == 0.0
    with watch:
        time.sleep(0.2)
        mark = watch.elapsed()
    assert 0.15 < mark < 5.0
    assert watch.samples[0].time <= mark + 0.1


def test_samples_between_keeps_the_samples_of_one_phase():
    watch = monitor.UtilizationMonitor(nvidia_smi=None)
    watch.samples = [monitor.Sample(t, (1.0,)) for t in (0.1, 0.5, 0.9, 1.3)]
    assert [s.time for s in watch.samples_between(0.5, 0.9)] == [0.5, 0.9]
    assert watch.samples_between(2.0, 3.0) == []
