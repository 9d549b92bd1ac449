"""Checks of lesson 03's exercises (multi-worker training), registered by name with ``@register``.

* ``check_train_worker(train_worker)``: runs the learner's worker function (exercise 1 fixes
  its held-out evaluation; a per-replica batch) on a real localhost cluster of 2 workers, then on
  one of 3 (fresh data, steps and batch each time; each worker's copy of the data holds only
  its shard, the other rows decoys drawn like the data, so that no worker can train the right
  weights from rows of another, nor tell those rows from its own; ``build_model`` seeded
  differently on each worker): each worker built the model once in the scope of a
  ``MultiWorkerMirroredStrategy`` of one replica per worker, ran every backward pass in that
  replica context on its share of the global batch (an audit layer of the model counts them),
  batched and windowed no more than its share (whatever tf.data API made the batch), saved
  after every ``save_every`` steps and the last; all finish with equal weights, equal to a
  one-device reference on the same global batches from the chief's initial weights; the chief
  alone wrote into the checkpoint folder (the others saved the same variables into temporary
  folders deleted after each save, none left by the next step; listed after the run, the folder
  holds only what the chief's checkpoints wrote: :mod:`.checkpoint_files`), and the newest
  checkpoint holds the optimizer's step count and the final weights; then the held-out loss
  each worker returned (:mod:`.worker_evaluation`: each worker ran exactly its own held-out
  examples through the trained model (their rows, not only their count), in passes of at
  most a replica's batch, and all returned the mean over the whole set on one device). The
  audit lives in the closures of the worker script's set-up (no global names it) and is
  written after the learner's function returned, with a secret the set-up read and deleted
  before that function ran; a function that reads frames, closures or the heap is refused up
  front (by name or string constant, ``getattr(build_model, "__closure__")``).
  Each worker's shard is read into memory and deleted by the set-up, which waits until no
  worker's file is left before the learner's code runs, and hands the function a file with
  no name in any folder (``memfd_create``; a temporary file where there is none).
* ``check_diagnose(diagnose)``: fresh logs of several failed jobs (a worker killed, crashed
  before joining and while training, stalled or never started; a job whose workers each
  trained alone); the learner's function, called in a copy of this process forked before the
  logs are drawn, names the cause and the worker at fault.
* ``check_resume(restore_latest, make_dataset_fn)``: in this process, ``restore_latest`` on
  fresh checkpoints of a model and an SGD optimizer with momentum (both restored, with the
  count) and ``make_dataset_fn`` on fresh input contexts; then the course's worker script with the
  learner's two functions, killed after a checkpoint and restarted: the second run starts at the
  ``examples_done`` of the chief's newest checkpoint (its name holds only the save count),
  trains every step left exactly once, and ends with the weights of an unbroken one-device run.

Still passes (xf03 L1): workers that combine their sums through files or sockets of their
own instead of the strategy's collectives: the audit sees what each ran, not how the numbers
met. Still passes: a function reaching the audit by attribute names built at run time (or ctypes),
or through a library function that reads a closure's cells for it under a name not scanned
(``getnamespace``, ``func_dump``, Keras' ``serialize_keras_object`` are; the first tested):
no scan of code sees every name it builds, the audit must be reachable from what it
records, and CPython raises no audit event for ``__closure__`` or ``cell_contents``. The
callers' locals (read by names built at run time: ``getargvalues`` and ``f_locals`` are
scanned) hold no part of the in-process audit of the datasets, which lives in closures (its
end, called early, is named; tested), but do hold that check's other locals (the examples
each step trained so far). The audit of the datasets also misses some whole global batches
(:mod:`course_utils.grading.checks.dataset_audit`). Exercise 1 passes a global batch of the
workers ``TF_CONFIG`` lists, not the replicas: on CPUs MWMS makes one replica per worker
(``collective_all_reduce_strategy.py`` lines 415-423), the same number here.

The worker scripts are written by :mod:`course_utils.grading.checks.worker_scripts`; every
worker is forked from one process that imported TensorFlow once
(:mod:`course_utils.grading.checks.forked_workers`), so that a check pays that import once
per interpreter, not once per worker.
"""

