"""What a coordinator loop did, watched: lesson 04's ``check_run_steps`` passes a watched
coordinator in the ``ClusterCoordinator``'s place and reads, from a record the learner's code is
not handed, which steps were scheduled and how many were in flight at each ``schedule``.

:func:`watch` makes the classes afresh for every call, without instance attributes (``__slots__
= ()``): the coordinator and the record live in the methods' closures, so neither an attribute
set on the watched object nor a method replaced on a class imported from this module changes
what is recorded, and the judge's ``tampered`` names a class whose methods or an object whose
class were changed during the call. The record (:class:`WatchRecord`) is also where a learner's
code could reach it (the methods' closures): so every event (a schedule and its RemoteValue's
identity, a fetch, a join) is also written into an OS pipe whose read end only the check's judge
holds a reference to (a class made afresh by :func:`watch`, in no closure the learner is handed:
replacing the record's attributes or methods cannot reach the judge); the judge's ``changed``
replays that log, judges the steps in flight from it, and names a record that differs from it as
changed. The watch's own functions are reachable too, so a step could be declared finished
without a wait: before each ``schedule`` the watch also logs how many of the real steps are
still running (TensorFlow's ``RemoteValue`` status), and the replay names a schedule at which
more were running than the waits it saw allow. A wait on a real ``RemoteValue`` reached through
the closures is not seen: it can only make a loop wait more. The functions the watch's log calls
while the learner's code runs (``os.write``, ``struct.pack``, and the status read's ``getattr``,
``sum`` and ``threading.Event.is_set``) are bound when the course is imported, so that replacing
an attribute of this module, of ``os``, ``struct``, ``threading.Event`` or ``builtins`` (during
the call, or left in place for a later check) cannot hide a step still running. Code that
reaches through the closures to TensorFlow's own ``RemoteValue`` objects (setting or swapping
their status events), rewrites the closures, or finds the pipe's read end by its file descriptor
(``/proc/self/fd``: descriptors belong to the whole process) and rewrites the log can, and no
check in the same process can stop it."""

from __future__ import annotations

import os
import struct
import threading
import weakref
from collections import Counter
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

# Bound once, when the course is imported (before any learner's code runs): a replacement a
# learner's function leaves in place is not picked up by a later watch either.
_WRITE, _READ, _PACK, _UNPACK = os.write, os.read, struct.pack, struct.unpack
_GETATTR, _SUM, _IS_SET = getattr, sum, threading.Event.is_set

__all__ = ["WatchRecord", "taken_in_order", "watch"]


def taken_in_order(values: list[int], rows: list[list[int]]) -> bool:
    """Whether ``values`` are, together, the first few numbers of each row (one per step)."""
    left = Counter(values)
    for row in rows:
        for value in row:
            if not left[value]:
                break
            left[value] -= 1
    return not +left


class WatchRecord:
    """What the watched coordinator saw: each step's real ``RemoteValue``, in the order
    scheduled, and the steps in flight at each ``schedule``: the oldest step not known finished
    and every step scheduled after it.

    A step is known finished once ``join`` (or a ``done`` that said so) returned after it was
    scheduled, or once its watched value was fetched. A step whose result was never waited for
    stays in flight, and so do the steps after it however many of them were fetched: the loop
    must wait for the oldest (waiting for the newest alone drains the workers while the record
    would count the oldest, never fetched, as one still busy).

    This is the object the watched methods' closures hold (a learner's code can reach it);
    what judges it, the pipe's read end included, is the object :func:`watch` returns.
    """

    _EVENT = "<cq"  # kind (b"S" schedule, b"F" a step fetched, b"J" all finished,
    #                   b"R" steps really running before the next schedule), number

    def __init__(self) -> None:
        self.scheduled: list[Any] = []
        self.finished: list[bool] = []
        self.in_flight: list[int] = []
        self.handed: list[Any] = []               # the watched values given to the learner


