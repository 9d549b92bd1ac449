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
    CRASHES,
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
    give, once with some survivors timed out first (a rule "timed out anywhere: stalled" is
    wrong there), and a killed worker 0 with one of the reasons its peers give (drawn: any but
    heartbeats, as worker 0 runs the coordination service); two crashes before the culprit
    joined (two kinds drawn: its peers' logs then end as a never-started worker's do, only the
    culprit's log tells them apart) and two while training: a worker past the first two (its
    peers time out, as for a stall) and the chief in its save (its peers find it gone, as for
    a kill). The errors span kinds the lesson never names: no list of names finds them. Each
    job draws its own id of the traced step (r03c L2). The job whose survivors time out first
    has 4 workers, 2 of its 3 survivors timed out: a majority (xf03 L3)."""
    early = rng.sample([c for c in CRASHES if c not in ("label", "chief's save")], 2)
    jobs = [(cause, None) for cause in CAUSES if cause not in ("killed", "crashed")]
    jobs += [("killed", reason) for reason in KILLED_REASONS]
    jobs += [("killed", "worker 0"), ("killed", "some timed out"),
             *(("crashed", crash) for crash in [*early, "label", "chief's save"])]
    rng.shuffle(jobs)
    # each job's traced train_step has its own id, shared by its workers' tracebacks (a
    # crash's and its survivors'): no id marks a survivor
    ops = rng.sample(range(200, 1000), len(jobs))
    cases = []
    for (cause, when), op in zip(jobs, ops, strict=True):
        reason = when if cause == "killed" and when in KILLED_REASONS else None
        crash = when if cause == "crashed" else None
        # 3 or 4 workers and a culprit past the first two wherever the cause allows it: no rule
        # that assumes 2 workers, or blames the first log with a traceback, is right by chance
        workers = rng.randint(2, 4) if cause in ("not_in_cluster", "never_started") else (
            4 if when == "some timed out" else rng.randint(3, 4))
        culprit = None if cause == "not_in_cluster" else rng.randrange(workers)
        if when == "worker 0":       # its peers give no heartbeats reason: it runs the
            culprit = 0              # coordination service; any other may come first
            reason = rng.choice(possible_reasons(0))
        elif when == "chief's save":
            culprit = 0
        elif cause in ("killed", "stalled") or when == "label":
            culprit = rng.randrange(1 if reason == "heartbeats" else 2, workers)
        # most survivors time out first (2 of 3), one still names the kill: no majority of
        # the survivors' errors tells the cause (xf03 L3)
        timed_out = workers - 2 if when == "some timed out" else 0
        logs = failure_logs(cause, workers, culprit, rng, killed_reason=reason, crash=crash,
                            timed_out=timed_out, op=op)
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
                         hint="read each worker's last lines: a traceback of its own, whatever "
                              "its error (crashed; a crashed worker 0's peers fail as for a "
                              "kill), "
                              "an empty log (never started), peers failing with "
                              "UnavailableError (its port refused a call, a call in flight "
                              "was dropped, or no heartbeats came from it: that worker is "
                              "gone, killed, even if other peers timed out first) or only "
                              "DeadlineExceededError (the collective time-out: alive but "
                              "silent, stalled), every worker '1 replicas in sync' (TF_CONFIG "
                              "too late). Sections 3 and 8.")
