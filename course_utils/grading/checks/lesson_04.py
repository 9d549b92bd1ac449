"""Checks of lesson 04's exercises (registered by name with ``@register``).

Each check runs the learner's code on the notebook's own ``ParameterServerStrategy`` (a check
cannot start a second in-process cluster) and verifies what the parameter servers recorded:

* ``check_run_steps(run_steps, strategy)``: a coordinator loop that gives every worker its own
  dataset (``create_per_worker_dataset``), keeps ``max_in_flight`` steps scheduled and
  unfinished while steps remain and never more (watched through a stand-in from
  :func:`~course_utils.grading.checks.coordinator_watch.watch` passed in the coordinator's
  place, its record kept by the check), and returns the values the steps computed, in the
  order scheduled;
* ``check_make_file_dataset_fn(make_file_dataset_fn, strategy)``: a ``dataset_fn`` over
  TFRecord files of unequal sizes, each worker reading whole files of its own, the shares within
  one file of each other, each worker's examples read in passes, never dry, counted from what
  each worker read (:mod:`course_utils.grading.checks.per_worker_datasets`, which says how);
* ``check_make_average_update(make_average_update, strategy)``: the ``update(loss)`` it returns
  blends each loss into a moving average on a parameter server (``decay * average + (1 - decay)
  * loss``), the check's own decay, start and losses drawn fresh. Its arithmetic is checked
  alone: called eagerly, then in steps one at a time. Overlapping workers (made likely by a
  barrier) must then leave, for ``N`` updates of one loss ``L``, ``decay**N * start + (1 -
  decay**N) * L``, what the updates one after another give in any order. Since a race is
  likely, not certain, the traced steps are read as well
  (:func:`~course_utils.grading.checks.lock_sections.locked_writes`): every write of the
  average must run under a ``tf.CriticalSection``'s lock (after its ``MutexLock``, before its
  ``ConsumeMutexLock``) together with every read it is computed from, or be one op that reads
  and writes under the variable's exclusive lock from no earlier read; the lock's mutex must
  live on the average's parameter server and be one for every step (two steps traced). An
  answer that calls Python (``tf.py_function``, ``tf.numpy_function``) in the step is refused
  before any step runs, as exercise 2's check refuses such a dataset (a step that took a
  Python lock hung).

:func:`barrier_fn` (a counter on a parameter server) puts the workers in step so that they update
at once: the races are likely, not certain (one may read after the other wrote), however busy.
"""

from __future__ import annotations

import math
from typing import Any

from course_utils.grading.checks.coordinator_watch import taken_in_order, watch
from course_utils.grading.checks.dataset_graphs import runs_python
from course_utils.grading.checks.lock_sections import _DEPTH, locked_writes, mutexes_of
from course_utils.grading.checks.per_worker_datasets import (
    BARRIER_TIMEOUT_S,
    _overloaded,
    barrier_fn,
    check_make_file_dataset_fn,
    num_workers_of,
)
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["BARRIER_TIMEOUT_S", "barrier_fn", "check_make_average_update",
           "check_make_file_dataset_fn", "check_run_steps", "num_workers_of"]


