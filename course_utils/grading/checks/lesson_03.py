"""Checks of lesson 03's exercises (multi-worker training), registered by name with ``@register``.

* ``check_tf_config_for(tf_config_for)``: the ``TF_CONFIG`` of worker ``index`` on fresh random
  hosts and ports, read back by a real ``TFConfigClusterResolver`` and compared field by field.
* ``check_shard_for_worker(shard_for_worker)``: for fresh random datasets and worker counts, the
  workers' element sets are disjoint and together complete.
* ``check_train_on_local_cluster(train_on_local_cluster)``: runs the learner's function on
  :data:`WORKER_SCRIPT` with 2 workers: both finished, the loss fell, no process or port left.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from course_utils.environment import import_tensorflow as _tf
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = [
    "WORKER_SCRIPT",
    "check_shard_for_worker",
    "check_tf_config_for",
    "check_train_on_local_cluster",
]

#: The worker script ``check_train_on_local_cluster`` runs: the Trainer under MWMS, 3 epochs.
WORKER_SCRIPT = '''"""Exercise 3's worker: a small model trained with the Trainer under MWMS."""
import course_utils.cluster as cluster

strategy = cluster.worker_strategy()        # reads TF_CONFIG, before any other TF work
import keras, tensorflow as tf
import course_utils as cu

x, y = cu.data.teacher_classification(128, 8, 3, seed=0)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().with_options(options)

def model_fn():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])

def loss_fn(y_true, logits):
    return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)

trainer = cu.Trainer(model_fn, lambda: keras.optimizers.SGD(0.2), loss_fn, strategy=strategy,
                     verbose=0)
trainer.fit(data, epochs=3, steps_per_epoch=4, on_epoch_end=lambda epoch, logs: print(
    f"epoch {epoch + 1} loss {logs['loss']:.4f}", flush=True))
