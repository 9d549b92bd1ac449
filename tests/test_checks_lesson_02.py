"""Lesson 02's checks: the reference solutions pass, wrong ones fail saying why, stubs are
"not attempted". The unit-test process has 4 logical CPUs (tests/conftest.py), so the checks'
strategy has 4 replicas here. Each exercise has an adversarial catalogue of six or more wrong
answers as a learner would write them."""

from __future__ import annotations

import gc
import glob
import os
import sys
import tempfile
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import course_utils as cu
from course_utils.grading import checks
from course_utils.grading.checks import file_shards, lesson_02
from course_utils.grading.framework import NotAttemptedError, strict_checks

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from catalogue_routes import FULL_ENV, LEFT_OUT, catalogue_params  # noqa: E402

SUM = tf.distribute.ReduceOp.SUM

# --- reference solutions (as in solutions/02_mirrored_strategy_solutions.ipynb) -------------


ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def _train_on(strategy, model, optimizer, examples, global_batch, start, steps):
    """``steps`` steps of the run's loop under ``strategy``, from the stream's batch ``start``."""
    batches = tf.data.Dataset.from_tensor_slices(examples).repeat().batch(global_batch)
    _train_steps(strategy, model, optimizer, batches.skip(start).take(steps), global_batch)


def _train_steps(strategy, model, optimizer, batches, global_batch):
    """One step of the run's loop under ``strategy`` for each of ``batches``."""
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(y, model(x, training=True)),
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    step = tf.function(lambda batch: strategy.run(replica_step, args=batch))
    for batch in strategy.experimental_distribute_dataset(batches):
        step(batch)


def _run_batch(config):
    return config["per_replica_batch_size"] * config["num_replicas"]


def resume_training(directory, build_fresh, strategy, examples, config):
    model, optimizer = build_fresh()
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
        tf.train.latest_checkpoint(directory)).assert_existing_objects_matched()
    done = int(optimizer.iterations.numpy())
    _train_on(strategy, model, optimizer, examples, _run_batch(config), done,
              config["total_steps"] - done)
    return model, optimizer


def _scored(queries, keys):
    return tf.matmul(queries, keys, transpose_b=True)


def compute_loss(queries, keys):
    context = tf.distribute.get_replica_context()
    every_key = context.all_gather(keys, axis=0)  # replica 0's first
    counts = context.all_gather(tf.shape(queries)[:1], axis=0)
    first = tf.reduce_sum(counts[:context.replica_id_in_sync_group])
    targets = first + tf.range(tf.shape(queries)[0])
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(targets,
                                                            _scored(queries, every_key))
    return tf.reduce_sum(losses) / tf.cast(tf.reduce_sum(counts), losses.dtype)


def _clipped(gradients, clip_norm, how):
    """The update each replica hands apply_gradients, clipped ``how`` (None: not at all)."""
    context = tf.distribute.get_replica_context()
    if how == "global":  # the right one: scale each part by the global gradient's norm
        total = context.all_reduce(SUM, gradients)
        return [g * tf.minimum(1.0, clip_norm / tf.linalg.global_norm(total))
                for g in gradients]
    if how == "replica":  # this replica's part clipped by its own norm
        return tf.clip_by_global_norm(gradients, clip_norm)[0]
    if how == "sum applied":  # the global gradient clipped, then summed again by the optimizer
        return tf.clip_by_global_norm(context.all_reduce(SUM, gradients), clip_norm)[0]
    if how == "squares":  # the norm from the parts' squared norms, summed
        norm = tf.sqrt(context.all_reduce(SUM, tf.linalg.global_norm(gradients) ** 2))
        return [g * tf.minimum(1.0, clip_norm / norm) for g in gradients]
    if how == "normalised":  # always scaled to clip_norm: no min(1, ...), never left as it is
        total = context.all_reduce(SUM, gradients)
        return [g * (clip_norm / tf.linalg.global_norm(total)) for g in gradients]
    if how == "per tensor":  # clip_by_norm of each variable's global gradient, divided back
        total = context.all_reduce(SUM, gradients)
        replicas = context.num_replicas_in_sync
        return [tf.clip_by_norm(g, clip_norm) / replicas for g in total]
    return gradients


def _train_step(loss_fn, reduce_op=SUM, how="global"):
    def distributed_train_step(strategy, model, optimizer, batch, clip_norm):
        def replica_step(query_features, key_features):
            with tf.GradientTape() as tape:
                loss = loss_fn(model(query_features, training=True),
                               model(key_features, training=True))
            gradients = _clipped(tape.gradient(loss, model.trainable_variables), clip_norm,
                                 how)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce(reduce_op, per_replica, axis=None)

    return distributed_train_step


def diagnose_loop(strategy, make_train_step, build_model, features, labels, global_batch_size,
                  projection_only=False):
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
        return applied, true_gradients, reported / float(true_loss)

    def factor(applied, true_gradients):
        return (sum(np.vdot(a, g) for a, g in zip(applied, true_gradients, strict=True))
                / sum(np.vdot(g, g) for g in true_gradients))

    def equal(applied, true_gradients, scale=1.0):  # weight for weight, not projected
        return all(np.allclose(a, scale * g, rtol=1e-3, atol=1e-5)
                   for a, g in zip(applied, true_gradients, strict=True))

    def close(value, target):
        return abs(value - target) <= 1e-3 * max(1.0, abs(target))

    applied, true_gradients, loss = measure(global_batch_size)
    gradient = factor(applied, true_gradients)
    if close(gradient, replicas) and replicas > 1:
        return "reduce_mean per replica"
    if close(gradient, global_batch_size):
        return "global_batch_size passed positionally"
    if not close(loss, 1):
        return "loss reported with ReduceOp.MEAN"
    # replicas + 1 as the hint says; the projection-only answer takes 2 replicas - 1 (the same
    # at the notebook's 2 replicas), which leaves no replica empty at the tests' 4 either
    short = 2 * replicas - 1 if projection_only else replicas + 1
    applied, true_gradients, _ = measure(short)  # a Keras loss object can project to ~1
    if (close(factor(applied, true_gradients), 1) if projection_only
            else equal(applied, true_gradients)):
        return "right"
    if equal(applied, true_gradients, short / global_batch_size):
        return "constant global_batch_size on a short batch"
    return "Keras loss object on an uneven split"




def always_right(strategy, make_train_step, build_model, features, labels, global_batch_size):
    return "right"


def full_batch_only(strategy, make_train_step, build_model, features, labels,
                    global_batch_size):
    """Measures only a full batch: cannot tell the short-batch mistakes from right."""
    diagnosis = diagnose_loop(strategy, make_train_step, build_model, features, labels,
                              global_batch_size)
    return "right" if diagnosis in ("constant global_batch_size on a short batch",
                                    "Keras loss object on an uneven split") else diagnosis


def make_files_dataset_fn(files, global_batch_size, shuffle_buffer):
    def dataset_fn(input_context):
        pipelines = input_context.num_input_pipelines
        pipeline = input_context.input_pipeline_id
        names = tf.data.Dataset.from_tensor_slices(files)
        if len(files) >= pipelines:  # whole files: each pipeline opens only its own
            records = tf.data.TFRecordDataset(names.shard(pipelines, pipeline))
        else:  # too few: every pipeline reads every file, in order, and keeps its share
            records = tf.data.TFRecordDataset(names).shard(pipelines, pipeline)
        batch = input_context.get_per_replica_batch_size(global_batch_size)
        return records.shuffle(shuffle_buffer).batch(batch)
    return dataset_fn


def stub(*args, **kwargs):
    # YOUR CODE HERE
    raise NotImplementedError()


# --- tests ------------------------------------------------------------------------------


def test_lesson_02_registers_its_checks():
    for name in ("check_resume_training", "check_compute_loss",
                 "check_distributed_train_step", "check_diagnose_loop",
                 "check_make_files_dataset_fn"):
        assert getattr(checks, name) is getattr(cu.grading, name) is getattr(lesson_02, name)


@pytest.mark.solution_passes
def test_the_reference_solutions_pass(capsys):
    assert checks.check_resume_training(resume_training) is True
    assert checks.check_compute_loss(compute_loss) is True
    assert checks.check_distributed_train_step(_train_step(compute_loss)) is True
    assert checks.check_diagnose_loop(diagnose_loop) is True
    assert checks.check_make_files_dataset_fn(make_files_dataset_fn) is True
    assert capsys.readouterr().out.count("✅") == 5


@pytest.mark.parametrize("check", [checks.check_resume_training, checks.check_compute_loss,
                                   checks.check_distributed_train_step,
                                   checks.check_diagnose_loop,
                                   checks.check_make_files_dataset_fn])
def test_stubs_are_not_attempted(check, capsys):
    with strict_checks(False):
        assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(True), pytest.raises(NotAttemptedError):
        check(stub)


# --- exercise 1: resume_training ----------------------------------------------------------


def _restored(path, build_fresh, optimizer_too=True):
    model, optimizer = build_fresh()
    parts = {"model": model, "optimizer": optimizer} if optimizer_too else {"model": model}
    tf.train.Checkpoint(**parts).restore(path).expect_partial()
    return model, optimizer


def _resumed_from(path, directory, build_fresh, strategy, examples, config):
    """The right continuation, from the checkpoint at ``path`` (not necessarily the latest)."""
    model, optimizer = _restored(path, build_fresh)
    done = int(optimizer.iterations.numpy())
    _train_on(strategy, model, optimizer, examples, _run_batch(config), done,
              config["total_steps"] - done)
    return model, optimizer


def _index_files(directory):
    return [path[:-len(".index")] for path in glob.glob(os.path.join(directory, "ckpt-*.index"))]


def restored_only(directory, build_fresh, strategy, examples, config):  # exercise 1 of old
    model, optimizer = _restored(tf.train.latest_checkpoint(directory), build_fresh)
    return model, optimizer


