"""Real TensorFlow clusters on one machine: multi-worker subprocesses, in-process parameter servers.

One job per module:

* ``tf_config`` -- :func:`tf_config`, :func:`cluster_spec`, :func:`pick_ports`; in the worker
  script, :func:`worker_strategy` builds the MultiWorkerMirroredStrategy with collective
  time-outs, and :func:`task` / :func:`is_chief` say who this process is.
* ``local`` -- :class:`LocalCluster` starts one subprocess per worker, each running your script
  with its own ``TF_CONFIG``, streams their logs and always cleans up; ``processes`` (start,
  signal, stop), ``logs`` (one file per worker) and ``errors`` (:class:`WorkerError`,
  :class:`ClusterTimeoutError`, carrying the last log lines) are its parts.
* ``forked`` -- :class:`ForkedCluster`, a :class:`LocalCluster` whose workers are forked from
  one process that has already imported TensorFlow (a worker's start is nearly all import).
* ``in_process`` -- :func:`start_in_process_cluster` starts workers and parameter servers as
  ``tf.distribute.Server`` objects in this process, for ``ParameterServerStrategy``.
* ``process_cluster`` -- :class:`ProcessCluster` starts every worker and parameter server as its
  own process (``serve_task.py``), so that one can be killed; this process coordinates.
* ``kubernetes`` -- :func:`tfjob_manifest` describes the same job for a real cluster (a Kubeflow
  ``TFJob``), refusing what the operator would refuse; :func:`to_yaml` writes it.

Example (a notebook)::

    %%writefile worker.py
    import course_utils as cu
    strategy = cu.cluster.worker_strategy()
    ...

    with cu.cluster.LocalCluster("worker.py", num_workers=2, timeout=60) as cluster:
        cluster.wait()
"""

from __future__ import annotations

from .errors import ClusterTimeoutError, WorkerError
from .forked import ForkedCluster
from .in_process import InProcessCluster, start_in_process_cluster
from .kubernetes import RESTART_POLICIES, persistent_volume_claim, tfjob_manifest, to_yaml
from .leftovers import leftovers
from .local import LocalCluster
from .process_cluster import ProcessCluster
from .tf_config import (
    COLLECTIVE_TIMEOUT_ENV,
    WORKER_ENV,
    cluster_spec,
    is_chief,
    pick_ports,
    task,
    tf_config,
    worker_strategy,
)

__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "RESTART_POLICIES",
    "WORKER_ENV",
    "ClusterTimeoutError",
    "ForkedCluster",
    "InProcessCluster",
    "LocalCluster",
    "ProcessCluster",
    "WorkerError",
    "cluster_spec",
    "is_chief",
    "leftovers",
    "persistent_volume_claim",
    "pick_ports",
    "start_in_process_cluster",
    "task",
    "tf_config",
    "tfjob_manifest",
    "to_yaml",
    "worker_strategy",
]
