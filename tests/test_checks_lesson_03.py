"""Lesson 03's checks: the reference solutions pass, lazy and wrong answers fail, stubs wait.

The cluster checks start real 2-worker jobs (marked slow); the diagnosis check and the stub and
source handling run without a cluster.
"""

from __future__ import annotations

import importlib.util
import random
import re
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import course_utils as cu
from course_utils.grading.checks import lesson_03, worker_logs, worker_scripts
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def train_worker(build_model, learning_rate, data_path, checkpoint_dir, steps, global_batch,
                 save_every):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    is_chief = resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0)
    with np.load(data_path) as data:
        x, y = data["x"], data["y"]

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.batch(batch, drop_remainder=True)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(learning_rate)
        optimizer.build(model.trainable_variables)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(labels, model(features)),
                                              global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(iterator):
        return strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)), axis=None)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    write_dir = checkpoint_dir if is_chief else tempfile.mkdtemp()
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=2)
    for step in range(1, steps + 1):
        train_step(iterator)
        if step % save_every == 0 or step == steps:
            manager.save(checkpoint_number=step)
            if not is_chief:
                tf.io.gfile.rmtree(write_dir)
    return model.get_weights()


def diagnose(logs):
    if all(re.search(r": 1 replicas in sync", log) for log in logs):
        return "not_in_cluster", None
    for worker, log in enumerate(logs):
        if not log.strip():
            return "never_started", worker
    for worker, log in enumerate(logs):
        if "Traceback" in log and not re.search(r"(Unavailable|DeadlineExceeded)Error", log):
            return "crashed", worker
    silent = [worker for worker, log in enumerate(logs) if "Error" not in log]
    if any("DeadlineExceededError" in log for log in logs):
        return "stalled", silent[0]
    return "killed", silent[0]


def restore_latest(checkpoint, checkpoint_dir, optimizer):
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
    return int(optimizer.iterations.numpy())


def make_dataset_fn(x, y, global_batch, start_step):
    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.skip(start_step * batch).batch(batch, drop_remainder=True)

    return dataset_fn


def restarts_from_zero(checkpoint, checkpoint_dir, optimizer):
    return 0


def never_skips(x, y, global_batch, start_step):
    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.batch(batch, drop_remainder=True)      # starts again at the first batch

    return dataset_fn


def stub(*args):
    raise NotImplementedError()


def variant(tmp_path, old, new):
    """``train_worker`` with ``old`` replaced by ``new``, loaded from a file (inspect reads it)."""
    source = worker_scripts.function_source(train_worker)
    assert old in source
    path = tmp_path / f"variant_{abs(hash(new))}.py"
    path.write_text("import tempfile\nimport keras\nimport numpy as np\nimport tensorflow as tf"
                    "\n\n\n" + source.replace(old, new))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.train_worker


def test_lesson_03_registers_its_checks():
    for name in lesson_03.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_03, name)


def test_the_setup_writes_the_learning_rate_the_reference_uses():
    assert f"LEARNING_RATE = {worker_scripts.LEARNING_RATE}\n" in worker_scripts.SETUP


def test_stubs_are_recognised_and_real_bodies_are_not():
    def documented_stub(a):
        """Docstring."""
        raise NotImplementedError()

    assert worker_scripts.is_stub(stub) and worker_scripts.is_stub(documented_stub)
    assert not worker_scripts.is_stub(restore_latest)
    assert not worker_scripts.is_stub(lambda: None)


def test_a_function_under_another_name_is_called_by_the_expected_one():
    source = worker_scripts.function_source(restarts_from_zero, "restore_latest")
    assert source.endswith("restore_latest = restarts_from_zero\n")
    assert worker_scripts.function_source(restore_latest, "restore_latest").startswith("def ")
    with pytest.raises(AssertionError, match="defined with def"):
        worker_scripts.function_source(lambda: None, "restore_latest")


def test_the_worker_scripts_hold_the_learners_source_and_compile():
    source = worker_scripts.function_source(train_worker)
    script = worker_scripts.train_worker_script(source)
    compile(script, "worker.py", "exec")
    assert "def train_worker(build_model" in script
    resume = worker_scripts.resume_script(worker_scripts.function_source(restore_latest),
                                          worker_scripts.function_source(make_dataset_fn))
    compile(resume, "worker.py", "exec")


