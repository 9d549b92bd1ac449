"""course_utils.strategies: every strategy by name, fallbacks, and reuse per device set."""

from __future__ import annotations

import time
import types

import pytest
import tensorflow as tf

from course_utils import strategies


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as error:
        strategies.make_strategy("mirorred")
    for name in strategies.STRATEGY_NAMES:
        assert name in str(error.value)


def test_default_strategy_is_tensorflows_default(capsys):
    strategy = strategies.make_strategy("default")
    assert strategy is tf.distribute.get_strategy()
    assert "Default strategy" in capsys.readouterr().out


def test_one_device_uses_the_first_device():
    strategy = strategies.make_strategy("one_device", verbose=False)
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert strategy.num_replicas_in_sync == 1


def test_mirrored_uses_every_logical_cpu():
    strategy = strategies.make_strategy("mirrored", verbose=False)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 4


def test_mirrored_is_reused_per_device_set():
    two = strategies.make_strategy("mirrored", num_replicas=2, verbose=False)
    assert two.num_replicas_in_sync == 2
    assert strategies.make_strategy("mirrored", num_replicas=2, verbose=False) is two
    assert strategies.make_strategy("mirrored", verbose=False) is not two


def test_mirrored_with_too_many_replicas_says_how_to_get_them():
    with pytest.raises(ValueError, match="logical_devices=8"):
        strategies.make_strategy("mirrored", num_replicas=8)


def test_replica_devices_rejects_zero():
    with pytest.raises(ValueError):
        strategies.replica_devices(0)


def test_tpu_without_a_tpu_falls_back_quickly_and_says_so(capsys, monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
    monkeypatch.setattr("course_utils.devices.os.path.exists", lambda path: False)
    start = time.perf_counter()
    strategy = strategies.make_strategy("tpu")
    elapsed = time.perf_counter() - start
    # 0.04 s on an idle 2-core machine (the environment is read, nothing is contacted); 2 s
    # leaves room for a loaded machine and still catches a connection attempt that waits
    assert elapsed < 2, f"the fallback to MirroredStrategy took {elapsed:.2f} s"
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == len(strategies.replica_devices())
    assert "No TPU on this machine" in capsys.readouterr().out


def test_tpu_with_plain_tensorflow_says_to_install_tensorflow_tpu(capsys, monkeypatch):
    def plain_tensorflow(resolver):  # what plain TensorFlow raises on a real TPU VM
        raise tf.errors.NotFoundError(None, None, "TPUs not found in the cluster. Failed in "
                                      "initialization: No OpKernel was registered to support "
                                      "Op 'ConfigureDistributedTPU' used by ...")

    monkeypatch.setattr("course_utils.devices.tpu_address", lambda: "local")
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", plain_tensorflow)
    strategy = strategies.make_strategy("tpu")
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    out = capsys.readouterr().out
    assert out.startswith("TPU at 'local': plain TensorFlow cannot drive this TPU; install "
                          "tensorflow-tpu")
    assert "NotFoundError" in out and "falling back to the 'mirrored' strategy" in out


def test_tpu_system_initialized_by_the_lesson_is_not_initialized_again(monkeypatch):
    from tensorflow.python.tpu import tpu_strategy_util

    calls = []
    monkeypatch.setattr("course_utils.devices.tpu_address", lambda: "local")
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", calls.append)
    tpu_strategy = types.SimpleNamespace(num_replicas_in_sync=4)
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda resolver: tpu_strategy)
    monkeypatch.setattr(tpu_strategy_util, "_INITIALIZED_TPU_SYSTEMS", {"local": "topology"})
    monkeypatch.setattr(strategies, "_CACHE", {})
    assert strategies.make_strategy("tpu", verbose=False) is tpu_strategy
    assert calls == []  # the lesson's raw cell had initialized it: not again
    monkeypatch.setattr(tpu_strategy_util, "_INITIALIZED_TPU_SYSTEMS", {})
    monkeypatch.setattr(strategies, "_CACHE", {})
    strategies.make_strategy("tpu", verbose=False)
    assert len(calls) == 1


