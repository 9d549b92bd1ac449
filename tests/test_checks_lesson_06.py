"""Lesson 06's checks: reference solutions pass, wrong answers fail with a useful message, stubs
are "not attempted". The unit-test process has 4 logical CPUs (tests/conftest.py)."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_06
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def place_two_towers(tower_a, tower_b, head, x_a, x_b, devices):
    import tensorflow as tf

    with tf.device(devices[0]):
        embedding_a = tower_a(x_a)
    with tf.device(devices[1]):
        embedding_b = tower_b(x_b)
        output = head(tf.concat([embedding_a, embedding_b], axis=1))
    return embedding_a, embedding_b, output


def place_all_on_first(tower_a, tower_b, head, x_a, x_b, devices):
    return place_two_towers(tower_a, tower_b, head, x_a, x_b, [devices[0], devices[0]])


def gpipe_bubble(num_stages, num_micro_batches):
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def bubble_from_events(events, num_stages):
    span = max(e.end for e in events) - min(e.start for e in events)
    return 1 - sum(e.end - e.start for e in events) / (num_stages * span)


def shard_dense_rows(x, kernel, bias, mesh):
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    dim = mesh.dim_names[0]

    def put(value, specs):
        value = tf.constant(value)
        replicated = dtensor.Layout.replicated(mesh, rank=len(value.shape))
        return dtensor.relayout(dtensor.copy_to_mesh(value, replicated),
                                dtensor.Layout(specs, mesh))

    kernel_rows = put(kernel, [dim, dtensor.UNSHARDED])
    y = tf.matmul(put(x, [dtensor.UNSHARDED, dim]), kernel_rows)
    return kernel_rows, y + put(bias, [dtensor.UNSHARDED])


def shard_dense_columns(x, kernel, bias, mesh):
    kernel_d = cu.parallel.shard(kernel, cu.parallel.dense_layouts(mesh, "columns")["kernel"])
    return kernel_d, cu.parallel.sharded_dense(x, kernel, bias, mesh, "columns")


def stub(*args):
    raise NotImplementedError()


def test_lesson_06_registers_its_checks():
    for name in lesson_06.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_06, name)


def test_two_towers_reference_passes_and_wrong_placement_fails():
    assert cu.grading.check_place_two_towers(place_two_towers) is True
    with pytest.raises(AssertionError, match="computed on CPU:0"):
        cu.grading.check_place_two_towers(place_all_on_first)
    with pytest.raises(AssertionError, match="three tensors"):
        cu.grading.check_place_two_towers(lambda *args: None)


def test_gpipe_bubble_formula():
    assert cu.grading.check_gpipe_bubble(gpipe_bubble) is True
    with pytest.raises(AssertionError, match="M slots out of"):
        cu.grading.check_gpipe_bubble(lambda k, m: (k - 1) / (m + k))


def test_bubble_from_events_reference_passes_and_busy_fraction_fails():
    assert cu.grading.check_bubble_from_events(bubble_from_events) is True
    with pytest.raises(AssertionError, match="span"):
        cu.grading.check_bubble_from_events(lambda e, k: 1 - bubble_from_events(e, k))


def test_bubble_from_events_below_the_formula_on_the_real_run_fails():
    def right_on_simulated_only(events, num_stages):  # simulated schedules start at 0.0
        simulated = min(e.start for e in events) == 0.0
        return bubble_from_events(events, num_stages) if simulated else 0.1

    with pytest.raises(AssertionError, match="cannot be below the formula"):
        cu.grading.check_bubble_from_events(right_on_simulated_only)


def test_shard_dense_rows_reference_passes_columns_fail():
    assert cu.grading.check_shard_dense_rows(shard_dense_rows) is True
    with pytest.raises(AssertionError, match="rows split"):
        cu.grading.check_shard_dense_rows(shard_dense_columns)


@pytest.mark.parametrize("name", ["place_two_towers", "gpipe_bubble", "bubble_from_events",
                                  "shard_dense_rows"])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(capsys, name):
    check = getattr(cu.grading, f"check_{name}")
    assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)