def lesson_loop_from_the_start(directory, build_fresh, strategy, examples, config):
    """Cell 30's restore, then cell 20's loop over the dataset from its first batch."""
    model, optimizer = _restored(tf.train.latest_checkpoint(directory), build_fresh)
    done = int(optimizer.iterations.numpy())
    _train_on(strategy, model, optimizer, examples, _run_batch(config), 0,
              config["total_steps"] - done)
    return model, optimizer


def this_strategys_global_batch(directory, build_fresh, strategy, examples, config):
    """The per-replica batch kept, times the replicas of the strategy resumed under."""
    model, optimizer = _restored(tf.train.latest_checkpoint(directory), build_fresh)
    done = int(optimizer.iterations.numpy())
    batch = config["per_replica_batch_size"] * strategy.num_replicas_in_sync
    _train_on(strategy, model, optimizer, examples, batch, done, config["total_steps"] - done)
    return model, optimizer


def model_only(directory, build_fresh, strategy, examples, config):  # Adam's state left
    latest = tf.train.latest_checkpoint(directory)
    model, optimizer = _restored(latest, build_fresh, optimizer_too=False)
    done = int(tf.train.load_checkpoint(latest).get_tensor(ITERATIONS))
    _train_on(strategy, model, optimizer, examples, _run_batch(config), done,
              config["total_steps"] - done)
    return model, optimizer


def steps_from_file_name(directory, build_fresh, strategy, examples, config):
    latest = tf.train.latest_checkpoint(directory)
    model, optimizer = _restored(latest, build_fresh)
    done = int(latest.rsplit("-", 1)[-1])
    _train_on(strategy, model, optimizer, examples, _run_batch(config), done,
              config["total_steps"] - done)
    return model, optimizer


def sorted_by_name(*args):  # ckpt-9 sorts after ckpt-12
    return _resumed_from(sorted(_index_files(args[0]))[-1], *args)


def highest_number(*args):  # the natural sort: ckpt-12 after ckpt-9, the rollback missed
    return _resumed_from(max(_index_files(args[0]),
                             key=lambda path: int(path.rsplit("-", 1)[-1])), *args)


def newest_file(*args):  # the file written last, by its time: the copy's
    return _resumed_from(max(_index_files(args[0]),
                             key=lambda path: os.path.getmtime(path + ".index")), *args)


def most_steps(*args):  # each checkpoint read: the one that trained most
    return _resumed_from(max(_index_files(args[0]), key=lambda path: int(
        tf.train.load_checkpoint(path).get_tensor(ITERATIONS))), *args)


def course_checkpoints(directory, build_fresh, strategy, examples, config):
    from course_utils.training.checkpoints import Checkpoints as Resumer

    model, optimizer = build_fresh()
    Resumer(directory, model, optimizer, max_to_keep=None).restore()
    done = int(optimizer.iterations.numpy())
    _train_on(strategy, model, optimizer, examples, _run_batch(config), done,
              config["total_steps"] - done)
    return model, optimizer


def trained_outside_the_replicas(directory, build_fresh, strategy, examples, config):
    """The right batches, trained on one device's step (no strategy.run)."""
    model, optimizer = _restored(tf.train.latest_checkpoint(directory), build_fresh)
    done, batch = int(optimizer.iterations.numpy()), _run_batch(config)
    _train_on(tf.distribute.get_strategy(), model, optimizer, examples, batch, done,
              config["total_steps"] - done)
    return model, optimizer


def right_with_extra_calls(directory, build_fresh, strategy, examples, config):
    """Right, then the model called once more in the replicas on a whole global batch."""
    model, optimizer = resume_training(directory, build_fresh, strategy, examples, config)
    batch = tf.data.Dataset.from_tensor_slices(examples).batch(_run_batch(config))
    strategy.run(model, args=(next(iter(strategy.experimental_distribute_dataset(batch)))[0],))
    return model, optimizer


def _batched_then_repeated(directory, build_fresh, strategy, examples, config,
                           drop_remainder=False):
    """The right checkpoint and steps, on a stream batched before it repeats (r02 L1)."""
    model, optimizer = _restored(tf.train.latest_checkpoint(directory), build_fresh)
    done, batch = int(optimizer.iterations.numpy()), _run_batch(config)
    stream = tf.data.Dataset.from_tensor_slices(examples).batch(
        batch, drop_remainder=drop_remainder).repeat().skip(done)
    _train_steps(strategy, model, optimizer, stream.take(config["total_steps"] - done), batch)
    return model, optimizer


def _trained_elsewhere_then_shown(directory, build_fresh, strategy, examples, config):
    """Right weights from a copy trained on one device (its Adam state copied back), the
    returned model called in the replicas on the remaining batches for show (r02 L2)."""
    model, optimizer = _restored(tf.train.latest_checkpoint(directory), build_fresh)
    done, batch = int(optimizer.iterations.numpy()), _run_batch(config)
    if strategy.num_replicas_in_sync == 1:
        _train_on(strategy, model, optimizer, examples, batch, done,
                  config["total_steps"] - done)
        return model, optimizer
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    copied = keras.optimizers.Adam(learning_rate=float(optimizer.learning_rate.numpy()))
    copied.build(copy.trainable_variables)
    for mine, theirs in zip(copied.variables, optimizer.variables, strict=True):
        mine.assign(theirs)
    _train_on(tf.distribute.get_strategy(), copy, copied, examples, batch, done,
              config["total_steps"] - done)
    model.set_weights(copy.get_weights())
    for mine, theirs in zip(optimizer.variables, copied.variables, strict=True):
        mine.assign(theirs)
    stream = tf.data.Dataset.from_tensor_slices(examples).repeat().batch(batch).skip(done)
    show = tf.function(lambda b: strategy.run(lambda x, y: model(x), args=b))
    for b in strategy.experimental_distribute_dataset(stream.take(config["total_steps"] - done)):
        show(b)
    return model, optimizer


_RUNS: dict = {}  # the check's checkpointed runs, by shape: made once for the catalogue


@pytest.fixture
def shared_checkpointed_runs(monkeypatch, tmp_path_factory):
    """The check's own training runs and checkpoints, made once per shape (the same draws for
    every wrong answer) and copied into each call's folder: the catalogue checks the answers
    against real checkpoints of the check's code, without training them again."""
    import random
    import shutil

    from course_utils.grading.checks import resume

    made = resume._checkpointed_run

    def shared(context, rng, steps, directory, saved_after, global_batch, size):
        key = (context.num_replicas_in_sync, type(context).__name__, steps,
               tuple(sorted(saved_after)), global_batch, size)
        if key not in _RUNS:
            folder = tmp_path_factory.mktemp("resume_run")
            _RUNS[key] = (folder, made(context, rng, steps, str(folder), saved_after,
                                       global_batch, size))
        folder, result = _RUNS[key]
        shutil.copytree(folder, directory, dirs_exist_ok=True)
        return result

    monkeypatch.setattr(resume, "_checkpointed_run", shared)
    monkeypatch.setattr(resume, "fresh_rng", lambda: random.Random(20))


RESUME_CATALOGUE = {
    "restored, not trained on (the old exercise)": (
        restored_only, "Adam's step count is"),
    "the lesson's restore and loop, the stream from its start": (
        lesson_loop_from_the_start, r"trained on the stream's first [23] batches"),
    "the per-replica batch × this strategy's replicas": (
        this_strategys_global_batch, r"global batches of \d+ \(the per-replica batch × this "),
    "the model restored, Adam not": (model_only, "Restore the optimizer's state"),
    "steps read off the file name": (steps_from_file_name, "Adam's step count is"),
    "sorted by name": (sorted_by_name, r"as if from ckpt-9 \(step 8\); from the latest"),
    "the newest file (a copy)": (newest_file, r"as if from ckpt-9 \(step 8\); from the latest"),
    "the highest number": (highest_number, "saved on the steps the run abandoned"),
    "the checkpoint with the most steps": (most_steps, "saved on the steps the run abandoned"),
    "the course's Checkpoints, bound as an alias": (
        course_checkpoints, "ran the course's .*restore with tf.train's own API"),
    "trained outside the replicas": (trained_outside_the_replicas,
                                     "the model ran in `strategy`'s replicas on 0 examples"),
    "right, the model called once more": (right_with_extra_calls,
                                          r"the model ran on \d+ examples while your"),
    "the stream batched, then repeated (r02 L1)": (
        _batched_then_repeated, "not a whole number of the run's global batches"),
    "the stream batched dropping its remainder, then repeated (r02 L1)": (
        lambda *args: _batched_then_repeated(*args, drop_remainder=True),
        r"differ .* from its batch \d+: its first batch crosses the end"),
    "a copy trained on one device, the model called in the replicas for show (r02 L2)": (
        _trained_elsewhere_then_shown, "Adam was handed no gradient"),
}


@pytest.mark.parametrize(("wrong", "says"), catalogue_params(RESUME_CATALOGUE))
def test_resume_training_catalogue_is_rejected(wrong, says, shared_checkpointed_runs):
    with pytest.raises(AssertionError, match=says) as caught:
        checks.check_resume_training(wrong)
    assert "Hint:" in str(caught.value)


def highest_number_recorded_as_latest(directory, build_fresh, strategy, examples, config):
    """The highest number, then every folder of the temporary directory that holds the same
    'checkpoint' record as the given one (the check's own copy) told it is the latest."""
    import tempfile

    best = os.path.basename(max(_index_files(directory),
                                key=lambda path: int(path.rsplit("-", 1)[-1])))
    with open(os.path.join(directory, "checkpoint")) as handle:
        mine = handle.read()
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), "*")):
        record = os.path.join(folder, "checkpoint")
        if folder != directory and os.path.isfile(record):
            with open(record) as handle:
                same = handle.read() == mine
            if same:
                with open(record, "w") as handle:
                    handle.write(f'model_checkpoint_path: "{best}"\n')
    return highest_number(directory, build_fresh, strategy, examples, config)