print("done", flush=True)
'''


# --- exercise 1: TF_CONFIG ---------------------------------------------------------------------


def _resolved(config: Any) -> dict[str, Any]:
    """What a real TFConfigClusterResolver reads from ``config`` (set as TF_CONFIG for a moment)."""
    tf = _tf()
    saved = os.environ.get("TF_CONFIG")
    os.environ["TF_CONFIG"] = json.dumps(config)
    try:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return {"task type": resolver.task_type, "task index": resolver.task_id,
                "cluster": resolver.cluster_spec().as_dict()}
    finally:
        if saved is None:
            del os.environ["TF_CONFIG"]
        else:
            os.environ["TF_CONFIG"] = saved


def _same_config(hosts: list[str], port: int, index: int) -> Any:
    expected = {"task type": "worker", "task index": index,
                "cluster": {"worker": [f"{host}:{port}" for host in hosts]}}

    def verify(got: Any) -> str | None:
        if not isinstance(got, dict):
            return f"return a dict (json.dumps makes it TF_CONFIG), got {type(got).__name__}"
        try:
            seen = _resolved(got)
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            return f"TFConfigClusterResolver refused it: {type(error).__name__}: {error}"
        for field, value in expected.items():
            if seen[field] != value:
                return f"the resolver read {field} {seen[field]!r}, expected {value!r}"
        return None

    return verify


@register
def check_tf_config_for(fn: Any) -> bool:
    """Check ``tf_config_for(hosts, port, index)``: the TF_CONFIG of worker ``index``."""
    rng = fresh_rng()
    cases = []
    for _ in range(3):
        hosts = [f"node-{rng.randint(0, 999)}.train.svc" for _ in range(rng.randint(2, 5))]
        hosts = list(dict.fromkeys(hosts))
        port, index = rng.randint(2000, 60000), rng.randrange(len(hosts))
        cases.append(Case(args=(hosts, port, index), verify=_same_config(hosts, port, index)))
    return run_check("tf_config_for", fn, cases,
                     hint='two keys: "cluster" ({"worker": ["host:port", ...]}, the same for '
                          'every worker) and "task" ({"type": "worker", "index": i}). Section 1.')


# --- exercise 2: sharding ----------------------------------------------------------------------


class _AllWorkers:
    """Calls the learner's function once per worker and returns the element sets (a list)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, size: int, num_workers: int) -> list[list[int]]:
        tf = _tf()
        return [sorted(int(v) for v in self.fn(tf.data.Dataset.range(size), num_workers, i)
                       .as_numpy_iterator()) for i in range(num_workers)]


def _disjoint_and_complete(size: int) -> Any:
    def verify(parts: list[list[int]]) -> str | None:
        seen: dict[int, int] = {}
        for worker, part in enumerate(parts):
            for value in part:
                if value in seen:
                    return f"element {value} is read by workers {seen[value]} and {worker}"
                seen[value] = worker
        missing = sorted(set(range(size)) - set(seen))
        if missing:
            return f"no worker reads the elements {missing[:10]}"
        return None

    return verify


@register
def check_shard_for_worker(fn: Any) -> bool:
    """Check ``shard_for_worker(dataset, num_workers, index)``: disjoint, complete parts."""
    tf = _tf()
    rng = fresh_rng()

    def is_dataset(got: Any) -> str | None:
        if not isinstance(got, tf.data.Dataset):
            return f"return a tf.data.Dataset, got {type(got).__name__}"
        return None

    cases = [Case(args=(tf.data.Dataset.range(10), 2, 0), verify=is_dataset,
                  label="(Dataset.range(10), 2, 0)")]
    everyone = _AllWorkers(fn)
    for _ in range(3):
        size, workers = rng.randint(5, 60), rng.randint(2, 5)
        cases.append(Case(args=(size, workers), verify=_disjoint_and_complete(size),
                          label=f"Dataset.range({size}) for {workers} workers"))
    hint = "each worker keeps every num_workers-th element, starting at its index. Section 6."
    first = run_check("shard_for_worker", fn, cases[:1], hint=hint)
    if not first:
        return False
    return run_check("shard_for_worker", everyone, cases[1:], hint=hint)


# --- exercise 3: a local cluster ---------------------------------------------------------------


def _trained_and_clean(num_workers: int) -> Any:
    from course_utils.cluster import LocalCluster, leftovers

    def verify(got: Any) -> str | None:
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], LocalCluster)):
            return "return (cluster, logs): the LocalCluster and the list of its workers' logs"
        cluster, logs = got
        if cluster.num_workers != num_workers or len(logs) != num_workers:
            return (f"expected {num_workers} workers and logs, got {cluster.num_workers} "
                    f"workers and {len(logs)} logs")
        codes = cluster.poll()
        if codes != [0] * num_workers:
            return f"every worker should have finished with exit code 0, got {codes}"
        for worker, log in enumerate(logs):
            losses = [float(v) for v in re.findall(r"^epoch \d+ loss ([\d.]+)", log, re.M)]
            if len(losses) < 2 or "done" not in log:
                return f"worker {worker}'s log does not show the training: {log[-300:]!r}"
            if not losses[-1] < losses[0]:
                return f"worker {worker}'s loss did not fall: {losses}"
        left = leftovers(cluster.pids, cluster.ports)
        if left["processes"] or left["ports"]:
            return f"left behind after the function returned: {left} (use a with block)"
        return None

    return verify


@register
def check_train_on_local_cluster(fn: Any) -> bool:
    """Check ``train_on_local_cluster(script, num_workers)`` on :data:`WORKER_SCRIPT`, 2 workers."""
    with tempfile.TemporaryDirectory(prefix="lesson03_") as folder:
        script = Path(folder) / "worker.py"
        script.write_text(WORKER_SCRIPT)
        cases = [Case(args=(str(script), 2), verify=_trained_and_clean(2),
                      label="(worker.py, 2)")]
        return run_check("train_on_local_cluster", fn, cases,
                         hint="start cu.cluster.LocalCluster(script, num_workers) in a with "
                              "block, wait() inside it, read the logs before it ends. "
                              "Sections 3-4.")
