"""One task of a parameter-server cluster, run as a process: a ``tf.distribute.Server``, forever.

Started by :class:`~course_utils.cluster.process_cluster.ProcessCluster` as
``python serve_task.py`` (by path, so it imports TensorFlow and nothing of the course) with the
task's ``TF_CONFIG`` in its environment. It prints one ``serving`` line, then serves until it is
killed.
"""

from __future__ import annotations

import json
import os

__all__ = ["main"]


def main(environ: dict[str, str] | None = None, *, join: bool = True) -> object:
    """Start the ``tf.distribute.Server`` that ``TF_CONFIG`` describes; serve it (``join``)."""
    environ = dict(os.environ if environ is None else environ)
    config = json.loads(environ["TF_CONFIG"])
    task = config["task"]
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(config["cluster"]),
        job_name=task["type"],
        task_index=int(task["index"]),
        protocol="grpc",
        start=True,
    )
    print(f"serving {task['type']}:{task['index']} at {server.target}", flush=True)
    if join:
        server.join()
    return server


if __name__ == "__main__":
    main()
