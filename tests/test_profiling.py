"""course_utils.profiling: a TensorFlow profiler trace, read back and split into input, compute,
communication and other.

The real traces come from a ``tf.function`` step under ``MirroredStrategy`` over 2 logical CPUs
(so collective ops appear), fed by a tf.data iterator: an input-bound run waits 40 ms per batch
for a ``time.sleep`` in the pipeline and computes almost nothing; a compute-bound run reads a
cached, prefetched pipeline and multiplies matrices. The two are far apart (about 90 % against
1 % input on an idle 2-core machine), so the assertions hold with both cores busy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import course_utils as cu
from course_utils import profiling

INPUT_WAIT_S = 0.04


def _run(tmp_path, *, slow_input: bool, heavy: int, steps: int = 3, replicas: int = 2) -> tuple:
    """Profile ``steps`` distributed steps; returns (xplane path, calls made to the step)."""
    import keras
    import tensorflow as tf

    strategy = cu.make_strategy("mirrored", num_replicas=replicas, verbose=False)
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.random((128, 32), np.float32), rng.random((128, 1), np.float32)))
    if slow_input:
        # finite, exactly the batches the run takes: no sleep is left running when it ends
        data = cu.data.add_latency(data.repeat().batch(32).take(steps + 1), INPUT_WAIT_S)
    else:
        data = data.batch(32).cache().repeat().prefetch(4)
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
    weights = tf.constant(rng.normal(size=(384, 384)).astype(np.float32) / 20)
    iterator = iter(strategy.experimental_distribute_dataset(data))

    @tf.function
    def train_step():
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                hidden = tf.tile(x, [1, 12])
                for _ in range(heavy):
                    hidden = tf.tanh(hidden @ weights)
                loss = tf.reduce_mean((model(hidden[:, :32]) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(replica_step, args=next(iterator))

    calls = []

    def run_step(step: int) -> None:
        calls.append(step)
        train_step()

    return profiling.capture(run_step, steps, tmp_path / "logs", warmup=1), calls


@pytest.fixture(scope="module")
def input_bound(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("input"), slow_input=True, heavy=0)


@pytest.fixture(scope="module")
def compute_bound(tmp_path_factory):
    # One replica: with two on busy cores, the replica that runs first waits for the other in
    # the all-reduce, and that wait (communication) could outgrow the compute it waits for.
    return _run(tmp_path_factory.mktemp("compute"), slow_input=False, heavy=60, replicas=1)


# ----------------------------------------------------------------------------- real traces


def test_capture_profiles_each_step_after_the_warmup(input_bound, tmp_path_factory):
    path, calls = input_bound
    assert calls == [0, 1, 2, 3]  # one warm-up step unprofiled, then 3 profiled
    assert path.name.endswith(".xplane.pb") and path.is_file()
    assert path.parent.parent.name == "profile"  # LOGDIR/plugins/profile/RUN/HOST.xplane.pb
    markers = [e for e in profiling.trace_events(path) if "step_num" in e.get("args", {})]
    assert sorted(int(e["args"]["step_num"]) for e in markers) == [1, 2, 3]
    assert all(e["name"] == f"train {e['args']['step_num']}" for e in markers)


def test_trace_events_name_the_threads(input_bound):
    events = profiling.trace_events(input_bound[0])
    threads = {e["args"]["name"].split("/")[0] for e in events if e.get("name") == "thread_name"}
    assert {"python", "tf_Compute", "collective_ops"} <= threads, threads
    # a finite distributed dataset is read with get_next_as_optional: its own thread and event
    assert any(name.startswith("tf_data_iterator_get_next") for name in threads), threads
    assert any(e.get("name", "").startswith("IteratorGetNext") for e in events)


def test_an_input_bound_run_is_input_bound(input_bound):
    breakdown = profiling.step_breakdown(input_bound[0])
    assert breakdown.steps == 3
    assert breakdown.bottleneck() == "input", profiling.format_breakdown(breakdown)
    # most of each step's sleep is waited for; on a loaded machine the Python thread's own gaps
    # ("other") may grow, so no share of the step is asserted, only what the sleep caused
    assert breakdown.input_s > 0.5 * INPUT_WAIT_S, profiling.format_breakdown(breakdown)


def test_a_compute_bound_run_is_compute_bound(compute_bound):
    breakdown = profiling.step_breakdown(compute_bound[0])
    assert breakdown.bottleneck() == "compute", profiling.format_breakdown(breakdown)
    assert breakdown.shares()["input"] < 0.2, profiling.format_breakdown(breakdown)


def test_collectives_of_a_mirrored_step_count_as_communication(input_bound):
    breakdown = profiling.step_breakdown(input_bound[0])
    assert breakdown.communication_s > 0
    events = profiling.trace_events(input_bound[0])
    assert any(e.get("name") == "CollectiveReduceV2" for e in events)


def test_a_path_a_directory_a_trace_dict_and_events_agree(input_bound):
    path = input_bound[0]
    events = profiling.trace_events(path)
    expected = profiling.step_breakdown(events)
    assert profiling.step_breakdown(path) == expected
    assert profiling.step_breakdown(str(path.parent)) == expected
    assert profiling.step_breakdown({"traceEvents": events}) == expected


# ----------------------------------------------------------------------------- attribution


def _thread(tid: int, name: str) -> dict:
    return {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}


def _span(tid: int, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


SYNTHETIC = [
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
    _thread(1, "python"), _thread(2, "tf_Compute/7"), _thread(3, "tf_data_iterator_get_next/8"),
    _thread(4, "tf_data_private_threadpool/9"), _thread(5, "collective_ops/10"),
    # step 0, 0..100 us: input 0..40, compute 30..80, collective 70..90, nothing 90..100
    _span(1, "train 0", 0, 100, step_num="0", step_name="train 0"),
    _span(3, "IteratorGetNextOp::DoCompute", 0, 40),
    _span(2, "MatMul", 30, 50, long_name="dense/MatMul:MatMul", is_eager="0"),
    _span(5, "CollectiveReduceV2", 70, 20, long_name="sgd/CollectiveReduceV2:CollectiveReduceV2"),
    _span(4, "EagerPyFunc", 0, 100, long_name="EagerPyFunc:EagerPyFunc"),  # the pipeline's work
    _span(2, "ExecutorState::Process", 0, 100),  # a wrapper, not an op
    # step 1, 200..500 us: compute throughout (an op that started before the step is clipped)
    _span(1, "train 1", 200, 300, step_num="1", step_name="train 1"),
    _span(2, "Tanh", 150, 100, long_name="Tanh:Tanh", is_eager="0"),
    _span(2, "MatMul", 250, 250, long_name="MatMul:MatMul", is_eager="0"),
]


def test_each_instant_counts_once_input_first_then_compute_then_communication():
    breakdown = profiling.step_breakdown(SYNTHETIC)
    # summed over both steps (400 us): input 40, compute 40 + 300, communication 10, other 10
    shares = breakdown.shares()
    assert breakdown.steps == 2
    assert breakdown.step_s == pytest.approx(200e-6)  # median of 100 and 300 us
    assert shares == pytest.approx({"input": 0.10, "compute": 0.85, "communication": 0.025,
                                    "other": 0.025})
    assert breakdown.input_s == pytest.approx(0.10 * 200e-6)
    assert breakdown.bottleneck() == "compute"


def test_seconds_per_step_sum_to_the_step_and_shares_to_one():
    breakdown = profiling.step_breakdown(SYNTHETIC)
    parts = (breakdown.input_s, breakdown.compute_s, breakdown.communication_s, breakdown.other_s)
    assert sum(parts) == pytest.approx(breakdown.step_s)
    assert sum(breakdown.shares().values()) == pytest.approx(1.0)


def test_gpu_kernels_are_compute_and_nccl_kernels_communication():
    events = [
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        _span(1, "train 0", 0, 100, step_num="0"),
        {**_span(1, "volta_sgemm_128x64_nn", 10, 50), "pid": 2},
        {**_span(1, "ncclDevKernel_AllReduce_Sum_f32", 60, 30), "pid": 2},
    ]
    shares = profiling.step_breakdown(events).shares()
    assert shares == pytest.approx({"input": 0.0, "compute": 0.5, "communication": 0.3,
                                    "other": 0.2})


def test_bottleneck_names_the_largest_part_but_never_other():
    make = profiling.StepBreakdown
    assert make(1, 1.0, 0.1, 0.2, 0.3, 0.4).bottleneck() == "communication"
    assert make(1, 1.0, 0.5, 0.2, 0.1, 0.2).bottleneck() == "input"
    assert make(1, 1.0, 0.0, 0.0, 0.0, 0.0).shares() == dict.fromkeys(
        ["input", "compute", "communication", "other"], 0.0)


def test_format_breakdown_shows_milliseconds_shares_and_the_bottleneck():
    text = profiling.format_breakdown(profiling.StepBreakdown(4, 0.05, 0.04, 0.005, 0.0, 0.005))
    lines = text.splitlines()
    assert lines[0].split() == ["part", "ms/step", "share"]
    assert lines[1].split() == ["input", "40.00", "80%"]
    assert lines[2].split() == ["compute", "5.00", "10%"]
    assert lines[3].split() == ["communication", "0.00", "0%"]
    assert "50.00" in lines[5] and "median of 4 steps" in lines[5]
    assert lines[-1] == "bottleneck: input"


# ----------------------------------------------------------------------------- bad input


def test_a_missing_trace_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="no profiler trace at"):
        profiling.trace_events(tmp_path / "nothing.xplane.pb")
    with pytest.raises(FileNotFoundError, match="no .xplane.pb under"):
        profiling.step_breakdown(tmp_path)  # a directory without a profile
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(ValueError, match="not a profiler trace"):
        profiling.trace_events(other)


def test_a_trace_without_step_markers_says_how_to_mark_steps():
    events = [e for e in SYNTHETIC if "step_num" not in e.get("args", {})]
    with pytest.raises(ValueError, match="tf.profiler.experimental.Trace"):
        profiling.step_breakdown(events)


def test_capture_needs_a_step_and_stops_the_profiler_after_an_error(tmp_path):
    with pytest.raises(ValueError, match="steps must be at least 1"):
        profiling.capture(lambda step: None, 0, tmp_path)

    def broken(step: int) -> None:
        if step == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        profiling.capture(broken, 2, tmp_path / "broken")
    # the profiler was stopped: a new capture can start
    path = profiling.capture(lambda step: None, 1, tmp_path / "again", warmup=0)
    assert json.dumps(profiling.trace_events(path))  # a readable trace


def test_spans_and_step_windows_are_what_the_breakdown_counts():
    windows = profiling.step_windows(SYNTHETIC)
    assert windows == [(0.0, 100.0), (200.0, 500.0)]
    spans = profiling.spans(SYNTHETIC)
    assert [(s.name, s.category) for s in spans] == [
        ("IteratorGetNextOp::DoCompute", "input"), ("MatMul", "compute"),
        ("CollectiveReduceV2", "communication"), ("Tanh", "compute"), ("MatMul", "compute")]
    assert spans[0].thread == "tf_data_iterator_get_next/8" and spans[0].end == 40.0


def test_breakdown_rows_make_one_table_row_per_run():
    breakdown = profiling.step_breakdown(SYNTHETIC)
    rows = profiling.breakdown_rows({"a": breakdown, "b": breakdown})
    assert [row["run"] for row in rows] == ["a", "b"]
    assert rows[0]["bottleneck"] == breakdown.bottleneck() and rows[0]["steps"] == 2
    parts = sum(rows[0][f"{part} (ms)"] for part in ("input", "compute", "communication", "other"))
    assert parts == pytest.approx(rows[0]["step (ms)"])
    assert rows[0]["input share"] == pytest.approx(breakdown.shares()["input"])


@pytest.mark.slow
def test_the_overview_page_reads_capture_step_roots_on_a_cpu(input_bound, compute_bound):
    """capture marks steps with _r=1 (step roots): the Overview page finds them on a CPU."""
    verdict = profiling.overview_verdict(input_bound[0])
    assert set(verdict) == set(profiling.OVERVIEW_FIELDS)
    assert verdict["hardware_type"] == "CPU_ONLY"
    assert "HIGHLY input-bound" in verdict["input_conclusion"]
    # a compute-bound run is never "HIGHLY" input-bound (on a busy machine it can read
    # "POTENTIALLY", from Python time it calls 'All Others')
    assert "HIGHLY" not in profiling.overview_verdict(compute_bound[0])["input_conclusion"]


def test_the_timeline_draws_the_busiest_threads_of_the_first_steps():
    import matplotlib.pyplot as plt

    from course_utils import plots

    ax = plots.trace_timeline(SYNTHETIC, steps=1)
    try:
        labels = [label.get_text() for label in ax.get_yticklabels()]
        assert set(labels) == {"tf_data_iterator_get_next/8", "tf_Compute/7",
                               "collective_ops/10"}
        assert ax.get_xlim() == (0.0, 0.1)  # one step of 100 us, in ms
    finally:
        plt.close(ax.figure)
    with pytest.raises(ValueError, match="no profiled steps"):
        plots.trace_timeline([])