def test_rewriting_the_checks_copy_is_refused(shared_checkpointed_runs):
    with pytest.raises(AssertionError, match="a checkpoint folder other than the one you"):
        checks.check_resume_training(highest_number_recorded_as_latest)


# --- exercise 2: compute_loss (the whole global batch's negatives) and distributed_train_step


def _losses_over(queries, keys, targets):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(targets, _scored(queries, keys))


def one_device_loss(queries, keys):  # the notebook's, bound under the answer's name
    targets = tf.range(tf.shape(queries)[0])
    return tf.reduce_mean(_losses_over(queries, keys, targets))


def colleague_loss(queries, keys):  # the notebook's: the lesson's counted reduction (cell 33)
    targets = tf.range(tf.shape(queries)[0])
    pairs = tf.distribute.get_replica_context().all_reduce(SUM, tf.shape(queries)[0])
    return tf.nn.compute_average_loss(_losses_over(queries, keys, targets),
                                      global_batch_size=pairs)


def _gathered(queries, keys, first="counted", divide="pairs", stop=None):
    """Every key gathered; this replica's targets start at ``first``; the sum divided by
    ``divide``; ``stop``: which gathered keys carry no gradient."""
    context = tf.distribute.get_replica_context()
    every_key = context.all_gather(keys, axis=0)
    mine = tf.shape(queries)[0]
    counts = context.all_gather(tf.shape(queries)[:1], axis=0)
    at = context.replica_id_in_sync_group
    start = {"counted": tf.reduce_sum(counts[:at]), "zero": 0, "even": at * mine,
             "largest": at * tf.reduce_max(counts)}[first]
    if stop == "all":
        every_key = tf.stop_gradient(every_key)
    elif stop == "others":  # this replica's own keys put back, with their gradient
        before = tf.stop_gradient(every_key[:start])
        after = tf.stop_gradient(every_key[start + mine:])
        every_key = tf.concat([before, keys, after], axis=0)
    losses = _losses_over(queries, every_key, start + tf.range(mine))
    total = {"pairs": tf.cast(tf.reduce_sum(counts), losses.dtype),
             "mine": tf.cast(mine, losses.dtype),
             "mine x replicas": tf.cast(mine * context.num_replicas_in_sync, losses.dtype)}
    return tf.reduce_sum(losses) / total[divide]


def every_pair_in_every_replica(queries, keys):
    """Right: the queries gathered too, the whole batch's loss in each replica, its N-th."""
    context = tf.distribute.get_replica_context()
    every_query, every_key = (context.all_gather(t, axis=0) for t in (queries, keys))
    return one_device_loss(every_query, every_key) / context.num_replicas_in_sync


def nan_on_an_empty_replica(queries, keys):
    """This replica's mean times its share of the pairs: NaN where it has none (r02 L3)."""
    context = tf.distribute.get_replica_context()
    counts = context.all_gather(tf.shape(queries)[:1], axis=0)
    mean = _gathered(queries, keys, divide="mine")
    return mean * tf.cast(tf.shape(queries)[0] / tf.reduce_sum(counts), mean.dtype)


def constant_loss(queries, keys):
    return tf.constant(1.0)


OWN_KEYS = r"global batch of \d+ pairs.*scored against its own replica's keys only"
ADDS_UP_TO = r"global batch of \d+ pairs.*the replicas' losses add up to [\d.]+; one device"
SHORT_ADDS_UP = (r"case [34] \(inside 4 replicas, a global batch of \d+ pairs.*the replicas' "
                 "losses add up to [\\d.]+; one device")
GRADIENT_ONLY = r"add up to one device's loss \([\d.]+\), but their summed gradient"

LOSS_CATALOGUE = {  # the right loss: test_the_reference_solutions_pass
    "a constant": (constant_loss, "compute_loss: case 1 .*differs"),
    "the colleague's loss, as given (the lesson's counted reduction)": (colleague_loss,
                                                                        OWN_KEYS),
    "one_device_loss bound as compute_loss": (one_device_loss, ADDS_UP_TO),
    "every key gathered, the targets from 0": (
        lambda q, k: _gathered(q, k, first="zero"), ADDS_UP_TO),
    "every key gathered, the mean of this replica's queries": (
        lambda q, k: _gathered(q, k, divide="mine"), ADDS_UP_TO),
    "every key gathered, the targets from replica id x its pairs (an even split)": (
        lambda q, k: _gathered(q, k, first="even"), SHORT_ADDS_UP),
    "every key gathered, divided by its pairs x replicas (an even split)": (
        lambda q, k: _gathered(q, k, divide="mine x replicas"), SHORT_ADDS_UP),
    "every key gathered under stop_gradient": (lambda q, k: _gathered(q, k, stop="all"),
                                               GRADIENT_ONLY),
    "the others' keys under stop_gradient, its own put back": (
        lambda q, k: _gathered(q, k, stop="others"), GRADIENT_ONLY),
    "the mean of its pairs times its share, NaN on an empty replica (r02 L3)": (
        nan_on_an_empty_replica, "add up to nan"),
    "every key gathered, the targets from replica id x the largest share (r02 L4)": (
        lambda q, k: _gathered(q, k, first="largest"), r"case 5 .* split as input pipelines"),
}


@pytest.mark.parametrize(("wrong", "says"), catalogue_params(LOSS_CATALOGUE))
def test_compute_loss_catalogue_is_rejected(wrong, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_compute_loss(wrong)


@pytest.mark.skipif(os.environ.get(FULL_ENV) != "1", reason=LEFT_OUT)
def test_the_whole_loss_in_every_replica_passes_too():
    assert checks.check_compute_loss(every_pair_in_every_replica) is True


def _step_without_update(strategy, model, optimizer, batch, clip_norm):  # no training
    def replica_step(query_features, key_features):
        return compute_loss(model(query_features, training=True),
                            model(key_features, training=True))
    return strategy.reduce(SUM, strategy.run(replica_step, args=batch), axis=None)


def _keras_global_clipnorm(strategy, model, optimizer, batch, clip_norm):
    optimizer.global_clipnorm = clip_norm  # Keras clips each replica's part
    return _train_step(compute_loss, how=None)(strategy, model, optimizer, batch, clip_norm)


def _the_batch_across(strategy, batch):
    return (tf.concat(strategy.experimental_local_results(t), 0) for t in batch)


def _gathered_on_one_device(strategy, model, optimizer, batch, clip_norm):
    """The right update made the wrong way: the global batch gathered and trained in the
    cross-replica context (the model called once in the replicas, for show)."""
    strategy.run(lambda query_features, key_features: model(query_features), args=batch)
    query_features, key_features = _the_batch_across(strategy, batch)
    with tf.GradientTape() as tape:
        loss = one_device_loss(model(query_features, training=True),
                               model(key_features, training=True))
    gradients, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables),
                                          clip_norm)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    return loss


def _replica_losses_and_gradients(strategy, model, batch):
    """Each replica's pair loss and its gradients, unreduced (``strategy.run``'s results)."""
    def replica_step(query_features, key_features):
        with tf.GradientTape() as tape:
            loss = compute_loss(model(query_features, training=True),
                                model(key_features, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)
    return strategy.run(replica_step, args=batch)


def _momentum_by_hand(strategy, model, optimizer, batch, clip_norm):
    """The right update typed by hand on the optimizer's own momentum slots, its iterations
    counted by hand: apply_gradients never called (r02 L5)."""
    losses, gradients = _replica_losses_and_gradients(strategy, model, batch)
    gradients, _ = tf.clip_by_global_norm(
        [strategy.reduce(SUM, g, axis=None) for g in gradients], clip_norm)
    for variable, gradient in zip(model.trainable_variables, gradients, strict=True):
        velocity = optimizer.momentums[optimizer._get_variable_index(variable)]
        velocity.assign(velocity * optimizer.momentum - optimizer.learning_rate * gradient)
        variable.assign_add(velocity)
    optimizer.iterations.assign_add(1)
    return strategy.reduce(SUM, losses, axis=None)


def _constant_loss_step(strategy, model, optimizer, batch, clip_norm):
    return tf.constant(1.0)


UPDATE_DIFFERED = "after step 1 .* weights differ from one device"  # the loss of step 1 equal


def _through_the_layers(model, inputs):
    for layer in model.layers[1:]:
        inputs = layer(inputs)
    return inputs


def _every_replica_the_whole_batch(strategy, model, optimizer, batch, clip_norm,
                                   embed="model"):
    """No data parallelism: every replica gathers the global batch's features, embeds all of
    it and applies its N-th of the one-device clipped gradient: the right weights, N times
    the work. ``embed``: "keys" (the keys' features gathered, its own queries embedded: the
    gradient needs no gather), "layers" (the layers called one by one; the model on no
    example), "hand" (the layers' weights run by hand; the model on its slice for show, after
    the tape) or "hand, on the tape" (that call on the tape, times 0)."""
    def replica_step(query_features, key_features):
        context = tf.distribute.get_replica_context()
        every_query, every_key = (context.all_gather(t, axis=0)
                                  for t in (query_features, key_features))
        with tf.GradientTape() as tape:
            if embed == "keys":
                loss = _keys_embedded_here(model, query_features, every_key)
            else:
                run = {"model": lambda t: model(t, training=True),
                       "layers": lambda t: _through_the_layers(model, t)}.get(
                    embed, lambda t: _forward_by_hand(model, t))
                if embed == "layers":
                    model(query_features[:0], training=True)
                loss = one_device_loss(run(every_query), run(every_key))
                if embed == "hand, on the tape":
                    loss += 0.0 * tf.reduce_sum(model(query_features, training=True))
        if embed == "hand":
            model(query_features, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        if embed != "keys":  # the whole batch's loss in every replica: its N-th applied
            grads = [g / context.num_replicas_in_sync for g in grads]
        grads = _clipped(grads, clip_norm, "global")
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss / (1 if embed == "keys" else context.num_replicas_in_sync)

    return strategy.reduce(SUM, strategy.run(replica_step, args=batch), axis=None)


def _keys_embedded_here(model, query_features, every_key_feature):
    """This replica's share, every key embedded by this replica from the gathered features."""
    context = tf.distribute.get_replica_context()
    counts = context.all_gather(tf.shape(query_features)[:1], axis=0)
    start = tf.reduce_sum(counts[:context.replica_id_in_sync_group])
    queries = model(query_features, training=True)
    losses = _losses_over(queries, model(every_key_feature, training=True),
                          start + tf.range(tf.shape(queries)[0]))
    return tf.reduce_sum(losses) / tf.cast(tf.reduce_sum(counts), losses.dtype)


FLOWS_UNEXPLAINED = ("the backward passes through the model's calls in the replicas do not "
                     "explain")
FED_TOO_MUCH = r"the replicas together ran the model on \d+ queries and keys"


def _forward_by_hand(model, x):
    """The model's Dense layers run from their weights: no layer called, nothing counted."""
    dense = [layer for layer in model.layers if layer.weights]
    for index, layer in enumerate(dense):
        x = tf.matmul(x, layer.kernel) + layer.bias
        x = tf.nn.relu(x) if index < len(dense) - 1 else x
    return x


def _gathered_by_hand_across_replicas(strategy, model, optimizer, batch, clip_norm):
    """The global batch gathered in the cross-replica context and run through the layers'
    weights by hand there (no model call outside a replica), the model called in each replica
    on its slice for show, the clipped gradient applied across the replicas."""
    strategy.run(lambda query_features, key_features: model(query_features, training=True),
                 args=batch)
    query_features, key_features = _the_batch_across(strategy, batch)
    with tf.GradientTape() as tape:
        loss = one_device_loss(_forward_by_hand(model, query_features),
                               _forward_by_hand(model, key_features))
    gradients, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables),
                                          clip_norm)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    return loss


