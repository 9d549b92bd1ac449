"""Lesson 03's pictures: workers on a ring, in-graph vs between-graph replication, the
all-reduce cost chart; each refuses what it cannot draw."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from course_utils import plots  # noqa: E402


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_draw_multi_worker_draws_one_box_per_worker_and_a_ring(workers):
    ax = plots.draw_multi_worker(workers)
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.endswith("(process)") for t in texts) == workers
    arrows = [p for p in ax.patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == (workers if workers > 1 else 0)
    assert any("chief" in t for t in texts)


def test_draw_multi_worker_refuses_no_workers():
    with pytest.raises(ValueError, match="at least 1"):
        plots.draw_multi_worker(0)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_draw_replication_shows_one_process_beside_one_process_per_worker(devices):
    ax = plots.draw_replication(devices)
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.startswith("replica ") for t in texts) == 2 * devices
    assert sum(t.startswith("worker ") for t in texts) == devices
    assert any("in-graph" in t for t in texts) and any("between-graph" in t for t in texts)


def test_draw_replication_refuses_no_devices():
    with pytest.raises(ValueError, match="at least 1"):
        plots.draw_replication(0)


def test_allreduce_cost_chart_draws_the_points_the_fit_and_its_two_terms():
    sizes, seconds = [400, 4000, 40000], [1e-3, 1.1e-3, 2e-3]
    ax = plots.allreduce_cost_chart(sizes, seconds, latency=1e-3, seconds_per_byte=2.5e-8)
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["measured (median)", "fit: α + n·β", "α (latency)", "n·β (bandwidth)"]
    assert list(ax.get_lines()[0].get_ydata()) == [1.0, 1.1, 2.0]       # milliseconds


def test_allreduce_cost_chart_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="one time per message size"):
        plots.allreduce_cost_chart([1, 2], [1.0], latency=0.1, seconds_per_byte=0.1)


def test_draw_failure_paths_names_each_error_a_survivor_can_raise():
    ax = plots.draw_failure_paths()
    text = " ".join(t.get_text() for t in ax.texts)
    for phrase in ("UnavailableError", "DeadlineExceededError", "tasks are unhealthy",
                   "PreemptionCheckpointHandler", "coordination service"):
        assert phrase in text
    assert "run by worker 0" in text    # multi_worker_util.coordination_leader
    assert sum(type(p).__name__ == "FancyArrowPatch" for p in ax.patches) == 3