def _replay(events: list[tuple[bytes, int]]) -> tuple[list[int], list[int], list[tuple]]:
    """From the pipe's events: the identity of each step's RemoteValue in the order scheduled,
    the steps in flight at each schedule, and each (schedule, running, in flight) at which more
    steps were really running than the waits seen allow."""
    identities: list[int] = []
    finished: list[bool] = []
    in_flight: list[int] = []
    overrun: list[tuple[int, int, int]] = []
    running = 0
    for kind, number in events:
        if kind == b"R":
            running = number
        elif kind == b"S":
            oldest = next((i for i, done in enumerate(finished) if not done), len(finished))
            in_flight.append(1 + len(finished) - oldest)
            # a step waited for has finished: only those after the oldest can still run
            if running > len(finished) - oldest:
                overrun.append((len(in_flight), running, in_flight[-1]))
            identities.append(number)
            finished.append(False)
            running = 0
        elif kind == b"F" and 0 <= number < len(finished):
            finished[number] = True
        elif kind == b"J":
            finished[:] = [True] * len(finished)
    return identities, in_flight, overrun


def _judge(record: WatchRecord, drain: Any, closer: Any,
           classes: dict[type, dict[str, Any]]) -> Any:
    """The check's view of ``record``: a class made afresh for every watch, held by no closure
    the learner's code is handed, so that neither it nor the pipe's read end can be replaced."""
    replayed: list[list[int]] = []  # the pipe's steps in flight, once changed() ran

    class Judged:
        """``scheduled``, ``handed`` and ``in_flight`` (the pipe's, once :meth:`changed` ran),
        :meth:`changed`, :meth:`tampered` and :attr:`max_in_flight`."""

        __slots__ = ()

        @property
        def scheduled(self) -> list[Any]:
            return record.scheduled

        @property
        def handed(self) -> list[Any]:
            return record.handed

        @property
        def in_flight(self) -> list[int]:
            return replayed[0] if replayed else record.in_flight

        @property
        def max_in_flight(self) -> int:
            """The most steps in flight at any ``schedule``."""
            return max(self.in_flight, default=0)

        def changed(self) -> str | None:
            """How the record differs from the pipe's log (the learner's code rewrote it), or
            None; the log's steps in flight then stand in ``in_flight``."""
            identities, in_flight, overrun = _replay(drain())
            mine = [id(remote) for remote in record.scheduled]
            changed = None
            if overrun:
                at, running, counted = overrun[0]
                changed = (f"at schedule {at}, {running} of your steps were still running on "
                           f"the workers, while the waits the watch saw left {counted - 1} "
                           "unfinished: a step was declared finished without waiting for it. "
                           "Wait for a step by fetching its RemoteValue (or join), and leave "
                           "the watch alone")
            elif identities != mine or in_flight != record.in_flight:
                changed = ("the watch's record of your steps was changed while your function "
                           f"ran (its steps in flight {record.in_flight}, as they happened "
                           f"{in_flight}; {len(mine)} steps recorded, {len(identities)} "
                           "scheduled): schedule through the coordinator you are given, and "
                           "leave its record alone")
            replayed[:] = [in_flight]
            closer()
            return changed

        def tampered(self, watched: Any) -> str | None:
            """What the learner's code changed in the watched objects, or None."""
            for cls, methods in classes.items():
                if dict(vars(cls)) != methods:
                    return (f"the methods of the check's {cls.__name__} were replaced: call "
                            "them, do not change them")
            kinds = list(classes)
            if (type(watched) is not kinds[0]
                    or any(type(value) is not kinds[1] for value in record.handed)):
                return "the class of the check's coordinator or of its RemoteValues was changed"
            return None

    return Judged()


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _pipe_writer(fd: int, layout: str) -> Any:
    """``log(kind, number)``: one event into the pipe ``fd`` (ignored once it is closed)."""
    write, pack = _WRITE, _PACK  # bound at import: a module's attribute replaced later is not

    def log(kind: bytes, number: int = 0) -> None:
        try:
            write(fd, pack(layout, kind, number))
        except OSError:  # closed, or full (BlockingIOError): the replay then differs
            pass

    return log


def _pipe_reader(fd: int, layout: str) -> Any:
    """``drain()``: every ``(kind, number)`` event waiting in the pipe ``fd`` (``os.read`` and
    ``struct.unpack`` bound at import)."""
    read, unpack, size = _READ, _UNPACK, struct.calcsize(layout)

    def drain() -> list[tuple[bytes, int]]:
        data = bytearray()
        while True:
            try:
                chunk = read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data.extend(chunk)
        return [unpack(layout, bytes(data[start:start + size]))
                for start in range(0, len(data) - size + 1, size)]

    return drain


