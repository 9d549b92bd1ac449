"""Lesson 03, exercise 2: diagnose a failed multi-worker job from its workers' logs (registered
with ``@register``; the contract is in :mod:`course_utils.grading.checks.lesson_03`'s
docstring). The logs are made by :mod:`course_utils.grading.checks.worker_logs`."""

from __future__ import annotations

import sys
from typing import Any

from course_utils.grading.checks import worker_logs
from course_utils.grading.checks.forked_call import ForkedCall
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.worker_logs import (
    CAUSES,
    KILLED_REASONS,
    failure_logs,
    possible_reasons,
)
from course_utils.grading.checks.worker_scripts import is_stub
from course_utils.grading.framework import (
    Case,
    expect_function,
    fresh_rng,
    not_attempted,
    run_check,
)

__all__ = ["check_diagnose"]


def _diagnosis_cases(rng: Any) -> list[Case]:
    """Fresh jobs: every cause; a killed worker other than 0 once with each reason its peers
    give, and a killed worker 0 with one of the reasons its peers give (drawn: any but
    heartbeats, as worker 0 runs the coordination service); a crash both before the culprit
    joined (its peers' logs then end as a never-started worker's do: only the culprit's log
    tells them apart) and while training."""
    jobs = [(cause, None) for cause in CAUSES if cause not in ("killed", "crashed")]
    jobs += [("killed", reason) for reason in KILLED_REASONS]
    jobs += [("killed", "worker 0"), ("crashed", "early"), ("crashed", "late")]
    rng.shuffle(jobs)
    cases = []
    for cause, when in jobs:
        reason = when if cause == "killed" else None
        # 3 or 4 workers and a culprit past the first two wherever the cause allows it: no rule
        # that assumes 2 workers, or blames the first log with a traceback, is right by chance
        workers = rng.randint(2, 4) if cause in ("not_in_cluster", "never_started") else (
            rng.randint(3, 4))
        culprit = None if cause == "not_in_cluster" else rng.randrange(workers)
        if reason == "worker 0":     # its peers give no heartbeats reason: it runs the
            culprit = 0              # coordination service; any other may come first
            reason = rng.choice(possible_reasons(0))
        elif cause in ("killed", "stalled") or when == "late":
            culprit = rng.randrange(1 if reason == "heartbeats" else 2, workers)
        logs = failure_logs(cause, workers, culprit, rng, killed_reason=reason,
                            crashed_early=when == "early" if cause == "crashed" else None)
        cases.append(Case(args=(logs,), expected=(cause, culprit),
                          label=f"the logs of a {workers}-worker job"))
    return cases


def _diagnosis_verify(expected: tuple[str, int | None]) -> Any:
    def verify(got: Any) -> str | None:
        if not (isinstance(got, tuple) and len(got) == 2):
            return f"return (cause, worker), got {got!r}"
        cause, worker = got
        if cause not in CAUSES:
            return f"the cause must be one of {CAUSES}, got {cause!r}"
        if cause != expected[0]:
            return f"the cause is {expected[0]!r}, you said {cause!r}"
        if worker != expected[1]:
            return f"the worker at fault is {expected[1]!r}, you said {worker!r}"
        return None

    return verify


@register
def check_diagnose(fn: Any) -> bool:
    """Check ``diagnose(logs) -> (cause, worker)`` on fresh logs of failed jobs, calling it in a
    copy of this process forked before the logs and their answers are drawn (nothing it can
    reach holds them)."""
    name = "diagnose"
    expect_function(name, fn)
    if is_stub(fn):
        not_attempted(name)
        return False
    # the course's log maker (and this module) make the logs: an answer that makes its own to
    # match them reads the answer from the check's code, not from the logs
    guarded = refusing(fn, [*own_functions(worker_logs), *own_functions(sys.modules[__name__])],
                       "read the logs themselves: the course's log maker is the check's")
    with ForkedCall(guarded) as in_a_copy:
        cases = _diagnosis_cases(fresh_rng())
        for case in cases:
            case.verify = _diagnosis_verify(case.expected)
        return run_check(name, in_a_copy, cases,
                         hint="read each worker's last lines: a traceback of its own (crashed), "
                              "an empty log (never started), peers failing with "
                              "UnavailableError (its port refused a call, a call in flight "
                              "was dropped, or no heartbeats came from it: that worker is "
                              "gone, killed) or "
                              "DeadlineExceededError (the collective time-out: alive but "
                              "silent, stalled), every worker '1 replicas in sync' (TF_CONFIG "
                              "too late). Sections 3 and 8.")
