"""What a coordinator loop did, watched: lesson 04's ``check_run_steps`` passes a watched
coordinator in the ``ClusterCoordinator``'s place and reads, from a record the learner's code is not
handed, which steps were scheduled and how many were in flight at each ``schedule``.

:func:`watch` makes the classes afresh for every call, without instance attributes (``__slots__ =
()``): the coordinator and the record live in the methods' closures, so neither an attribute set on
the watched object nor a method replaced on a class imported from this module changes what is
recorded, and the judge's ``tampered`` names a class whose methods or an object whose class were
changed during the call. The record (:class:`WatchRecord`) is also where a learner's code could
reach it (the methods' closures): so every event (a schedule and its RemoteValue's identity, a
fetch, a join) is also written into an OS pipe whose read end belongs to a child process (it copies
the log to the judge once the pipe is closed, and makes the pipe itself once it is undumpable,
handing the check the write end alone: see :mod:`~course_utils.grading.checks.child_pipe`, which
says what can still reach the log: ``CAP_SYS_PTRACE``, as root has in some containers – the grader
runs submissions as a sandbox user, which has no capability, or, where none can run them, as root
without it; nbgrader run as root gives it –, rewriting the Python the child runs, or a race inside
the check's process itself). Nothing comes out of the child before the pipe is closed but one byte,
read by the watch before it returns, saying the child made itself undumpable. The judge's
``changed`` closes the pipe, replays the child's copy, judges the steps in flight from it, and names
a record that differs from it as changed. The write end is reachable (its descriptor is in the
closures), so a learner's code can add events but not take back one the watch wrote: the replay
names a frame the watch never writes (bytes that break the log's framing, so that the watch's own
frames would be read from their numbers' bytes), and a write the pipe refuses (its descriptor
closed, or the pipe full while the child is stopped) ends the child, so that its copy is lost and
the record differs from it; once judged, the watch writes no more (the number may be another file's
by then); a child that exits on its own (``sys.executable`` cannot run ``-I -S -c``) is said to be
the check's failure, not the answer's. Before each ``schedule`` the watch reads how many of the real
steps are still running (TensorFlow's ``RemoteValue`` status) and writes that count and the schedule
in one write, so that nothing comes between them, and the replay names a schedule at which more were
running than the steps it counts in flight, less the new one, allow. Added events can only mark
steps finished or add steps (a record then differs), so whatever is added, each schedule the judge
passes had at most its window's steps really in flight. A wait on a real ``RemoteValue`` reached
through the closures is not seen: it can only make a loop wait more. The watch's functions, the
judge's replay and the functions they call while the learner's code runs (``os.write``, ``os.kill``,
``struct.pack``, and the status read's ``getattr``, ``sum`` and ``threading.Event.is_set``) are
bound once, when the course is imported, so that replacing an attribute of this module, of ``os``,
``struct``, ``threading.Event`` or ``builtins`` (during the call, or left in place for a later
check) cannot hide a step still running from them. The judge and the check run after the learner's
code, with the builtins then in place: a builtin (``len``, ``min``) replaced and left in place,
lying only to their frames, can. Each step's status event is taken when it is scheduled: one swapped
on its ``RemoteValue`` later is not read. Code that reaches through the closures to TensorFlow's own
objects (setting a status event, swapping it before the watch takes it, on the real coordinator),
rewrites the closures, or moves the pipe's descriptors (``os.dup2``) for the call, or reaches the
child's read end as :mod:`~course_utils.grading.checks.child_pipe` says, can, and no check in the
same process can stop it. Still passes: a loop that sleeps until its steps have really finished,
then marks them finished through the closures: it kept its window (what is judged is the steps
really running), by the clock."""

from __future__ import annotations

import os
import select
import struct
import threading
import time
import weakref
from collections import Counter
from types import MappingProxyType
from typing import Any

from course_utils.grading.checks.child_pipe import COPY as _COPY
from course_utils.grading.checks.child_pipe import TRACED as _TRACED
from course_utils.grading.checks.child_pipe import child_reader as _child_reader
from course_utils.grading.checks.child_pipe import closer as _closer
from course_utils.grading.checks.child_pipe import end as _end
from course_utils.grading.checks.child_pipe import killer as _killer
from course_utils.grading.checks.child_pipe import pipe_writer as _pipe_writer
from course_utils.grading.checks.child_pipe import starter as _starter
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

# Bound once, when the course is imported (before any learner's code runs), into the closure of
# the watch made below: a replacement a learner's function leaves in place, of these names too,
# is not picked up by a later watch either.
_WRITE, _READ, _PACK, _UNPACK = os.write, os.read, struct.pack, struct.unpack
_SELECT, _CLOCK, _KILL = select.select, time.monotonic, os.kill
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


def _replay(events: list[tuple[bytes, int]]) -> tuple[Any, list[int], list[tuple]]:
    """From the pipe's events: the identity of each step's RemoteValue in the order scheduled
    (None where a frame is not one the watch writes: bytes written into the pipe broke its
    framing, so that the watch's own frames would be read from their numbers' bytes), the steps
    in flight at each schedule, and each (schedule, running, in flight) at which more steps were
    really running than the waits seen allow."""
    identities: list[int] = []
    finished: list[bool] = []
    in_flight: list[int] = []
    overrun: list[tuple[int, int, int]] = []
    running = 0
    for kind, number in events:
        if kind == b"R" and 0 <= number <= len(finished):
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
        elif kind == b"J" and number == 0:
            finished[:] = [True] * len(finished)
        else:  # the watch writes none such: the log's framing was broken
            return None, in_flight, overrun
    return identities, in_flight, overrun


