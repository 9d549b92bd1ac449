"""The explanatory diagrams of lessons 00 and 01 (course_utils.plots.draw_*), and the ideal
pipeline schedule the timeline draws."""

from __future__ import annotations

import matplotlib
import pytest

from course_utils import plots
from course_utils.plots.diagrams_basics import _TRAINING_STEP as TRAINING_STEP

matplotlib.use("Agg")


def _bars(ax):
    return [patch for patch in ax.patches if patch.get_width() > 0]


def test_training_step_diagram_shows_the_five_parts_on_host_and_two_devices():
    ax = plots.draw_training_step()
    assert [label.get_text() for label in ax.get_legend().get_texts()] == list(plots.STEP_PARTS)
    assert [tick.get_text() for tick in ax.get_yticklabels()] == [
        "device 1", "device 0", "host (CPU)"]
    assert len(_bars(ax)) == len(TRAINING_STEP)
    # Both devices compute, then all-reduce at the same time: the communication bars line up.
    communication = [(bar.get_x(), bar.get_width()) for bar, (_, part, *_) in
                     zip(_bars(ax), TRAINING_STEP, strict=True) if part == "communication"]
    assert len(communication) == 2 and len(set(communication)) == 1


def test_sequential_schedule_costs_the_sum_and_prefetch_the_larger_part():
    sequential = plots.pipeline_schedule("sequential", 5, produce_s=2.0, consume_s=1.0)
    prefetch = plots.pipeline_schedule("prefetch", 5, produce_s=2.0, consume_s=1.0)
    assert max(end for *_, end in sequential) == 5 * (2.0 + 1.0)
    assert max(end for *_, end in prefetch) == 5 * 2.0 + 1.0
    # Sequential: nothing overlaps, so every interval starts where the one before ended.
    ordered = sorted((start, end) for *_, start, end in sequential)
    assert all(a[1] == b[0] for a, b in zip(ordered, ordered[1:], strict=False))


def test_parallel_map_schedule_uses_its_workers_and_keeps_the_order():
    schedule = plots.pipeline_schedule("parallel map", 6, produce_s=2.0, consume_s=1.0,
                                       parallel_calls=3)
    lanes = {lane for lane, kind, *_ in schedule if kind == "produce"}
    assert lanes == {"worker 1", "worker 2", "worker 3"}
    consumed = [element for _, kind, element, *_ in schedule if kind == "consume"]
    assert consumed == list(range(6))
    # No worker runs two elements at once.
    for lane in lanes:
        spans = sorted((s, e) for name, _, _, s, e in schedule if name == lane)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert max(end for *_, end in schedule) < max(
        end for *_, end in plots.pipeline_schedule("prefetch", 6, 2.0, 1.0))


def test_pipeline_schedule_rejects_unknown_modes_and_bad_sizes():
    with pytest.raises(ValueError, match="mode"):
        plots.pipeline_schedule("magic")
    with pytest.raises(ValueError):
        plots.pipeline_schedule("prefetch", num_elements=0)


def test_pipeline_timeline_draws_exactly_the_computed_schedule():
    axes = plots.draw_pipeline_timeline(num_elements=4, produce_s=2.0, consume_s=1.0)
    assert len(axes) == len(plots.PIPELINE_MODES)
    for ax, mode in zip(axes, plots.PIPELINE_MODES, strict=True):
        schedule = plots.pipeline_schedule(mode, 4, 2.0, 1.0)
        drawn = sorted((round(bar.get_x(), 6), round(bar.get_x() + bar.get_width(), 6))
                       for bar in _bars(ax))
        assert drawn == sorted((round(s, 6), round(e, 6)) for *_, s, e in schedule)
        total = max(end for *_, end in schedule)
        title = ax.get_title(loc="left")
        assert title.startswith(mode) and f"{total:g} time units" in title


def test_epoch_orders_draws_one_panel_per_order_with_every_example_where_it_landed():
    orders = {"shuffled": [3, 0, 2, 1], "in order": [0, 1, 2, 3]}
    axes = plots.epoch_orders(orders)
    assert [ax.get_title() for ax in axes] == list(orders)
    for ax, order in zip(axes, orders.values(), strict=True):
        points = ax.collections[0].get_offsets().tolist()
        assert points == [[position, value] for position, value in enumerate(order)]
    with pytest.raises(ValueError):
        plots.epoch_orders({})
