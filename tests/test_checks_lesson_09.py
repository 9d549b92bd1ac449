"""Lesson 09's checks: reference passes, wrong answers fail with a useful message, stubs wait.

The checks profile real distributed runs (MirroredStrategy over 2 of the tests' logical CPUs),
a few steps each.
"""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_09

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def find_bottleneck(events):
    """The reference: time inside the steps per part, the largest part named."""
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and "step_num" in e.get("args", {})]
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    totals = {"input": 0.0, "compute": 0.0, "communication": 0.0}
    for e in events:
        if e.get("ph") != "X" or not any(s <= e["ts"] < end for s, end in steps):
            continue
        op = e.get("args", {}).get("long_name", "")
        if e["name"].startswith("IteratorGetNext"):
            totals["input"] += e["dur"]
        elif threads.get((e["pid"], e.get("tid")), "").startswith("tf_data") or ":" not in op:
            continue
        elif e["name"].startswith("Iterator::"):
            continue
        elif "Collective" in op or "Nccl" in op:
            totals["communication"] += e["dur"]
        else:
            totals["compute"] += e["dur"]
    return max(totals, key=totals.get)


def remove_input_bottleneck(records, read, augment, batch_size):
    import tensorflow as tf

    return records.map(read).cache().map(augment).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def test_lesson_09_registers_its_checks():
    for name in lesson_09.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_09, name)


def test_find_bottleneck_reference_passes():
    assert cu.grading.check_find_bottleneck(find_bottleneck) is True


def test_find_bottleneck_always_compute_fails_on_the_input_bound_trace():
    with pytest.raises(AssertionError, match="this run is input-bound"):
        cu.grading.check_find_bottleneck(lambda events: "compute")


def test_find_bottleneck_may_not_call_the_course_helper():
    with pytest.raises(AssertionError, match="must read the events itself"):
        cu.grading.check_find_bottleneck(
            lambda events: cu.profiling.step_breakdown(events).bottleneck())
    assert cu.profiling.step_breakdown is not None  # put back after the check


def test_remove_input_bottleneck_reference_passes(capsys):
    assert cu.grading.check_remove_input_bottleneck(remove_input_bottleneck) is True
    out = capsys.readouterr().out
    assert "input share of the step" in out
    print(out)  # the measured shares, for -s


def test_the_slow_pipeline_fails_with_its_input_share():
    with pytest.raises(AssertionError, match="still waits for input"):
        cu.grading.check_remove_input_bottleneck(lesson_09.slow_pipeline)


def test_caching_after_augmentation_is_named():
    def cached_noise(records, read, augment, batch_size):
        return records.map(read).map(augment).cache().batch(batch_size)

    with pytest.raises(AssertionError, match="same augmentation"):
        cu.grading.check_remove_input_bottleneck(cached_noise)


def test_stubs_are_not_attempted_and_fail_in_strict_mode(assert_not_attempted):
    def find_bottleneck(events):
        raise NotImplementedError()

    def remove_input_bottleneck(records, read, augment, batch_size):
        raise NotImplementedError()

    assert_not_attempted(cu.grading.check_find_bottleneck, find_bottleneck)
    assert_not_attempted(cu.grading.check_remove_input_bottleneck, remove_input_bottleneck)


def test_a_low_first_baseline_is_profiled_again(monkeypatch):
    """A busy moment that hides the slow pipeline's wait in one profile does not fail a good
    submission: the check profiles its baseline again."""
    calls = []
    real = lesson_09.slow_pipeline

    def fast_first(records, read, augment, batch_size):  # the first baseline waits for nothing
        calls.append(1)
        if len(calls) == 1:
            return remove_input_bottleneck(records, read, augment, batch_size)
        return real(records, read, augment, batch_size)

    monkeypatch.setattr(lesson_09, "slow_pipeline", fast_first)
    assert cu.grading.check_remove_input_bottleneck(remove_input_bottleneck) is True
    assert 2 <= len(calls) <= lesson_09.BASELINE_ATTEMPTS  # the fast one, then the real ones


def test_slow_baseline_gives_up_after_its_attempts_with_every_share():
    class Breakdown:
        def __init__(self, share):
            self.share = share

        def shares(self):
            return {"input": self.share}

    profiles = iter([Breakdown(0.3), Breakdown(0.7)])
    assert lesson_09.slow_baseline(lambda: next(profiles)).share == 0.7
    low = iter([Breakdown(0.1), Breakdown(0.2), Breakdown(0.3)])
    with pytest.raises(RuntimeError, match="10%, 20%, 30% for input in 3 profiles"):
        lesson_09.slow_baseline(lambda: next(low))
