"""Lesson 09's checks: reference passes, wrong answers fail with a useful message, stubs wait.

The profile checks profile real distributed runs (MirroredStrategy over 2 of the tests' logical
CPUs), a few steps each, and read traces built to order (``profile_traces``).
"""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_09

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def part_totals(events, *, inside_steps=True, skip_tf_data=True):
    """Microseconds of input, compute and communication (the reference's reading)."""
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and "step_num" in e.get("args", {})]
    if not inside_steps:
        steps = [(float("-inf"), float("inf"))]
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    totals = {"input": 0.0, "compute": 0.0, "communication": 0.0}
    for e in events:
        if e.get("ph") != "X" or not any(s <= e["ts"] < end for s, end in steps):
            continue
        op = e.get("args", {}).get("long_name", "")
        if e["name"].startswith("IteratorGetNext"):
            totals["input"] += e["dur"]
        elif ((skip_tf_data and threads.get((e["pid"], e.get("tid")), "").startswith("tf_data"))
              or ":" not in op):
            continue
        elif e["name"].startswith("Iterator::"):
            continue
        elif "Collective" in op or "Nccl" in op:
            totals["communication"] += e["dur"]
        else:
            totals["compute"] += e["dur"]
    return totals


def find_bottleneck(events):
    """The reference: time inside the steps per part, the largest part named."""
    totals = part_totals(events)
    return max(totals, key=totals.get)


def choose_accumulation_steps(global_batch, num_replicas, weight_bytes, per_example, budget):
    per_replica = global_batch // num_replicas
    for k in range(1, per_replica + 1):
        if per_replica % k == 0 and 4 * weight_bytes + per_replica // k * per_example <= budget:
            return k
    raise ValueError("nothing fits")


def remove_input_bottleneck(records, read, augment, batch_size):
    import tensorflow as tf

    return records.map(read).cache().map(augment).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def test_lesson_09_registers_its_checks():
    for name in lesson_09.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_09, name)


def test_find_bottleneck_reference_passes():
    assert cu.grading.check_find_bottleneck(find_bottleneck) is True


@pytest.mark.parametrize("constant", ["input", "compute", "communication"])
def test_find_bottleneck_a_constant_fails(constant):
    with pytest.raises(AssertionError, match="-bound; cu.profiling reads it as"):
        cu.grading.check_find_bottleneck(lambda events: constant)


def test_find_bottleneck_a_threshold_on_the_input_share_fails():
    def threshold(events):
        totals = part_totals(events)
        return "input" if totals["input"] > 0.5 * sum(totals.values()) else "compute"

    with pytest.raises(AssertionError, match="-bound"):
        cu.grading.check_find_bottleneck(threshold)


@pytest.mark.parametrize("shortcut", [{"inside_steps": False}, {"skip_tf_data": False}])
def test_find_bottleneck_ignoring_the_steps_or_the_tf_data_threads_fails(shortcut):
    def reading(events):
        totals = part_totals(events, **shortcut)
        return max(totals, key=totals.get)

    with pytest.raises(AssertionError, match="-bound"):
        cu.grading.check_find_bottleneck(reading)


def test_the_built_traces_read_back_as_built_by_the_course_and_the_reference():
    import random

    from course_utils.grading.checks import profile_traces

    rng = random.Random(0)
    for description in profile_traces.BOTTLENECK_CASES:
        for _ in range(10):
            kind, events = profile_traces.trace_case(rng, description)
            assert cu.profiling.step_breakdown(events).bottleneck() == kind == find_bottleneck(
                events), description
    exact = profile_traces.synthetic_trace(rng, {"input": 0.4, "compute": 0.3,
                                                 "communication": 0.1}, background=0.3)
    shares = cu.profiling.step_breakdown(exact).shares()
    assert shares == pytest.approx({"input": 0.4, "compute": 0.3, "communication": 0.1,
                                    "other": 0.2}, abs=1e-4)
    with pytest.raises(ValueError, match="shares"):
        profile_traces.synthetic_trace(rng, {"input": 0.8, "compute": 0.4})


def test_choose_accumulation_steps_reference_passes():
    assert cu.grading.check_choose_accumulation_steps(choose_accumulation_steps) is True


@pytest.mark.parametrize("lazy", [
    lambda g, r, w, a, b: 1,
    lambda g, r, w, a, b: g // r,
    lambda g, r, w, a, b: choose_accumulation_steps(g, 1, w, a, b),  # ignores the replicas
    lambda g, r, w, a, b: choose_accumulation_steps(g, r, w / 4, a, b),  # forgets grads, slots
    lambda g, r, w, a, b: next(k for k in (1, 2, 4, 8, 16, 32, 64)  # powers of two only
                               if 4 * w + g // r // k * a <= b),
])
def test_choose_accumulation_steps_lazy_answers_fail(lazy):
    with pytest.raises(AssertionError, match="choose_accumulation_steps"):
        cu.grading.check_choose_accumulation_steps(lazy)


def test_choose_accumulation_steps_must_raise_when_nothing_fits():
    def never_raises(global_batch, num_replicas, weight_bytes, per_example, budget):
        try:
            return choose_accumulation_steps(global_batch, num_replicas, weight_bytes,
                                             per_example, budget)
        except ValueError:
            return global_batch // num_replicas

    with pytest.raises(AssertionError, match="raise ValueError"):
        cu.grading.check_choose_accumulation_steps(never_raises)


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
        cu.grading.check_remove_input_bottleneck(
            lambda *args, **kwargs: lesson_09.slow_pipeline(*args, **kwargs))


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

    def choose_accumulation_steps(global_batch, num_replicas, weight_bytes, per_example, budget):
        raise NotImplementedError()

    assert_not_attempted(cu.grading.check_choose_accumulation_steps, choose_accumulation_steps)
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
