"""The parameter-server diagram of lesson 04."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import course_utils as cu  # noqa: E402


def test_draw_parameter_server_draws_every_machine():
    ax = cu.plots.draw_parameter_server(num_workers=3, num_ps=2)
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.startswith("worker") for t in texts) == 3
    assert sum(t.startswith("parameter server") for t in texts) == 2
    assert any(t.startswith("coordinator") for t in texts)


def test_step_timeline_draws_one_bar_per_step_on_its_workers_lane():
    steps = [
        {"worker": 0, "began": 10.0, "ended": 10.2, "applied": 1, "stale_by": 0},
        {"worker": 1, "began": 10.0, "ended": 10.5, "applied": 3, "stale_by": 1},
        {"worker": 0, "began": 10.2, "ended": 10.4, "applied": 2, "stale_by": 0},
    ]
    ax = cu.plots.draw_step_timeline(steps)
    bars = ax.patches
    assert len(bars) == 3
    assert [round(bar.get_x(), 3) for bar in bars] == [0.0, 0.0, 0.2]  # seconds from the start
    assert bars[0].get_facecolor() != bars[1].get_facecolor()  # stale steps stand out
    assert [t.get_text() for t in ax.get_yticklabels()] == ["worker 0", "worker 1"]


def test_step_timeline_names_what_a_step_lacks():
    import pytest

    with pytest.raises(ValueError, match="stale_by"):
        cu.plots.draw_step_timeline([{"worker": 0, "began": 0, "ended": 1, "applied": 1}])


def test_failure_recovery_names_both_failures_and_the_checkpoint():
    ax = cu.plots.draw_failure_recovery()
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "worker 1 ✗" in texts and "parameter server 1 ✗" in texts
    assert "checkpoint" in texts and "UnavailableError" in texts
