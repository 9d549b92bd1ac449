"""What a coordinator loop did, watched: lesson 04's ``check_run_steps`` passes a
:class:`WatchedCoordinator` in the ``ClusterCoordinator``'s place and reads which steps were
scheduled, and how many were in flight at once."""

from __future__ import annotations

from collections import Counter
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["WatchedCoordinator", "WatchedRemoteValue", "taken_in_order"]


def taken_in_order(values: list[int], rows: list[list[int]]) -> bool:
    """Whether ``values`` are, together, the first few numbers of each row (one per step)."""
    left = Counter(values)
    for row in rows:
        for value in row:
            if not left[value]:
                break
            left[value] -= 1
    return not +left


class WatchedRemoteValue:
    """A ``RemoteValue`` that tells its :class:`WatchedCoordinator` when it was fetched."""

    def __init__(self, remote: Any) -> None:
        self.remote = remote
        self.finished = False

    def fetch(self) -> Any:
        """The step's result (waits for it)."""
        value = self.remote.fetch()
        self.finished = True
        return value

    def get(self) -> Any:
        """The step's result as tensors (waits for it)."""
        value = self.remote.get()
        self.finished = True
        return value


class WatchedCoordinator:
    """A ``ClusterCoordinator`` that counts the steps scheduled and not yet known finished.

    A step is known finished once ``join`` returned after it was scheduled, or once its
    ``RemoteValue`` was fetched. ``max_in_flight`` is the most steps scheduled and not known
    finished at any ``schedule`` call.
    """

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self.strategy = coordinator.strategy
        self.scheduled: list[WatchedRemoteValue] = []
        self.max_in_flight = 0

    def create_per_worker_dataset(self, dataset_fn: Any) -> Any:
        """As ``ClusterCoordinator.create_per_worker_dataset``."""
        return self.coordinator.create_per_worker_dataset(dataset_fn)

    def schedule(self, fn: Any, args: Any = None, kwargs: Any = None) -> WatchedRemoteValue:
        """As ``ClusterCoordinator.schedule``, counting the steps in flight."""
        in_flight = 1 + sum(not remote.finished for remote in self.scheduled)
        self.max_in_flight = max(self.max_in_flight, in_flight)
        watched = WatchedRemoteValue(self.coordinator.schedule(fn, args=args, kwargs=kwargs))
        self.scheduled.append(watched)
        return watched

    def join(self) -> None:
        """As ``ClusterCoordinator.join``: every step scheduled so far has finished."""
        self.coordinator.join()
        for remote in self.scheduled:
            remote.finished = True

    def done(self) -> bool:
        """As ``ClusterCoordinator.done``."""
        finished = self.coordinator.done()
        if finished:
            for remote in self.scheduled:
                remote.finished = True
        return finished

    def fetch(self, values: Any) -> Any:
        """As ``ClusterCoordinator.fetch`` (of watched values too)."""
        tf = _tf()

        def one(value: Any) -> Any:
            if isinstance(value, WatchedRemoteValue):
                return value.fetch()
            return self.coordinator.fetch(value)

        return tf.nest.map_structure(one, values)
