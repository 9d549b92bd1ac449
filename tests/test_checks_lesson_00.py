"""Lesson 00's checks (``course_utils/grading/checks/lesson_00.py``), run in this process."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_00

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def test_lesson_00_registers_its_checks():
    for name in lesson_00.__all__:
        assert getattr(cu.grading, name) is getattr(lesson_00, name)


def test_correct_function_prints_one_pass_line(capsys):
    assert cu.grading.check_global_batch_size(lambda batch, replicas: batch * replicas)
    assert capsys.readouterr().out == "✅ global_batch_size: 6 cases passed\n"


def test_wrong_function_raises_with_case_expected_got_and_hint():
    with pytest.raises(AssertionError) as info:
        cu.grading.check_global_batch_size(lambda batch, replicas: batch + replicas)
    message = str(info.value)
    assert "case 1 (1, 1)" in message
    assert "expected: 1" in message and "got:      2" in message
    assert "Hint:" in message


def test_float_where_int_expected_is_explained():
    with pytest.raises(AssertionError, match="should be an int, got the float"):
        cu.grading.check_global_batch_size(lambda batch, replicas: float(batch * replicas))


def test_floor_division_in_learning_rate_fails():
    with pytest.raises(AssertionError, match="scaled_learning_rate"):
        cu.grading.check_scaled_learning_rate(lambda lr, base, batch: lr * (batch // base))
    assert cu.grading.check_scaled_learning_rate(lambda lr, base, batch: lr * batch / base)


def test_logical_cpu_names_check_uses_this_process_devices():
    import tensorflow as tf

    names = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert cu.grading.check_logical_cpu_names(lambda: list(names))
    with pytest.raises(AssertionError, match="items"):
        cu.grading.check_logical_cpu_names(lambda: names[:1])


def test_mirrored_strategy_check_accepts_a_right_strategy_and_rejects_the_default():
    import tensorflow as tf

    assert cu.grading.check_mirrored_strategy(
        lambda names: tf.distribute.MirroredStrategy(devices=names))
    with pytest.raises(AssertionError, match="replica"):
        cu.grading.check_mirrored_strategy(lambda names: tf.distribute.MirroredStrategy())
    with pytest.raises(AssertionError, match="MirroredStrategy"):
        cu.grading.check_mirrored_strategy(lambda names: tf.distribute.get_strategy())