def _judge(record: WatchRecord, drain: Any, closer: Any, replay: Any,
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
            events = drain()
            if events is None:
                closer()
                return ("the watch's log was held open after your function returned (a copy "
                        "of its descriptor kept): schedule through the coordinator you are "
                        "given, and leave the watch alone")
            if events == _TRACED:
                closer()
                return ("the check's log copier was traced (ptrace) before it made itself "
                        "undumpable, so its log cannot be trusted: leave the check's child "
                        "processes alone")
            if isinstance(events, int):
                closer()
                return (f"the check's log copier (a child Python: {_COPY[0]!r} -I -S) exited "
                        f"with status {events} before it copied the log: this Python cannot "
                        "run it, so the check cannot judge your loop here (not a fault of "
                        "your answer; tell your instructor)")
            identities, in_flight, overrun = replay(events)
            mine = [id(remote) for remote in record.scheduled]
            changed = None
            if identities is None:
                closer()
                return ("the watch's log holds bytes the watch never wrote (its framing was "
                        "broken while your function ran): schedule through the coordinator "
                        "you are given, and leave the watch alone")
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


def _status_counter(get: Any, total: Any, is_set: Any) -> tuple[Any, Any]:
    """``(note, running)``: ``note(remote)`` keeps a real ``RemoteValue``'s status event (set by
    TensorFlow once its step returned or failed), taken when it is scheduled, so that an event
    swapped on the ``RemoteValue`` later is not read; ``running()`` says how many of the steps
    noted have not finished yet (no wait; a value without one counts finished). With
    ``getattr``, ``sum`` and ``Event.is_set`` as given."""
    events: tuple[Any, ...] = ()  # a tuple, rebound: no list of the closure to change

    def note(remote: Any) -> None:
        nonlocal events
        event = get(remote, "_status_available_event", None)
        events = (*events, event) if event is not None else events

    def running() -> int:
        return total(1 for event in events if not is_set(event))

    return note, running


def _make_watch(tf_of: Any, layout: str, parts: dict[str, Any], bound: dict[str, Any]) -> Any:
    """:func:`watch`, with every function it and its judge call bound now (at import)."""
    # POSIX only (select reads no pipe on Windows, where os.set_blocking is missing before
    # Python 3.12): said when a watch is made, so that importing the course works everywhere
    start, finalize, copy = _starter(), weakref.finalize, _COPY
    new_record, writer, reader, counter, end, closing, killer, classes = (
        parts[name] for name in ("record", "writer", "reader", "counter", "end", "closer",
                                 "killer", "classes"))
    parts, bound = MappingProxyType(dict(parts)), MappingProxyType(dict(bound))

    def watch(coordinator: Any) -> tuple[Any, Any]:
        """A watched stand-in for ``coordinator`` to hand to the learner, and the check's view
        of its record (``changed``, ``tampered``, ``scheduled``, ``in_flight``,
        ``max_in_flight``)."""
        if start is None:
            raise OSError("lesson 04's coordinator watch reads a pipe with select: it needs "
                          "Linux or macOS")
        write_fd, child = start(copy)
        record = new_record()
        close_write, current = closing(write_fd)
        closer = finalize(record, end, close_write, child)
        log = writer(current, killer(bound["kill"], child.pid), layout, bound["write"],
                     bound["pack"])
        drain = reader(close_write, child, layout, bound, current)  # held by the judge alone
        status = counter(bound["getattr"], bound["sum"], bound["is_set"])
        return classes(coordinator, tf_of(), record, log, drain, status, closer, parts)

    return watch


def _classes(coordinator: Any, tf: Any, record: WatchRecord, log: Any, drain: Any,
             status: tuple[Any, Any], closer: Any, parts: dict[str, Any]) -> tuple[Any, Any]:
    """The watched coordinator and the judge of ``record`` (see :func:`watch`)."""
    index_of: dict[int, int] = {}
    note, running = status

    def known_finished(index: int) -> None:
        if not record.finished[index]:  # logged once: a value fetched again changes nothing
            log((b"F", index))
        record.finished[index] = True

    def all_finished() -> None:
        if not all(record.finished):  # logged where it changes something: polls log nothing
            log((b"J", 0))
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
            steps_running = running()  # before this step
            remote = coordinator.schedule(fn, args=args, kwargs=kwargs)
            note(remote)
            log((b"R", steps_running), (b"S", id(remote)))  # one write: nothing between
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
    return WatchedCoordinator(), parts["judge"](record, drain, closer, parts["replay"], classes)


watch = _make_watch(
    _tf, WatchRecord._EVENT,
    {"record": WatchRecord, "writer": _pipe_writer, "reader": _child_reader,
     "counter": _status_counter, "end": _end, "closer": _closer, "killer": _killer,
     "classes": _classes,
     "judge": _judge, "replay": _replay},
    {"write": _WRITE, "read": _READ, "pack": _PACK, "unpack": _UNPACK, "select": _SELECT,
     "clock": _CLOCK, "getattr": _GETATTR, "sum": _SUM, "is_set": _IS_SET, "kill": _KILL})
