"""Checks of lesson 09's exercises, registered by name with ``@register``.

Lesson: Capstone: a real job, profiled.
"""

from __future__ import annotations

import math
from typing import Any

from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["check_capstone_steps_per_epoch"]


@register
def check_capstone_steps_per_epoch(fn: Any) -> bool:
    """Check ``capstone_steps_per_epoch``: the steps of one epoch, rounded up."""
    rng = fresh_rng()
    pairs = [(10, 5), (11, 5)]
    pairs += [(rng.randint(1, 10_000), rng.randint(1, 512)) for _ in range(4)]
    cases = [Case(args=(examples, batch), expected=math.ceil(examples / batch))
             for examples, batch in pairs]
    return run_check("capstone_steps_per_epoch", fn, cases,
                     hint="a last, partial batch is a step too: round up.")
