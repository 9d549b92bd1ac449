"""The ways round the checks' guard (``call_guard``), tried on every guarded exercise.

Exercises 00-1, 00-3, 05-2, 06-3, 07-1, 07-2, 09-1 and 09-3 forbid a course helper while the
learner's function runs. A fresh reader got the helper past the guard by calling it in a
thread the profiler does not watch (``_thread.start_new_thread`` reached from C), in a forked
child or a ``multiprocessing`` process that sends the result back, in a subprocess, and by
clearing the guard's record; and in a thread that was running before the check started. Each
way is tried here on each exercise, the helper wired as its check wires it, and must be
rejected with a message that names it.

Cheap on purpose: no case trains or profiles anything. Each runs the answer through the same
guard (or refusal) the check builds, with the same helpers, and reads the verdict the check
reads; the helper itself is called with arguments that make it fail at once (its call is
what counts). The right answers are run by the solutions' notebooks.
"""

from __future__ import annotations

import _thread
import multiprocessing
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from course_utils.grading.checks.call_guard import (
    FORGED,
    PROCESS,
    RAW_THREAD,
    CallsInto,
    watching_problem,
)
from course_utils.grading.checks.forked_call import ForkedCall, ForkedCallError
from course_utils.grading.checks.refusals import own_functions, refusing


def _call(function: Callable[..., Any], *args: Any) -> Any:
    """``function`` called as a learner's answer would, failing at once on these arguments:
    entering its code is what the guard records."""
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - the helper was entered; its failure does not matter
        return None


# --- the ways round it: each makes a learner's function from the helper -----------------


def raw_thread(helper: Callable[[], Any]) -> Callable[..., Any]:
    """The helper in a thread started with ``_thread`` from C (``map``): no profiler there."""
    def answer(*args: Any) -> Any:
        done, out = _thread.allocate_lock(), []
        done.acquire()

        def run() -> None:
            try:
                out.append(helper())
            finally:
                done.release()

        list(map(_thread.start_new_thread, [run], [()]))
        done.acquire()
        return out[0]
    return answer


def forked(helper: Callable[[], Any]) -> Callable[..., Any]:
    """The helper in a child made with ``os.fork``, its result sent back through a pipe."""
    def answer(*args: Any) -> Any:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, pickle.dumps(helper()))
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read, "rb") as pipe:
            return pickle.loads(pipe.read())  # noqa: S301 - our own child's bytes
    return answer


def with_multiprocessing(helper: Callable[[], Any]) -> Callable[..., Any]:
    """The helper in a ``multiprocessing`` process (fork), its result sent back by a pipe."""
    def answer(*args: Any) -> Any:
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=lambda: send.send(helper()))
        child.start()
        result = receive.recv()
        child.join()
        return result
    return answer


def in_a_subprocess(helper: Callable[[], Any]) -> Callable[..., Any]:
    """Work handed to another program (here a Python that does nothing)."""
    def answer(*args: Any) -> Any:
        subprocess.run([sys.executable, "-c", "pass"], check=True)  # noqa: S603
        return None
    return answer


def record_cleared(helper: Callable[[], Any]) -> Callable[..., Any]:
    """The helper called, then the guard's note of it cleared (the guard is the profiler's
    ``__self__``)."""
    def answer(*args: Any) -> Any:
        result = helper()
        sys.getprofile().__self__._logged.clear()
        return result
    return answer


_EARLIER: list[Any] = []  # an executor made "in an earlier cell": its worker already runs


def earlier_executor(helper: Callable[[], Any]) -> Callable[..., Any]:
    """The helper handed to a thread that was running before the check started (an
    executor's worker, made earlier): watched since the guard profiles every thread."""
    if not _EARLIER:
        from concurrent.futures import ThreadPoolExecutor

        _EARLIER.append(ThreadPoolExecutor(1))
        _EARLIER[0].submit(int).result()

    def answer(*args: Any) -> Any:
        return _EARLIER[0].submit(helper).result()
    return answer


WAYS = {earlier_executor: "ran the course's|called", raw_thread: RAW_THREAD, forked: PROCESS,
        with_multiprocessing: PROCESS, in_a_subprocess: PROCESS, record_cleared: FORGED}


# --- each exercise: its helper, and its answer run through its check's own guard ---------


def _refused(guarded: Callable[..., Any], *args: Any) -> str | None:
    try:
        guarded(*args)
    except AssertionError as error:
        return str(error)
    return None


def ex_00_1(way: Callable[..., Any]) -> str | None:
    """diagnose_step: in a copy forked before the cases, refusing lesson 00's functions and
    its cases' maker."""
    from course_utils.grading.checks import diagnose_step_cases, lesson_00

    answer = way(lambda: _call(diagnose_step_cases.diagnose_cases, None))
    guarded = refusing(answer, [*own_functions(lesson_00), *own_functions(diagnose_step_cases)],
                       "compute the medians yourself")
    with ForkedCall(guarded, timeout_s=30) as in_a_copy:
        try:
            in_a_copy({"input": [1.0]}, [2.0])
        except ForkedCallError as error:
            return str(error)
    return None