STEP_CATALOGUE = {
    "a constant": (_constant_loss_step, "the model was called 0 times"),
    # the first answer of each rejection runs in make test (tests/tools/catalogue_routes.py)
    "each replica's part clipped": (_train_step(compute_loss, how="replica"),
                                    UPDATE_DIFFERED),
    "the loss, no update": (_step_without_update, UPDATE_DIFFERED),
    "the lesson's step, no clip": (_train_step(compute_loss, how=None),
                                   UPDATE_DIFFERED),
    "reported with ReduceOp.MEAN": (_train_step(compute_loss, tf.distribute.ReduceOp.MEAN),
                                    "the loss of step 1"),
    "Keras's global_clipnorm": (_keras_global_clipnorm, UPDATE_DIFFERED),
    "the clipped sum applied, summed again": (_train_step(compute_loss, how="sum applied"),
                                              UPDATE_DIFFERED),
    "the norm from the parts' squared norms": (_train_step(compute_loss, how="squares"),
                                               UPDATE_DIFFERED),
    "each tensor clipped by its own norm": (_train_step(compute_loss, how="per tensor"),
                                            UPDATE_DIFFERED),
    # told apart where a step's norm is under clip_norm: case 1's short batch when its norm
    # is (a draw), else case 2, whose clip binds on no step
    "normalised to clip_norm, not clipped": (_train_step(compute_loss, how="normalised"),
                                             "case 2 .*step 1's norm|case 1 .*after step 2 "
                                             r".*a global norm of [\d.e+-]+ \(clip_norm"),
    "the batch gathered, trained across replicas": (_gathered_on_one_device,
                                                    "outside any replica"),
    "compute_loss not written yet": (_train_step(stub), "write compute_loss first"),
    "every replica gathers and trains the whole global batch": (
        _every_replica_the_whole_batch, FED_TOO_MUCH),
    "every replica gathers the keys' features and embeds them all": (
        lambda *args: _every_replica_the_whole_batch(*args, embed="keys"), FED_TOO_MUCH),
    "every replica runs the layers on the whole global batch": (
        lambda *args: _every_replica_the_whole_batch(*args, embed="layers"), FED_TOO_MUCH),
    "every replica runs the layers' weights by hand on the whole global batch (r02 L1)": (
        lambda *args: _every_replica_the_whole_batch(*args, embed="hand"), FLOWS_UNEXPLAINED),
    "the same, the model's call on the slice on the tape times 0": (
        lambda *args: _every_replica_the_whole_batch(*args, embed="hand, on the tape"),
        FLOWS_UNEXPLAINED),
    "the batch gathered and run by hand across replicas, the model called for show": (
        _gathered_by_hand_across_replicas, FLOWS_UNEXPLAINED),
    "SGD with momentum typed by hand, apply_gradients not called (r02 L5)": (
        _momentum_by_hand, "was handed no gradient"),
}


@pytest.mark.parametrize(("wrong", "says"), catalogue_params(STEP_CATALOGUE))
def test_distributed_train_step_catalogue_is_rejected(wrong, says):
    # one full batch and the short one: every answer here but the normalised one is told
    # apart by step 1 already
    with pytest.raises(AssertionError, match=says):
        checks.check_distributed_train_step(wrong, num_full_batches=1)


def _whole_gradient_shared(strategy, model, optimizer, batch, clip_norm):
    """Right: each replica's gradient all-reduced, the sum clipped, and each replica hands the
    optimizer its N-th (the parts are equal; apply_gradients sums them back)."""
    def replica_step(query_features, key_features):
        with tf.GradientTape() as tape:
            loss = compute_loss(model(query_features, training=True),
                                model(key_features, training=True))
        context = tf.distribute.get_replica_context()
        whole = context.all_reduce(SUM, tape.gradient(loss, model.trainable_variables))
        clipped, _ = tf.clip_by_global_norm(whole, clip_norm)
        share = [g / context.num_replicas_in_sync for g in clipped]
        optimizer.apply_gradients(zip(share, model.trainable_variables, strict=True))
        return loss
    return strategy.reduce(SUM, strategy.run(replica_step, args=batch), axis=None)


def _reduced_then_applied_across(strategy, model, optimizer, batch, clip_norm):
    """Right (r02): the replicas' gradients reduced to the cross-replica context, clipped
    there and applied there (Keras all-reduces nothing outside a replica context)."""
    losses, gradients = _replica_losses_and_gradients(strategy, model, batch)
    gradients = [strategy.reduce(SUM, g, axis=None) for g in gradients]
    clipped, _ = tf.clip_by_global_norm(gradients, clip_norm)
    optimizer.apply_gradients(zip(clipped, model.trainable_variables, strict=True))
    return strategy.reduce(SUM, losses, axis=None)


@pytest.mark.parametrize("right", [_whole_gradient_shared, _reduced_then_applied_across])
def test_other_right_steps_pass(right):
    assert checks.check_distributed_train_step(right, num_full_batches=1) is True


# --- exercise 3: diagnose_loop -------------------------------------------------------------


def test_a_diagnosis_that_always_says_right_is_told_to_run_the_loop():
    with pytest.raises(AssertionError, match="answered 'right' without running a single step"):
        checks.check_diagnose_loop(always_right)


def test_a_diagnosis_that_never_tries_a_short_batch_fails():
    with pytest.raises(AssertionError, match="on a short batch'|on an uneven split'"):
        checks.check_diagnose_loop(full_batch_only)


def right_by_the_projection_alone(strategy, make_train_step, build_model, features, labels,
                                  global_batch_size):
    """A fresh read's answer (nb32-02, 4 of 4 on the former data): the reference, but "right"
    named by the short batch's update projecting to 1, not by comparing weight for weight
    (its short batch split unevenly, no replica empty)."""
    return diagnose_loop(strategy, make_train_step, build_model, features, labels,
                         global_batch_size, projection_only=True)


def test_right_named_by_the_projection_alone_is_refused():
    """Every case's data make a Keras loss object's short-batch update project to exactly 1
    (loops.projecting_data): the projection alone calls it right."""
    with pytest.raises(AssertionError, match="this loop is 'Keras loss object on an uneven "
                                             "split', not 'right'"):
        checks.check_diagnose_loop(right_by_the_projection_alone)


def test_the_keras_loss_objects_update_projects_to_one_on_the_checks_data():
    """loops.projecting_data: the per-example gradients are orthogonal, of one norm."""
    import random

    from course_utils.grading.checks.loops import projecting_data

    x, y, build_model = projecting_data(random.Random(5), classes=3)
    model = build_model()
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    gradients = []
    for i in range(3):  # a short batch of 3 on 2 replicas: 2 and 1
        with tf.GradientTape() as tape:
            loss = per_example(y[i:i + 1], model(x[i:i + 1]))[0]
        gradients.append(tape.gradient(loss, model.trainable_variables)[0].numpy())
    true = sum(gradients) / 3
    keras_update = (gradients[0] + gradients[1]) / 4 + gradients[2] / 2
    assert abs(np.vdot(keras_update, true) / np.vdot(true, true) - 1) < 1e-5
    assert not np.allclose(keras_update, true, rtol=1e-3, atol=1e-5)


def one_short_step_by_the_reported_loss(strategy, make_train_step, build_model, features,
                                        labels, global_batch_size):
    """A fresh read's answer (E3-L2, 6 of 6 while every loop reported the loss it
    differentiated): one step on a short batch of replicas + 1, the reported loss divided by
    the one-device mean loss, no gradient, no full batch; each kind named by that ratio."""
    replicas, size = strategy.num_replicas_in_sync, strategy.num_replicas_in_sync + 1
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    x, y = features[:size], labels[:size]
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(learning_rate=1.0)
        optimizer.build(model.trainable_variables)
    true = float(tf.reduce_mean(per_example(y, model(x))))
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)
    ratio = float(make_train_step(model, optimizer)(
        next(iter(strategy.experimental_distribute_dataset(batches))))) / true
    for target, kind in ((1, "right"), (1 / replicas, "loss reported with ReduceOp.MEAN"),
                         (size / global_batch_size,
                          "constant global_batch_size on a short batch")):
        if abs(ratio - target) <= 1e-3 * max(1.0, target):
            return kind
    if ratio > global_batch_size / 2:
        return "global_batch_size passed positionally"
    if ratio >= 1.5 or ratio != ratio:
        return "reduce_mean per replica"
    return "Keras loss object on an uneven split"


