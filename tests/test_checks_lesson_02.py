"""Lesson 02's checks: the reference solutions pass, wrong ones fail saying why, stubs are
"not attempted". The unit-test process has 4 logical CPUs (tests/conftest.py), so the checks'
strategy has 4 replicas here."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

import course_utils as cu
from course_utils.grading import checks
from course_utils.grading.checks import lesson_02
from course_utils.grading.framework import NotAttemptedError, strict_checks

# --- reference solutions (as in solutions/02_mirrored_strategy_solutions.ipynb) -------------


def build_and_compile(strategy, num_features, num_classes):
    with strategy.scope():
        model = cu.models.mlp(num_features, num_classes, hidden_units=(32,))
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def compute_loss(labels, logits, global_batch_size):
    per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)


def _train_step(loss_fn, reduce_op=tf.distribute.ReduceOp.SUM):
    def distributed_train_step(strategy, model, optimizer, batch, global_batch_size):
        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(features, training=True), global_batch_size)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce(reduce_op, per_replica, axis=None)

    return distributed_train_step


def warmup_learning_rate(step, base_learning_rate, base_batch_size, per_replica_batch_size,
                         num_replicas, warmup_steps):
    target = base_learning_rate * per_replica_batch_size * num_replicas / base_batch_size
    if step >= warmup_steps:
        return target
    return base_learning_rate + (target - base_learning_rate) * step / warmup_steps


# --- wrong solutions --------------------------------------------------------------------


def built_outside_the_scope(strategy, num_features, num_classes):
    model = cu.models.mlp(num_features, num_classes, hidden_units=(8,))
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def not_compiled(strategy, num_features, num_classes):
    with strategy.scope():
        return cu.models.mlp(num_features, num_classes, hidden_units=(8,))


def mean_per_replica(labels, logits, global_batch_size):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def positional_batch_size(labels, logits, global_batch_size):
    per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    return tf.nn.compute_average_loss(per_example, global_batch_size)


def no_warmup(step, base_learning_rate, base_batch_size, per_replica_batch_size, num_replicas,
              warmup_steps):
    return base_learning_rate * per_replica_batch_size * num_replicas / base_batch_size


def stub(*args, **kwargs):
    # YOUR CODE HERE
    raise NotImplementedError()


# --- tests ------------------------------------------------------------------------------


def test_lesson_02_registers_its_checks():
    for name in ("check_build_and_compile", "check_compute_loss",
                 "check_distributed_train_step", "check_warmup_learning_rate"):
        assert getattr(checks, name) is getattr(cu.grading, name) is getattr(lesson_02, name)


def test_the_reference_solutions_pass(capsys):
    assert checks.check_build_and_compile(build_and_compile) is True
    assert checks.check_compute_loss(compute_loss) is True
    assert checks.check_distributed_train_step(_train_step(compute_loss)) is True
    assert checks.check_warmup_learning_rate(warmup_learning_rate) is True
    assert capsys.readouterr().out.count("✅") == 4


def test_a_model_built_outside_the_scope_is_named():
    with pytest.raises(AssertionError, match="outside strategy.scope") as caught:
        checks.check_build_and_compile(built_outside_the_scope)
    assert "Hint:" in str(caught.value)


def test_an_uncompiled_model_fails():
    with pytest.raises(AssertionError, match="not compiled"):
        checks.check_build_and_compile(not_compiled)


@pytest.mark.parametrize("wrong, ratio", [(mean_per_replica, "×"),
                                          (positional_batch_size, "×")])
def test_wrong_loss_reductions_fail_with_expected_and_got(wrong, ratio):
    with pytest.raises(AssertionError) as caught:
        checks.check_compute_loss(wrong)
    message = str(caught.value)
    assert "expected:" in message and "got:" in message and ratio in message
    assert "global_batch_size=" in message  # the hint names the fix


def test_a_step_averaged_per_replica_is_measured_against_one_device():
    with pytest.raises(AssertionError) as caught:
        checks.check_distributed_train_step(_train_step(mean_per_replica))
    message = str(caught.value)
    replicas = cu.make_strategy("mirrored", verbose=False).num_replicas_in_sync
    assert "one-device reference" in message
    assert f"{replicas:.3g}× the reference" in message, message


def test_a_step_reporting_the_mean_over_replicas_fails_on_the_loss():
    with pytest.raises(AssertionError, match="returned loss"):
        checks.check_distributed_train_step(
            _train_step(compute_loss, tf.distribute.ReduceOp.MEAN))


def test_no_warmup_fails_at_step_zero():
    with pytest.raises(AssertionError, match="case 1 .*expected"):
        checks.check_warmup_learning_rate(no_warmup)


@pytest.mark.parametrize("check", [checks.check_build_and_compile, checks.check_compute_loss,
                                   checks.check_distributed_train_step,
                                   checks.check_warmup_learning_rate])
def test_stubs_are_not_attempted(check, capsys):
    with strict_checks(False):
        assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(True), pytest.raises(NotAttemptedError):
        check(stub)
