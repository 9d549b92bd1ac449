"""course_utils.parallel: placement, GPipe and 1F1B schedules and runs, DTensor layouts, ZeRO."""

from __future__ import annotations

import gc
import weakref

import pytest

import course_utils as cu
from course_utils.parallel import pipeline


def test_short_device():
    assert cu.parallel.short_device("/job:localhost/replica:0/task:0/device:CPU:1") == "CPU:1"
    assert cu.parallel.short_device("CPU:0") == "CPU:0"


@pytest.mark.parametrize(("k", "m"), [(1, 1), (2, 1), (4, 4), (4, 8), (3, 5)])
def test_gpipe_schedule_structure_and_bubble(k, m):
    tasks = cu.parallel.gpipe_schedule(k, m)
    assert len(tasks) == 2 * k * m
    assert max(t.slot for t in tasks) + 1 == 2 * (m + k - 1)
    for stage in range(k):  # each stage does each micro-batch once forward, once backward
        mine = [t for t in tasks if t.stage == stage]
        assert sorted((t.phase, t.micro_batch) for t in mine) == sorted(
            [("F", b) for b in range(m)] + [("B", b) for b in range(m)])
    slots = {(t.stage, t.slot) for t in tasks}
    assert len(slots) == len(tasks)  # one task per stage per slot
    forward = {(t.stage, t.micro_batch): t.slot for t in tasks if t.phase == "F"}
    backward = {(t.stage, t.micro_batch): t.slot for t in tasks if t.phase == "B"}
    for (stage, b), slot in forward.items():
        if stage:
            assert slot > forward[(stage - 1, b)]
    for (stage, b), slot in backward.items():
        assert slot > forward[(k - 1, b)]
        if stage < k - 1:
            assert slot > backward[(stage + 1, b)]
    assert pipeline.schedule_bubble(tasks, k) == pytest.approx(cu.parallel.bubble_fraction(k, m))


def test_bubble_fraction_values_and_errors():
    assert cu.parallel.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert cu.parallel.bubble_fraction(1, 3) == 0
    with pytest.raises(ValueError):
        cu.parallel.bubble_fraction(0, 2)


def test_measured_bubble_from_events():
    events = [cu.parallel.Event(0, 0, "F", 0.0, 1.0), cu.parallel.Event(1, 0, "F", 1.0, 2.0)]
    assert cu.parallel.measured_bubble(events, 2) == pytest.approx(0.5)


def test_draw_pipeline_schedule_returns_axes():
    import matplotlib

    matplotlib.use("Agg")
    ax = cu.plots.draw_pipeline_schedule(3, 2)
    assert "33%" in ax.get_title() or "50%" in ax.get_title()
    with pytest.raises(ValueError):
        cu.plots.draw_pipeline_schedule(0, 2)


@pytest.fixture(scope="module")
def tf_devices():
    cu.setup(logical_devices=4, seed=1)
    import tensorflow as tf

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 4:
        pytest.skip("another test configured fewer logical devices in this process")
    return tf, devices


def _model():
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])


def test_split_step_places_both_passes_and_matches_the_whole_model(tf_devices):
    tf, devices = tf_devices
    import keras

    model = _model()
    stages = cu.parallel.split_sequential(model, [1], devices[:2])
    assert [set(cu.parallel.variable_devices(s)) for s in stages] == [{"CPU:0"}, {"CPU:1"}]
    x, y = tf.random.normal((10, 6)), tf.random.uniform((10,), 0, 3, tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    result = cu.parallel.split_step(stages, devices[:2], x, y, loss_fn)
    assert result["placement"] == {"forward": ["CPU:0", "CPU:1"], "backward": ["CPU:0", "CPU:1"]}
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    assert cu.equality.largest_difference(grads, result["grads"]) < 1e-5
    rows = cu.parallel.memory_per_stage(stages, batch_size=10)
    assert rows[0]["parameters"] == (6 * 8 + 8) * 4
    assert rows[0]["optimizer_state"] == 2 * rows[0]["parameters"]
    assert rows[1]["activations"] == 10 * (8 + 3) * 4
    with pytest.raises(ValueError):
        cu.parallel.split_sequential(model, [1], devices[:3])


def test_model_parallel_devices_prefers_whole_gpus_and_falls_back_to_logical_cpus(tf_devices):
    tf, devices = tf_devices
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    whole = len(gpus) == len(tf.config.list_physical_devices("GPU"))  # no GPU split
    expected = gpus[:2] if whole and len(gpus) >= 2 else devices[:2]
    assert cu.parallel.model_parallel_devices(2) == expected
    assert cu.parallel.model_parallel_devices(4) == (
        gpus[:4] if whole and len(gpus) >= 4 else devices)
    with pytest.raises(ValueError, match="logical_devices"):
        cu.parallel.model_parallel_devices(len(devices) + len(gpus) + 1)
    with pytest.raises(ValueError):
        cu.parallel.model_parallel_devices(0)


def test_model_parallel_devices_does_not_split_a_model_over_one_split_gpu(monkeypatch,
                                                                          tf_devices):
    """One GPU split into four logical GPUs (what cu.setup does to a lone GPU) is one chip."""
    import types

    tf, devices = tf_devices
    logical = tf.config.list_logical_devices
    split_gpu = [types.SimpleNamespace(name=f"/device:GPU:{i}") for i in range(4)]
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: split_gpu if kind == "GPU" else logical(kind))
    assert cu.parallel.model_parallel_devices(2) == devices[:2]


