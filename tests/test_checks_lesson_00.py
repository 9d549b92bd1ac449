"""Lesson 00's checks (``course_utils/grading/checks/lesson_00.py``): reference solutions pass,
the broken code of each exercise fails with feedback that says what differed, stubs are skipped
(and raise in strict mode)."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_00

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def stub(*args):
    raise NotImplementedError()


def test_lesson_00_registers_its_checks():
    for name in lesson_00.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_00, name)


# --- diagnose_step ---------------------------------------------------------------------------


def diagnose_step(parts, whole_step):
    synchronisation = whole_step - sum(parts.values())
    largest = max(parts, key=parts.get)
    return "synchronisation" if synchronisation > parts[largest] else largest


def test_reference_diagnosis_names_the_largest_part_or_synchronisation():
    parts = {"input": 10.0, "compute": 2.0}
    assert lesson_00.reference_diagnosis(parts, 12.5) == "input"
    assert lesson_00.reference_diagnosis(parts, 25.0) == "synchronisation"
    assert lesson_00.reference_diagnosis(parts, 8.0) == "input"  # overlapped: still the input


def test_diagnose_step_passes_the_reference_and_fails_the_largest_part_alone(capsys):
    assert cu.grading.check_diagnose_step(diagnose_step)
    assert "✅ diagnose_step: 6 cases passed" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="expected: 'synchronisation'"):
        cu.grading.check_diagnose_step(lambda parts, whole: max(parts, key=parts.get))


def test_diagnose_step_stub_is_not_attempted(assert_not_attempted):
    assert_not_attempted(cu.grading.check_diagnose_step, stub)


# --- split_cpu (run in a fresh process) -------------------------------------------------------


def split_cpu(num_devices):
    physical_cpu = tf.config.list_physical_devices("CPU")[0]  # noqa: F821 - the script's tf
    tf.config.set_logical_device_configuration(  # noqa: F821
        physical_cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_broken(num_devices):
    cpus = tf.config.list_logical_devices("CPU")  # noqa: F821 - starts TensorFlow's devices
    tf.config.set_logical_device_configuration(  # noqa: F821
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)  # noqa: F821
    return [device.name for device in tf.config.list_logical_devices("CPU")]  # noqa: F821


def split_cpu_stub(num_devices):
    raise NotImplementedError()


@pytest.mark.slow
def test_split_cpu_runs_the_fix_in_a_fresh_process_and_rejects_the_broken_code(capsys):
    assert cu.grading.check_split_cpu(split_cpu)
    assert "✅ split_cpu: 1 case passed" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="in a fresh process it raised") as info:
        cu.grading.check_split_cpu(split_cpu_broken)
    assert "PHYSICAL" in str(info.value)  # the hint names the fix


@pytest.mark.slow
def test_run_split_in_fresh_process_reports_the_broken_splits_value_error():
    # TensorFlow checks the device before it checks whether the devices started, so the broken
    # version (a logical device handed over) fails with a ValueError, not a RuntimeError.
    broken = lesson_00.run_split_in_fresh_process(split_cpu_broken, 2)
    assert broken["error"].startswith("ValueError: Unrecognized device: LogicalDevice("), broken
    fixed = lesson_00.run_split_in_fresh_process(split_cpu, 3)
    assert fixed["devices"] == [f"/device:CPU:{index}" for index in range(3)]
    assert fixed["returned"] == fixed["devices"]


def test_split_cpu_stub_is_not_attempted_without_starting_a_process(assert_not_attempted):
    assert_not_attempted(cu.grading.check_split_cpu, split_cpu_stub)


# --- step_breakdown ---------------------------------------------------------------------------


def step_breakdown(next_batch, train_step, batch, repeats):
    timings = cu.bench.time_interleaved({
        "input": next_batch, "compute": lambda: train_step(batch),
        "whole step": lambda: train_step(next_batch())}, repeats=repeats)
    return {name: timing.median for name, timing in timings.items()}


def test_step_breakdown_passes_the_reference(capsys):
    assert cu.grading.check_step_breakdown(step_breakdown)
    assert "✅ step_breakdown" in capsys.readouterr().out


def test_step_breakdown_in_milliseconds_or_without_the_input_fails():
    def in_milliseconds(next_batch, train_step, batch, repeats):
        return {k: v * 1e3 for k, v in step_breakdown(next_batch, train_step, batch,
                                                       repeats).items()}

    with pytest.raises(AssertionError, match="should take about"):
        cu.grading.check_step_breakdown(in_milliseconds)

    def compute_only(next_batch, train_step, batch, repeats):
        timings = cu.bench.time_interleaved({"compute": lambda: train_step(batch)}, repeats)
        return {"input": 0.0, "compute": timings["compute"].median, "whole step": 0.0}

    with pytest.raises(AssertionError, match="timed calls"):
        cu.grading.check_step_breakdown(compute_only)


# --- overlapped_pipeline ----------------------------------------------------------------------


def overlapped_pipeline(records, read, batch_size):
    import tensorflow as tf

    return records.map(read).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def test_overlapped_pipeline_passes_the_fix_and_fails_the_broken_code(capsys):
    import tensorflow as tf

    assert cu.grading.check_overlapped_pipeline(overlapped_pipeline)
    assert "reads ran during" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="does not overlap"):
        cu.grading.check_overlapped_pipeline(
            lambda records, read, batch_size: records.prefetch(tf.data.AUTOTUNE).map(read)
            .batch(batch_size))


def test_overlapped_pipeline_must_keep_the_order_and_the_short_batch():
    import tensorflow as tf

    with pytest.raises(AssertionError, match="sizes"):
        cu.grading.check_overlapped_pipeline(
            lambda records, read, batch_size: records.map(read).batch(
                batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    with pytest.raises(AssertionError, match="another order"):
        cu.grading.check_overlapped_pipeline(
            lambda records, read, batch_size: records.map(read).shuffle(64).batch(batch_size))
