"""Proofs that course_utils.training.Trainer is correct under strategies.

Every test runs on the 4 logical CPUs that tests/conftest.py creates. Only the default strategy
and one MirroredStrategy over the 4 CPUs are used in this process (a second mirrored device set
could abort on collective keys); parameter-server runs happen in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from course_utils.strategies import make_strategy
from course_utils.training import Trainer, UnsupportedByKeras3Error

HERE = Path(__file__).resolve().parent
FEATURES, CLASSES = 8, 3


def mirrored4() -> tf.distribute.Strategy:
    return make_strategy("mirrored", num_replicas=4, verbose=False)


def default() -> tf.distribute.Strategy:
    return tf.distribute.get_strategy()


def make_data(n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES, CLASSES)).astype("float32")
    y = np.argmax(x @ w, axis=1).astype("int32")
    return x, y


def dataset(x: np.ndarray, y: np.ndarray, batch: int, **kwargs) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, **kwargs)


def _build_model(regularize: bool = False) -> keras.Model:
    regularizer = keras.regularizers.L2(1e-3) if regularize else None
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
            keras.layers.Dense(CLASSES, dtype="float32"),
        ]
    )


INITIAL_WEIGHTS = None


def initial_weights() -> list[np.ndarray]:
    global INITIAL_WEIGHTS
    if INITIAL_WEIGHTS is None:
        keras.utils.set_random_seed(1)
        INITIAL_WEIGHTS = _build_model().get_weights()
    return INITIAL_WEIGHTS


def model_fn(regularize: bool = False):
    def build() -> keras.Model:
        model = _build_model(regularize)
        model.set_weights(initial_weights())
        return model

    return build


def sgd() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=0.1)


def loss_fn(y_true: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)


def make_trainer(strategy, regularize=False, optimizer_fn=sgd, **kwargs) -> Trainer:
    return Trainer(model_fn(regularize), optimizer_fn, loss_fn, strategy=strategy, **kwargs)


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))


def test_four_replicas_match_one_device():
    x, y = make_data(256)
    one = make_trainer(default(), regularize=True)
    four = make_trainer(mirrored4(), regularize=True)
    h1 = one.fit(dataset(x, y, 64), epochs=3)
    h4 = four.fit(dataset(x, y, 64), epochs=3)
    error = max_abs_diff(one.model.get_weights(), four.model.get_weights())
    print(f"max abs weight difference, 1 device vs 4 replicas after 12 steps: {error:.2e}")
    assert error < 1e-5
    assert max_abs_diff(one.model.get_weights(), initial_weights()) > 1e-2  # it did train
    np.testing.assert_allclose(h1["loss"], h4["loss"], rtol=1e-5)
    assert h4["loss"][-1] < h4["loss"][0]
    assert one.steps == four.steps == 12 and one.updates == 12


def test_one_device_strategy_matches_the_default_strategy():
    x, y = make_data(128)
    default_trainer = make_trainer(default())
    one_device = make_trainer(make_strategy("one_device", verbose=False))
    default_trainer.fit(dataset(x, y, 32), epochs=1)
    one_device.fit(dataset(x, y, 32), epochs=1)
    assert max_abs_diff(default_trainer.model.get_weights(), one_device.model.get_weights()) < 1e-6
    assert "OneDeviceStrategy" in repr(one_device)


def test_adam_four_replicas_match_one_device():
    x, y = make_data(256)
    adam = lambda: keras.optimizers.Adam(learning_rate=1e-2)
    one = make_trainer(default(), optimizer_fn=adam)
    four = make_trainer(mirrored4(), optimizer_fn=adam)
    one.fit(dataset(x, y, 64), epochs=1)
    four.fit(dataset(x, y, 64), epochs=1)
    assert max_abs_diff(one.model.get_weights(), four.model.get_weights()) < 1e-5
    assert int(four.optimizer.iterations.numpy()) == 4


@pytest.mark.parametrize("strategy_fn", [default, mirrored4], ids=["one_device", "mirrored4"])
def test_accumulating_4x32_equals_1x128(strategy_fn):
    x, y = make_data(256)
    big = make_trainer(strategy_fn(), regularize=True)
    accumulated = make_trainer(strategy_fn(), regularize=True, accumulation_steps=4)
    h_big = big.fit(dataset(x, y, 128), epochs=1)
    h_acc = accumulated.fit(dataset(x, y, 32), epochs=1)
    error = max_abs_diff(big.model.get_weights(), accumulated.model.get_weights())
    print(f"max abs weight difference, 4x32 accumulated vs 1x128 ({strategy_fn.__name__}): "
          f"{error:.2e}")
    assert error < 1e-5
    np.testing.assert_allclose(h_big["loss"], h_acc["loss"], rtol=1e-5)
    assert accumulated.steps == 8 and accumulated.updates == 2
    assert int(accumulated.optimizer.iterations.numpy()) == 2


def test_uneven_last_batch_matches_one_device():
    # 130 examples in batches of 32: the last global batch has 2 examples, so 2 of the 4
    # replicas get an empty batch. Update and reported loss must equal the single device's.
    x, y = make_data(130)
    one = make_trainer(default(), regularize=True)
    four = make_trainer(mirrored4(), regularize=True)
    h1 = one.fit(dataset(x, y, 32), epochs=2)
    h4 = four.fit(dataset(x, y, 32), epochs=2)
    error = max_abs_diff(one.model.get_weights(), four.model.get_weights())
    print(f"max abs weight difference with a short last batch: {error:.2e}")
    assert error < 1e-5
    np.testing.assert_allclose(h1["loss"], h4["loss"], rtol=1e-5)


def test_reported_loss_is_the_true_mean_not_scaled_by_replicas():
    x, y = make_data(128)
    trainer = make_trainer(mirrored4(), optimizer_fn=lambda: keras.optimizers.SGD(0.0))
    history = trainer.fit(dataset(x, y, 128), epochs=1)
    expected = float(np.mean(loss_fn(y, trainer.model(x)).numpy()))
    assert history["loss"][0] == pytest.approx(expected, rel=1e-5)


def test_metrics_are_reported_per_epoch_and_agree_across_strategies():
    x, y = make_data(256)
    one = make_trainer(default(), metrics=[keras.metrics.SparseCategoricalAccuracy("acc")])
    four = make_trainer(mirrored4(), metrics=["accuracy"])  # resolved from the shapes
    h1 = one.fit(dataset(x, y, 64), epochs=2)
    h4 = four.fit(dataset(x, y, 64), epochs=2)
    assert len(h4["accuracy"]) == 2 and all(0.0 <= a <= 1.0 for a in h4["accuracy"])
    np.testing.assert_allclose(h1["acc"], h4["accuracy"], atol=1e-6)
    assert four.evaluate(dataset(x, y, 64))["accuracy"] == pytest.approx(
        one.evaluate(dataset(x, y, 64))["acc"], abs=1e-6
    )


def test_steps_per_execution_gives_the_same_result():
    x, y = make_data(256)
    single = make_trainer(mirrored4(), accumulation_steps=2)
    several = make_trainer(mirrored4(), accumulation_steps=2, steps_per_execution=3)
    data = dataset(x, y, 16)  # 16 batches: 8 updates = 3 + 3 + 2 per call
    h1 = single.fit(data, epochs=1)
    h2 = several.fit(data, epochs=1)
    assert max_abs_diff(single.model.get_weights(), several.model.get_weights()) < 1e-6
    np.testing.assert_allclose(h1["loss"], h2["loss"], rtol=1e-6)
    assert several.steps == 16 and several.updates == 8


def test_repeated_dataset_with_steps_per_epoch_and_function_data():
    x, y = make_data(256)
    trainer = make_trainer(mirrored4())
    history = trainer.fit(dataset(x, y, 32).repeat(), epochs=2, steps_per_epoch=5)
    assert len(history["loss"]) == 2 and trainer.steps == 10

    def data_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = context.get_per_replica_batch_size(32)
        return (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shard(context.num_input_pipelines, context.input_pipeline_id)
            .batch(per_replica, drop_remainder=True)
            .repeat()
        )

    history = trainer.fit(data_fn, epochs=1, steps_per_epoch=4)
    assert trainer.steps == 14 and np.isfinite(history["loss"][0])
    with pytest.raises(ValueError, match="steps_per_epoch"):
        trainer.fit(dataset(x, y, 32).repeat(), epochs=1)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_and_leaves_global_policy_alone(policy):
    before = keras.config.dtype_policy().name
    x, y = make_data(256)
    trainer = make_trainer(
        mirrored4(), mixed_precision=policy, optimizer_fn=lambda: keras.optimizers.Adam(1e-2)
    )
    assert keras.config.dtype_policy().name == before
    hidden = trainer.model.layers[0]
    assert hidden.compute_dtype == policy.split("_")[1]
    assert hidden.kernel.dtype == "float32"
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer) == (
        policy == "mixed_float16"
    )
    history = trainer.fit(dataset(x, y, 64).repeat(), epochs=3, steps_per_epoch=8)
    assert history["loss"][-1] < history["loss"][0]
    assert keras.config.dtype_policy().name == before


def test_planted_inf_gradient_is_skipped_on_every_replica():
    x, y = make_data(128)
    poisoned = x.copy()
    poisoned[100] = np.inf  # example 100 of a global batch of 128 lands on replica 3 only
    trainer = make_trainer(mirrored4(), mixed_precision="mixed_float16")
    scale_before = float(trainer.optimizer.dynamic_scale.numpy())
    before = trainer.model.get_weights()
    trainer.fit(dataset(poisoned, y, 128), epochs=1)
    assert max_abs_diff(before, trainer.model.get_weights()) == 0.0
    per_replica = trainer.strategy.experimental_local_results(trainer.model.layers[0].kernel.value)
    assert all(np.all(np.isfinite(v.numpy())) for v in per_replica)
    assert float(trainer.optimizer.dynamic_scale.numpy()) == scale_before / 2
    trainer.fit(dataset(x, y, 128), epochs=1)  # a finite step then applies
    assert max_abs_diff(before, trainer.model.get_weights()) > 0.0


def test_unknown_precision_policy_is_a_value_error():
    with pytest.raises(ValueError, match="precision policy"):
        make_trainer(default(), mixed_precision="float8")


def test_per_worker_iterator_outside_parameter_servers_is_a_value_error():
    with pytest.raises(ValueError, match="ParameterServerStrategy"):
        make_trainer(default()).per_worker_iterator(lambda context: None)


def test_model_built_outside_the_scope_is_a_value_error():
    outside = _build_model()
    with pytest.raises(ValueError, match="outside strategy.scope") as refused:
        Trainer(lambda: outside, sgd, loss_fn, strategy=mirrored4())
    assert "Create the model inside model_fn" in str(refused.value)
    assert keras.config.dtype_policy().name == "float32"


def test_optimizer_built_outside_the_scope_names_the_optimizer():
    outside = keras.optimizers.SGD(0.1)  # its iterations variable, made here
    with pytest.raises(ValueError, match="outside strategy.scope") as refused:
        Trainer(model_fn(), lambda: outside, loss_fn, strategy=mirrored4())
    assert "Create the optimizer inside optimizer_fn" in str(refused.value)


def test_scalar_loss_is_a_value_error():
    x, y = make_data(64)
    scalar_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = Trainer(model_fn(), sgd, scalar_loss)
    with pytest.raises(ValueError, match="per-example"):
        trainer.fit(dataset(x, y, 32), epochs=1)


def test_unbuilt_model_is_built_in_scope_from_the_data():
    x, y = make_data(128)

    def subclassed() -> keras.Model:
        return keras.Sequential([keras.layers.Dense(CLASSES)])  # no Input: unbuilt

    trainer = Trainer(subclassed, sgd, loss_fn, strategy=mirrored4())
    assert not trainer.model.built
    history = trainer.fit(dataset(x, y, 32), epochs=2)
    assert trainer.model.built and history["loss"][1] < history["loss"][0]


def test_checkpoint_resumes_an_interrupted_run(tmp_path):
    x, y = make_data(256)
    calls = {"n": 0}

    def fail_at_step_5(features, labels):
        def check(value):
            calls["n"] += 1
            if calls["n"] == 6:
                raise RuntimeError("simulated crash")
            return value

        return tf.py_function(check, [features], tf.float32), labels

    crashing = dataset(x, y, 32).map(fail_at_step_5)
    crashing = crashing.map(lambda a, b: (tf.ensure_shape(a, [None, FEATURES]), b))
    first = make_trainer(default(), checkpoint_dir=tmp_path, checkpoint_every_steps=2)
    with pytest.raises(Exception, match="simulated crash"):
        first.fit(crashing.repeat(), epochs=2, steps_per_epoch=4)
    second = make_trainer(default(), checkpoint_dir=tmp_path, checkpoint_every_steps=2)
    history = second.fit(dataset(x, y, 32).repeat(), epochs=2, steps_per_epoch=4)
    assert second.resumed_from_step == 4  # the checkpoint written after step 4
    assert second.steps == 4 and second.run_step == 8
    assert len(history["loss"]) == 1  # only the second epoch was left to run
    # A finished run is not resumed: the next trainer starts a new run from step 0.
    third = make_trainer(default(), checkpoint_dir=tmp_path)
    third.fit(dataset(x, y, 32).repeat(), epochs=1, steps_per_epoch=2)
    assert third.resumed_from_step is None and third.run_step == 2


class _Killed(Exception):
    pass


def _kill_after_epoch(last: int):
    def on_epoch_end(epoch, logs):
        if epoch == last:
            raise _Killed

    return on_epoch_end


@pytest.mark.parametrize("given", ["dataset function", "dataset", "dataset per epoch",
                                   "dataset reshuffled per epoch"])
def test_a_killed_and_resumed_run_reads_on_and_equals_an_uninterrupted_one(tmp_path, given):
    x, y = make_data(256)  # 8 global batches of 32: 12 steps read part of them twice

    def dataset_fn(context):  # per-replica batches, sharded per pipeline, from example 0
        batch = context.get_per_replica_batch_size(32)
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        return data.batch(batch, drop_remainder=True)

    def reshuffled():  # made anew by each run, as by a restarted process
        data = tf.data.Dataset.from_tensor_slices((x[:128], y[:128]))
        return data.shuffle(128, seed=1).batch(32)  # a new order each epoch

    data, steps_per_epoch, epochs = {
        "dataset function": (dataset_fn, 3, 4),
        "dataset": (dataset(x, y, 32).repeat(), 3, 4),
        "dataset per epoch": (dataset(x[:128], y[:128], 32), None, 2),  # 4 steps an epoch
        "dataset reshuffled per epoch": (None, None, 3),  # resumed in its second epoch of 3
    }[given]

    def run(directory, kill_after=None):
        trainer = make_trainer(mirrored4(), checkpoint_dir=directory, verbose=0)
        trainer.fit(reshuffled() if data is None else data, epochs=epochs,
                    steps_per_epoch=steps_per_epoch,
                    on_epoch_end=None if kill_after is None else _kill_after_epoch(kill_after))
        return trainer

    uninterrupted = run(tmp_path / "a")
    with pytest.raises(_Killed):
        run(tmp_path / "b", kill_after=0)
    resumed = run(tmp_path / "b")
    assert resumed.resumed_from_step == (steps_per_epoch or 4)  # after epoch 1
    assert resumed.run_step == uninterrupted.run_step
    difference = max_abs_diff(resumed.model.get_weights(), uninterrupted.model.get_weights())
    assert difference < 1e-5, difference


@pytest.mark.slow
def test_parameter_server_training_in_a_subprocess_and_the_in_process_cluster_is_reused():
    env = dict(os.environ, GRPC_FAIL_FAST="use_caller")
    result = subprocess.run(
        [sys.executable, str(HERE / "cluster_scripts" / "ps_train.py")],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULT ") :])
    assert report["steps"] == report["planned_steps"] == 60
    assert report["loss"][-1] < report["loss"][0]
    assert all(0.0 <= a <= 1.0 for a in report["accuracy"])
    assert report["accumulating_steps"] == 10 and report["accumulating_updates"] == 5
    assert np.isfinite(report["accumulating_loss"][0])
    assert report["partitioned_error"] == "UnsupportedByKeras3Error"
    assert "tf_keras" in report["partitioned_message"]
    # each worker's dataset function got its own index, so the two shuffled differently
    firsts = report["first_batches"]
    assert sorted(firsts) == ["0", "1"], firsts
    assert [firsts[w]["pipeline"] for w in ("0", "1")] == [0, 1]
    assert {firsts[w]["of"] for w in ("0", "1")} == {2}
    assert firsts["0"]["batch"] != firsts["1"]["batch"], firsts
    # The in-process cluster starts once per size and reuses its strategy (the same fresh
    # process: one cluster start fewer than a separate test).
    started = report["in_process"]
    assert started["same"] and started["reused"] and started["servers"] == 3, started
    assert started["kind"] == "ParameterServerStrategyV2", started
    spec = started["spec"]
    assert sorted(spec) == ["ps", "worker"] and len(spec["worker"]) == 2, started
    assert "at least one worker and one ps" in started["refused"], started


def test_unsupported_error_is_a_not_implemented_error():
    assert issubclass(UnsupportedByKeras3Error, NotImplementedError)