@pytest.mark.slow
def test_tpu_that_cannot_be_reached_falls_back(capsys, monkeypatch):
    monkeypatch.setenv("TPU_NAME", "local")
    strategy = strategies.make_strategy("tpu")
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert "falling back" in capsys.readouterr().out


def test_auto_picks_mirrored_with_several_devices(monkeypatch):
    monkeypatch.setattr("course_utils.devices.tpu_available", lambda: False)
    strategy = strategies.make_strategy("auto", verbose=False)
    assert strategy.num_replicas_in_sync == 4


def test_multi_worker_without_tf_config_explains(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        strategies.make_strategy("multi_worker")


def test_parameter_server_without_a_cluster_explains(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="cluster_resolver"):
        strategies.make_strategy("parameter_server")


def _train_steps(strategy, steps: int = 2, features: int = 4) -> float:
    """A few real all-reducing training steps under ``strategy``; returns the last loss."""
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    global_batch = 8 * strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.ones((global_batch * steps, features)), tf.zeros((global_batch * steps, 2)))
    ).batch(global_batch)

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_sum(tf.square(model(x) - y), axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    for x, y in strategy.experimental_distribute_dataset(dataset):
        loss = step(x, y)
    return float(loss)


_FRESH_KERNEL = (
    "import course_utils as cu\n"
    "cu.setup(logical_devices=4, seed=0)\n"
    "import sys; sys.path.insert(0, 'tests')\n"
    "import tensorflow as tf\n"
    "from test_strategies import _train_steps\n"
)


def _last_lines_of_fresh_python(code: str, count: int) -> list[str]:
    """Run ``code`` after a lesson-like set-up in a fresh Python; its last ``count`` lines."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _FRESH_KERNEL + code], capture_output=True,
                            text=True, timeout=300,
                            cwd=strategies.__file__.rsplit("/course_utils", 1)[0])
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-count:]


_HAND_BUILT = (
    "devices = [d.name for d in tf.config.list_logical_devices('CPU')]\n"
    "raw = tf.distribute.MirroredStrategy(devices=devices)\n"
    "helper = cu.make_strategy('mirrored', verbose=False)\n"
    "assert helper is not raw\n"
    "assert helper.extended.worker_devices == raw.extended.worker_devices\n"
    "two = cu.make_strategy('mirrored', num_replicas=2, verbose=False)\n"
    "for index, s in enumerate((raw, helper, raw, two, raw)):  # other shapes every time\n"
    "    loss = round(_train_steps(s, features=3 + index), 4)\n"
    "    print('hand-built', s.num_replicas_in_sync, loss)\n"
)
_DEVICE_SETS = (
    "for n in (4, 2, 1, 4, 2):\n"
    "    s = cu.make_strategy('mirrored', num_replicas=n, verbose=False)\n"
    "    print('device-set', n, s.num_replicas_in_sync, round(_train_steps(s), 4))\n"
)


@pytest.fixture(scope="module")
def fresh_kernel_lines() -> list[str]:
    """One fresh lesson-like process for both tests below (a TensorFlow start, not two): the
    hand-built strategy first (created before any helper, as in a lesson), then the helpers
    over other device sets in the same process."""
    return _last_lines_of_fresh_python(_HAND_BUILT + _DEVICE_SETS, 10)


@pytest.mark.slow
def test_strategies_over_different_device_sets_train_in_one_process(fresh_kernel_lines):
    lines = [line.split()[1:] for line in fresh_kernel_lines if line.startswith("device-set ")]
    assert [line[:2] for line in lines] == [[str(n), str(n)] for n in (4, 2, 1, 4, 2)], (
        fresh_kernel_lines)


@pytest.mark.slow
def test_a_hand_built_mirrored_strategy_trains_beside_the_helpers(fresh_kernel_lines):
    lines = [line.split()[1:] for line in fresh_kernel_lines if line.startswith("hand-built ")]
    assert [line[0] for line in lines] == ["4", "4", "4", "2", "4"], fresh_kernel_lines
