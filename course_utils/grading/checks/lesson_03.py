"""Checks of lesson 03's exercises (multi-worker training), registered by name with ``@register``.

* ``check_train_worker(train_worker)``: runs the learner's worker function on a real 2-worker
  localhost cluster (fresh data, steps and batch): both workers finish, their weights equal a
  one-device reference on the same global batches, the chief alone wrote into the checkpoint
  folder (the other worker saved into a temporary folder it deleted), and the newest checkpoint
  holds the final weights.
* ``check_diagnose(diagnose)``: fresh logs of several failed jobs (a worker killed, crashed,
  stalled or never started; a job whose workers each trained alone); the learner's function
  names the cause and the worker at fault.
* ``check_resume(restore_latest, make_dataset_fn)``: the course's worker script with the
  learner's two functions, killed after a checkpoint and restarted: the second run starts at the
  step of the chief's newest checkpoint, trains every step left exactly once, and ends with the
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
from course_utils.grading.checks.worker_logs import CAUSES, failure_logs
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
    weights = [_load(out / f"weights-{i}.npz") for i in range(2)]
    expected = reference_weights(job, job["steps"], initial=_load(out / "initial-0.npz"))
    error = _max_difference(weights[0], expected)
    if _max_difference(weights[0], weights[1]) > 1e-6:
        return "the two workers ended with different weights: were the variables mirrored?"
    if error > 1e-4:
        return (f"the weights differ from one device trained on the same global batches (max "
                f"|difference| {error:.2g}): does every worker read its own part of each global "
                "batch (InputContext), and is the loss divided by the global batch?")
    audits = [json.loads((out / f"audit-{i}.json").read_text()) for i in range(2)]
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
                         hint="the lesson's worker script, parts 1-5: MWMS, a dataset_fn "
                              "sharded by its InputContext, the model built in the scope, "
                              "the step, a CheckpointManager writing to checkpoint_dir on the "
                              "chief only. Section 2.")


# --- exercise 2: diagnose a failed job ---------------------------------------------------------


def _diagnosis_cases(rng: Any) -> list[Case]:
    causes = list(CAUSES) + [rng.choice(CAUSES[:4]) for _ in range(3)]
    rng.shuffle(causes)
    cases = []
    for cause in causes:
        workers = rng.randint(2, 4)
        culprit = None if cause == "not_in_cluster" else rng.randrange(workers)
        logs = failure_logs(cause, workers, culprit, rng)
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
                          "'Connection refused' (that worker is gone: killed) or "
                          "DeadlineExceededError (alive but silent: stalled), every worker "
                          "'1 replicas in sync' (TF_CONFIG too late). Sections 3 and 8.")


# --- exercise 3: resume with nothing lost ------------------------------------------------------


def _steps_logged(log: str) -> list[int]:
    return [int(step) for step in re.findall(r"^step (\d+) ", log, re.MULTILINE)]


def _run_killed(script: Path, args: list[str], folder: Path, kill_after: int) -> None:
    """Run the job, kill worker 1 once it logged step ``kill_after``, stop the rest."""
    from course_utils.cluster import LocalCluster

    with LocalCluster(script, 2, args=[*args, "--step-delay", "1.0"], timeout=CLUSTER_TIMEOUT,
                      stream=False, collective_timeout=60,
                      env={"TMPDIR": str(folder / "tmp")}) as cluster:
        cluster.wait_for(rf"^step {kill_after} ", worker=1)
        cluster.kill_worker(1)


def _verify_resume(folder: Path, job: dict[str, Any], logs: list[str], saved: int) -> str | None:
    started = re.search(r"^resumed at step (\d+)$", logs[0], re.MULTILINE)
    if started is None or int(started.group(1)) != saved:
        seen = started.group(1) if started else "?"
        return (f"the restarted job began at step {seen}, but the chief's newest checkpoint is "
                f"of step {saved}: restore it and return the steps it had trained")
    steps = _steps_logged(logs[0])
    if steps != list(range(saved + 1, job["steps"] + 1)):
        return f"the restarted job trained steps {steps}, expected {saved + 1}-{job['steps']}"
    weights = _load(folder / "out" / "weights-0.npz")
    initial = _load(folder / "out" / "initial-0.npz")
    error = _max_difference(weights, reference_weights(job, job["steps"], initial=initial))
    if error > 1e-4:
        return (f"after the restart the weights differ from an uninterrupted run (max |difference|"
                f" {error:.2g}): the resumed pipeline must start at the first global batch not "
                "trained yet")
    return None


@register
def check_resume(restore_latest: Any, make_dataset_fn: Any) -> bool:
    """Check ``restore_latest`` and ``make_dataset_fn`` by killing and restarting a real job."""
    name = "resume"
    stubs = [is_stub(fn) for fn in (restore_latest, make_dataset_fn)]
    if all(stubs):
        not_attempted(name)
        return False
    if any(stubs):
        raise AssertionError(f"{name}: write both functions, restore_latest and make_dataset_fn")
    sources = [function_source(restore_latest, "restore_latest"),
               function_source(make_dataset_fn, "make_dataset_fn")]
    rng = fresh_rng()
    with tempfile.TemporaryDirectory(prefix="lesson03_resume_") as root:
        folder = Path(root)
        (folder / "tmp").mkdir()
        job = _fresh_job(rng, folder, batches=9)   # no batch twice: a missing skip shows
        job["steps"] = 2 * job["save_every"] + 2
        kill_after = job["save_every"] + 1              # just after the first checkpoint
        script = folder / "worker.py"
        script.write_text(resume_script(*sources))
        args = _script_args(job, folder)

        def kill_restart_verify(_: Any) -> str | None:
            try:
                _run_killed(script, args, folder, kill_after)
                latest = _tf().train.latest_checkpoint(str(folder / "checkpoints"))
                if latest is None:
                    return "after the kill the checkpoint folder is empty: the job never saved"
                saved = int(latest.rsplit("-", 1)[1])   # the script numbers them by step
                _, logs = _run(script, args, folder)
            except Exception as error:  # noqa: BLE001 - the learner's code failed in a worker
                return f"the job failed: {error}"
            return _verify_resume(folder, job, logs, saved)

        case = Case(args=(None,), verify=lambda reason: reason,
                    label=f"killed after step {kill_after} of {job['steps']}, restarted")
        return run_check(name, kill_restart_verify, [case],
                         hint="restore tf.train.latest_checkpoint(checkpoint_dir) and return "
                              "optimizer.iterations; skip start_step per-replica batches of "
                              "this worker's shard before batching. Sections 2-3.")