def test_a_diagnosis_by_the_reported_loss_alone_is_refused():
    """The deck gives at least one loop whose update is wrong a report of the true mean loss,
    computed apart from the gradient: read alone, the report calls that loop right."""
    with pytest.raises(AssertionError, match="this loop is '.*', not 'right'"):
        checks.check_diagnose_loop(one_short_step_by_the_reported_loss)


def test_the_deck_reports_the_true_mean_for_some_loop_whose_update_is_wrong():
    from course_utils.data import teacher_classification
    from course_utils.grading.checks.loops import LoopBox
    from course_utils.models import mlp

    strategy, wrong = lesson_02.mirrored_strategy(), lesson_02.DIAGNOSES[1:3] + \
        lesson_02.DIAGNOSES[4:]
    x, y = teacher_classification(8, 4, 3, seed=0)
    batch = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8))))
    box = LoopBox(strategy)
    try:
        calls_right = []
        for _ in range(len(lesson_02.DIAGNOSES)):
            number, loop = box.loop(8, lesson_02.DIAGNOSES)
            with strategy.scope():
                model = mlp(4, 3, hidden_units=(8,), name="deck_report")
                optimizer = keras.optimizers.SGD(learning_rate=1.0)
                optimizer.build(model.trainable_variables)
            true = float(tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x), from_logits=True)))
            ratio = float(loop(model, optimizer)(batch)) / true
            verdict = box.verdict(number, "right")
            kind = "right" if verdict is None else verdict.split("'")[1]
            calls_right.append(kind in wrong and abs(ratio - 1) < 1e-3)
    finally:
        box.close()
    assert any(calls_right)


def test_every_diagnosis_is_reachable():
    assert set(lesson_02.DIAGNOSES) == {
        "right", "reduce_mean per replica", "global_batch_size passed positionally",
        "loss reported with ReduceOp.MEAN", "constant global_batch_size on a short batch",
        "Keras loss object on an uneven split"}


def _closure_values(fn):
    """Every value in fn's closure and in the closures of the functions found there (names
    built at run time: the checks refuse the plain ones by name, and these answers test what
    stands behind that refusal)."""
    closure_of, contents = "".join(["__clo", "sure__"]), "".join(["cell_", "contents"])
    values, todo, seen = {}, [fn], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:  # closures that reach each other (TensorFlow's wrappers)
            continue
        seen.add(id(current))
        cells = getattr(current, closure_of, None) or ()
        for name, cell in zip(current.__code__.co_freevars, cells, strict=True):
            value = getattr(cell, contents)
            values.setdefault(name, value)
            if callable(value) and hasattr(value, "__code__"):
                todo.append(value)
    return values


def read_from_the_closure(strategy, make_train_step, build_model, features, labels,
                          global_batch_size):  # the loop read, never run
    values = _closure_values(make_train_step)
    if values.get("report") == tf.distribute.ReduceOp.MEAN:
        return "loss reported with ReduceOp.MEAN"
    loss = values.get("replica_loss")
    if not hasattr(loss, "__code__"):
        return "Keras loss object on an uneven split"
    if loss.__name__ == "counted":
        return "right"
    if "reduce_mean" in loss.__code__.co_names:
        return "reduce_mean per replica"
    return "constant global_batch_size on a short batch"


def test_a_diagnosis_read_from_the_loops_closure_is_rejected():
    with pytest.raises(AssertionError, match="without running a single step"):
        checks.check_diagnose_loop(read_from_the_closure)


def _one_frozen_step(strategy, make_train_step, build_model, features, labels, size):
    """One step with SGD(0.0) on ``size`` examples: it runs, and moves nothing."""
    with strategy.scope():
        model, optimizer = build_model(), keras.optimizers.SGD(learning_rate=0.0)
        optimizer.build(model.trainable_variables)
    batches = tf.data.Dataset.from_tensor_slices((features[:size], labels[:size])).batch(size)
    make_train_step(model, optimizer)(next(iter(strategy.experimental_distribute_dataset(
        batches))))


def ran_one_step_then_read_the_closure(strategy, make_train_step, build_model, features,
                                       labels, global_batch_size):  # finding 11 of the read
    _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                     global_batch_size)
    return read_from_the_closure(strategy, make_train_step, build_model, features, labels,
                                 global_batch_size)


def ran_one_step_then_decoded_the_numbers(strategy, make_train_step, build_model, features,
                                          labels, global_batch_size):
    """Runs one frozen full step, then decodes the loop's constants (a, b, c, e, f)."""
    _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                     global_batch_size)
    values = {name: float(value) for name, value in _closure_values(make_train_step).items()
              if isinstance(value, tf.Tensor)}
    if not np.isclose(values["f_num"], values["f_den"]):
        return "loss reported with ReduceOp.MEAN"
    if values["c"]:
        return "right"
    if values["e"]:
        return "constant global_batch_size on a short batch"
    replicas = strategy.num_replicas_in_sync
    if np.isclose(values["a"] / values["b"], global_batch_size / replicas):
        return "global_batch_size passed positionally"
    if np.isclose(values["b"] / values["a"], 1.0):
        return "reduce_mean per replica"
    return "Keras loss object on an uneven split"


def short_step_too_then_decoded_the_numbers(strategy, make_train_step, build_model, features,
                                            labels, global_batch_size):
    """Runs a frozen full step and a frozen short one, then decodes the loop's constants."""
    _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                     strategy.num_replicas_in_sync + 1)
    return ran_one_step_then_decoded_the_numbers(strategy, make_train_step, build_model,
                                                 features, labels, global_batch_size)


def _checkers_verify(make_train_step):
    """The check's verify function for this loop, found among the process's objects."""
    for thing in getattr(gc, "".join(["get_", "objects"]))():
        if type(thing).__name__ == "Case" and len(thing.args) > 1 and (
                thing.args[1] is make_train_step):
            return thing.verify
    raise LookupError("no case")


def read_the_checkers_case(strategy, make_train_step, build_model, features, labels,
                           global_batch_size):
    """Runs a frozen full and short step, then reads the answer off the check's own case."""
    for size in (global_batch_size, strategy.num_replicas_in_sync + 1):
        _one_frozen_step(strategy, make_train_step, build_model, features, labels, size)
    verify = _checkers_verify(make_train_step)
    return next((v for v in (verify.__defaults__ or ()) if v in lesson_02.DIAGNOSES), "right")


def asked_the_checkers_box(strategy, make_train_step, build_model, features, labels,
                           global_batch_size):
    """Runs a frozen full and short step, then asks the check's own verdict function."""
    for size in (global_batch_size, strategy.num_replicas_in_sync + 1):
        _one_frozen_step(strategy, make_train_step, build_model, features, labels, size)
    verify = _checkers_verify(make_train_step)
    number, verdict = verify.__defaults__[0], verify.__defaults__[3]
    said = verdict(number, "right")
    return "right" if said is None else said.split("'")[1]


@pytest.mark.parametrize(("wrong", "says"), [
    (ran_one_step_then_read_the_closure, "full batches only|this loop is|raised"),
    (ran_one_step_then_decoded_the_numbers, "after steps on full batches only|raised"),
    (short_step_too_then_decoded_the_numbers, "raised KeyError"),
    (read_the_checkers_case, "this loop is '"),
    (asked_the_checkers_box, "verdict had been asked before the check asked"),
])
def test_a_diagnosis_that_runs_a_frozen_step_and_reads_the_loop_is_rejected(wrong, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_diagnose_loop(wrong)


def test_every_kind_of_loop_runs_one_code_whose_closure_names_no_mistake():
    from course_utils.grading.checks.loops import LoopBox

    box = LoopBox(lesson_02.mirrored_strategy())
    try:
        loops = [box.loop(8, kind=kind)[1] for kind in lesson_02.DIAGNOSES]
        assert len({loop.__code__ for loop in loops}) == 1
        for loop in loops:
            values = _closure_values(loop).values()
            assert not any(isinstance(value, str | float | tf.Tensor) for value in values)
            assert not any(getattr(value, "__name__", "") == "counted" for value in values)
    finally:
        box.close()


def test_the_deck_holds_every_kind_once_and_extras_among_the_short_batch_kinds():
    """So that a guess by elimination among the short-batch kinds not yet answered, which
    passed 1 check in 6 with one loop of each kind, passes 1 in 405 (the best fixed guess)."""
    from course_utils.grading.checks.loops import LoopBox

    extra, short = lesson_02.EXTRA_SHORT_BATCH_LOOPS, lesson_02.SHORT_BATCH_DIAGNOSES
    for _ in range(3):  # each deck drawn afresh by the child
        box = LoopBox(lesson_02.mirrored_strategy())
        try:
            numbers = [box.loop(8, lesson_02.DIAGNOSES, extra_from=short, extra=extra)[0]
                       for _ in range(len(lesson_02.DIAGNOSES) + extra)]
            verdicts = [box.verdict(number, "right") for number in numbers]
        finally:
            box.close()
        kinds = ["right" if v is None else v.split("'")[1] for v in verdicts]
        assert set(kinds) == set(lesson_02.DIAGNOSES)
        for kind in lesson_02.DIAGNOSES:
            kinds.remove(kind)
        assert len(kinds) == extra and set(kinds) <= set(short)


@pytest.mark.parametrize("constant", ["reduce_mean per replica",
                                      "Keras loss object on an uneven split",
                                      "global_batch_size passed positionally",
                                      "loss reported with ReduceOp.MEAN"])
def test_diagnose_loop_constants_are_rejected(constant):
    def always(strategy, make_train_step, build_model, features, labels, global_batch_size):
        return constant

    with pytest.raises(AssertionError, match="without running a single step"):
        checks.check_diagnose_loop(always)


# --- exercise 4: make_files_dataset_fn (whole files, or every file and a share) -----------


def _answer(make_records, shuffle=True):
    """A make_files_dataset_fn whose dataset_fn reads ``make_records(files, context)``, then
    shuffles with shuffle_buffer and batches per replica (each part as the reference does)."""
    def make_files_dataset_fn(files, global_batch_size, shuffle_buffer):
        def dataset_fn(context):
            records = make_records(files, context)
            if shuffle:
                records = records.shuffle(shuffle_buffer)
            return records.batch(context.get_per_replica_batch_size(global_batch_size))
        return dataset_fn
    make_files_dataset_fn.__name__ = make_records.__name__
    return make_files_dataset_fn


def _split(files, context):  # the reference's records, shuffle and batch left out
    names = tf.data.Dataset.from_tensor_slices(files)
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(files) >= n:
        return tf.data.TFRecordDataset(names.shard(n, i))
    return tf.data.TFRecordDataset(names).shard(n, i)


def sliced_and_interleaved(files, global_batch_size, shuffle_buffer):  # a right variant
    def dataset_fn(context):
        n, i = context.num_input_pipelines, context.input_pipeline_id
        if len(files) >= n:  # a Python slice of the names, its own files' order shuffled
            names = tf.data.Dataset.from_tensor_slices(files[i::n]).shuffle(len(files))
            records = names.interleave(tf.data.TFRecordDataset, cycle_length=2)
        else:
            records = tf.data.TFRecordDataset(files).shard(n, i)
        return records.shuffle(shuffle_buffer).batch(
            context.get_per_replica_batch_size(global_batch_size))
    return dataset_fn


def constant(files, global_batch_size, shuffle_buffer):
    return None


@_answer
def constant_dataset(files, context):
    return tf.data.Dataset.from_tensors(b"0")


@_answer
def unsplit(files, context):  # the work skipped: every worker reads everything
    return tf.data.TFRecordDataset(files)


def lesson_cell_85(files, global_batch_size, shuffle_buffer):  # copied unchanged
    def dataset_fn(input_context):
        per_replica_batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        return tf.data.Dataset.range(256).shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id).batch(
            per_replica_batch_size)
    return dataset_fn


