"""Lesson 09's checks: reference passes, wrong answer fails, stub waits."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_09
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def capstone_steps_per_epoch(num_examples, global_batch_size):
    return -(-num_examples // global_batch_size)


def stub(*args):
    raise NotImplementedError()


def test_lesson_09_registers_its_checks():
    for name in lesson_09.__all__:
        assert getattr(cu.grading, name) is getattr(lesson_09, name)


def test_the_reference_solution_passes():
    assert cu.grading.check_capstone_steps_per_epoch(capstone_steps_per_epoch) is True


def test_floor_division_fails_with_the_hint():
    with pytest.raises(AssertionError, match="round up"):
        cu.grading.check_capstone_steps_per_epoch(lambda examples, batch: examples // batch)


def test_a_stub_is_not_attempted_and_fails_in_strict_mode(capsys):
    assert cu.grading.check_capstone_steps_per_epoch(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_capstone_steps_per_epoch(stub)
