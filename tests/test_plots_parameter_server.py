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
