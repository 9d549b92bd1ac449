"""cu.grid: a benchmark over a grid of options, its table, plot and written report (lesson 09)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_utils import grid, plots  # noqa: E402
from course_utils.bench import Timing  # noqa: E402


def _result(strategy, batch, median_ms, spread=0.0, first_s=1.0):
    median = median_ms / 1e3
    times = (median - spread / 2e3, median, median + spread / 2e3)
    return grid.GridResult({"strategy": strategy, "batch": batch}, first_s, Timing(times), batch)


def test_combinations_vary_the_last_option_fastest():
    assert grid.combinations({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]
    with pytest.raises(ValueError, match="at least one value"):
        grid.combinations({"a": []})


def test_run_grid_builds_each_step_once_times_its_first_call_apart_and_keeps_its_output():
    built, calls = [], {}

    def make_step(size, name):
        built.append((size, name))
        calls[(size, name)] = 0

        def step():
            calls[(size, name)] += 1
            return {"examples": size, "name": name}
        return step

    results = grid.run_grid({"size": [2, 4], "name": ["a", "b"]}, make_step,
                            examples_per_call=lambda options: options["size"], repeats=3,
                            calls_per_repeat=2, warmup=1)
    assert built == [(2, "a"), (2, "b"), (4, "a"), (4, "b")]
    assert all(count == 1 + 1 + 3 * 2 for count in calls.values())  # first, warm-up, timed
    assert [r.output for r in results] == [{"examples": s, "name": n} for s, n in built]
    assert all(len(r.timing.times) == 3 and r.first_call_s > 0 for r in results)
    assert [r.examples_per_call for r in results] == [2, 2, 4, 4]


def test_tensor_outputs_are_kept_as_numpy_values():
    class FakeTensor:
        def __init__(self, value):
            self.value = value

        def numpy(self):
            import numpy as np

            return np.asarray(self.value)

    results = grid.run_grid({"x": [1]}, lambda x: lambda: (FakeTensor(3), [FakeTensor([1, 2])]),
                            examples_per_call=lambda o: 1, repeats=1)
    scalar, (vector,) = results[0].output
    assert scalar == 3 and isinstance(scalar, int) and list(vector) == [1, 2]


def test_a_result_knows_its_median_spread_and_throughput():
    result = _result("mirrored", 64, 20.0, spread=4.0)
    assert result.median_s == pytest.approx(0.020)
    assert result.spread_s == pytest.approx(0.004)
    assert result.examples_per_s == pytest.approx(64 / 0.020)
    assert result.label() == "mirrored · 64" and result.label(["batch"]) == "64"


def test_rows_give_each_combination_its_numbers_and_its_ratio_to_the_fastest():
    rows = grid.result_rows([_result("default", 64, 10.0), _result("mirrored", 64, 20.0)])
    assert rows[0]["strategy"] == "default" and rows[0]["vs fastest"] == "×1.00"
    assert rows[1]["vs fastest"] == "×0.50" and rows[1]["ms per step (median)"] == 20.0
    assert rows[1]["examples/s"] == 3200


def test_axis_effects_compare_like_with_like():
    results = [_result("default", 64, 10.0), _result("default", 128, 16.0),
               _result("mirrored", 64, 20.0), _result("mirrored", 128, 40.0)]
    effects = grid.axis_effects(results, "strategy")
    assert effects == {"mirrored": [pytest.approx(0.5), pytest.approx(0.4)]}
    assert grid.axis_effects(results, "batch")[128] == [pytest.approx(64 / 16 / (64 / 10) * 2),
                                                        pytest.approx(1.0)]
    assert grid.axis_effects([_result("default", 64, 10.0)], "strategy") == {}


def test_plot_grid_draws_one_bar_per_combination_with_its_range():
    results = [_result(s, b, 10.0 * (i + 1), spread=1.0)
               for i, (s, b) in enumerate([("default", 64), ("default", 128),
                                           ("mirrored", 64), ("mirrored", 128)])]
    ax = grid.plot_grid(results, hue="strategy")
    try:
        assert len(ax.patches) == 4
        assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128"]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["default", "mirrored"]
        assert len(ax.lines) == 4  # one range line per bar
    finally:
        plt.close(ax.figure)


def test_grouped_bars_refuses_nothing_and_labels_every_bar():
    with pytest.raises(ValueError, match="nothing"):
        plots.grouped_bars({})
    ax = plots.grouped_bars({"g1": {"a": 1.0, "b": 2.0}, "g2": {"a": 3.0}})
    try:
        assert len(ax.patches) == 4  # a missing bar is drawn with height 0
        assert sorted(t.get_text() for t in ax.texts) == ["0", "1", "2", "3"]
    finally:
        plt.close(ax.figure)


def test_the_micro_batch_order_draws_k_passes_side_by_side_then_chained():
    with pytest.raises(ValueError, match="k >= 2"):
        plots.draw_micro_batch_order(1)
    ax = plots.draw_micro_batch_order(3)
    try:
        bars = [collection.get_paths()[0].get_extents() for collection in ax.collections]
        assert len(bars) == 2 * (2 * 3 + 1)  # F and B per micro-batch, one apply, twice
        starts = sorted(round(bar.x0, 3) for bar in bars)
        assert starts.count(0.0) == 3 + 1  # three forwards side by side; one chained
        texts = [text.get_text() for text in ax.texts]
        assert texts.count("F2") == texts.count("B3") == 2 and texts.count("apply") == 2
    finally:
        plt.close(ax.figure)


def test_the_capstone_diagram_draws_every_stage_and_the_choices_made():
    ax = plots.draw_capstone_job({"choices": "MirroredStrategy\nfloat32 · k=1"})
    try:
        texts = [t.get_text() for t in ax.texts]
        for _, name, _ in plots.CAPSTONE_STAGES:
            assert any(text.startswith(f"{name}\n") for text in texts), name
        assert "choices\nMirroredStrategy\nfloat32 · k=1" in texts
        assert "the fix changes the job" in texts
    finally:
        plt.close(ax.figure)


def test_axis_evidence_gives_the_ratios_and_the_noise_and_no_verdict():
    slower = [_result("default", 64, 10.0, spread=0.5), _result("default", 128, 16.0, spread=0.5),
              _result("mirrored", 64, 20.0, spread=0.5), _result("mirrored", 128, 40.0, spread=0.5)]
    (row,) = grid.axis_evidence(slower, "strategy")
    assert row["option"] == "strategy = mirrored" and row["against"] == "strategy = default"
    assert row["ratios, like for like"] == "×0.40 to ×0.50" and row["comparisons"] == 2
    assert row["noise (±)"] == f"{grid.noise(slower):.1%}"
    assert not any(word in str(row) for word in ("faster", "slower", "within"))
    assert grid.axis_evidence([_result("default", 64, 10.0)], "strategy") == []


def test_contradictions_flag_a_slower_choice_with_both_numbers():
    results = [_result("default", 64, 20.0, spread=0.2), _result("mirrored", 64, 10.0, spread=0.2)]
    (row,) = grid.contradictions(results, {"strategy": "default", "batch": 64}, ["strategy"])
    assert row["faster"] == "mirrored" and row["examples/s (yours)"] == 3200
    assert row["examples/s (faster)"] == 6400 and row["ratio"].startswith("×2.00")
    assert grid.contradictions(results, {"strategy": "mirrored", "batch": 64}, ["strategy"]) == []
    noisy = [_result("default", 64, 10.0, spread=3.0), _result("mirrored", 64, 9.8, spread=3.0)]
    assert grid.contradictions(noisy, {"strategy": "default", "batch": 64}, ["strategy"]) == []
    (missing,) = grid.contradictions(results, {"strategy": "default", "batch": 32}, ["strategy"])
    assert "not measured" in missing["faster"]
