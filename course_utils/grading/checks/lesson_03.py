"""Checks of lesson 03's exercises (multi-worker training), registered by name with ``@register``.

* ``check_train_worker(train_worker)``: runs the learner's worker function (exercise 1 fixes a
  broken one, given a per-replica batch) on a real 2-worker localhost cluster (fresh data,
  steps and batch; ``build_model`` seeded differently on each worker): each worker built the
  model once in the scope of a ``MultiWorkerMirroredStrategy`` of 2 replicas, ran every backward
  pass in its 2-replica context on its half of the global batch (an audit layer of the model
  counts them), saved after every ``save_every`` steps and the last, both finish with
  equal weights, equal to a one-device reference on the same global batches from the chief's
  initial weights, the chief alone wrote into the checkpoint folder (the other worker saved
  into a temporary folder it deleted), and the newest checkpoint holds the optimizer's step
  count and the final weights.
* ``check_diagnose(diagnose)``: fresh logs of several failed jobs (a worker killed, crashed,
  stalled or never started; a job whose workers each trained alone); the learner's function
  names the cause and the worker at fault.
* ``check_resume(restore_latest, make_dataset_fn)``: the course's worker script with the
  learner's two functions, killed after a checkpoint and restarted: the second run starts at the
  ``examples_done`` of the chief's newest checkpoint (its name holds only the save count),
  trains every step left exactly once, and ends with the
  weights of an uninterrupted one-device run.

The worker scripts are written by :mod:`course_utils.grading.checks.worker_scripts`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.grading.checks.registry import register
from course_utils.grading.checks.worker_logs import CAUSES, KILLED_REASONS, failure_logs
from course_utils.grading.checks.worker_scripts import (
    function_source,
    is_stub,
    reference_weights,
    resume_script,
    train_worker_script,
)
from course_utils.grading.framework import Case, fresh_rng, not_attempted, run_check
from course_utils.quiet import import_tensorflow as _tf

__all__ = [
    "CAUSES",
    "check_diagnose",
    "check_resume",
    "check_train_worker",
    "failure_logs",
    "resume_script",
]

#: Seconds a check waits for its cluster: generous, so that it holds with both cores busy.
CLUSTER_TIMEOUT = 240.0


def _fresh_job(rng: Any, folder: Path, batches: int | None = None) -> dict[str, Any]:
    """Fresh data and sizes for one job (``batches`` global batches of data, else 3-5), the
    data written where the workers read it."""
    global_batch = rng.choice([16, 24, 32])
    num_examples = global_batch * (batches or rng.randint(3, 5))
    features, classes = rng.randint(4, 7), rng.randint(3, 4)
    data = np.random.default_rng(rng.randint(0, 2**31))
    x = data.normal(size=(num_examples, features)).astype("float32")
    y = data.integers(0, classes, size=num_examples).astype("int32")
    np.savez(folder / "data.npz", x=x, y=y)
    return {"x": x, "y": y, "global_batch": global_batch, "classes": classes,
            "steps": rng.randint(5, 7), "save_every": rng.choice([2, 3]),
            "seed": rng.randint(0, 10_000)}


def _script_args(job: dict[str, Any], folder: Path) -> list[str]:
    return ["--data", str(folder / "data.npz"), "--checkpoint-dir", str(folder / "checkpoints"),
            "--out", str(folder / "out"), "--steps", str(job["steps"]),
            "--global-batch", str(job["global_batch"]), "--save-every", str(job["save_every"]),
            "--seed", str(job["seed"]), "--classes", str(job["classes"])]


def _run(script: Path, args: list[str], folder: Path, **kwargs: Any) -> tuple[Any, list[str]]:
    """Run ``script`` on 2 workers until they finish; return (cluster, logs). Raises on failure."""
    from course_utils.cluster import LocalCluster

    with LocalCluster(script, 2, args=args, timeout=CLUSTER_TIMEOUT, stream=False,
                      collective_timeout=60, env={"TMPDIR": str(folder / "tmp")},
                      **kwargs) as cluster:
        cluster.wait()
    return cluster, [cluster.log(i) for i in range(2)]


def _max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    if len(a) != len(b) or any(u.shape != v.shape for u, v in zip(a, b, strict=True)):
        return float("inf")
    return max(float(np.abs(u - v).max()) for u, v in zip(a, b, strict=True))


def _load(path: Path) -> list[np.ndarray]:
    with np.load(path) as weights:
        return [weights[name] for name in weights.files]


# --- exercise 1: the worker's training part -----------------------------------------------------


def _verify_train_worker(folder: Path, job: dict[str, Any]) -> str | None:
    """What is wrong with the finished job in ``folder`` (None when it is right)."""
    tf = _tf()
    out = folder / "out"
    audits = [json.loads((out / f"audit-{i}.json").read_text()) for i in range(2)]
    for worker, audit in enumerate(audits):
        built = audit["built"]
        if len(built) != 1:
            return (f"worker {worker} called build_model {len(built)} times: build the model "
                    "once, inside the strategy's scope")
        if not built[0]["multi_worker"]:
            return (f"worker {worker} built the model under {built[0]['strategy']}, not in the "
                    "scope of a tf.distribute.MultiWorkerMirroredStrategy")
        if built[0]["replicas"] != 2:
            return (f"worker {worker}'s strategy had {built[0]['replicas']} replicas in sync, "
                    "not 2: was TF_CONFIG read (the strategy built first)?")
    half = job["global_batch"] // 2
    for worker, audit in enumerate(audits):
        if not audit["contexts"] or set(audit["contexts"]) != {2}:
            return (f"worker {worker} ran the backward pass in a replica context of "
                    f"{sorted(set(audit['contexts']))} replicas, not 2: train the model built "
                    "in the scope, inside strategy.run, so that its gradients are all-reduced")
        if audit["rows"] != [half] * job["steps"]:
            return (f"worker {worker}'s {len(audit['rows'])} backward passes carried "
                    f"{audit['rows'][:8]} examples; each of the {job['steps']} steps should "
                    f"train this worker on its own {half} of the {job['global_batch']} "
                    "examples of the global batch (InputContext)")
    due = [*range(job["save_every"], job["steps"] + 1, job["save_every"]), job["steps"]]
    for worker, audit in enumerate(audits):
        if audit["saved_after"] != due:
            return (f"worker {worker} saved after steps {audit['saved_after']}, expected "
                    f"{due}: every save_every steps and after the last one")
    weights = [_load(out / f"weights-{i}.npz") for i in range(2)]
    expected = reference_weights(job, job["steps"], initial=_load(out / "initial-0.npz"))
    error = _max_difference(weights[0], expected)
    if _max_difference(weights[0], weights[1]) > 1e-6:
        return "the two workers ended with different weights: were the variables mirrored?"
    if error > 1e-4:
        return (f"the weights differ from one device trained on the same global batches of "
                f"{job['global_batch']} examples (max |difference| {error:.2g}): does every "
                "worker read its own part of each global batch (InputContext), is the global "
                "batch replica_batch × num_replicas_in_sync, and is the loss divided by it?")
    shared = os.path.realpath(folder / "checkpoints")
    chief, other = audits[0]["saves"], audits[1]["saves"]
    if not chief or any(os.path.realpath(d) != shared for d in chief):
        return ("the chief should save into checkpoint_dir with a CheckpointManager; it saved "
                f"into {chief}")
    if len(other) != len(chief):
        return (f"every worker must call save (the chief saved {len(chief)} times, worker 1 "
                f"{len(other)} times); the others save into a temporary folder")
    if any(os.path.realpath(d).startswith(shared) for d in other):
        return "worker 1 wrote into checkpoint_dir: only the chief may write there"
    if any(os.path.exists(d) for d in other):
        return "worker 1 left its temporary checkpoint folder behind: delete it after each save"
    latest = tf.train.latest_checkpoint(str(folder / "checkpoints"))
    if latest is None:
        return "no checkpoint in checkpoint_dir: save at the end of training too"
    iterations = [name for name, _ in tf.train.list_variables(latest)
                  if name.endswith("iterations/.ATTRIBUTES/VARIABLE_VALUE")]
    reader = tf.train.load_checkpoint(latest)
    if [int(reader.get_tensor(name)) for name in iterations] != [job["steps"]]:
        return ("the newest checkpoint holds no optimizer that applied every step: put the "
                "optimizer in the tf.train.Checkpoint with the model, so a restart resumes it")
    restored = reference_weights(job, 0, checkpoint=latest)
    if _max_difference(restored, weights[0]) > 1e-6:
        return "the newest checkpoint does not hold the final weights: save after the last step"
    return None


@register
def check_train_worker(fn: Any) -> bool:
    """Check ``train_worker(...)`` on a real 2-worker cluster (see the module docstring)."""
    name = "train_worker"
    if is_stub(fn):
        not_attempted(name)
        return False
    source = function_source(fn, "train_worker")
    rng = fresh_rng()
    with tempfile.TemporaryDirectory(prefix="lesson03_train_") as root:
        folder = Path(root)
        (folder / "tmp").mkdir()
        job = _fresh_job(rng, folder)
        if job["steps"] % job["save_every"] == 0:      # a last step that is no regular save
            job["steps"] += 1
        script = folder / "worker.py"
        script.write_text(train_worker_script(source))

        def run_and_verify(_: Any) -> str | None:
            try:
                _run(script, _script_args(job, folder), folder)
            except Exception as error:  # noqa: BLE001 - the learner's code failed in a worker
                return f"the job failed: {error}"
            return _verify_train_worker(folder, job)

        case = Case(args=(None,), verify=lambda reason: reason,
                    label=f"2 workers, {job['steps']} steps of {job['global_batch']} examples")
        return run_check(name, run_and_verify, [case],
                         hint="compare the broken worker with the lesson's script, parts 1-5: "
                              "a dataset_fn sharded by its InputContext, the global batch of "
                              "all replicas, the step inside strategy.run, the loss divided "
                              "by it, a CheckpointManager of the model and optimizer writing "
                              "to checkpoint_dir on the chief only, every save_every steps "
                              "and after the last step. Section 2.")


# --- exercise 2: diagnose a failed job ---------------------------------------------------------


def _diagnosis_cases(rng: Any) -> list[Case]:
    """Fresh jobs: every cause, and a killed worker once with each reason its peers give."""
    jobs = [(cause, None) for cause in CAUSES if cause != "killed"]
    jobs += [("killed", reason) for reason in KILLED_REASONS]
    rng.shuffle(jobs)
    cases = []
    for cause, reason in jobs:
        workers = rng.randint(2, 4)
        first = 1 if reason == "heartbeats" else 0   # worker 0 leads the coordination service
        culprit = None if cause == "not_in_cluster" else rng.randrange(first, workers)
        logs = failure_logs(cause, workers, culprit, rng, killed_reason=reason)
        cases.append(Case(args=(logs,), expected=(cause, culprit),
                          label=f"the logs of a {workers}-worker job"))
    return cases


def _diagnosis_verify(expected: tuple[str, int | None]) -> Any:
    def verify(got: Any) -> str | None:
        if not (isinstance(got, tuple) and len(got) == 2):
            return f"return (cause, worker), got {got!r}"
        cause, worker = got
        if cause not in CAUSES:
            return f"the cause must be one of {CAUSES}, got {cause!r}"
        if cause != expected[0]:
            return f"the cause is {expected[0]!r}, you said {cause!r}"
        if worker != expected[1]:
            return f"the worker at fault is {expected[1]!r}, you said {worker!r}"
        return None

    return verify


@register
def check_diagnose(fn: Any) -> bool:
    """Check ``diagnose(logs) -> (cause, worker)`` on fresh logs of failed jobs."""
    cases = _diagnosis_cases(fresh_rng())
    for case in cases:
        case.verify = _diagnosis_verify(case.expected)
    return run_check("diagnose", fn, cases,
                     hint="read each worker's last lines: a traceback of its own (crashed), an "
                          "empty log (never started), peers failing with UnavailableError "
                          "(refused, socket closed, reset or no heartbeats: that worker is "
                          "gone, killed) or DeadlineExceededError (the collective time-out: alive "
                          "but silent, stalled), every worker '1 replicas in sync' (TF_CONFIG "
                          "too late). Sections 3 and 8.")


# --- exercise 3: resume after the job changed shape -------------------------------------------


def _steps_logged(log: str) -> list[int]:
    return [int(step) for step in re.findall(r"^step (\d+) ", log, re.MULTILINE)]


def _restore_problem(restore_latest: Any, rng: Any) -> str | None:
    """Run ``restore_latest`` here on a fresh folder of checkpoints (and on an empty one)."""
    tf = _tf()
    import keras

    features, units = rng.randint(3, 6), rng.randint(2, 5)

    def fresh() -> tuple[Any, Any, Any]:
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(units)])
        done = tf.Variable(0, dtype=tf.int64)
        return model, done, tf.train.Checkpoint(model=model, examples_done=done)

    with tempfile.TemporaryDirectory(prefix="lesson03_restore_") as root:
        empty = Path(root) / "empty"
        empty.mkdir()
        model, done, checkpoint = fresh()
        before = model.get_weights()
        got = restore_latest(checkpoint, str(empty), done)
        if got != 0 or _max_difference(model.get_weights(), before) > 0:
            return ("with no checkpoint in checkpoint_dir, return 0 and restore nothing (got "
                    f"{got!r})")
        saved = fresh()
        manager = tf.train.CheckpointManager(saved[2], root, max_to_keep=3)
        for _ in range(2):                                 # the newest one must win
            for variable in saved[0].weights:
                variable.assign(np.random.default_rng(rng.randint(0, 2**31)).normal(
                    size=variable.shape).astype("float32"))
            saved[1].assign(int(saved[1].numpy()) + rng.randint(50, 5000))
            manager.save()             # numbered 1, 2: the name does not say examples_done
        model, done, checkpoint = fresh()
        got = restore_latest(checkpoint, root, done)
        expected = int(saved[1].numpy())
        if not isinstance(got, (int, np.integer)) or int(got) != expected:
            return (f"the newest checkpoint holds examples_done = {expected}; restore_latest "
                    f"returned {got!r}: restore it, then return examples_done")
        if _max_difference(model.get_weights(), saved[0].get_weights()) > 1e-7:
            return "restore_latest returned the count but did not restore the newest model"
    return None


def _dataset_fn_problem(make_dataset_fn: Any, rng: Any) -> str | None:
    """Call the learner's ``dataset_fn`` for fresh input contexts; check two steps of data."""
    tf = _tf()
    for _ in range(3):
        pipelines, per = rng.choice([2, 3, 4]), rng.choice([1, 2])
        replicas = pipelines * per
        replica_batch = rng.randint(2, 4)
        global_batch = replicas * replica_batch
        size = global_batch * rng.randint(4, 7) + rng.randint(1, global_batch - 1)
        done = rng.choice([e for e in range(size, 3 * size) if e % pipelines])
        ids = np.arange(size)
        x = np.random.default_rng(rng.randint(0, 2**31)).normal(size=(size, 3)).astype("float32")
        dataset_fn = make_dataset_fn(x, ids, global_batch, done)
        trained: list[list[int]] = [[], []]
        for pipeline in range(pipelines):
            context = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                                 input_pipeline_id=pipeline,
                                                 num_replicas_in_sync=replicas)
            batches = list(dataset_fn(context).take(2 * per).as_numpy_iterator())
            where = (f"{pipelines} input pipelines feeding {per} replica(s) each, global batch "
                     f"{global_batch}, resumed at example {done}")
            if len(batches) != 2 * per or any(len(b[1]) != replica_batch for b in batches):
                return (f"{where}: pipeline {pipeline} must give per-replica batches of "
                        f"{replica_batch}, got sizes {[len(b[1]) for b in batches]}")
            for index, (features, labels) in enumerate(batches):
                if not np.array_equal(features, x[labels]):
                    return f"{where}: the features no longer match their labels"
                trained[index // per] += [int(label) for label in labels]
        for step, got in enumerate(trained):
            due = sorted(((done + step * global_batch + np.arange(global_batch)) % size).tolist())
            if sorted(got) != due:
                extra = sorted(set(got) - set(due))[:4]
                missing = sorted(set(due) - set(got))[:4]
                return (f"{where}: step {step + 1} after the restart trained examples it should "
                        f"not ({extra}) or missed some ({missing}); {len(due)} were due from "
                        f"example {(done + step * global_batch) % size}")
    return None


def _run_killed(script: Path, args: list[str], folder: Path, kill_after: int) -> None:
    """Run the job, kill worker 1 once it logged step ``kill_after``, stop the rest."""
    from course_utils.cluster import LocalCluster

    with LocalCluster(script, 2, args=[*args, "--step-delay", "1.0"], timeout=CLUSTER_TIMEOUT,
                      stream=False, collective_timeout=60,
                      env={"TMPDIR": str(folder / "tmp")}) as cluster:
        cluster.wait_for(rf"^step {kill_after} ", worker=1)
        cluster.kill_worker(1)


def _verify_resume(folder: Path, job: dict[str, Any], logs: list[str], saved: int,
                   first_batch: int) -> str | None:
    started = re.search(r"^resumed at example (\d+)$", logs[0], re.MULTILINE)
    if started is None or int(started.group(1)) != saved:
        seen = started.group(1) if started else "?"
        return (f"the restarted job began at example {seen}, but the chief's newest checkpoint "
                f"holds {saved}: restore it and return examples_done")
    steps = _steps_logged(logs[0])
    if steps != list(range(1, job["steps"] + 1)):
        return f"the restarted job trained steps {steps}, expected 1-{job['steps']}"
    batch = job["global_batch"]
    batches = [(k * first_batch, first_batch) for k in range(saved // first_batch)]
    batches += [(saved + k * batch, batch) for k in range(job["steps"])]
    weights = _load(folder / "out" / "weights-0.npz")
    initial = _load(folder / "out" / "initial-0.npz")
    error = _max_difference(weights, reference_weights(job, 0, initial=initial, batches=batches))
    if error > 1e-4:
        return (f"after the restart the weights differ from one device trained on the same "
                f"examples (max |difference| {error:.2g}): the resumed pipeline must start at "
                "the first example not trained yet")
    return None


@register
def check_resume(restore_latest: Any, make_dataset_fn: Any) -> bool:
    """Check ``restore_latest`` and ``make_dataset_fn``: in this process on fresh checkpoints
    and input contexts (several pipelines, several replicas each, a count of examples done
    that no number of pipelines divides), then by killing a real job and restarting it with
    another global batch."""
    name = "resume"
    stubs = [is_stub(fn) for fn in (restore_latest, make_dataset_fn)]
    if all(stubs):
        not_attempted(name)
        return False
    if any(stubs):
        raise AssertionError(f"{name}: write both functions, restore_latest and make_dataset_fn")
    rng = fresh_rng()
    hint = ("restore tf.train.latest_checkpoint(checkpoint_dir) and return examples_done; "
            "skip the examples done in the whole data before it is cut into the pipelines' "
            "shards, so that any number of pipelines and replicas resumes at that example. "
            "Lesson sections 2-3 and 5.")
    with tempfile.TemporaryDirectory(prefix="lesson03_resume_") as root:
        folder = Path(root)
        (folder / "tmp").mkdir()
        job = _fresh_job(rng, folder, batches=9)   # no batch twice: a missing skip shows
        first_batch = job["global_batch"]
        job["steps"] = job["save_every"] + 1
        kill_after = job["save_every"] + 1              # just after the first checkpoint
        script = folder / "worker.py"
        first_args = _script_args({**job, "steps": 4 * job["save_every"]}, folder)
        job["global_batch"] = rng.choice([b for b in (16, 24, 32) if b != first_batch])
        args = _script_args(job, folder)

        def kill_restart_verify(_: Any) -> str | None:
            script.write_text(resume_script(function_source(restore_latest, "restore_latest"),
                                            function_source(make_dataset_fn, "make_dataset_fn")))
            try:
                _run_killed(script, first_args, folder, kill_after)
                latest = _tf().train.latest_checkpoint(str(folder / "checkpoints"))
                if latest is None:
                    return "after the kill the checkpoint folder is empty: the job never saved"
                saved = int(_tf().train.load_checkpoint(latest).get_tensor(
                    "examples_done/.ATTRIBUTES/VARIABLE_VALUE"))   # not in the file name
                _, logs = _run(script, args, folder)
            except Exception as error:  # noqa: BLE001 - the learner's code failed in a worker
                return f"the job failed: {error}"
            return _verify_resume(folder, job, logs, saved, first_batch)

        parts = {"restore": lambda: _restore_problem(restore_latest, rng),
                 "dataset": lambda: _dataset_fn_problem(make_dataset_fn, rng),
                 "cluster": lambda: kill_restart_verify(None)}
        cases = [Case(args=("restore",), verify=lambda reason: reason,
                      label="restore_latest on fresh checkpoints, in this process"),
                 Case(args=("dataset",), verify=lambda reason: reason,
                      label="make_dataset_fn on fresh input contexts, in this process"),
                 Case(args=("cluster",), verify=lambda reason: reason,
                      label=f"a 2-worker job killed after step {kill_after} (global batch "
                            f"{first_batch}), restarted with global batch "
                            f"{job['global_batch']}")]
        return run_check(name, lambda part: parts[part](), cases, hint=hint)