def course_pipeline_unsplit(files, global_batch_size, shuffle_buffer):  # cu.data's helper
    def dataset_fn(context):
        return cu.data.make_pipeline(
            tf.data.TFRecordDataset(files), context.get_per_replica_batch_size(
                global_batch_size), shuffle_buffer=shuffle_buffer)
    return dataset_fn


@_answer
def records_split_always(files, context):  # cell 85 on files: every worker reads every file
    return tf.data.TFRecordDataset(files).shard(context.num_input_pipelines,
                                                context.input_pipeline_id)


@_answer
def own_files_kept_from_all(files, context):  # right records, read from every file
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(files) < n:
        return _split(files, context)
    tagged = tf.data.Dataset.from_tensor_slices((files, tf.range(len(files)))).interleave(
        lambda name, number: tf.data.TFRecordDataset(name).map(lambda r: (r, number)),
        cycle_length=1)
    return tagged.filter(lambda r, number: number % n == i).map(lambda r, number: r)


@_answer
def files_split_always(files, context):  # a pipeline without a file reads nothing
    return tf.data.TFRecordDataset(tf.data.Dataset.from_tensor_slices(files).shard(
        context.num_input_pipelines, context.input_pipeline_id))


@_answer
def shuffled_then_split(files, context):  # each worker shuffles its own way, then cuts
    if len(files) >= context.num_input_pipelines:
        return _split(files, context)
    return tf.data.TFRecordDataset(files).shuffle(10_000).shard(
        context.num_input_pipelines, context.input_pipeline_id)


@_answer
def seeded_then_split(files, context):  # an op seed: the workers' global seeds differ
    if len(files) >= context.num_input_pipelines:
        return _split(files, context)
    return tf.data.TFRecordDataset(files).shuffle(10_000, seed=7).shard(
        context.num_input_pipelines, context.input_pipeline_id)


@_answer
def names_shuffled_then_split(files, context):  # list_files' default, by hand
    names = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files))
    if len(files) >= context.num_input_pipelines:
        return tf.data.TFRecordDataset(names.shard(context.num_input_pipelines,
                                                   context.input_pipeline_id))
    return _split(files, context)


@_answer
def workers_made_to_agree(files, context):  # one seed for every worker: the process's gone
    tf.random.set_seed(1234)
    return tf.data.TFRecordDataset(files).shuffle(10_000).shard(
        context.num_input_pipelines, context.input_pipeline_id)


