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


def compute_loss(labels, logits):
    per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    examples = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
    return tf.nn.compute_average_loss(per_example, global_batch_size=examples)


def _train_step(loss_fn, reduce_op=tf.distribute.ReduceOp.SUM):
    def distributed_train_step(strategy, model, optimizer, batch):
        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(features, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce(reduce_op, per_replica, axis=None)

    return distributed_train_step


def diagnose_reduction(gradient_ratio, loss_ratio, examples_per_replica, global_batch_size):
    replicas, examples = len(examples_per_replica), sum(examples_per_replica)

    def close(value, target):
        return abs(value - target) <= 1e-3 * max(1.0, abs(target))

    if close(gradient_ratio, 1):
        return "right" if close(loss_ratio, 1) else "loss reported with ReduceOp.MEAN"
    if close(gradient_ratio, replicas):
        return "reduce_mean per replica"
    if close(gradient_ratio, global_batch_size):
        return "global_batch_size passed positionally"
    if examples < global_batch_size and close(gradient_ratio, examples / global_batch_size):
        return "constant global_batch_size on a short batch"
    return "Keras loss object on an uneven split"


# --- wrong solutions --------------------------------------------------------------------


def built_outside_the_scope(strategy, num_features, num_classes):
    model = cu.models.mlp(num_features, num_classes, hidden_units=(8,))
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def not_compiled(strategy, num_features, num_classes):
    with strategy.scope():
        return cu.models.mlp(num_features, num_classes, hidden_units=(8,))


def mean_per_replica(labels, logits):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def keras_loss_object(labels, logits):  # right on even splits only
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)


def constant_global_batch(labels, logits):  # right on full batches only
    per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    return tf.nn.compute_average_loss(per_example,
                                      global_batch_size=tf.shape(labels)[0] * replicas)


def always_right(gradient_ratio, loss_ratio, examples_per_replica, global_batch_size):
    return "right"


def distribute(strategy, examples, global_batch_size):
    def dataset_fn(input_context):
        per_replica = input_context.get_per_replica_batch_size(global_batch_size)
        return examples.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id).batch(per_replica)
    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_unsharded(strategy, examples, global_batch_size):
    def dataset_fn(input_context):
        return examples.batch(input_context.get_per_replica_batch_size(global_batch_size))
    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_global_batches(strategy, examples, global_batch_size):
    def dataset_fn(input_context):
        return examples.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id).batch(global_batch_size)
    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_auto_sharded(strategy, examples, global_batch_size):
    return strategy.experimental_distribute_dataset(examples.batch(global_batch_size))


def stub(*args, **kwargs):
    # YOUR CODE HERE
    raise NotImplementedError()


# --- tests ------------------------------------------------------------------------------


def test_lesson_02_registers_its_checks():
    for name in ("check_build_and_compile", "check_compute_loss",
                 "check_distributed_train_step", "check_diagnose_reduction",
                 "check_distribute_dataset"):
        assert getattr(checks, name) is getattr(cu.grading, name) is getattr(lesson_02, name)


def test_the_reference_solutions_pass(capsys):
    assert checks.check_build_and_compile(build_and_compile) is True
    assert checks.check_compute_loss(compute_loss) is True
    assert checks.check_distributed_train_step(_train_step(compute_loss)) is True
    assert checks.check_diagnose_reduction(diagnose_reduction) is True
    assert checks.check_distribute_dataset(distribute) is True
    assert capsys.readouterr().out.count("✅") == 5


def test_a_model_built_outside_the_scope_is_named():
    with pytest.raises(AssertionError, match="outside strategy.scope") as caught:
        checks.check_build_and_compile(built_outside_the_scope)
    assert "Hint:" in str(caught.value)


def test_an_uncompiled_model_fails():
    with pytest.raises(AssertionError, match="not compiled"):
        checks.check_build_and_compile(not_compiled)


def test_a_mean_per_replica_fails_with_the_measured_ratio():
    with pytest.raises(AssertionError) as caught:
        checks.check_compute_loss(mean_per_replica)
    message = str(caught.value)
    replicas = cu.make_strategy("mirrored", verbose=False).num_replicas_in_sync
    assert f"{replicas:.4g}× the one-device gradient" in message, message
    assert "all_reduce" in message  # the hint names the fix


@pytest.mark.parametrize("wrong", [keras_loss_object, constant_global_batch])
def test_reductions_right_only_on_full_batches_fail_on_a_short_one(wrong):
    with pytest.raises(AssertionError, match=r"global batch of \d+\): split over 4 replicas"):
        checks.check_compute_loss(wrong)


def test_a_step_with_a_constant_global_batch_fails_on_the_short_last_batch():
    with pytest.raises(AssertionError, match="short last batch"):
        checks.check_distributed_train_step(_train_step(constant_global_batch))


def test_a_step_reporting_the_mean_over_replicas_fails_on_the_loss():
    with pytest.raises(AssertionError, match="ReduceOp.SUM"):
        checks.check_distributed_train_step(
            _train_step(compute_loss, tf.distribute.ReduceOp.MEAN))


def test_a_step_waiting_for_compute_loss_says_so():
    with pytest.raises(AssertionError, match="write compute_loss first"):
        checks.check_distributed_train_step(_train_step(stub))


def test_a_diagnosis_that_always_says_right_is_told_the_cause():
    with pytest.raises(AssertionError, match="this is '.*', not 'right'"):
        checks.check_diagnose_reduction(always_right)


def test_every_diagnosis_is_reachable():
    assert set(lesson_02.DIAGNOSES) == {
        "right", "reduce_mean per replica", "global_batch_size passed positionally",
        "loss reported with ReduceOp.MEAN", "constant global_batch_size on a short batch",
        "Keras loss object on an uneven split"}


@pytest.mark.parametrize(("wrong", "says"), [
    (distribute_unsharded, "both workers read the same examples"),
    (distribute_global_batches, r"make \d+ steps, got \d+"),  # a global batch per replica
    (distribute_auto_sharded, "distribute_datasets_from_function"),
])
def test_a_dataset_distributed_the_wrong_way_is_told_what_to_fix(wrong, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_distribute_dataset(wrong)


@pytest.mark.parametrize("check", [checks.check_build_and_compile, checks.check_compute_loss,
                                   checks.check_distributed_train_step,
                                   checks.check_diagnose_reduction,
                                   checks.check_distribute_dataset])
def test_stubs_are_not_attempted(check, capsys):
    with strict_checks(False):
        assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(True), pytest.raises(NotAttemptedError):
        check(stub)
