"""course_utils.bench.time_interleaved and compare_throughput (used by lessons 00 and 01)."""

from __future__ import annotations

import time

import pytest
import tensorflow as tf

from course_utils import bench


def test_time_interleaved_takes_turns_after_the_warmup_rotating_who_goes_first():
    calls = []
    timings = bench.time_interleaved({"a": lambda: calls.append("a"),
                                      "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b"]  # each turn starts one later
    assert set(timings) == {"a", "b"} and all(len(t.times) == 3 for t in timings.values())


def test_time_interleaved_tells_a_slow_function_from_a_fast_one():
    timings = bench.time_interleaved({"slow": lambda: time.sleep(0.03), "fast": lambda: None},
                                     repeats=2)
    assert timings["slow"].best >= 0.025 > timings["fast"].best


def test_a_function_far_slower_than_the_fastest_is_timed_once_and_left_out_of_the_turns():
    calls = []

    def record(name, seconds):
        return lambda: (calls.append(name), time.sleep(seconds))

    timings = bench.time_interleaved({"a": record("a", 0.002), "b": record("b", 0.002),
                                      "slow": record("slow", 0.2)},
                                     repeats=3, warmup=1, slow_ratio=20)
    assert calls.count("slow") == 3 and calls.count("a") == calls.count("b") == 5
    assert calls[:7] == ["a", "b", "slow"] * 2 + ["slow"]  # warm-up, a timed call each, the
    # slow one's second
    assert len(timings["slow"].times) == 1 and timings["slow"].best >= 0.2
    assert len(timings["a"].times) == len(timings["b"].times) == 3
    stalls = iter([0.2])  # a fast function whose first timed call stalls stays in the turns

    def stalls_once():
        time.sleep(next(stalls, 0.002))

    timings = bench.time_interleaved({"a": lambda: time.sleep(0.002), "b": stalls_once},
                                     repeats=2, warmup=0, slow_ratio=20)
    assert len(timings["b"].times) == 2
    with pytest.raises(ValueError, match="slow_ratio"):
        bench.time_interleaved({"a": lambda: None}, slow_ratio=1)


def test_time_interleaved_rejects_nothing_to_time():
    with pytest.raises(ValueError):
        bench.time_interleaved({}, repeats=2)
    with pytest.raises(ValueError):
        bench.time_interleaved({"a": lambda: None}, repeats=0)


def test_compare_throughput_builds_a_fresh_dataset_for_every_run():
    built = []

    def make(name):
        def build():
            built.append(name)
            return tf.data.Dataset.range(40).batch(10)
        return build

    consumed = []
    result = bench.compare_throughput({"x": make("x"), "y": make("y")}, repeats=2,
                                      consume=consumed.append)
    assert built == ["x", "y", "x", "y"]
    assert len(consumed) == 4 * 3  # one warm-up batch of four is not timed
    assert set(result) == {"x", "y"} and all(value > 0 for value in result.values())
    with pytest.raises(ValueError):
        bench.compare_throughput({"x": make("x")}, repeats=0)