def batch_per_worker(files, global_batch_size, shuffle_buffer):  # not per replica
    def dataset_fn(context):
        return _split(files, context).shuffle(shuffle_buffer).batch(
            global_batch_size // context.num_input_pipelines)
    return dataset_fn


def remainder_dropped(files, global_batch_size, shuffle_buffer):
    def dataset_fn(context):
        return _split(files, context).shuffle(shuffle_buffer).batch(
            context.get_per_replica_batch_size(global_batch_size), drop_remainder=True)
    return dataset_fn


unshuffled = _answer(_split, shuffle=False)
unshuffled.__name__ = "unshuffled"


def same_order_each_epoch(files, global_batch_size, shuffle_buffer):
    def dataset_fn(context):
        return _split(files, context).shuffle(shuffle_buffer, reshuffle_each_iteration=False
                                              ).batch(context.get_per_replica_batch_size(
                                                  global_batch_size))
    return dataset_fn


def buffer_of_64(files, global_batch_size, shuffle_buffer):  # a buffer typed, too small
    def dataset_fn(context):
        return _split(files, context).shuffle(64).batch(
            context.get_per_replica_batch_size(global_batch_size))
    return dataset_fn


def buffer_capped_at_64(files, global_batch_size, shuffle_buffer):  # "memory": a cap of 64
    def dataset_fn(context):
        return _split(files, context).shuffle(min(shuffle_buffer, 64)).batch(
            context.get_per_replica_batch_size(global_batch_size))
    return dataset_fn


def buffer_of_a_million(files, global_batch_size, shuffle_buffer):  # typed, shuffle_buffer unread
    def dataset_fn(context):
        return _split(files, context).shuffle(1_000_000).batch(
            context.get_per_replica_batch_size(global_batch_size))
    return dataset_fn


def batches_shuffled(files, global_batch_size, shuffle_buffer):  # lesson 01's bug
    def dataset_fn(context):
        return _split(files, context).batch(context.get_per_replica_batch_size(
            global_batch_size)).shuffle(shuffle_buffer)
    return dataset_fn


def buffer_own_unless_tiny(files, global_batch_size, shuffle_buffer):  # x02 L3: 13
    def dataset_fn(context):
        return _split(files, context).shuffle(10_000 if shuffle_buffer > 3 else 1).batch(
            context.get_per_replica_batch_size(global_batch_size))
    return dataset_fn


def small_buffers_ignored(files, global_batch_size, shuffle_buffer):  # x02 L3: 14
    def dataset_fn(context):
        return _split(files, context).shuffle(shuffle_buffer if shuffle_buffer > 3 else 1
                                              ).batch(context.get_per_replica_batch_size(
                                                  global_batch_size))
    return dataset_fn


def per_replica_for_two(files, global_batch_size, shuffle_buffer):  # x02 L4: 2 replicas typed
    def dataset_fn(context):
        return _split(files, context).shuffle(shuffle_buffer).batch(
            global_batch_size // (2 * context.num_input_pipelines))
    return dataset_fn


def _every_file(files, context, read_one):  # whole files kept by number, every file read
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(files) < n:
        return _split(files, context)
    exists = lambda name: tf.numpy_function(  # noqa: E731
        lambda s: os.path.exists(s.decode()), [name], tf.bool)
    return tf.data.Dataset.from_tensor_slices(files).enumerate().filter(
        lambda number, name: exists(name)).interleave(
        lambda number, name: read_one(name).filter(lambda r: tf.equal(number % n, i)),
        cycle_length=1)


@_answer
def every_file_missing_skipped(files, context):  # x02 L1: 16
    return _every_file(files, context, tf.data.TFRecordDataset)


@_answer
def every_file_errors_ignored(files, context):  # x02 R1: 21, hung the check on missing files
    return _every_file(files, context, lambda name: tf.data.TFRecordDataset(name).ignore_errors())


@_answer
def every_present_file_by_name(files, context):  # x02 L2: 17
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(files) < n:
        return _split(files, context)
    present = [name for name in files if os.path.exists(name)]
    own = tf.constant([os.path.basename(name) for name in files[i::n]])
    pairs = tf.data.Dataset.from_tensor_slices(present).interleave(
        lambda name: tf.data.TFRecordDataset(name).map(lambda r: (name, r)), cycle_length=1)
    return pairs.filter(lambda name, r: tf.reduce_any(tf.equal(
        tf.strings.split(name, "/")[-1], own))).map(lambda name, r: r)


@_answer
def few_interleaved_in_any_order(files, context):  # x02 L5: 18, passed with 1 file drawn
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(files) >= n:
        return _split(files, context)
    return tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False).shard(n, i)


@_answer
def repeated_for_ever(files, context):  # an endless pipeline: the check's time limit ends it
    return _split(files, context).repeat()


def _dealt_in_blocks(files, context, size):  # xf02b L1, L2: contiguous blocks of files
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(files) < n:
        return _split(files, context)
    rest_to_the_last = i == n - 1 and size * n <= len(files)
    mine = files[i * size:] if rest_to_the_last else files[i * size:(i + 1) * size]
    return tf.data.TFRecordDataset(tf.constant(mine, tf.string))


@_answer
def files_in_blocks_of_the_ceiling(files, context):  # [2, 2, 2, 0]: passed 2 of 3 before
    return _dealt_in_blocks(files, context, -(-len(files) // context.num_input_pipelines))


@_answer
def files_in_blocks_rest_to_the_last(files, context):  # [1, 1, 1, 3]: passed 1 of 3 before
    return _dealt_in_blocks(files, context, len(files) // context.num_input_pipelines)


@_answer
def every_file_but_the_small_ones(files, context):  # xf02b L3: decoys told by their size
    n, i = context.num_input_pipelines, context.input_pipeline_id
    if len(files) < n:
        return _split(files, context)
    sizes = [os.path.getsize(name) for name in files]
    usable = [k for k, size in enumerate(sizes) if size >= max(sizes) // 2]
    return tf.data.Dataset.from_tensor_slices(([files[k] for k in usable], usable)).interleave(
        lambda name, k: tf.data.TFRecordDataset(name).map(lambda r: (r, k)),
        cycle_length=1).filter(lambda r, k: k % n == i).map(lambda r, k: r)


def buffer_capped_at_1000(files, global_batch_size, shuffle_buffer):  # xf02b L4: > any share
    def dataset_fn(context):
        return _split(files, context).shuffle(min(shuffle_buffer, 1000)).batch(
            context.get_per_replica_batch_size(global_batch_size))
    return dataset_fn


@_answer
def few_read_backwards(files, context):  # xf02b L5 (x02 L6): not the order given
    if len(files) >= context.num_input_pipelines:
        return _split(files, context)
    return tf.data.TFRecordDataset(files[::-1]).shard(context.num_input_pipelines,
                                                      context.input_pipeline_id)


def _access_times_kept():
    """Whether this file system moves a file's access time on a read (relatime, strictatime)."""
    with tempfile.NamedTemporaryFile(delete=False) as probe:
        probe.write(b"x")
    path = probe.name
    mtime = os.stat(path).st_mtime_ns
    os.utime(path, ns=(mtime - 3600 * 10**9, mtime))
    with open(path, "rb") as again:
        again.read()
    kept = os.stat(path).st_atime_ns >= mtime
    os.remove(path)
    return kept


def test_an_endless_pipeline_fails_on_the_checks_time_limit(monkeypatch):
    monkeypatch.setattr(file_shards, "READ_SECONDS", 2)
    with pytest.raises(AssertionError, match=r"took more than 2 s or .*no endless repeat"):
        checks.check_make_files_dataset_fn(repeated_for_ever)


@pytest.mark.skipif(not _access_times_kept(), reason="this file system keeps no access times")
def test_every_file_read_with_errors_ignored_is_seen_by_access_time():
    with pytest.raises(AssertionError, match=r"not its own.*access time moved"):
        checks.check_make_files_dataset_fn(every_file_errors_ignored)


@pytest.mark.parametrize("right", [make_files_dataset_fn, sliced_and_interleaved])
def test_right_dataset_fns_pass(right):
    assert checks.check_make_files_dataset_fn(right) is True


SHARES_CUT_BY_SEED = "cuts differently in each worker|both gave|missing"


@pytest.mark.parametrize(("wrong", "says"), catalogue_params([
    (constant, "must return a function of input_context"),
    (constant_dataset, "both gave|records of the files'"),
    (unsplit, "both gave"),
    (lesson_cell_85, "records of the files'"),
    (course_pipeline_unsplit, "both gave"),
    (records_split_always, r"kept \d+ of file \d+'s \d+ records"),
    (own_files_kept_from_all, "opens files that are not its own"),
    (files_split_always, r"pipeline \d of \d got no records"),
    (shuffled_then_split, SHARES_CUT_BY_SEED),
    (seeded_then_split, SHARES_CUT_BY_SEED),
    (names_shuffled_then_split, SHARES_CUT_BY_SEED),
    (workers_made_to_agree, "set TensorFlow's global seed"),
    (batch_per_worker, r"batches held \[\d+\] records|gave the replicas"),
    (remainder_dropped, r"[1-9]\d* missing"),
    (unshuffled, "same order in both epochs"),
    (same_order_each_epoch, "same order in both epochs"),
    (buffer_of_64, "not a buffer of your own"),
    (buffer_capped_at_64, r"came out more than \d+ places before|a buffer of 64, not"),
    (buffer_of_a_million, "not a buffer of your own"),
    (batches_shuffled,
     r"came out right after the record read before them|batches held|gave the replicas"),
    (buffer_own_unless_tiny,
     r"no record of pipeline \d's \d+ came out [12] places? early|a buffer of 10000, not"),
    (small_buffers_ignored, r"no record of pipeline \d's \d+ came out [12] places? early"),
    (per_replica_for_two,  # by a worker's batches or, one pipeline drawn, by a step's parts
     r"batches held \[\d+\] records, expected|gave the replicas \[[\d, ]+\] records, expected"),
    (every_file_missing_skipped, "not its own.*Is this even a TFRecord"),
    (every_present_file_by_name, "not its own.*Is this even a TFRecord"),
    (few_interleaved_in_any_order, SHARES_CUT_BY_SEED + "|in the order given"),
    (files_in_blocks_of_the_ceiling, "deal the files evenly"),
    (files_in_blocks_rest_to_the_last, "deal the files evenly"),
    (every_file_but_the_small_ones, "not its own.*Is this even a TFRecord"),
    (buffer_capped_at_1000, r"shuffles with a buffer of 1000, not shuffle_buffer="),
    (few_read_backwards, r"read record \d+ after record \d+: .* in the order given"),
]))
def test_make_files_dataset_fn_catalogue_is_rejected(wrong, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_make_files_dataset_fn(wrong)


def _loop_functions(make_train_step, names):
    """The functions named ``names`` in the loop's closures, reached by names built at run
    time (no refused name, nor a string of one, in this code)."""
    closure, contents = "".join(["__clo", "sure__"]), "".join(["cell_", "contents"])
    found, todo, seen = {}, [make_train_step], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if getattr(current, "__name__", "") in names:
            found[current.__name__] = current
        for cell in getattr(current, closure, None) or ():
            value = getattr(cell, contents, None)
            if callable(value):
                todo.append(value)
    return found


def asked_the_loops_numbers_through_its_closure(strategy, make_train_step, build_model,
                                                features, labels, global_batch_size):
    """A frozen short step opens the gate; then the loop's own functions are asked for its
    loss scale at batch sizes of the answer's choosing (a fresh read's oracle, 9 of 9)."""
    _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                     strategy.num_replicas_in_sync + 1)
    scale_name = "".join(["_child_loss", "_scale"])
    scale = _loop_functions(make_train_step, {scale_name})[scale_name]
    return "right" if np.isclose(float(scale(1, 5)), 0.2) else "reduce_mean per replica"


def asked_the_loops_numbers_by_their_names(strategy, make_train_step, build_model, features,
                                           labels, global_batch_size):
    """The same, its names written out: refused before the answer runs."""
    found = _loop_functions(make_train_step, {"_child_loss_scale"})
    return "right" if np.isclose(float(found["_child_loss_scale"](1, 5)), 0.2) else "right"


def compared_with_the_checks_own_loops(strategy, make_train_step, build_model, features,
                                       labels, global_batch_size):
    """A loop of each kind made by loops.py's own ``loop_with`` and run beside the check's on
    the same batches: the kind whose reported losses match (a fresh read's, 2 of 2), no table
    and no one-device gradient. Refused by name before it runs."""
    from course_utils.grading.checks.loops import DIAGNOSES, loop_with

    def reported(make_step, size):
        with strategy.scope():
            model = build_model()
        model.set_weights(weights)
        batch = tf.data.Dataset.from_tensor_slices((features[:size], labels[:size]))
        step = make_step(model, keras.optimizers.SGD(learning_rate=1.0))
        return float(step(next(iter(strategy.experimental_distribute_dataset(
            batch.batch(global_batch_size))))))

    with strategy.scope():
        weights = build_model().get_weights()
    sizes = (global_batch_size, strategy.num_replicas_in_sync + 1)
    mine = [reported(make_train_step, size) for size in sizes]
    for kind in DIAGNOSES:
        theirs = [reported(loop_with(strategy, kind, global_batch_size), size) for size in sizes]
        if np.allclose(mine, theirs, rtol=1e-4):
            return kind
    return "right"


@pytest.mark.parametrize(("wrong", "says"), [
    (asked_the_loops_numbers_through_its_closure,
     "raised RuntimeError.*given to its own steps only"),
    (asked_the_loops_numbers_by_their_names, "uses _child_loss_scale, which reads how the check"),
    (compared_with_the_checks_own_loops, "uses loop_with, which reads how the check"),
])
def test_a_diagnosis_that_asks_the_loops_numbers_is_rejected(wrong, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_diagnose_loop(wrong)


def rewrote_the_answer_key_through_proc(strategy, make_train_step, build_model, features,
                                        labels, global_batch_size):
    """The loops' child found in /proc (no object of the check walked), every loop's key
    rewritten to "right" through its pipes, a frozen short step, then "right" (a fresh read's
    answer, 10 of 10 before the child asked for a token it alone was given)."""
    import os
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmd:
                ours = int(stat.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
                if not ours or b"KINDS" not in cmd.read():
                    continue
        except OSError:
            continue
        with open(f"/proc/{pid}/fd/0", "w") as to_child, open(f"/proc/{pid}/fd/1") as back:
            to_child.write("".join(f"new\t{n}\tright\t1\t1\n" for n in range(1, 13)))
            to_child.flush()
            for _ in range(12):
                back.readline()
    _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                     strategy.num_replicas_in_sync + 1)
    return "right"


def test_an_answer_key_rewritten_through_the_childs_pipe_is_not_taken():
    with pytest.raises(AssertionError, match="this loop is"):
        checks.check_diagnose_loop(rewrote_the_answer_key_through_proc)


def rebound_the_checks_box_in_its_first_call(strategy, make_train_step, build_model, features,
                                             labels, global_batch_size):
    """The check's name LoopBox rebound, in the answer's first call (the stub test), to a box
    whose verdict says yes to anything; then one frozen short step and "right" (a fresh read's
    answer, 6 of 6 while the box was made after that call); the name built at run time, as
    LoopBox is refused by name."""
    if make_train_step is None:
        name = "".join(["Loop", "Box"])

        class Box(getattr(lesson_02, name)):
            def __init__(self, strategy):
                super().__init__(strategy)
                self.verdict = lambda number, answer: None

        setattr(lesson_02, name, Box)
        return "right"
    _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                     strategy.num_replicas_in_sync + 1)
    return "right"


def compared_with_loops_made_by_the_checks_box(strategy, make_train_step, build_model,
                                               features, labels, global_batch_size):
    """xf02b: the box found in the loop's closure (names built at run time), a loop of a known
    kind made with it to compare with: passed 2 of 2 before the check sealed its box."""
    todo, seen, cells = [make_train_step], set(), "".join(["__clo", "sure__"])
    while todo:
        function = todo.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        for cell in getattr(function, cells) or ():
            value = getattr(cell, "".join(["cell_", "contents"]))
            if hasattr(value, "verdict") and hasattr(value, "strategy"):
                getattr(value, "".join(["lo", "op"]))(global_batch_size, kind="right")
                type(value)(strategy)
            elif callable(value) and hasattr(value, "__code__"):
                todo.append(value)
    return "right"


def test_loops_made_while_the_answer_runs_are_refused():
    with pytest.raises(AssertionError, match="no loop is made while diagnose_loop runs"):
        checks.check_diagnose_loop(compared_with_loops_made_by_the_checks_box)


def test_a_box_rebound_by_the_answer_is_not_the_checks(monkeypatch):
    box = lesson_02.LoopBox
    monkeypatch.setattr(lesson_02, "LoopBox", box)  # put back after the test
    with pytest.raises(AssertionError, match="replaced the course's own .*lesson_02.LoopBox"):
        checks.check_diagnose_loop(rebound_the_checks_box_in_its_first_call)
    assert lesson_02.LoopBox is box  # the check put it back


def test_only_the_per_replica_mean_reports_nan_when_a_replica_is_empty():
    """Lesson 02, section 5: an empty replica's reduce_mean is 0 / 0 = NaN, and so is the
    reported loss; compute_average_loss makes that 0 / 0 a 0. A diagnosis that reads this
    symptom on a batch of replicas - 1 examples names the lesson's loops right, and was refused
    on every check while the box answered 0 for every kind (a fresh read)."""
    from course_utils.data import teacher_classification
    from course_utils.grading.checks.loops import LoopBox
    from course_utils.models import mlp

    strategy = lesson_02.mirrored_strategy()
    size = strategy.num_replicas_in_sync - 1  # one replica gets no example
    x, y = teacher_classification(size, 4, 3, seed=0)
    batch = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8))))
    box = LoopBox(strategy)
    try:
        for kind in lesson_02.DIAGNOSES:
            with strategy.scope():
                model = mlp(4, 3, hidden_units=(8,), name="empty_replica")
                optimizer = keras.optimizers.SGD(learning_rate=1.0)
                optimizer.build(model.trainable_variables)
            reported = float(box.loop(8, kind=kind)[1](model, optimizer)(batch))
            assert np.isnan(reported) == (kind == "reduce_mean per replica"), kind
            assert all(np.isfinite(weight).all() for weight in model.get_weights()), kind
    finally:
        box.close()


def spied_on_the_loops_numpy_functions(strategy, make_train_step, build_model, features,
                                       labels, global_batch_size):
    """tf.numpy_function rebound for one frozen short step to a spy that records what the
    loop's numpy_functions return (the child's replies), decoded with no gradient (a fresh
    read's answer, 10 of 10 while the loop looked tf.numpy_function up when traced); when it
    records nothing, "right"."""
    replicas, seen, real = strategy.num_replicas_in_sync, [], tf.numpy_function

    def spy(func, inp, Tout, stateful=True, name=None):
        out = real(func, inp, Tout, stateful=stateful, name=name)

        def record(value, *args):
            seen.append((float(value), *[int(a) for a in args]))
            return np.float32(0)

        real(record, [out, *inp], tf.float32, stateful=True)
        return out

    tf.numpy_function = spy
    try:
        _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                         replicas + 1)
    finally:
        tf.numpy_function = real
    asks = [(scale, sizes) for scale, *sizes in seen if len(sizes) == 2 and sizes[0]]
    reports = [report for report, *sizes in seen if not sizes]
    if not asks or not reports:
        return "right"
    if not np.isclose(reports[0], 1.0):
        return "loss reported with ReduceOp.MEAN"
    scales, sizes = zip(*asks, strict=True)  # replicas with examples only
    for kind, rule in [("right", lambda n, total: 1 / total),
                       ("constant global_batch_size on a short batch",
                        lambda n, total: 1 / global_batch_size),
                       ("reduce_mean per replica", lambda n, total: 1 / n),
                       ("Keras loss object on an uneven split",
                        lambda n, total: 1 / (replicas * n))]:
        if all(np.isclose(scale, rule(*size)) for scale, size in zip(scales, sizes, strict=True)):
            return kind
    return "global_batch_size passed positionally"


