"""Lesson 06's checks: reference solutions pass, lazy and wrong answers fail with a useful
message, stubs are "not attempted". The unit-test process has 4 logical CPUs (tests/conftest.py)."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_06
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def one_f_one_b_orders(num_stages, num_micro_batches):
    orders = []
    for stage in range(num_stages):
        warm_up = min(num_stages - 1 - stage, num_micro_batches)
        order = [("F", b) for b in range(warm_up)]
        for b in range(warm_up, num_micro_batches):
            order += [("F", b), ("B", b - warm_up)]
        order += [("B", b) for b in range(num_micro_batches - warm_up, num_micro_batches)]
        orders.append(order)
    return orders


def gpipe_orders(num_stages, num_micro_batches):
    return [[("F", b) for b in range(num_micro_batches)]
            + [("B", b) for b in range(num_micro_batches)] for _ in range(num_stages)]


def same_warm_up_everywhere(num_stages, num_micro_batches):  # K − 1 warm-ups on every stage
    orders = []
    for _ in range(num_stages):
        warm_up = min(num_stages - 1, num_micro_batches)
        order = [("F", b) for b in range(warm_up)]
        for b in range(warm_up, num_micro_batches):
            order += [("F", b), ("B", b - warm_up)]
        order += [("B", b) for b in range(num_micro_batches - warm_up, num_micro_batches)]
        orders.append(order)
    return orders


def backward_first(num_stages, num_micro_batches):  # B before its own F: a deadlock
    return [[("B", 0), ("F", 0)] + [(p, b) for b in range(1, num_micro_batches) for p in "FB"]
            for _ in range(num_stages)]


def one_forward_then_its_backward(num_stages, num_micro_batches):  # no warm-up: serial
    return [[(p, b) for b in range(num_micro_batches) for p in "FB"] for _ in range(num_stages)]


def the_lessons_helper(num_stages, num_micro_batches):
    return cu.parallel.one_f_one_b_orders(num_stages, num_micro_batches)


def split_gradients(part_a, part_b, x, y, loss_fn, devices):
    import tensorflow as tf

    with tf.device(devices[0]), tf.GradientTape() as tape_a:
        hidden = part_a(x)
    with tf.device(devices[1]), tf.GradientTape() as tape_b:
        tape_b.watch(hidden)
        loss = loss_fn(y, part_b(hidden))
    with tf.device(devices[1]):
        d_hidden, *grads_b = tape_b.gradient(loss, [hidden, *part_b.trainable_variables])
    with tf.device(devices[0]):
        grads_a = tape_a.gradient(hidden, part_a.trainable_variables, output_gradients=d_hidden)
    return loss, grads_a + grads_b


def one_tape(part_a, part_b, x, y, loss_fn, devices):  # the broken code of the exercise
    import tensorflow as tf

    with tf.GradientTape() as tape:
        with tf.device(devices[0]):
            hidden = part_a(x)
        with tf.device(devices[1]):
            loss = loss_fn(y, part_b(hidden))
    return loss, tape.gradient(loss, part_a.trainable_variables + part_b.trainable_variables)


def one_tape_on_the_second_device(part_a, part_b, x, y, loss_fn, devices):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        with tf.device(devices[0]):
            hidden = part_a(x)
        with tf.device(devices[1]):
            loss = loss_fn(y, part_b(hidden))
    with tf.device(devices[1]):
        return loss, tape.gradient(loss, part_a.trainable_variables + part_b.trainable_variables)


def shard_dense_rows(x, kernel, bias, mesh):
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    dim = mesh.dim_names[0]

    def put(value, specs):
        value = tf.convert_to_tensor(value)
        replicated = dtensor.Layout.replicated(mesh, rank=len(value.shape))
        return dtensor.relayout(dtensor.copy_to_mesh(value, replicated),
                                dtensor.Layout(specs, mesh))

    x_rows, kernel_rows = put(x, [dtensor.UNSHARDED, dim]), put(kernel, [dim, dtensor.UNSHARDED])
    return x_rows, kernel_rows, tf.matmul(x_rows, kernel_rows) + put(bias, [dtensor.UNSHARDED])


def x_left_whole(x, kernel, bias, mesh):
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    _, kernel_rows, y = shard_dense_rows(x, kernel, bias, mesh)
    whole_x = dtensor.copy_to_mesh(tf.constant(x), dtensor.Layout.replicated(mesh, rank=2))
    return whole_x, kernel_rows, y


def computed_whole(x, kernel, bias, mesh):  # right layouts and values, but nothing sharded
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    x_rows, kernel_rows, _ = shard_dense_rows(x, kernel, bias, mesh)
    y = tf.matmul(x, kernel) + bias
    return x_rows, kernel_rows, dtensor.copy_to_mesh(y, dtensor.Layout.replicated(mesh, rank=2))


def with_constant(x, kernel, bias, mesh):  # right eagerly; tf.constant cannot take a traced x
    import tensorflow as tf

    return shard_dense_rows(tf.constant(x), kernel, bias, mesh)


def with_course_helpers(x, kernel, bias, mesh):
    layouts = cu.parallel.dense_layouts(mesh, "rows")
    return (cu.parallel.shard(x, layouts["x"]), cu.parallel.shard(kernel, layouts["kernel"]),
            cu.parallel.sharded_dense(x, kernel, bias, mesh, "rows"))


def stub(*args):
    raise NotImplementedError()


def test_lesson_06_registers_its_checks():
    for name in lesson_06.__all__:
        assert getattr(cu.grading, name) is getattr(lesson_06, name)


def test_one_f_one_b_reference_passes():
    assert cu.grading.check_one_f_one_b_orders(one_f_one_b_orders) is True


@pytest.mark.parametrize(("answer", "message"), [
    (gpipe_orders, "activations"),
    (same_warm_up_everywhere, "activations|time slots"),
    (backward_first, "deadlock"),
    (one_forward_then_its_backward, "more than GPipe"),
    (the_lessons_helper, "build the orders yourself"),
    (lambda k, m: [[("F", 0), ("B", 0)]] * k, "exactly once|once for every"),
    (lambda k, m: None, "one order"),
])
def test_one_f_one_b_lazy_and_wrong_answers_fail(answer, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_one_f_one_b_orders(answer)


def test_the_course_helper_is_back_after_the_check():
    with pytest.raises(AssertionError):
        cu.grading.check_one_f_one_b_orders(the_lessons_helper)
    assert cu.parallel.one_f_one_b_orders(2, 2) == one_f_one_b_orders(2, 2)


def test_split_gradients_reference_passes_and_one_device_backward_fails():
    assert cu.grading.check_split_gradients(split_gradients) is True
    with pytest.raises(AssertionError, match="computed on CPU:0"):
        cu.grading.check_split_gradients(one_tape)
    with pytest.raises(AssertionError, match="part_a was computed on"):
        cu.grading.check_split_gradients(one_tape_on_the_second_device)
    with pytest.raises(AssertionError, match="loss, grads"):
        cu.grading.check_split_gradients(lambda *args: None)


def test_shard_dense_rows_reference_passes_and_wrong_layouts_fail():
    assert cu.grading.check_shard_dense_rows(shard_dense_rows) is True
    with pytest.raises(AssertionError, match="x's layout"):
        cu.grading.check_shard_dense_rows(x_left_whole)
    with pytest.raises(AssertionError, match="DTensor's own API"):
        cu.grading.check_shard_dense_rows(with_course_helpers)
    with pytest.raises(AssertionError, match="not the matmul of the sharded x and kernel"):
        cu.grading.check_shard_dense_rows(computed_whole)
    with pytest.raises(AssertionError, match="tracing failed.*tf.convert_to_tensor"):
        cu.grading.check_shard_dense_rows(with_constant)
    assert callable(cu.parallel.shard) and cu.parallel.shard.__name__ == "shard"


@pytest.mark.parametrize("name", ["one_f_one_b_orders", "split_gradients", "shard_dense_rows"])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(capsys, name):
    check = getattr(cu.grading, f"check_{name}")
    assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)