def _status_counter() -> Any:
    """``running(remotes)``: how many real ``RemoteValue``s' steps have not finished yet (no
    wait: each one's status event, set by TensorFlow once the step returned or failed; a value
    without one counts finished). ``getattr``, ``sum`` and ``Event.is_set`` bound at import."""
    get, total, is_set = _GETATTR, _SUM, _IS_SET

    def running(remotes: list[Any]) -> int:
        events = (get(remote, "_status_available_event", None) for remote in remotes)
        return total(1 for event in events if event is not None and not is_set(event))

    return running


def watch(coordinator: Any) -> tuple[Any, Any]:
    """A watched stand-in for ``coordinator`` to hand to the learner, and the check's view of
    its record (``changed``, ``tampered``, ``scheduled``, ``in_flight``, ``max_in_flight``)."""
    tf = _tf()
    record = WatchRecord()
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)  # a full pipe loses events (then named), never hangs
    closer = weakref.finalize(record, _close, read_fd, write_fd)
    log = _pipe_writer(write_fd, WatchRecord._EVENT)
    drain = _pipe_reader(read_fd, WatchRecord._EVENT)  # held by the judge alone
    running = _status_counter()  # bound now, as the pipe's writer is
    index_of: dict[int, int] = {}

    def known_finished(index: int) -> None:
        if not record.finished[index]:  # logged once: a value fetched again changes nothing
            log(b"F", index)
        record.finished[index] = True

    def all_finished() -> None:
        if not all(record.finished):  # logged where it changes something: polls log nothing
            log(b"J")
        record.finished[:] = [True] * len(record.finished)

    class WatchedRemoteValue:
        """A ``RemoteValue`` whose fetch tells the watch that its step finished."""

        __slots__ = ()

        def fetch(self) -> Any:
            """The step's result (waits for it)."""
            index = index_of[id(self)]
            value = record.scheduled[index].fetch()
            known_finished(index)
            return value

        def get(self) -> Any:
            """The step's result as tensors (waits for it)."""
            index = index_of[id(self)]
            value = record.scheduled[index].get()
            known_finished(index)
            return value

    class WatchedCoordinator:
        """A ``ClusterCoordinator`` whose steps in flight are recorded."""

        __slots__ = ()

        @property
        def strategy(self) -> Any:
            """As ``ClusterCoordinator.strategy``."""
            return coordinator.strategy

        def create_per_worker_dataset(self, dataset_fn: Any) -> Any:
            """As ``ClusterCoordinator.create_per_worker_dataset``."""
            return coordinator.create_per_worker_dataset(dataset_fn)

        def schedule(self, fn: Any, args: Any = None, kwargs: Any = None) -> Any:
            """As ``ClusterCoordinator.schedule``, recording the steps in flight."""
            oldest = next((index for index, finished in enumerate(record.finished)
                           if not finished), len(record.finished))
            record.in_flight.append(1 + len(record.finished) - oldest)
            log(b"R", running(record.scheduled))
            remote = coordinator.schedule(fn, args=args, kwargs=kwargs)
            log(b"S", id(remote))
            watched = WatchedRemoteValue()
            index_of[id(watched)] = len(record.scheduled)
            record.scheduled.append(remote)
            record.finished.append(False)
            record.handed.append(watched)
            return watched

        def join(self) -> None:
            """As ``ClusterCoordinator.join``: every step scheduled so far has finished."""
            coordinator.join()
            all_finished()

        def done(self) -> bool:
            """As ``ClusterCoordinator.done``."""
            finished = coordinator.done()
            if finished:
                all_finished()
            return finished

        def fetch(self, values: Any) -> Any:
            """As ``ClusterCoordinator.fetch`` (of watched values too)."""

            def one(value: Any) -> Any:
                if type(value) is WatchedRemoteValue:
                    return value.fetch()
                return coordinator.fetch(value)

            return tf.nest.map_structure(one, values)

    classes = {cls: dict(vars(cls)) for cls in (WatchedCoordinator, WatchedRemoteValue)}
    return WatchedCoordinator(), _judge(record, drain, closer, classes)
