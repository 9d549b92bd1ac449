"""plots.draw_multi_worker: one box per worker, ring arrows, refuses an empty cluster."""

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