def test_rnn_split_after_its_first_recurrent_layer_runs_on_two_devices(tf_devices):
    tf, _ = tf_devices
    import keras

    devices = cu.parallel.model_parallel_devices(2)
    model = cu.models.rnn(6, 3, 2, units=8, embed_dim=5, recurrent_layers=2)
    assert [layer.name for layer in model.layers] == ["sequence", "embed", "gru_0", "gru_1",
                                                      "logits"]
    stages = cu.parallel.split_sequential(model, [2], devices)
    assert [[layer.name for layer in s.layers] for s in stages] == [["embed", "gru_0"],
                                                                   ["gru_1", "logits"]]
    short = [cu.parallel.short_device(d) for d in devices]
    assert [set(cu.parallel.variable_devices(s)) for s in stages] == [{short[0]}, {short[1]}]
    x, y = cu.data.sequence_task(16, 6, 3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    result = cu.parallel.split_step(stages, devices, x, y, loss_fn)
    assert result["placement"] == {"forward": short, "backward": short}
    with tf.device(devices[0]), tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    assert abs(float(result["loss"]) - float(loss)) < 1e-6
    assert cu.equality.largest_difference(grads, result["grads"]) < 1e-5


def test_split_keeps_use_cudnn_which_keras_get_config_leaves_out(tf_devices):
    import keras

    devices = cu.parallel.model_parallel_devices(2)
    model = cu.models.rnn(6, 3, 2, units=8, embed_dim=5, recurrent_layers=2, use_cudnn=False)
    grus = [layer for layer in model.layers if isinstance(layer, keras.layers.GRU)]
    assert [layer.use_cudnn for layer in grus] == [False, False]
    assert "use_cudnn" not in grus[0].get_config()  # why fresh_layer is needed
    assert type(grus[0]).from_config(grus[0].get_config()).use_cudnn == "auto"
    assert cu.parallel.fresh_layer(grus[0]).use_cudnn is False
    stages = cu.parallel.split_sequential(model, [2], devices)
    assert [layer.use_cudnn for s in stages for layer in s.layers
            if isinstance(layer, keras.layers.GRU)] == [False, False]
    with pytest.raises(ValueError):
        cu.models.rnn(6, 3, cell="simple", use_cudnn=False)


def test_run_gpipe_matches_the_whole_batch(tf_devices):
    tf, devices = tf_devices
    import keras

    model = _model()
    stages = cu.parallel.split_sequential(model, [1, 2], devices[:3])
    x, y = tf.random.normal((12, 6)), tf.random.uniform((12,), 0, 3, tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    run = cu.parallel.run_gpipe(stages, devices[:3], tf.split(x, 4), tf.split(y, 4), loss_fn)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    assert abs(float(run.loss) - float(loss)) < 1e-5
    assert cu.equality.largest_difference(grads, run.grads) < 1e-5
    assert cu.equality.largest_difference([model(x)], [run.outputs]) < 1e-5
    assert len(run.events) == 2 * 3 * 4
    last = {cu.parallel.short_device(d) for (s, _, _), d in run.devices.items() if s == 2}
    assert last == {"CPU:2"}
    assert 0 <= cu.parallel.measured_bubble(run.events, 3) < 1


@pytest.mark.parametrize("by", ["columns", "rows"])
def test_sharded_dense_layouts_and_values(tf_devices, by):
    tf, devices = tf_devices
    import numpy as np

    mesh = cu.parallel.make_mesh(devices)
    rng = np.random.default_rng(0)
    x, kernel, bias = (rng.normal(size=s).astype("float32") for s in ((5, 8), (8, 12), (12,)))
    y = cu.parallel.sharded_dense(x, kernel, bias, mesh, by)
    assert np.allclose(cu.parallel.unshard(y), x @ kernel + bias, atol=1e-4)
    layouts = cu.parallel.dense_layouts(mesh, by)
    pieces = cu.parallel.shard_shapes(cu.parallel.shard(kernel, layouts["kernel"]))
    assert pieces == ([(8, 3)] * 4 if by == "columns" else [(2, 12)] * 4)
    assert cu.parallel.sharding_of(y) == (["unsharded", "model"] if by == "columns"
                                          else ["unsharded", "unsharded"])
    with pytest.raises(ValueError):
        cu.parallel.dense_layouts(mesh, "diagonal")


def test_draw_model_split_and_sharded_dense_return_axes():
    import matplotlib

    matplotlib.use("Agg")
    assert "two devices" in cu.plots.draw_model_split(4, 2).get_title()
    ax = cu.plots.draw_model_split(3, 1, layer_names=["embed", "gru", "logits"],
                                   device_names=["GPU:0", "GPU:1"])
    texts = [t.get_text() for t in ax.texts]
    assert "gru" in texts and any(t.startswith("GPU:1") for t in texts)
    with pytest.raises(ValueError):
        cu.plots.draw_model_split(3, 1, layer_names=["a", "b"])
    for by in ("columns", "rows"):
        assert by in cu.plots.draw_sharded_dense(by).get_title()
    with pytest.raises(ValueError):
        cu.plots.draw_model_split(3, 3)
    with pytest.raises(ValueError):
        cu.plots.draw_sharded_dense("diagonal")


# --- schedules: 1F1B, in-flight activations, interleaving --------------------------------------


@pytest.mark.parametrize(("k", "m"), [(1, 1), (2, 1), (4, 2), (4, 4), (4, 8), (3, 7)])
def test_one_f_one_b_has_gpipes_slots_and_keeps_at_most_k_minus_s(k, m):
    one_f_one_b = cu.parallel.one_f_one_b_schedule(k, m)
    gpipe = cu.parallel.gpipe_schedule(k, m)
    assert max(t.slot for t in one_f_one_b) == max(t.slot for t in gpipe) == 2 * (m + k - 1) - 1
    assert cu.parallel.peak_in_flight(gpipe, k) == [m] * k
    assert cu.parallel.peak_in_flight(one_f_one_b, k) == [min(m, k - s) for s in range(k)]
    assert len({(t.stage, t.slot) for t in one_f_one_b}) == len(one_f_one_b) == 2 * k * m


def test_one_f_one_b_orders_start_with_warm_up_forwards():
    orders = cu.parallel.one_f_one_b_orders(4, 6)
    assert orders[0][:5] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    assert orders[3][:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert cu.parallel.gpipe_orders(2, 2)[0] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_schedule_from_orders_names_deadlocks_and_bad_orders():
    with pytest.raises(ValueError, match="deadlock"):
        cu.parallel.schedule_from_orders([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="once for every"):
        cu.parallel.check_orders([[("F", 0), ("F", 0)]], 1)
    with pytest.raises(ValueError, match="pair"):
        cu.parallel.check_orders([[("F",), ("B", 0)]], 1)
    with pytest.raises(ValueError):
        cu.parallel.schedule_from_orders([])


def test_interleaved_bubble_fraction():
    assert cu.parallel.interleaved_bubble_fraction(4, 8, 1) == cu.parallel.bubble_fraction(4, 8)
    assert cu.parallel.interleaved_bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
    with pytest.raises(ValueError):
        cu.parallel.interleaved_bubble_fraction(4, 8, 0)


@pytest.mark.parametrize(("stages", "micro_batches", "chunks"),
                         [(2, 2, 2), (2, 4, 3), (3, 6, 2), (4, 8, 2), (4, 4, 3)])
def test_interleaved_schedule_counts_its_bubble(stages, micro_batches, chunks):
    tasks = cu.parallel.interleaved_schedule(stages, micro_batches, chunks)
    assert len(tasks) == 2 * stages * micro_batches * chunks
    assert max(t.slot for t in tasks) + 1 == 2 * (chunks * micro_batches + stages - 1)
    assert cu.parallel.schedule_bubble(tasks, stages) == pytest.approx(
        cu.parallel.interleaved_bubble_fraction(stages, micro_batches, chunks))
    done = {(t.phase, t.chunk * stages + t.stage, t.micro_batch): t.slot for t in tasks}
    last = stages * chunks - 1
    for (phase, virtual, b), slot in done.items():  # every dependency finished earlier
        needs = ([("F", virtual - 1, b)] if virtual else []) if phase == "F" else (
            [("F", virtual, b)] + ([("B", virtual + 1, b)] if virtual < last else []))
        assert all(done[need] < slot for need in needs)
    assert len({(t.stage, t.slot) for t in tasks}) == len(tasks)  # one pass per stage per slot


def test_interleaved_orders_follow_megatron():
    orders = cu.parallel.interleaved_orders(2, 2, 2)
    # stage 0 warms up with 2·(K − 1) + (v − 1)·K = 4 forwards: both chunks of both micro-batches
    assert orders[0][:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1)]
    assert orders[0][4] == ("B", 0, 1)  # backwards start from the last chunk
    assert cu.parallel.peak_in_flight(cu.parallel.interleaved_schedule(4, 8, 2), 4) == [
        11, 9, 7, 5]
    for bad in ((4, 6, 2), (4, 8, 1)):  # M not a multiple of K; v = 1 is plain 1F1B
        with pytest.raises(ValueError):
            cu.parallel.interleaved_orders(*bad)
    with pytest.raises(ValueError, match="chunk"):
        cu.parallel.schedule_from_orders(orders, chunks=3)
    early = [("B", 0, 0)] + [p for p in orders[0] if p != ("B", 0, 0)]  # backward first
    with pytest.raises(ValueError, match="deadlock"):
        cu.parallel.schedule_from_orders([early, orders[1]], chunks=2)


def test_run_pipeline_1f1b_matches_gpipe_and_counts_tapes(tf_devices):
    tf, devices = tf_devices
    import keras

    model = _model()
    stages = cu.parallel.split_sequential(model, [1, 2], devices[:3])
    x, y = tf.random.normal((12, 6)), tf.random.uniform((12,), 0, 3, tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    runs = {s: cu.parallel.run_pipeline(stages, devices[:3], tf.split(x, 6), tf.split(y, 6),
                                        loss_fn, schedule=s) for s in ("gpipe", "1f1b")}
    assert cu.equality.largest_difference(runs["gpipe"].grads, runs["1f1b"].grads) < 1e-6
    assert runs["gpipe"].peak_in_flight == [6, 6, 6]
    assert runs["1f1b"].peak_in_flight == [3, 2, 1]
    with pytest.raises(ValueError, match="schedule"):
        cu.parallel.run_pipeline(stages, devices[:3], tf.split(x, 6), schedule="zigzag")


def test_draw_pipeline_events_and_1f1b_schedule(tf_devices):
    import matplotlib

    matplotlib.use("Agg")
    events = [cu.parallel.Event(0, 0, "F", 1.0, 1.002), cu.parallel.Event(1, 0, "F", 1.002, 1.004)]
    ax = cu.plots.draw_pipeline_events(events, 2)
    assert len(ax.patches) == 2 and ax.get_xlim()[1] == pytest.approx(4.0)
    with pytest.raises(ValueError):
        cu.plots.draw_pipeline_events([], 2)
    assert "1F1B" in cu.plots.draw_pipeline_schedule(4, 8, schedule="1f1b").get_title()
    ax = cu.plots.draw_pipeline_schedule(2, 2, schedule="interleaved", chunks=2)
    assert "v = 2" in ax.get_title() and ax.get_xlim()[1] == pytest.approx(5.0)
    mine = cu.parallel.schedule_from_orders(cu.parallel.gpipe_orders(2, 3))
    ax = cu.plots.draw_pipeline_schedule(2, 3, schedule="yours", tasks=mine)
    assert ax.get_title().startswith("yours") and ax.get_xlim()[1] == 8
    with pytest.raises(ValueError, match="empty"):
        cu.plots.draw_pipeline_schedule(2, 3, schedule="yours", tasks=[])
    with pytest.raises(ValueError):
        cu.plots.draw_pipeline_schedule(4, 8, schedule="zigzag")


def test_gpipe_widget_numbers_for_1f1b():
    numbers = cu.widgets.gpipe_numbers(4, 8, "1f1b")
    assert numbers["activations_in_flight"] == 4 and numbers["slots"] == 22
    assert cu.widgets.gpipe_numbers(4, 8)["activations_in_flight"] == 8


# --- ZeRO ----------------------------------------------------------------------------------------


def test_zero_shard_bounds_cover_the_vector_once():
    assert cu.parallel.zero_shard_bounds(114, 4) == [(0, 29), (29, 58), (58, 87), (87, 114)]
    assert cu.parallel.zero_shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    with pytest.raises(ValueError):
        cu.parallel.zero_shard_bounds(0, 4)


def test_zero_bytes_per_device_by_stage():
    rows = [cu.parallel.zero_bytes_per_device(100, 4, stage) for stage in range(4)]
    assert rows[0] == {"parameters": 400, "gradients": 400, "optimizer_state": 800,
                       "total": 1600}
    assert rows[1]["optimizer_state"] == 200 and rows[1]["gradients"] == 400
    assert rows[2]["gradients"] == 100 and rows[2]["parameters"] == 400
    assert rows[3]["total"] == 400
    with pytest.raises(ValueError):
        cu.parallel.zero_bytes_per_device(100, 4, 4)


def test_draw_zero_stages_returns_axes():
    import matplotlib

    matplotlib.use("Agg")
    assert "1/N" in cu.plots.draw_zero_stages(4).get_title()
    with pytest.raises(ValueError):
        cu.plots.draw_zero_stages(0)


@pytest.mark.slow
def test_megatron_step_all_reduces_once_more_when_its_input_needs_a_gradient():
    from course_utils.parallel import collectives_in_fresh_process

    found = collectives_in_fresh_process(8, 6, 16)
    assert {step: len(rows) for step, rows in found.items()} == {"x not watched": 2,
                                                                  "x watched": 3}
    watched = found["x watched"]
    assert sum(row["all-reduce after"] == "layer_2" for row in watched) == 1  # forward
    assert [row["of a result shaped"] for row in watched
            if row["all-reduce after"].startswith("gradient_tape")].count("[8, 6]") == 1
    assert all(len(row["devices"]) == 4 for row in watched)
    for rows in found.values():  # DTensor sums both weights' gradients in one all-reduce
        together = [row["sums together"] for row in rows if len(row["sums together"]) > 1]
        assert together == [["gradient_tape/layer_1/MatMul" + ("_1" if rows is watched else "")
                             + " [6, 16]", "gradient_tape/layer_2/MatMul_1 [16, 6]"]]
    assert all(row["sums together"] == [f"{row['all-reduce after']} {row['of a result shaped']}"]
               for row in watched if row["all-reduce after"] == "layer_2")


def test_run_pipeline_frees_a_stage_output_with_its_tape(tf_devices):
    """A stage's output lives until its micro-batch's backward pass on that stage, not the run."""
    tf, devices = tf_devices
    import keras

    stages = cu.parallel.split_sequential(_model(), [1, 2], devices[:3])

    class Watched:  # stage 0, counting its earlier outputs still alive at each call
        def __init__(self, stage):
            self.stage, self.outputs, self.alive = stage, [], []

        @property
        def trainable_variables(self):
            return self.stage.trainable_variables

        def __call__(self, x):
            gc.collect()
            self.alive.append(sum(ref() is not None for ref in self.outputs))
            out = self.stage(x)
            self.outputs.append(weakref.ref(out))
            return out

    watched = Watched(stages[0])
    x, y = tf.random.normal((12, 6)), tf.random.uniform((12,), 0, 3, tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    run = cu.parallel.run_pipeline([watched, *stages[1:]], devices[:3], tf.split(x, 6),
                                   tf.split(y, 6), loss_fn, schedule="1f1b")
    assert run.peak_in_flight == [3, 2, 1]
    assert watched.alive == [0, 1, 2, 2, 2, 2]  # K − 1 in flight, never all M
