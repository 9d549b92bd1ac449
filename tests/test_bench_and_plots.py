"""course_utils.bench and course_utils.plots."""

from __future__ import annotations

import json

import matplotlib
import pytest
import tensorflow as tf

from course_utils import bench, plots

matplotlib.use("Agg")


def test_time_function_repeats_after_warmup():
    calls = []
    timing = bench.time_function(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(timing.times) == 4
    assert timing.best <= timing.median <= max(timing.times)
    assert timing.stdev >= 0 and "median" in str(timing)
    with pytest.raises(ValueError):
        bench.time_function(lambda: None, repeats=0)


def test_spread_is_the_middle_80_percent_over_the_median():
    timing = bench.Timing(tuple(float(t) for t in range(1, 12)))  # 1 … 11 s
    assert timing.spread == pytest.approx((10 - 2) / 6)  # numpy's percentile 10 and 90
    assert bench.Timing((1.0,)).spread == 0.0


def test_block_reaches_every_replica_of_a_distributed_value(monkeypatch):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    value = strategy.experimental_distribute_values_from_function(lambda _: tf.ones(2))
    seen, real = [], bench._block
    monkeypatch.setattr(bench, "_block", lambda result: (seen.append(result), real(result)))
    bench._block(value)
    assert any(isinstance(item, tf.Tensor) for item in seen[1:]), seen


def test_dataset_throughput_counts_examples_of_batches():
    dataset = tf.data.Dataset.range(100).batch(10)
    result = bench.dataset_throughput(dataset, warmup_batches=1)
    assert result.batches == 9 and result.elements == 90
    assert result.elements_per_second > 0 and "examples/s" in str(result)
    limited = bench.dataset_throughput(tf.data.Dataset.range(100).batch(10), num_batches=3)
    assert limited.batches == 3


def test_dataset_throughput_with_pairs_and_consume():
    consumed = []
    dataset = tf.data.Dataset.from_tensor_slices((tf.zeros((20, 2)), tf.zeros(20))).batch(5)
    result = bench.dataset_throughput(dataset, warmup_batches=0, consume=consumed.append)
    assert result.elements == 20 and len(consumed) == 4


def test_dataset_throughput_of_an_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="no batch"):
        bench.dataset_throughput(tf.data.Dataset.range(1).batch(1), warmup_batches=1)


def test_scaling_efficiency():
    efficiency = bench.scaling_efficiency({1: 100.0, 2: 150.0, 4: 200.0})
    assert efficiency == {1: 1.0, 2: 0.75, 4: 0.5}
    with pytest.raises(ValueError):
        bench.scaling_efficiency({})


def test_write_results_records_the_machine(tmp_path):
    path = bench.write_results({"ratio": 1.02}, tmp_path / "out" / "r.json")
    payload = json.loads(path.read_text())
    assert payload["results"] == {"ratio": 1.02}
    assert payload["machine"]["cpu_count"] >= 1 and "tensorflow" in payload["machine"]


def test_plots_draw_what_they_are_given():
    ax = plots.bar_chart({"naive": 100.0, "fast": 250.0}, baseline="naive", title="t")
    assert len(ax.patches) == 2 and any("×2.50" in t.get_text() for t in ax.texts)
    ax = plots.time_breakdown({"input": 0.01, "compute": 0.02}, measured_total=0.035)
    assert len(ax.patches) == 2 and len(ax.lines) == 1
    ax = plots.scaling_curve({1: 10.0, 2: 15.0, 4: 18.0})
    assert [line.get_label() for line in ax.lines] == ["ideal", "measured"]
    ax = plots.line_chart({"loss": [3, 2, 1], "val": [3, 2.5, 2]})
    assert len(ax.lines) == 2
    for empty in (plots.bar_chart, plots.time_breakdown, plots.scaling_curve, plots.line_chart):
        with pytest.raises(ValueError):
            empty({})
