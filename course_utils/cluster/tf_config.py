"""``TF_CONFIG`` and who-am-I: cluster specs, one task's ``TF_CONFIG``, the worker's strategy.

The same dictionaries describe a cluster on ``localhost`` (``LocalCluster`` writes them) and on
Kubernetes (the training operator writes them in every pod).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "WORKER_ENV",
    "cluster_spec",
    "is_chief",
    "pick_ports",
    "task",
    "tf_config",
    "visible_gpus",
    "worker_gpus",
    "worker_strategy",
]

#: Environment every local worker gets: quiet logs and unbuffered prints, nothing that changes
#: what TensorFlow computes or how it fails (GPUs: ``settings.gpu_visibility``, per worker).
WORKER_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "PYTHONUNBUFFERED": "1",
}


def visible_gpus() -> list[str]:
    """The CUDA ids of the GPUs this process sees (none when TensorFlow was not imported)."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is None:
        return []
    count = len(tf.config.list_physical_devices("GPU"))
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [i.strip() for i in inherited.split(",") if i.strip()] if inherited else []
    return ids[:count] if len(ids) >= count else [str(i) for i in range(count)]


def worker_gpus(index: int, num_workers: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for local worker ``index``: a GPU of its own, or none."""
    from course_utils.settings import gpu_visibility

    gpus = visible_gpus()
    slot = gpu_visibility(index, num_workers, len(gpus))
    return gpus[int(slot)] if slot else ""


#: Environment variable that passes the collective time-out (seconds) to worker scripts.
COLLECTIVE_TIMEOUT_ENV = "COURSE_COLLECTIVE_TIMEOUT"


def pick_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on this machine (chosen with portpicker)."""
    import portpicker

    ports: list[int] = []
    while len(ports) < count:
        port = portpicker.pick_unused_port()
        if port not in ports:
            ports.append(port)
    return ports


def cluster_spec(
    num_workers: int,
    num_ps: int = 0,
    *,
    chief: bool = False,
    host: str = "localhost",
    ports: Sequence[int] | None = None,
) -> dict[str, list[str]]:
    """A cluster spec ``{"chief": [...], "worker": [...], "ps": [...]}`` of host:port strings."""
    if num_workers < 0 or num_ps < 0 or num_workers + num_ps + int(chief) == 0:
        raise ValueError("a cluster needs at least one task")
    needed = int(chief) + num_workers + num_ps
    ports = list(ports) if ports is not None else pick_ports(needed)
    if len(ports) != needed:
        raise ValueError(f"need {needed} ports, got {len(ports)}")
    addresses = iter(f"{host}:{port}" for port in ports)
    spec: dict[str, list[str]] = {}
    if chief:
        spec["chief"] = [next(addresses)]
    if num_workers:
        spec["worker"] = [next(addresses) for _ in range(num_workers)]
    if num_ps:
        spec["ps"] = [next(addresses) for _ in range(num_ps)]
    return spec


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> dict:
    """The ``TF_CONFIG`` dictionary of one task (``json.dumps`` it into the environment)."""
    if task_type not in cluster:
        raise ValueError(f"task type {task_type!r} is not in the cluster {sorted(cluster)}")
    if not 0 <= task_index < len(cluster[task_type]):
        raise ValueError(
            f"task index {task_index} out of range: {task_type} has {len(cluster[task_type])} tasks"
        )
    return {
        "cluster": {name: list(addresses) for name, addresses in cluster.items()},
        "task": {"type": task_type, "index": task_index},
    }


def task(environ: Mapping[str, str] | None = None) -> tuple[str | None, int | None]:
    """``(task_type, task_index)`` of this process from ``TF_CONFIG`` (None, None if unset)."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG")
    if not raw:
        return None, None
    info = json.loads(raw).get("task", {})
    return info.get("type"), info.get("index")


def is_chief(environ: Mapping[str, str] | None = None) -> bool:
    """True for the task that writes checkpoints and summaries: the chief, else worker 0."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG")
    if not raw:
        return True
    config = json.loads(raw)
    task_type, index = config.get("task", {}).get("type"), config.get("task", {}).get("index")
    if task_type == "chief":
        return True
    return task_type == "worker" and index == 0 and "chief" not in config.get("cluster", {})


def worker_strategy(timeout_seconds: float | None = None) -> Any:
    """In a worker script: a MultiWorkerMirroredStrategy from ``TF_CONFIG``, collective time-out.

    The time-out (default: what :class:`LocalCluster` passes in ``COURSE_COLLECTIVE_TIMEOUT``,
    else none; ``0`` switches it off) makes a collective that waits longer than it raise
    ``DeadlineExceededError``. A dead or stalled peer is usually found first by the coordination
    service's heartbeat check (about 10 s, an ``UnavailableError``); TensorFlow calls the option a
    debugging aid that starts a thread for every collective (``CommunicationOptions`` in
    ``collective_util.py``). The implementation is TensorFlow's default, ``AUTO``. Call it at the
    start of the script, before any other TensorFlow work.
    """
    import tensorflow as tf

    if not os.environ.get("TF_CONFIG"):
        raise ValueError(
            "TF_CONFIG is not set: run this script through cu.cluster.LocalCluster (or set "
            "TF_CONFIG yourself) before creating a MultiWorkerMirroredStrategy"
        )
    if timeout_seconds is None and os.environ.get(COLLECTIVE_TIMEOUT_ENV):
        timeout_seconds = float(os.environ[COLLECTIVE_TIMEOUT_ENV])
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