def ex_00_3(way: Callable[..., Any]) -> str | None:
    """step_breakdown: in a copy, its waits served by the check's thread (``step_waits``)."""
    from course_utils import bench
    from course_utils.grading.checks import lesson_00
    from course_utils.grading.checks.step_waits import WaitServer

    answer = way(lambda: _call(bench.time_interleaved, {}, 0))
    server, calls = WaitServer(10**6, 0.0), []
    try:
        with ForkedCall(server.answer(answer), timeout_s=30) as in_a_copy:
            server.serve(0.0, 0.0, False, calls)
            result, switched_off, called, events = in_a_copy(1)
    finally:
        server.close()
    return lesson_00._breakdown_problem(result, calls, (switched_off, called), 1, {
        "input": 0.0, "compute": 0.0, "whole step": 0.0}, disturbed=False, events=events)


def ex_05_2(way: Callable[..., Any]) -> str | None:
    """tpu_settings: refusing lesson 05's functions, its rules' verifier among them."""
    from course_utils.grading.checks import lesson_05, settings_rules

    answer = way(lambda: _call(settings_rules.settings_problem, (1, 1, 1.0, 1.0, 0.1, 1),
                               (1, 1)))
    return _refused(lesson_05._refusing_the_check(answer, "apply the rules yourself"),
                    2, 64, 1.0, 10.0, 0.1, 256)


def ex_06_3(way: Callable[..., Any]) -> str | None:
    """shard_attention: refusing cu.parallel.mesh and lesson 06's functions."""
    from course_utils.grading.checks import head_shards, lesson_06
    from course_utils.grading.checks.dtensor_watch import whole_copy_watch
    from course_utils.grading.checks.refusals import own_functions
    from course_utils.parallel import mesh

    helpers = [mesh.shard, mesh.sharded_dense, mesh.dense_layouts, mesh.make_mesh,
               *lesson_06._the_checks_own(),
               *own_functions(head_shards, but=["weight_initializer"])]
    answer = way(lambda: _call(lesson_06._short, "device:CPU:0"))
    return _refused(refusing(answer, helpers, "use DTensor's own API", whole_copy_watch([])))


def _ex_07(way: Callable[..., Any]) -> str | None:
    """train_with_accumulation (07-1) and its mirrored version (07-2): refusing cu.Trainer
    and its replica step, by file."""
    from course_utils.grading.checks import lesson_07
    from course_utils.training import trainer

    answer = way(lambda: _call(trainer.Trainer.latest_checkpoint, None))
    return _refused(lesson_07._without_the_trainer(answer))


def ex_09_1(way: Callable[..., Any]) -> str | None:
    """find_bottleneck: a guard on course_utils/profiling.py, read by each case's verify."""
    from course_utils import profiling
    from course_utils.grading.checks import lesson_09

    guard = CallsInto(lesson_09._course_profiling_file())
    answer = way(lambda: _call(profiling.step_breakdown, None))
    import random

    from course_utils.grading.checks.profile_traces import BOTTLENECK_CASES, trace_case

    _, events = trace_case(random.Random(0), next(iter(BOTTLENECK_CASES)))
    with guard:
        got = answer(events)
        return lesson_09._verifier(events, guard)(got)  # counts its answer after the call


def ex_09_3(way: Callable[..., Any]) -> str | None:
    """write_report: a guard on the check's reference."""
    from course_utils.grading.checks.report_cases import report_reference

    guard = CallsInto(report_reference.__code__)
    answer = way(lambda: _call(report_reference, None, None, 0, {}, 0))
    with guard:
        answer()
        called = guard.take()  # as the check's verify reads it
    return watching_problem(called) or (f"write_report called {called}" if called else None)


EXERCISES = {"00-1": ex_00_1, "00-3": ex_00_3, "05-2": ex_05_2, "06-3": ex_06_3,
             "07-1": _ex_07, "07-2": _ex_07, "09-1": ex_09_1, "09-3": ex_09_3}


@pytest.mark.parametrize("exercise", EXERCISES)
@pytest.mark.parametrize("way", WAYS, ids=lambda way: way.__name__)
def test_each_way_round_the_guard_is_rejected_and_named(exercise, way):
    if way is earlier_executor and exercise.startswith("00"):
        pytest.skip("the answer runs in a forked copy, where an earlier thread does not exist")
    said = EXERCISES[exercise](way)
    assert said is not None and any(part in said for part in WAYS[way].split("|")), (
        exercise, way.__name__, said)


def _honest(*args: Any) -> Any:
    return None


@pytest.mark.parametrize("exercise", ["00-1", "05-2", "06-3", "09-1", "09-3"])
def test_an_honest_answer_through_the_same_guard_is_not_refused(exercise):
    said = EXERCISES[exercise](lambda helper: _honest)
    assert said is None or not said.startswith(("your function", "write_report called")), said


_READS_ITS_PARENT = """
import os, sys
from course_utils.grading.checks.forked_call import ForkedCall

def peek(_):
    try:
        with open(f"/proc/{os.getppid()}/mem", "rb"):
            return "read"
    except OSError as error:
        return f"refused: {error.strerror}"

with ForkedCall(peek) as call:
    print(call(None))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="needs Linux and root, to run the copy as an unprivileged user")
def test_the_forked_copy_cannot_read_the_checks_memory_as_an_unprivileged_user(repo):
    """A lesson 03 attacker searched /proc/PPID/mem for the cases' answers; the check's process
    is not dumpable while its copy lives, so a copy of the same user is refused (root, with
    CAP_SYS_PTRACE, is not: grading runs notebooks as an unprivileged user)."""
    run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, "-c", _READS_ITS_PARENT],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(repo)}, cwd="/tmp")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "refused: Permission denied"