@register
def check_run_steps(fn: Any, strategy: Any) -> bool:
    """Check ``run_steps(coordinator, dataset_fn, step_fn, num_steps, max_in_flight)``."""
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # the notebook's own
    rng = fresh_rng()
    workers = num_workers_of(strategy)
    # each worker's dataset: its own random numbers, so results carry no order of their own
    table = tf.constant([[rng.randint(1, 10**9) for _ in range(64)] for _ in range(workers)],
                        tf.int64)
    rows = table.numpy().tolist()
    with strategy.scope():
        applied = tf.Variable(0, dtype=tf.int64, name="check_applied_steps")

    def dataset_fn() -> Any:
        try:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        except RuntimeError as error:  # called here: TensorFlow's words, then the course's
            raise RuntimeError(
                "dataset_fn was called on the coordinator, where there is no worker index: "
                "each worker must make its own dataset from it (create_per_worker_dataset, "
                "lesson 04, section 3), not pull every batch from one iterator made here"
            ) from error
        return tf.data.Dataset.from_tensor_slices(tf.gather(table, worker)).repeat()

    @tf.function
    def step_fn(iterator: Any) -> Any:
        result = next(iterator)  # what only a step run on a worker can compute
        applied.assign_add(1)
        return result

    def case(num_steps: int, max_in_flight: int) -> Case:
        watched, record = watch(coordinator)

        def verify(got: Any) -> str | None:
            done = int(applied.numpy())  # read at once: a loop without join is still running
            applied.assign(0)
            tampered = record.tampered(watched) or record.changed()
            if tampered:
                return tampered
            if len(record.scheduled) != num_steps or done != len(record.scheduled):
                return (f"{len(record.scheduled)} steps were scheduled on the coordinator "
                        f"passed to run_steps and {done} applied when it returned, "
                        f"{num_steps} asked for: a step scheduled is not yet a step run "
                        "(section 2); did every step go through that coordinator and end?")
            window = [min(number, max_in_flight) for number in range(1, num_steps + 1)]
            if record.in_flight != window:
                steps = next(i for i, (a, b) in enumerate(
                    zip(record.in_flight, window, strict=True)) if a != b)
                said = ("more: which step's end does your loop wait for?"
                        if record.in_flight[steps] > window[steps] else
                        "fewer, while steps remained: the workers sat idle. What does your "
                        "loop wait for before scheduling more?")
                return (f"steps in flight (from the oldest not yet waited for) at each schedule: "
                        f"{record.in_flight}; with max_in_flight={max_in_flight} expected "
                        f"{window}. At schedule {steps + 1} there were {said}")
            if not isinstance(got, (list, tuple)) or len(got) != num_steps:
                return f"return a list of one result per step ({num_steps}), got {got!r:.80}"
            if any(hasattr(value, "fetch") for value in got):
                return "you returned RemoteValues, promises of results, not the values (section 2)"
            try:
                values = [int(value) for value in got]
            except (TypeError, ValueError):
                return f"return numbers (what each step returned), got {got!r:.80}"
            if not taken_in_order(values, rows):  # worker w's steps: the start of rows[w]
                return (f"you returned {values[:4]}..., not the numbers step_fn read on the "
                        "workers (each worker's dataset holds its own numbers; section 3)")
            in_order = [int(remote.fetch()) for remote in record.scheduled]
            if values != in_order:
                return ("the right values, in another order than the steps were scheduled "
                        f"(got {values[:4]}..., scheduled {in_order[:4]}...): sorted, or as "
                        "they finished?")
            return None

        return Case(args=(watched, dataset_fn, step_fn, num_steps, max_in_flight),
                    verify=verify, label=f"(coordinator, dataset_fn, step_fn, num_steps="
                                         f"{num_steps}, max_in_flight={max_in_flight})")

    # a window of 2 and one of 3, in a drawn order: a fixed window passes one of them only
    cases = [case(rng.randint(7, 12), window) for window in rng.sample((2, 3), 2)]
    return run_check("run_steps", fn, cases,
                     hint="lesson 04, section 2 (schedule returns at once; a RemoteValue is a "
                          "promise) and section 3 (each worker its own data). After each "
                          "schedule, how many of your steps are unfinished, and which one "
                          "does your loop wait for next?")


def _near(got: float, expected: float) -> bool:  # float32 arithmetic, in any order of its ops
    return abs(got - expected) <= 1e-5 * max(1.0, abs(expected))


