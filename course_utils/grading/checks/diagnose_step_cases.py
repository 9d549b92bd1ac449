"""Lesson 00, exercise 1: the cases of ``check_diagnose_step``, each made to have its verdict.

Each part's calls and the whole step's have an exact median (the two middle calls equal it),
a quarter of one part's calls disturbed above it, compute's first call a tracing; each case's
kind sets how the unexplained rest (the whole step's median less the parts') compares with
the largest part, with wide margins, and so the verdict the lesson's rule gives. Nothing here
diagnoses timings: the package is installed for learners, and the exercise is that rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.grading.framework import Case

__all__ = ["diagnose_cases"]

_PARTS = ("input", "host→device transfer", "compute", "communication")
#: Calls timed per part in ``check_diagnose_step``; a quarter of some are disturbed.
_CALLS = 12


def _calls(rng: Any, median_ms: float, slow_s: float = 0.0,
           first_s: float | None = None) -> list[float]:
    """``_CALLS`` timings (seconds) whose median is exactly ``median_ms``: the two middle calls
    equal it, half the others within 5 % below, half within 5 % above. A quarter of the calls,
    among those above, take ``slow_s`` longer (disturbed by other programs); with ``first_s``
    the first call takes that long (a tracing; another call above): the median stays."""
    half = (_CALLS - 2) // 2
    below = [median_ms * rng.uniform(0.95, 1.0) for _ in range(half)]
    above = [median_ms * rng.uniform(1.0, 1.05) for _ in range(half)]
    disturbed = rng.sample(range(half), _CALLS // 4)
    for index in disturbed:
        above[index] += slow_s * 1e3
    first = []
    if first_s is not None:
        spare = rng.choice([i for i in range(half) if i not in disturbed])
        above.pop(spare)
        first = [first_s * 1e3]
    rest = below + [median_ms, median_ms] + above
    rng.shuffle(rest)
    return [round(ms / 1e3, 6) for ms in first + rest]


#: Each kind of case that is not a part's, and the verdict it is made to have.
_MADE_TO_BE = {"synchronisation": "synchronisation", "overlapped": "input",
               "rest above the largest part": "synchronisation",
               "rest below the largest part": "input",
               "rest above one large part": "synchronisation", "parts alike": None,
               "overlapped, parts alike": None}


def _medians(rng: Any, kind: str) -> tuple[dict[str, float], str | None]:
    """The parts' medians (ms) of a case of ``kind``, and the part made the largest (or None)."""
    low = 2.0 if kind == "rest above the largest part" else 0.5
    medians = {name: rng.uniform(low, 3.0) for name in _PARTS}
    big = {"overlapped": "input", "rest below the largest part": "input"}.get(
        kind, kind if kind in medians else None)
    alike = kind in ("parts alike", "overlapped, parts alike")
    if alike or kind == "rest above one large part":
        big = rng.choice(_PARTS)
    if alike:  # comparable parts: the largest wins by a tenth or more
        medians = {name: rng.uniform(7.0, 8.5) for name in _PARTS}
        medians[big] = rng.uniform(9.5, 10.5)
    elif big is not None:
        medians[big] = rng.uniform(8.0, 20.0)
    return medians, big


def _whole_ms(rng: Any, kind: str, medians: dict[str, float]) -> float:
    """The whole step's median (ms) that gives a case of ``kind`` its verdict."""
    total, largest = sum(medians.values()), max(medians.values())
    if kind == "synchronisation":  # the step takes far longer than its parts
        return total + largest + rng.uniform(2.0, 10.0)
    if kind in ("rest above the largest part", "rest above one large part"):
        return total + largest * rng.uniform(1.4, 1.6)  # below the sum where parts are small
    if kind == "rest below the largest part":
        return total + largest * rng.uniform(0.6, 0.85)
    if kind == "overlapped":
        return total - largest * 0.8
    if kind == "overlapped, parts alike":  # a rest below minus the largest part (abs() of it
        return total - largest * 1.3  # is above it), the step still at least half the total
    return total * rng.uniform(1.0, 1.1)  # a tenth of the sum at most: below the largest


def diagnose_cases(rng: Any) -> list[Case]:
    """``check_diagnose_step``'s cases, each with the verdict it was made to have: every median
    exact (``_calls``), the unexplained rest above the largest part by 40 % or more, or below
    it by 15 % or more, or negative (once smaller than the largest part, once larger by 30 %:
    the rest's size alone, ``abs()``, names synchronisation), or a tenth of the parts' sum at
    most against a largest part that is at least a tenth above every other; each case at a
    scale of its own (0.25-4 times), so that no absolute time, nor a share of the step, tells
    the verdicts apart
    (tests/test_checks_lesson_00.py draws thousands and applies the lesson's rule to them)."""
    cases = []
    # the boundaries of the rule: a rest just above the largest part (but below the sum of the
    # parts: comparing with the sum fails), and a rest above the mean and the second part but
    # below the largest (comparing with those, or with 0, fails)
    for kind in (*_PARTS, *_MADE_TO_BE):
        medians, big = _medians(rng, kind)
        scale = rng.uniform(0.25, 4.0)
        whole_ms = _whole_ms(rng, kind, medians) * scale
        medians = {name: ms * scale for name, ms in medians.items()}
        largest = max(medians.values())
        decoy = rng.choice([name for name in _PARTS if name not in (big, "input")])
        timings = {name: _calls(rng, ms, 12 * largest / 1e3 if name == decoy else 0.0,
                                30 * largest / 1e3 if name == "compute" else None)
                   for name, ms in medians.items()}  # compute's first call: the tracing
        whole = _calls(rng, whole_ms, 6 * whole_ms / 1e3)
        timings = dict(rng.sample(sorted(timings.items()), len(timings)))  # any order
        shown = {name: f"{np.median(calls) * 1e3:.2f} ms (median)"
                 for name, calls in timings.items()}
        cases.append(Case(args=(timings, whole), expected=_MADE_TO_BE.get(kind) or big,
                          label=f"(timings of {_CALLS} calls per part: {shown}, whole_step: "
                                f"{np.median(whole) * 1e3:.2f} ms (median); a quarter of the "
                                f"'{decoy}' calls disturbed, compute's first call traced)"))
    rng.shuffle(cases)
    return cases
