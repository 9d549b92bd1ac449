"""Lesson 02's checks: the reference solutions pass, wrong ones fail saying why, stubs are
"not attempted". The unit-test process has 4 logical CPUs (tests/conftest.py), so the checks'
strategy has 4 replicas here."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import course_utils as cu
from course_utils.grading import checks
from course_utils.grading.checks import lesson_02
from course_utils.grading.framework import NotAttemptedError, strict_checks

# --- reference solutions (as in solutions/02_mirrored_strategy_solutions.ipynb) -------------


def save_and_restore(model, optimizer, directory, build_fresh):
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(
        os.path.join(directory, "ckpt"))
    fresh_model, fresh_optimizer = build_fresh()
    tf.train.Checkpoint(model=fresh_model, optimizer=fresh_optimizer).read(path)
    return fresh_model, fresh_optimizer


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


def diagnose_loop(strategy, make_train_step, build_model, features, labels, global_batch_size):
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    replicas = strategy.num_replicas_in_sync

    def measure(size):
        x, y = features[:size], labels[:size]
        with strategy.scope():
            model = build_model()
            optimizer = keras.optimizers.SGD(learning_rate=1.0)
            optimizer.build(model.trainable_variables)
        before = model.get_weights()
        one_device = build_model()
        one_device.set_weights(before)
        with tf.GradientTape() as tape:
            true_loss = tf.reduce_mean(per_example(y, one_device(x)))
        true_gradients = [g.numpy() for g in
                          tape.gradient(true_loss, one_device.trainable_variables)]
        batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)
        reported = float(make_train_step(model, optimizer)(
            next(iter(strategy.experimental_distribute_dataset(batches)))))
        applied = [b - a for a, b in zip(model.get_weights(), before, strict=True)]
        ratio = (sum(np.vdot(a, g) for a, g in zip(applied, true_gradients, strict=True))
                 / sum(np.vdot(g, g) for g in true_gradients))
        return ratio, reported / float(true_loss)

    def close(value, target):
        return abs(value - target) <= 1e-3 * max(1.0, abs(target))

    gradient, loss = measure(global_batch_size)
    if close(gradient, replicas) and replicas > 1:
        return "reduce_mean per replica"
    if close(gradient, global_batch_size):
        return "global_batch_size passed positionally"
    if not close(loss, 1):
        return "loss reported with ReduceOp.MEAN"
    short = replicas + 1
    short_gradient, _ = measure(short)
    if close(short_gradient, 1):
        return "right"
    if close(short_gradient, short / global_batch_size):
        return "constant global_batch_size on a short batch"
    return "Keras loss object on an uneven split"


# --- wrong solutions --------------------------------------------------------------------


def copy_weights_only(model, optimizer, directory, build_fresh):
    fresh_model, fresh_optimizer = build_fresh()
    fresh_model.set_weights(model.get_weights())
    return fresh_model, fresh_optimizer


def checkpoint_without_optimizer(model, optimizer, directory, build_fresh):
    path = tf.train.Checkpoint(model=model).write(os.path.join(directory, "ckpt"))
    fresh_model, fresh_optimizer = build_fresh()
    tf.train.Checkpoint(model=fresh_model).read(path)
    return fresh_model, fresh_optimizer


def return_the_originals(model, optimizer, directory, build_fresh):
    tf.train.Checkpoint(model=model, optimizer=optimizer).write(os.path.join(directory, "c"))
    build_fresh()
    return model, optimizer


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


def always_right(strategy, make_train_step, build_model, features, labels, global_batch_size):
    return "right"


def full_batch_only(strategy, make_train_step, build_model, features, labels,
                    global_batch_size):
    """Measures only a full batch: cannot tell the short-batch mistakes from right."""
    diagnosis = diagnose_loop(strategy, make_train_step, build_model, features, labels,
                              global_batch_size)
    return "right" if diagnosis in ("constant global_batch_size on a short batch",
                                    "Keras loss object on an uneven split") else diagnosis


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
    for name in ("check_save_and_restore", "check_compute_loss",
                 "check_distributed_train_step", "check_diagnose_loop",
                 "check_distribute_dataset"):
        assert getattr(checks, name) is getattr(cu.grading, name) is getattr(lesson_02, name)


def test_the_reference_solutions_pass(capsys):
    assert checks.check_save_and_restore(save_and_restore) is True
    assert checks.check_compute_loss(compute_loss) is True
    assert checks.check_distributed_train_step(_train_step(compute_loss)) is True
    assert checks.check_diagnose_loop(diagnose_loop) is True
    assert checks.check_distribute_dataset(distribute) is True
    assert capsys.readouterr().out.count("✅") == 5


@pytest.mark.parametrize(("wrong", "says"), [
    (copy_weights_only, "no TensorFlow checkpoint"),
    (checkpoint_without_optimizer, "restored optimizer state differ"),
    (return_the_originals, r"that build_fresh\(\) gave you"),
])
def test_a_checkpoint_that_misses_a_part_is_told_which(wrong, says):
    with pytest.raises(AssertionError, match=says) as caught:
        checks.check_save_and_restore(wrong)
    assert "Hint:" in str(caught.value)


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
    with pytest.raises(AssertionError, match="this loop is '.*', not 'right'"):
        checks.check_diagnose_loop(always_right)


def test_a_diagnosis_that_never_tries_a_short_batch_fails():
    with pytest.raises(AssertionError, match="on a short batch'|on an uneven split'"):
        checks.check_diagnose_loop(full_batch_only)


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


@pytest.mark.parametrize("check", [checks.check_save_and_restore, checks.check_compute_loss,
                                   checks.check_distributed_train_step,
                                   checks.check_diagnose_loop,
                                   checks.check_distribute_dataset])
def test_stubs_are_not_attempted(check, capsys):
    with strict_checks(False):
        assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(True), pytest.raises(NotAttemptedError):
        check(stub)


# --- the rest of the adversarial catalogue: every exercise, six or more wrong answers -------


def restored_never(model, optimizer, directory, build_fresh):  # written, never read
    tf.train.Checkpoint(model=model, optimizer=optimizer).write(os.path.join(directory, "c"))
    return build_fresh()


def copied_by_hand(model, optimizer, directory, build_fresh):  # a checkpoint for show
    tf.train.Checkpoint(model=model, optimizer=optimizer).write(os.path.join(directory, "c"))
    fresh_model, fresh_optimizer = build_fresh()
    for target, source in zip(fresh_optimizer.variables, optimizer.variables, strict=True):
        target.assign(source)
    fresh_model.set_weights(model.get_weights())
    return fresh_model, fresh_optimizer


@pytest.mark.parametrize(("wrong", "says"), [
    (restored_never, "restored weights differ"),
    (copied_by_hand, "restored weights differ"),  # the originals are gone by then
])
def test_save_and_restore_catalogue_is_rejected(wrong, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_save_and_restore(wrong)


def positional_count(labels, logits):  # the count passed as sample_weight
    per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    examples = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
    return tf.nn.compute_average_loss(per_example, tf.cast(examples, tf.float32))


def summed_only(labels, logits):  # never divided
    return tf.reduce_sum(
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def constant_loss(labels, logits):
    return tf.constant(1.0)


@pytest.mark.parametrize("wrong", [positional_count, summed_only, constant_loss])
def test_compute_loss_catalogue_is_rejected(wrong):
    with pytest.raises(AssertionError, match="compute_loss: case"):
        checks.check_compute_loss(wrong)


def _step_without_update(strategy, model, optimizer, batch):  # the loss, no training
    def replica_step(features, labels):
        return compute_loss(labels, model(features, training=True))
    losses = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


def _first_replica_reported(strategy, model, optimizer, batch):  # one replica's share
    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            loss = compute_loss(labels, model(features, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss
    return strategy.experimental_local_results(strategy.run(replica_step, args=batch))[0]


@pytest.mark.parametrize("wrong", [_step_without_update, _first_replica_reported,
                                   _train_step(mean_per_replica)])
def test_distributed_train_step_catalogue_is_rejected(wrong):
    with pytest.raises(AssertionError, match="distributed_train_step: case"):
        checks.check_distributed_train_step(wrong)


@pytest.mark.parametrize("constant", ["reduce_mean per replica",
                                      "Keras loss object on an uneven split",
                                      "global_batch_size passed positionally"])
def test_diagnose_loop_constants_are_rejected(constant):
    def always(strategy, make_train_step, build_model, features, labels, global_batch_size):
        return constant

    with pytest.raises(AssertionError, match="diagnose_loop: case"):
        checks.check_diagnose_loop(always)


def distribute_dropping_the_remainder(strategy, examples, global_batch_size):
    def dataset_fn(input_context):
        per_replica = input_context.get_per_replica_batch_size(global_batch_size)
        shard = examples.shard(input_context.num_input_pipelines,
                               input_context.input_pipeline_id)
        return shard.batch(per_replica, drop_remainder=True)
    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_unbatched(strategy, examples, global_batch_size):
    def dataset_fn(input_context):
        return examples.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_pipeline_zero_only(strategy, examples, global_batch_size):  # index ignored
    def dataset_fn(input_context):
        per_replica = input_context.get_per_replica_batch_size(global_batch_size)
        return examples.shard(input_context.num_input_pipelines, 0).batch(per_replica)
    return strategy.distribute_datasets_from_function(dataset_fn)


@pytest.mark.parametrize("wrong", [distribute_dropping_the_remainder, distribute_unbatched,
                                   distribute_pipeline_zero_only])
def test_distribute_catalogue_is_rejected(wrong):
    with pytest.raises(AssertionError, match="distribute: case|distribute_dataset"):
        checks.check_distribute_dataset(wrong)


def test_more_diagnoses_and_steps_are_rejected():
    def says_mean(strategy, make_train_step, build_model, features, labels, global_batch_size):
        return "loss reported with ReduceOp.MEAN"

    with pytest.raises(AssertionError, match="diagnose_loop: case"):
        checks.check_diagnose_loop(says_mean)
    with pytest.raises(AssertionError, match="distributed_train_step: case"):
        checks.check_distributed_train_step(_train_step(keras_loss_object))
