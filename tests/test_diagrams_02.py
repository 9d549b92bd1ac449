"""Lesson 02's diagram: data parallelism drawn from code (cu.plots.draw_data_parallelism)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from course_utils import plots  # noqa: E402


def _boxes(ax, column):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_label() == column]


def _texts(ax):
    return [t.get_text() for t in ax.texts]


@pytest.mark.parametrize("num_replicas", [1, 2, 4, 8])
def test_one_slice_replica_and_update_per_replica_and_one_all_reduce(num_replicas):
    ax = plots.draw_data_parallelism(num_replicas)
    try:
        assert len(_boxes(ax, "batch")) == num_replicas
        assert len(_boxes(ax, "replica")) == num_replicas
        assert len(_boxes(ax, "update")) == num_replicas
        assert len(_boxes(ax, "reduce")) == 1
        # batch -> replica, replica -> all-reduce, all-reduce -> update: three arrows per replica
        assert sum(isinstance(p, FancyArrowPatch) for p in ax.patches) == 3 * num_replicas
        replica_texts = sorted(t for t in _texts(ax) if t.startswith("replica "))
        assert replica_texts == sorted(
            f"replica {i} (device {i})\nforward + backward\non its slice → g{i}"
            for i in range(num_replicas))
    finally:
        plt.close(ax.figure)


def test_each_slice_has_the_colour_of_the_replica_it_feeds():
    ax = plots.draw_data_parallelism(4)
    try:
        slices = sorted(_boxes(ax, "batch"), key=lambda p: -p.get_y())
        replicas = sorted(_boxes(ax, "replica"), key=lambda p: -p.get_y())
        for slice_box, replica_box in zip(slices, replicas, strict=True):
            assert slice_box.get_facecolor() == replica_box.get_edgecolor()
            # side by side: the slice's row is the replica's row
            assert replica_box.get_y() > slice_box.get_y()
            assert replica_box.get_y() + replica_box.get_height() < (
                slice_box.get_y() + slice_box.get_height())
        assert len({tuple(s.get_facecolor()) for s in slices}) == 4
    finally:
        plt.close(ax.figure)


def test_every_replica_applies_the_same_update_from_one_sum():
    ax = plots.draw_data_parallelism(3)
    try:
        updates = [t for t in _texts(ax) if t.startswith("w ← w − η·g")]
        assert len(updates) == 3 and len(set(updates)) == 1
        (reduce_text,) = [t for t in _texts(ax) if t.startswith("all-reduce")]
        assert all(f"g{i}" in reduce_text for i in range(3))
    finally:
        plt.close(ax.figure)


def test_no_replica_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        plots.draw_data_parallelism(0)
