"""course_utils.tflogs: TensorFlow's C++ log lines from a fresh process, per snippet."""

from __future__ import annotations

import pytest

from course_utils import tflogs

_SETUP = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy()
dataset = tf.data.Dataset.range(16).batch(4)
"""


def test_log_line_pattern_matches_tensorflows_lines_only():
    assert tflogs.LOG_LINE.match("I0000 00:00:1795409551.025166   27254 auto_shard.cc:799] AUTO")
    assert tflogs.LOG_LINE.match("W1123 04:54:13.123456    12 dataset.cc:997] Input of ...")
    assert tflogs.LOG_LINE.match("2026-11-23 08:04:57.616056: I tensorflow/core/common_runtime/"
                                 "eager/execute.cc:1244] PreferredDevice")  # TensorFlow 2.20
    assert not tflogs.LOG_LINE.match("WARNING: All log messages before absl::InitializeLog()")
    assert not tflogs.LOG_LINE.match("Traceback (most recent call last):")


@pytest.mark.slow  # a fresh TensorFlow process
def test_each_snippet_gets_the_lines_it_caused_and_verbose_logs_need_vmodule():
    snippets = {
        "distribute": "next(iter(strategy.experimental_distribute_dataset(dataset)))",
        "from_function": "next(iter(strategy.distribute_datasets_from_function(\n"
                         "    lambda context: tf.data.Dataset.range(16).batch(2))))",
    }
    logs = tflogs.tensorflow_log_lines(snippets, setup=_SETUP, vmodules=(None, "auto_shard=2"))
    assert set(logs) == {None, "auto_shard=2"}
    verbose = logs["auto_shard=2"]
    assert set(verbose) == set(snippets)
    # the default level never shows the verbose line
    assert not any("auto_shard.cc" in line for lines in logs[None].values() for line in lines)
    shard = {name: [line for line in lines if "auto_shard.cc" in line]
             for name, lines in verbose.items()}
    if tflogs.writes_verbose_auto_shard_line():
        assert len(shard["distribute"]) == 1 and shard["distribute"][0].startswith("I")
        assert "AUTO sharding policy will apply DATA sharding policy" in shard["distribute"][0]
    else:  # TensorFlow 2.20 writes nothing about sharding, even at the verbose level
        assert shard["distribute"] == []
    assert shard["from_function"] == []
    # TensorFlow's start-up lines (written while ``setup`` ran) are not returned
    assert not any("cpu_feature_guard" in line or "port.cc" in line
                   for lines in verbose.values() for line in lines)


@pytest.mark.slow  # a fresh TensorFlow process
def test_the_verbose_auto_shard_line_is_written_from_tensorflow_2_21():
    assert tflogs.writes_verbose_auto_shard_line("2.21.0")
    assert tflogs.writes_verbose_auto_shard_line("2.22.0rc1")
    assert tflogs.writes_verbose_auto_shard_line("3.0.0")
    assert not tflogs.writes_verbose_auto_shard_line("2.20.0")
    import tensorflow as tf

    assert tflogs.writes_verbose_auto_shard_line() == tflogs.writes_verbose_auto_shard_line(
        tf.__version__)


@pytest.mark.slow  # a fresh TensorFlow process
def test_a_failing_snippet_raises_with_its_stderr():
    with pytest.raises(RuntimeError, match="exit code 3"):
        tflogs.tensorflow_log_lines({"fails": "raise SystemExit(3)"})