@pytest.mark.parametrize("cause", worker_logs.CAUSES)
def test_failure_logs_are_diagnosed_by_the_reference(cause):
    rng = random.Random(7)
    for _ in range(5):
        workers = rng.randint(2, 4)
        culprit = None if cause == "not_in_cluster" else rng.randrange(workers)
        logs = worker_logs.failure_logs(cause, workers, culprit, rng)
        assert len(logs) == workers
        assert diagnose(logs) == (cause, culprit)


def test_failure_logs_refuse_a_culprit_that_does_not_fit():
    with pytest.raises(ValueError, match="cause must be one of"):
        worker_logs.failure_logs("flooded", 2, 0, random.Random(0))
    with pytest.raises(ValueError, match="does not fit"):
        worker_logs.failure_logs("killed", 2, None, random.Random(0))
    with pytest.raises(ValueError, match="at least 2 workers"):
        worker_logs.failure_logs("killed", 1, 0, random.Random(0))


def test_the_reference_diagnosis_passes_and_lazy_ones_fail():
    assert cu.grading.check_diagnose(diagnose) is True
    # The cases are drawn fresh: a constant fails on whichever it gets wrong first.
    with pytest.raises(AssertionError, match="the cause is|the worker at fault"):
        cu.grading.check_diagnose(lambda logs: ("killed", 0))
    with pytest.raises(AssertionError, match="worker at fault"):
        cu.grading.check_diagnose(lambda logs: (diagnose(logs)[0], 0 if diagnose(logs)[1]
                                                else None))
    with pytest.raises(AssertionError, match="return \\(cause, worker\\)"):
        cu.grading.check_diagnose(lambda logs: "killed")


@pytest.mark.parametrize("check, args", [("train_worker", (stub,)), ("diagnose", (stub,)),
                                         ("resume", (stub, stub))])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(check, args, capsys):
    assert getattr(cu.grading, f"check_{check}")(*args) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        getattr(cu.grading, f"check_{check}")(*args)


def test_half_an_answer_to_resume_is_named_without_a_cluster():
    with pytest.raises(AssertionError, match="write both functions"):
        cu.grading.check_resume(restore_latest, stub)


def test_the_reference_weights_follow_the_global_batches():
    rng = np.random.default_rng(0)
    job = {"x": rng.normal(size=(48, 4)).astype("float32"), "y": rng.integers(0, 3, 48),
           "global_batch": 16, "classes": 3}
    keras.utils.set_random_seed(1)
    initial = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                keras.layers.Dense(3)]).get_weights()
    three = worker_scripts.reference_weights(job, 3, initial=initial)
    six = worker_scripts.reference_weights(job, 6, initial=initial)
    assert not np.allclose(three[0], six[0])
    assert np.allclose(worker_scripts.reference_weights(job, 0, initial=initial)[0], initial[0])


@pytest.mark.slow
def test_the_reference_worker_passes_on_a_real_cluster():
    assert cu.grading.check_train_worker(train_worker) is True


@pytest.mark.slow
@pytest.mark.parametrize("old, new, message", [
    ("checkpoint_dir if is_chief else tempfile.mkdtemp()", "checkpoint_dir",
     "worker 1 wrote into checkpoint_dir|the job failed"),   # the two writers may collide
    ("dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)", "pass",
     "differ from one device"),
    ("                tf.io.gfile.rmtree(write_dir)", "                pass",
     "left its temporary checkpoint folder")])
def test_a_worker_that_writes_everywhere_or_reads_everything_fails(tmp_path, old, new, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_train_worker(variant(tmp_path, old, new))


@pytest.mark.slow
def test_the_reference_resume_passes_on_a_killed_cluster():
    assert cu.grading.check_resume(restore_latest, make_dataset_fn) is True


@pytest.mark.slow
@pytest.mark.parametrize("restore, dataset, message", [
    (restarts_from_zero, make_dataset_fn, "began at step 0"),
    (restore_latest, never_skips, "differ from an uninterrupted run")])
def test_a_resume_that_loses_or_repeats_work_fails(restore, dataset, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_resume(restore, dataset)