#: What each finding of :func:`locked_writes` says of an answer, in the order they are named.
_UNLOCKED = {
    "unread function": (
        "update passes the average into tf.functions nested deeper than the check reads "
        f"(more than {_DEPTH} inside the step), so it cannot tell whether that read or write is "
        "locked: call the read and the write at most a few functions deep"),
    "read outside": (
        "update writes the average under a lock, from a value of it read before the lock was "
        "taken: another worker's update can land between that read and the write, and this "
        "one then overwrites it (or adds to it a change made from the old value: stale). Read "
        "the average inside the function the lock runs"),
    "stale": (
        "update adds to the average, in one atomic op (or a function that locks and writes), a "
        "change computed from a read of it taken before: another worker's update can land "
        "between that read and the add, which then moves a value it was not computed from "
        "(stale: no update lost, yet not the updates one after another). Read the average "
        "inside the lock that also holds the write"),
    "write after the lock": (
        "update reads the average under a lock and writes it outside it: the write is no "
        "input of what the locked function returns, so the lock may be released (the "
        "ConsumeMutexLock after that function's outputs) before it lands, and another worker "
        "can read the old value. Return from the locked function a value made after the write "
        "(lesson 04, section 2: version.assign_add(1).read_value())"),
    "no lock": (
        "update writes the average under no lock, from a read of it (or with an update op "
        "that does not hold the variable's exclusive lock): two workers can both read it "
        "before either writes, and the second write replaces the first, whose update is lost. "
        "Run the read and the write inside one tf.CriticalSection (lesson 04, section 2)"),
}


