"""Lesson 03's check workers, forked from one process that has already imported TensorFlow.

Each worker of a check's job is a fresh process running the check's script. Importing
TensorFlow and Keras is nearly all that such a worker costs (measured here: about 8 of its
9 CPU-seconds), and a check starts 5 of them. So a check's cluster is a
:class:`course_utils.cluster.ForkedCluster` whose zygote also imports the datasets' audit
the set-up binds (:data:`ZYGOTE_IMPORTS`): the check pays those imports once per interpreter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from course_utils.cluster import forked

__all__ = ["ForkedCluster", "once_more_if_transient"]

#: What a job's failure says when the cluster's own transport failed, not the learner's code:
#: TensorFlow's errors of a collective or an RPC between the workers, and gRPC's own.
TRANSIENT = re.compile(r"\b(?:DeadlineExceededError|UnavailableError|AbortedError|"
                       r"CancelledError)\b|Unable to parse request|stopped sending heartbeats")

#: What the zygote imports before it forks a worker (with the datasets' audit the set-up binds).
ZYGOTE_IMPORTS = "numpy, tensorflow, keras, course_utils.grading.checks.dataset_audit"


def once_more_if_transient(attempt: Callable[[], str | None],
                           failed: str = "the job failed:") -> str | None:
    """``attempt()``'s verdict (None: right), run once more when its first verdict is a job
    that failed as a cluster's transport fails (:data:`TRANSIENT`): on 2 cores, busy with
    other clusters, such a failure was seen now and then in a job of right answers. A wrong
    answer that makes its job fail this way fails both times; only the second verdict counts.
    """
    verdict = attempt()
    if verdict is not None and verdict.startswith(failed) and TRANSIENT.search(verdict):
        verdict = attempt()
    return verdict


class ForkedCluster(forked.ForkedCluster):
    """A :class:`course_utils.cluster.ForkedCluster` whose zygote imports
    :data:`ZYGOTE_IMPORTS` (read when the cluster is made)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("preload", ZYGOTE_IMPORTS)
        super().__init__(*args, **kwargs)
