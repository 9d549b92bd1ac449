"""Workers and parameter servers as ``tf.distribute.Server`` objects in this process.

For ``ParameterServerStrategy``: this process is the coordinator, the servers run beside it on
localhost. TensorFlow cannot stop an in-process server, so one cluster per size lives as long as
the process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .tf_config import cluster_spec

__all__ = ["InProcessCluster", "start_in_process_cluster"]


@dataclass
class InProcessCluster:
    """Workers and parameter servers running as ``tf.distribute.Server`` objects in this process."""

    cluster: dict[str, list[str]]
    resolver: Any
    servers: list[Any] = field(repr=False)
    _strategies: dict[Any, Any] = field(default_factory=dict, repr=False)

    def strategy(self, variable_partitioner: Any = None) -> Any:
        """The ``ParameterServerStrategy`` for this cluster (one per partitioner, reused)."""
        import tensorflow as tf

        key = id(variable_partitioner) if variable_partitioner is not None else None
        if key not in self._strategies:
            self._strategies[key] = tf.distribute.ParameterServerStrategy(
                self.resolver, variable_partitioner=variable_partitioner
            )
        return self._strategies[key]


_IN_PROCESS: dict[tuple[int, int], InProcessCluster] = {}


def start_in_process_cluster(num_workers: int = 2, num_ps: int = 1) -> InProcessCluster:
    """Start (once per size) workers and parameter servers in this process, gRPC on localhost.

    The servers live as long as the process: TensorFlow cannot stop an in-process server, so the
    same cluster is returned when a notebook cell runs again. This process is the coordinator.
    gRPC keeps TensorFlow's default, ``GRPC_FAIL_FAST=use_caller`` (``grpc_state.h``): the
    environment of this process, and of the children it starts later, is left as it was.
    """
    if (num_workers, num_ps) in _IN_PROCESS:
        return _IN_PROCESS[(num_workers, num_ps)]
    if num_workers < 1 or num_ps < 1:
        raise ValueError("a parameter-server cluster needs at least one worker and one ps")
    import tensorflow as tf

    spec = cluster_spec(num_workers, num_ps)
    cluster = tf.train.ClusterSpec(spec)
    worker_config = tf.compat.v1.ConfigProto()
    if (os.cpu_count() or 1) < num_workers + 1:
        worker_config.inter_op_parallelism_threads = num_workers + 1
    servers = [
        tf.distribute.Server(
            cluster, job_name="worker", task_index=i, config=worker_config, protocol="grpc"
        )
        for i in range(num_workers)
    ]
    servers += [
        tf.distribute.Server(cluster, job_name="ps", task_index=i, protocol="grpc")
        for i in range(num_ps)
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    result = InProcessCluster(cluster=spec, resolver=resolver, servers=servers)
    _IN_PROCESS[(num_workers, num_ps)] = result
    return result
