"""course_utils.strategies: every strategy by name, fallbacks, and reuse per device set."""

from __future__ import annotations

import time

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
    assert time.perf_counter() - start < 10
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert "No TPU on this machine" in capsys.readouterr().out


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