from __future__ import annotations

import ast
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.grading.checks import checkpoint_files as files
from course_utils.grading.checks.dataset_audit import COUNTED
from course_utils.grading.checks.diagnosis import (  # noqa: F401
    _diagnosis_cases,
    check_diagnose,
)
from course_utils.grading.checks.forked_workers import ForkedCluster, once_more_if_transient
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.resume_inputs import (
    dataset_fn_problem,
    max_difference,
    restore_problem,
)
from course_utils.grading.checks.worker_evaluation import (
    build_problem,
    failed_build,
    held_out_data,
    held_out_problem,
    optimizer_problem,
    reference_weights,
)
from course_utils.grading.checks.worker_logs import CAUSES, failure_logs
from course_utils.grading.checks.worker_scripts import (
    function_source,
    is_stub,
    parse_python,
    resume_script,
    train_worker_script,
)
from course_utils.grading.framework import (
    Case,
    fresh_rng,
    grader_introspection,
    not_attempted,
    run_check,
)
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


def _fresh_job(rng: Any, folder: Path, batches: int | None = None, workers: int = 2,
               shards: bool = False) -> dict[str, Any]:
    """Fresh data and sizes for one job of ``workers`` workers (``batches`` global batches of
    data, else 3-5), the data written where the workers read it: ``data.npz``, or with
    ``shards`` only ``data-{i}.npz``, worker i's shard (the set-up reads and deletes it)."""
    global_batch = workers * rng.choice([8, 12, 16])
    num_examples = global_batch * (batches or rng.randint(3, 5))
    features, classes = rng.randint(5, 7), rng.randint(3, 4)   # one-hot labels: never [n, features]
    data = np.random.default_rng(rng.randint(0, 2**31))
    x = data.normal(size=(num_examples, features)).astype("float32")
    y = data.integers(0, classes, size=num_examples).astype("int32")
    if not shards:
        np.savez(folder / "data.npz", x=x, y=y)
    x_eval, y_eval = held_out_data(data, workers, global_batch // workers, features, classes)
    for worker in range(workers if shards else 0):   # its shard; decoys, drawn alike, elsewhere
        own, own_eval = (data.normal(size=a.shape).astype("float32") for a in (x, x_eval))
        own[worker::workers] = x[worker::workers]
        own_eval[worker::workers] = x_eval[worker::workers]
        np.savez(folder / f"data-{worker}.npz", x=own, y=y, x_eval=own_eval, y_eval=y_eval)
    return {"x": x, "y": y, "x_eval": x_eval, "y_eval": y_eval,
            "global_batch": global_batch, "classes": classes,
            "steps": rng.randint(5, 7), "save_every": rng.choice([2, 3]),
            "seed": rng.randint(0, 10_000), "workers": workers}


def _script_args(job: dict[str, Any], folder: Path, data: str = "data.npz") -> list[str]:
    return ["--data", str(folder / data), "--checkpoint-dir", str(folder / "checkpoints"),
            "--out", str(folder / "out"), "--steps", str(job["steps"]),
            "--global-batch", str(job["global_batch"]), "--save-every", str(job["save_every"]),
            "--seed", str(job["seed"]), "--classes", str(job["classes"])]


def _run(script: Path, args: list[str], folder: Path, workers: int = 2,
         **kwargs: Any) -> tuple[Any, list[str]]:
    """Run ``script`` on ``workers`` workers to the end: (cluster, logs); raise if it fails."""
    with ForkedCluster(script, workers, args=args, timeout=CLUSTER_TIMEOUT, stream=False,
                      collective_timeout=60, env={"TMPDIR": str(folder / "tmp")},
                      **kwargs) as cluster:
        cluster.wait()
    return cluster, [cluster.log(i) for i in range(workers)]


def _load(path: Path) -> list[np.ndarray]:
    with np.load(path) as weights:
        return [weights[name] for name in weights.files]


# --- exercise 1: the worker's training part -----------------------------------------------------


def _verify_train_worker(folder: Path, job: dict[str, Any]) -> str | None:
    """What is wrong with the finished job in ``folder`` (None when it is right)."""
    tf = _tf()
    out = folder / "out"
    workers = job["workers"]
    audits = []
    for worker in range(workers):
        try:
            audit = ast.literal_eval(
                parse_python((out / f"audit-{worker}.txt").read_text(), "eval"))
        except (OSError, ValueError, SyntaxError):
            return (f"worker {worker} ended without the audit the check's set-up writes once "
                    "your function returned: return the weights, do not end the process")
        if not isinstance(audit, dict) or audit.get("secret") != job["secrets"][worker]:
            return (f"worker {worker}'s audit was not written by the check's set-up: leave the "
                    "check's files alone")
        audits.append(audit)
    problem = build_problem(dict(enumerate(audit["built"] for audit in audits)), workers)
    if problem:
        return problem
    share = job["global_batch"] // workers
    for worker, audit in enumerate(audits):
        if not audit["contexts"] or set(audit["contexts"]) != {workers}:
            return (f"worker {worker} ran the backward pass in a replica context of "
                    f"{sorted(set(audit['contexts']))} replicas, not {workers}: train the "
                    "model built in the scope, inside strategy.run, so that its gradients "
                    "are all-reduced")
        if audit["rows"] != [share] * job["steps"]:
            return (f"worker {worker} of {workers}: its {len(audit['rows'])} backward passes "
                    f"carried {audit['rows'][:8]} examples; each of the {job['steps']} steps "
                    f"should train this worker on its own {share} of the "
                    f"{job['global_batch']} examples of the global batch (InputContext; the "
                    "replicas in sync, not a number of workers you assume)")
    for worker, audit in enumerate(audits):
        if any(size < 0 or size > share for size in audit["batches"]):
            return (f"worker {worker} of {workers} batched {audit['batches'][:4]} examples at "
                    f"a time ({COUNTED}): its pipeline should read only its own {share} of each "
                    f"global batch of {job['global_batch']} (shard the data by the InputContext, "
                    "batch the per-replica size), not the whole batch to slice its rows")
    due = [*range(job["save_every"], job["steps"] + 1, job["save_every"]), job["steps"]]
    for worker, audit in enumerate(audits):
        if audit["saved_after"] != due:
            return (f"worker {worker} saved after steps {audit['saved_after']}, expected "
                    f"{due}: every save_every steps and after the last one")
    weights = [_load(out / f"weights-{i}.npz") for i in range(workers)]
    expected = reference_weights(job, job["steps"], initial=_load(out / "initial-0.npz"))
    for worker, own in enumerate(weights):
        if not all(np.isfinite(w).all() for w in own):
            return (f"worker {worker}'s weights are not finite (NaN or inf): the data and "
                    "the reference's training are finite")
    error = max_difference(weights[0], expected)
    if max(max_difference(weights[0], other) for other in weights[1:]) > 1e-6:
        return "the workers ended with different weights: were the variables mirrored?"
    if not error <= 1e-4:
        return (f"the weights differ from one device trained on the same global batches of "
                f"{job['global_batch']} examples (max |difference| {error:.2g}). Each "
                f"worker's copy of the data holds only its own examples (worker i of {workers}: "
                f"i, i + {workers}, i + {2 * workers}, …, what Dataset.shard("
                "num_input_pipelines, input_pipeline_id) keeps), the other rows decoys: does "
                "every worker read only its own part of each global batch (InputContext), is "
                "the global batch replica_batch × num_replicas_in_sync, and is the loss "
                "divided by it?")
    shared = os.path.realpath(folder / "checkpoints")
    chief = audits[0]["saves"]
    if not chief or any(os.path.realpath(d) != shared for d in chief):
        return ("the chief should save into checkpoint_dir with a CheckpointManager; it saved "
                f"into {chief}")
    for worker, audit in enumerate(audits[1:], start=1):
        other = audit["saves"]
        if len(other) != len(chief):
            return (f"every worker must call save (the chief saved {len(chief)} times, worker "
                    f"{worker} {len(other)} times); the others save into a temporary folder")
        if any(os.path.commonpath([os.path.realpath(d), shared]) == shared for d in other):
            return f"worker {worker} wrote into checkpoint_dir: only the chief may write there"
        for left, after in zip(audit["left"], audit["saved_after"], strict=True):
            if left:
                return (f"worker {worker}'s temporary checkpoint folder of an earlier save was "
                        f"still there when it saved after step {after}: delete it after each "
                        "save, not once at the end")
        for step, lingering in enumerate(audit["lingering"], start=1):
            if lingering:
                return (f"worker {worker}'s temporary checkpoint folder of an earlier save was "
                        f"still there while it trained step {step}: delete it right after each "
                        "save")
        if any(os.path.exists(d) for d in other):
            return (f"worker {worker} left its temporary checkpoint folder behind: delete it "
                    "after each save")
    problem = files.checkpoint_dir_problem(shared, audits) or files.saved_contents_problem(audits)
    if problem:     # listed: only the chief's checkpoints; the others' saves held the same
        return problem
    latest = tf.train.latest_checkpoint(str(folder / "checkpoints"))
    if latest is None:
        return "no checkpoint in checkpoint_dir: save at the end of training too"
    if optimizer_problem(latest, job["steps"]):
        return optimizer_problem(latest, job["steps"])
    restored = reference_weights(job, 0, checkpoint=latest)
    if not max_difference(restored, weights[0]) <= 1e-6:
        return "the newest checkpoint does not hold the final weights: save after the last step"
    return held_out_problem(job, audits, weights[0])


@register
def check_train_worker(fn: Any) -> bool:
    """Check ``train_worker(...)`` on a real 2-worker cluster (see the module docstring)."""
    name = "train_worker"
    if is_stub(fn):
        not_attempted(name)
        return False
    source = function_source(fn, "train_worker")
    peeks = grader_introspection(fn, constants=True)
    if peeks:
        raise AssertionError(f"{name}: your function uses {', '.join(peeks)}, which reads "
                             "objects of the process it runs in (the check's audit) instead "
                             "of training. Use only its arguments and tf, keras, np, os, json, "
                             "time, tempfile.")
    rng = fresh_rng()

    def run_and_verify(workers: int) -> str | None:
        """A fresh job on a fresh cluster of ``workers`` workers: what went wrong, or None."""
        with tempfile.TemporaryDirectory(prefix="lesson03_train_") as root:
            folder = Path(root)
            (folder / "tmp").mkdir()
            job = _fresh_job(rng, folder, workers=workers, shards=True)
            if job["steps"] % job["save_every"] == 0:   # a last step that is no regular save
                job["steps"] += 1
            script = folder / "worker.py"
            script.write_text(train_worker_script(source))
            (folder / "out").mkdir()
            job["secrets"] = [secrets.token_hex(16) for _ in range(workers)]
            for worker, secret in enumerate(job["secrets"]):   # read, then deleted, by SETUP
                (folder / "out" / f"secret-{worker}").write_text(secret)
            try:
                _run(script, _script_args(job, folder, "data-{task}.npz"), folder,
                     workers=workers)
            except Exception as error:  # noqa: BLE001 - the learner's code failed in a worker
                # the model built outside the strategy makes the workers race for
                # checkpoint_dir: name that cause, not the crash it led to
                if f"{folder / 'checkpoints'}{os.sep}" in str(error):
                    # two workers' saves met in checkpoint_dir (one's temporary files gone)
                    return (failed_build(folder / "out", workers)
                            or "a save failed inside checkpoint_dir: did more than the chief "
                               "write there? Only the chief may; every other worker saves "
                               f"into a temporary folder of its own. The job failed: {error}")
                return (failed_build(folder / "out", workers)
                        or f"the job failed: {error}")
            return _verify_train_worker(folder, job)

    # two sizes of cluster, so that no number of workers can be assumed; the second only
    # once the first passed
    cases = [Case(args=(workers,), verify=lambda reason: reason,
                  label=f"a fresh job on {workers} workers") for workers in (2, 3)]
    return run_check(name, lambda workers: once_more_if_transient(
                         lambda: run_and_verify(workers)), cases,
                     hint="keep the lesson's training (section 2, parts 1-5); evaluate each "
                          "worker's shard of the held-out set once (no repeat, no "
                          "drop_remainder), sum the losses and count the examples, "
                          "all-reduce both (strategy.reduce of strategy.run's values) and "
                          "divide once. Sections 2 and 3.")


# --- exercise 3: resume after the job changed shape -------------------------------------------


def _run_killed(script: Path, args: list[str], folder: Path, kill_after: int) -> None:
    """Run the job, kill worker 1 once it logged step ``kill_after``, stop the rest."""
    with ForkedCluster(script, 2, args=[*args, "--step-delay", "0.5"], timeout=CLUSTER_TIMEOUT,
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
    steps = [int(step) for step in re.findall(r"^step (\d+) ", logs[0], re.MULTILINE)]
    if steps != list(range(1, job["steps"] + 1)):
        return f"the restarted job trained steps {steps}, expected 1-{job['steps']}"
    batch = job["global_batch"]
    batches = [(k * first_batch, first_batch) for k in range(saved // first_batch)]
    batches += [(saved + k * batch, batch) for k in range(job["steps"])]
    weights = _load(folder / "out" / "weights-0.npz")
    initial = _load(folder / "out" / "initial-0.npz")
    error = max_difference(weights, reference_weights(job, 0, initial=initial, batches=batches))
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
    peeks = sorted({*grader_introspection(restore_latest, constants=True),
                    *grader_introspection(make_dataset_fn, constants=True)})
    if peeks:        # run_check sees only the check's own wrapper of the two
        raise AssertionError(f"{name}: your functions use {', '.join(peeks)}, which read the "
                             "checker's frames or objects (the checkpoints' contents, the audit "
                             "of your batches) instead of computing the answer")
    rng = fresh_rng()
    hint = ("restore tf.train.latest_checkpoint(checkpoint_dir) and return examples_done; "
            "start at that example of the whole data, whatever the number of pipelines and "
            "replicas: skip it before the data is sharded, or shard and let pipeline i of P "
            "skip ceil((examples_done - i) / P) of its own rows. "
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

        def kill_restart_verify() -> str | None:
            for leftover in ("checkpoints", "out"):   # of a first try, run once more
                shutil.rmtree(folder / leftover, ignore_errors=True)
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

        parts = {"restore": lambda: restore_problem(restore_latest, rng),
                 "dataset": lambda: dataset_fn_problem(make_dataset_fn, rng),
                 "cluster": lambda: once_more_if_transient(kill_restart_verify)}
        cases = [Case(args=("restore",), verify=lambda reason: reason,
                      label="restore_latest on fresh checkpoints, in this process"),
                 Case(args=("dataset",), verify=lambda reason: reason,
                      label="make_dataset_fn on fresh input contexts, in this process"),
                 Case(args=("cluster",), verify=lambda reason: reason,
                      label=f"a 2-worker job killed after step {kill_after} (global batch "
                            f"{first_batch}), restarted with global batch "
                            f"{job['global_batch']}")]
        return run_check(name, lambda part: parts[part](), cases, hint=hint)