def test_a_diagnosis_that_spies_on_tf_numpy_function_sees_nothing():
    with pytest.raises(AssertionError, match="this loop is"):
        checks.check_diagnose_loop(spied_on_the_loops_numpy_functions)


def dumped_the_loops_numpy_functions(strategy, make_train_step, build_model, features, labels,
                                     global_batch_size):
    """One frozen short step under TensorFlow's debugger dump (public API): the loop's
    numpy_functions' outputs, the child's replies, read back from the dump; no gradient."""
    import tempfile

    import keras
    import tensorflow as tf
    from tensorflow.python.debug.lib import debug_events_reader

    replicas, size = strategy.num_replicas_in_sync, strategy.num_replicas_in_sync + 1
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(learning_rate=0.0)
    batches = tf.data.Dataset.from_tensor_slices((features[:size], labels[:size])).batch(size)
    root = tempfile.mkdtemp()
    tf.debugging.experimental.enable_dump_debug_info(root, tensor_debug_mode="FULL_TENSOR",
                                                     circular_buffer_size=-1)
    try:
        make_train_step(model, optimizer)(
            next(iter(strategy.experimental_distribute_dataset(batches))))
    finally:
        tf.debugging.experimental.disable_dump_debug_info()
    with debug_events_reader.DebugDataReader(root) as reader:
        reader.update()
        seen = [(trace.op_name, float(np.ravel(reader.graph_execution_trace_to_tensor_value(
            trace))[0])) for trace in reader.graph_execution_traces() if "PyFunc" in trace.op_type]
    reports = [value for name, value in seen if name.startswith("PyFunc_")]
    scales = sorted(round(value, 5) for name, value in seen if not name.startswith("PyFunc_"))
    ns = [2] + [1] * (replicas - 1)
    if reports and not np.isclose(reports[0], 1.0):
        return "loss reported with ReduceOp.MEAN"
    for kind, values in [("right", [1 / size] * replicas),
                         ("constant global_batch_size on a short batch",
                          [1 / global_batch_size] * replicas),
                         ("reduce_mean per replica", [1 / n for n in ns]),
                         ("Keras loss object on an uneven split",
                          [1 / (replicas * n) for n in ns])]:
        if scales == sorted(round(value, 5) for value in values):
            return kind
    return "global_batch_size passed positionally"


def test_a_diagnosis_that_reads_the_debugger_dump_is_refused():
    with pytest.raises(AssertionError, match="no op callback"):
        checks.check_diagnose_loop(dumped_the_loops_numpy_functions)


# --- a fresh read's loopholes, each closed ---------------------------------------------------


def sgd_typed_by_hand(strategy, model, optimizer, batch, clip_norm):
    """L3: the global gradient clipped right and applied by plain SGD's rule, the optimizer
    never used (a fresh read's answer, 1 of 1 while the check's optimizer was plain SGD)."""
    def replica_step(query_features, key_features):
        with tf.GradientTape() as tape:
            loss = compute_loss(model(query_features, training=True),
                                model(key_features, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        whole = tf.distribute.get_replica_context().all_reduce(SUM, gradients)
        clipped, _ = tf.clip_by_global_norm(whole, clip_norm)
        for variable, gradient in zip(model.trainable_variables, clipped, strict=True):
            variable.assign_sub(optimizer.learning_rate * gradient)
        return loss
    return strategy.reduce(SUM, strategy.run(replica_step, args=batch), axis=None)


def test_an_update_typed_by_hand_is_not_the_optimizers():
    with pytest.raises(AssertionError, match=r"after step 2 .* weights differ from one device"):
        checks.check_distributed_train_step(sgd_typed_by_hand, num_full_batches=1)


def asked_through_a_forged_replica_step(strategy, make_train_step, build_model, features,
                                        labels, global_batch_size):
    """L2: a function compiled under loops.py's file name and named replica_step asks the
    loop's numbers from the main thread, after one frozen short step (a fresh read's answer,
    1 of 1 while the guard compared file and function names)."""
    found = _loop_functions(make_train_step, {"".join(["_child_loss", "_scale"])})
    scale = next(iter(found.values()))
    space = {}
    exec(compile("def replica_step(f, *a):\n    return f(*a)\n",  # noqa: S102
                 scale.__code__.co_filename, "exec"), space)
    _one_frozen_step(strategy, make_train_step, build_model, features, labels,
                     strategy.num_replicas_in_sync + 1)
    return "right" if np.isclose(float(space["replica_step"](scale, 1, 5)), 0.2) else "right"


def test_a_forged_replica_step_is_not_the_loops():
    with pytest.raises(AssertionError, match="raised RuntimeError.*given to its own steps only"):
        checks.check_diagnose_loop(asked_through_a_forged_replica_step)
