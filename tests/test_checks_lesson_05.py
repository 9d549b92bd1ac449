"""Lesson 05's checks: reference passes, wrong answers fail with a reason, stubs wait."""

from __future__ import annotations

import math

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_05
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def make_tpu_ready(dataset, batch_size, sequence_length):
    import tensorflow as tf

    def fix(tokens, label):
        tokens = tokens[:sequence_length]
        tokens = tf.pad(tokens, [[0, sequence_length - tf.shape(tokens)[0]]])
        return tf.ensure_shape(tokens, [sequence_length]), label

    return dataset.map(fix).batch(batch_size, drop_remainder=True)


def tpu_settings(replicas, max_global_batch, host_overhead_ms, step_ms, max_overhead_fraction,
                 num_examples):
    largest = max_global_batch // replicas
    per_replica = largest // 128 * 128 if largest >= 128 else largest // 8 * 8
    steps = num_examples // (per_replica * replicas)
    n = math.ceil(round(host_overhead_ms / max_overhead_fraction / step_ms, 6))
    return per_replica, max(1, min(n, steps))


def stub(*args):
    raise NotImplementedError()


def test_lesson_05_registers_its_checks():
    for name in ("check_make_tpu_ready", "check_tpu_settings"):
        assert getattr(cu.grading, name) is getattr(lesson_05, name)


def test_the_reference_pipeline_passes():
    assert cu.grading.check_make_tpu_ready(make_tpu_ready) is True


def test_padded_batch_without_drop_remainder_fails_on_unknown_dimensions():
    def padded(dataset, batch_size, sequence_length):
        return dataset.map(lambda t, y: (t[:sequence_length], y)).padded_batch(
            batch_size, padded_shapes=([sequence_length], []))

    with pytest.raises(AssertionError, match="unknown dimensions"):
        cu.grading.check_make_tpu_ready(padded)


def test_padding_at_the_front_is_named():
    import tensorflow as tf

    def front(dataset, batch_size, sequence_length):
        def fix(tokens, label):
            tokens = tokens[:sequence_length]
            tokens = tf.pad(tokens, [[sequence_length - tf.shape(tokens)[0], 0]])
            return tf.ensure_shape(tokens, [sequence_length]), label
        return dataset.map(fix).batch(batch_size, drop_remainder=True)

    with pytest.raises(AssertionError, match="pad with zeros at the end"):
        cu.grading.check_make_tpu_ready(front)


def test_a_shuffled_pipeline_is_told_to_keep_the_order():
    def shuffled(dataset, batch_size, sequence_length):
        return make_tpu_ready(dataset, batch_size, sequence_length).shuffle(100, seed=1)

    with pytest.raises(AssertionError, match="order"):
        cu.grading.check_make_tpu_ready(shuffled)


def test_the_reference_settings_pass():
    assert cu.grading.check_tpu_settings(tpu_settings) is True


def test_settings_ignoring_the_replicas_fail_with_the_hint():
    def global_batch(replicas, max_global_batch, *rest):
        return tpu_settings(1, max_global_batch, *rest)

    with pytest.raises(AssertionError, match="multiple of 128"):
        cu.grading.check_tpu_settings(global_batch)


def test_settings_without_the_epoch_cap_fail():
    def uncapped(replicas, max_global_batch, host_overhead_ms, step_ms, fraction, n):
        per_replica, _ = tpu_settings(replicas, max_global_batch, host_overhead_ms, step_ms,
                                      fraction, n)
        return per_replica, math.ceil(host_overhead_ms / (fraction * step_ms))

    with pytest.raises(AssertionError, match=r"result\[1\]"):
        cu.grading.check_tpu_settings(uncapped)


def test_reference_settings_examples():
    assert lesson_05.reference_tpu_settings(8, 4096, 2.0, 0.5, 0.1, 1_000_000) == (512, 40)
    assert lesson_05.reference_tpu_settings(1, 100, 1.0, 4.0, 0.05, 10_000) == (96, 5)


@pytest.mark.parametrize("name", ["check_make_tpu_ready", "check_tpu_settings"])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(name, capsys):
    check = getattr(cu.grading, name)
    assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)