@register
def check_make_average_update(fn: Any, strategy: Any) -> bool:
    """Check ``make_average_update(average, decay)``: the ``update(loss)`` it returns blends a
    loss into the average (``decay * average + (1 - decay) * loss``), its read and write under
    one lock made on the average's parameter server, so that overlapping workers' updates
    equal the same updates one after another in some order."""
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    rng = fresh_rng()
    workers = num_workers_of(strategy)
    barrier = barrier_fn(strategy)
    decay = round(rng.uniform(0.6, 0.85), 3)
    start = round(rng.uniform(4.0, 9.0), 2)  # far from every loss: a lost update shows
    losses = [round(rng.uniform(0.1, 3.0), 3) for _ in range(rng.randint(4, 6))]
    constant = round(rng.uniform(0.5, 2.0), 2)
    steps = workers * rng.randint(4, 6)  # full rounds of the barrier
    with strategy.scope():
        average = tf.Variable(start, dtype=tf.float32, name="check_average")
    spec = tf.TensorSpec([], tf.float32)

    def verify(update: Any) -> str | None:
        if not callable(update):
            return f"make_average_update must return a function update(loss), got {update!r:.80}"
        said = blended(f"update(loss) called one after another (eager) on losses {losses}",
                       losses, lambda loss: update(tf.constant(loss, tf.float32)))
        if said:
            return said
        traced = []
        try:  # a step run one at a time, and the workers' step, which waits at the barrier
            for waits in (False, True):
                @tf.function
                def step(loss: Any, waits: bool = waits) -> Any:
                    if waits:  # the workers in step, then each updates at once
                        loss = loss + tf.cast(barrier() * 0, tf.float32)
                    update(loss)
                    return loss
                traced.append(step.get_concrete_function(spec))
        except Exception as error:  # noqa: BLE001 - the answer's own error, said
            return (f"update could not be traced into a step: {type(error).__name__}: "
                    f"{str(error)[:300]}")
        if any(runs_python(each.graph) for each in traced):  # before any step can hang on it
            return ("update calls Python (tf.py_function or tf.numpy_function) inside the "
                    "step: a real job's workers cannot run it (it runs only in the process of "
                    "the Python program that made it: TensorFlow's py_function docs), and a "
                    "Python lock there serialises nothing across machines. Make it of "
                    "TensorFlow ops on the average")
        said = lock_message(*traced)
        if said:
            return said
        said = blended(f"{len(losses)} steps on losses {losses}, scheduled one at a time",
                       losses, lambda loss: coordinator.schedule(
                           traced[0], args=(tf.constant(loss, tf.float32),)).fetch())
        if said:
            return said
        for _ in range(2):  # again if a busy machine starved a worker past the barrier
            timeouts_before = int(barrier.timeouts.numpy())
            said = overlapped(traced[1])
            if said or int(barrier.timeouts.numpy()) == timeouts_before:
                return said  # a loss is real even out of step; a pass only in step
        return _overloaded(barrier)

    def blended(what: str, values: list[float], call: Any) -> str | None:
        average.assign(start)
        expected = start
        try:
            for loss in values:
                call(loss)
                expected = decay * expected + (1 - decay) * loss
        except Exception as error:  # noqa: BLE001 - the answer's own error, said
            return f"{what}: update raised {type(error).__name__}: {str(error)[:300]}"
        got = float(average.numpy())
        if _near(got, expected):
            return None
        swapped = start
        for loss in values:
            swapped = (1 - decay) * swapped + decay * loss
        why = (" (unchanged: does update write the average?)" if _near(got, start) else
               " (that is (1 - decay) * average + decay * loss: which of the two keeps the "
               "old average?)" if _near(got, swapped) else
               " (does every call blend its loss in, once?)")
        return (f"{what}, decay={decay}, from {start}: the average reads {got:.6g}; "
                f"average <- decay * average + (1 - decay) * loss gives {expected:.6g}{why}")

    def lock_message(alone: Any, in_step: Any) -> str | None:
        reports = [locked_writes(each, average) for each in (alone, in_step)]
        for finding, said in _UNLOCKED.items():
            if any(finding in report.problems for report in reports):
                return said
        if not all(report.writes for report in reports):
            return ("the traced step never writes the average (the eager calls did): a step "
                    "on a worker must update it")
        mutexes = [mutexes_of(report) for report in reports]
        if not any(mutexes):  # every write one atomic op, from no read: nothing to share
            return None
        if any(mutex is None for each in mutexes for mutex in each):
            return ("update makes its mutex inside the step: make the lock once, in "
                    "make_average_update, and share it between every step")
        if any(len(each) != 1 for each in mutexes):
            return ("update writes the average under more than one lock, or under a lock in "
                    "one step and none in another: one lock for every write, the read it is "
                    "computed from inside that same lock")
        home = tf.DeviceSpec.from_string(average.device).to_string()
        where = tf.DeviceSpec.from_string(mutexes[1][0].device).to_string()
        if where != home:
            return (f"the lock's mutex lives on {where}, not on {home}, the average's parameter "
                    "server: every worker's update would then wait on that machine. Make it "
                    "under tf.device(average.device) in make_average_update (lesson 04, "
                    "section 2 made version_lock beside version)")
        if mutexes[0][0] is not mutexes[1][0]:
            return ("the check traced two steps that call update, and they lock two different "
                    "tf.CriticalSections: update makes a new one at each call. TensorFlow "
                    "promises no exclusion between two ('running the same function in two "
                    "separate critical sections will not ensure serial execution', "
                    "critical_section_ops.py lines 171-172): make the lock once, in "
                    "make_average_update, and use that one in every update")
        return None

    def overlapped(step: Any) -> str | None:
        average.assign(start)
        try:
            for _ in range(steps):
                coordinator.schedule(step, args=(tf.constant(constant, tf.float32),))
            coordinator.join()
        except tf.errors.OpError as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return (f"update failed in a step on a worker: {type(error).__name__}: "
                    f"{lines[-1][:200] if lines else ''}")
        got = float(average.numpy())
        expected = decay**steps * start + (1 - decay**steps) * constant  # any order
        if _near(got, expected):
            return None
        ratio = (got - constant) / (start - constant)
        counted = (f" (as if {math.log(ratio) / math.log(decay):.2f} of them had landed one "
                   "after another: updates lost or stale)" if 0 < ratio < 1 else "")
        return (f"{steps} steps of loss {constant} from {start}, decay={decay}, {workers} "
                f"workers updating at the same moment: the average reads {got:.6g}; the "
                f"{steps} updates one after another, in any order, give {expected:.6g}"
                f"{counted}.")

    label = (f"(average on a parameter server, decay={decay}; {len(losses)} updates one at a "
             f"time, then {steps} from {workers} workers at once)")
    return run_check("make_average_update", fn, [Case(args=(average, decay), verify=verify,
                                                      label=label)],
                     hint="lesson 04, section 2 (a tf.CriticalSection on the counter's "
                          "parameter server). What can land between your read of the average "
                          "and your write, and which ops does the lock hold?")
