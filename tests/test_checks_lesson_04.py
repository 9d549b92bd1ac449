"""Lesson 04's checks on a real in-process cluster: the solutions pass; blank, lazy and wrong
answers (each a mistake a learner makes) fail with a message that says what differed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_04

pytestmark = pytest.mark.usefixtures("normal_check_mode")
REPO = Path(__file__).resolve().parents[1]


def test_lesson_04_registers_its_checks():
    for name in lesson_04.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_04, name)


SCRIPT = r'''
import course_utils as cu
import tensorflow as tf

cluster = cu.cluster.start_in_process_cluster(2, 1)
strategy = cluster.strategy()

def verdict(check, fn):
    try:
        return "PASS" if check(fn, strategy) else "BLANK"
    except AssertionError as error:
        return "FAIL " + str(error).replace(chr(10), " ")

def stub(*args):
    raise NotImplementedError()

# exercise 1: the coordinator loop
def right(coordinator, dataset_fn, step_fn, num_steps):
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(num_steps)]
    coordinator.join()
    return [r.fetch() for r in remotes]

def captured(coordinator, dataset_fn, step_fn, num_steps):
    iterator = iter(dataset_fn())
    remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(num_steps)]
    coordinator.join()
    return [r.fetch() for r in remotes]

def ones_after_join(coordinator, dataset_fn, step_fn, num_steps):
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    for _ in range(num_steps):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    return [1.0] * num_steps

def no_join(coordinator, dataset_fn, step_fn, num_steps):
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    return [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(num_steps)]

def remote_values(coordinator, dataset_fn, step_fn, num_steps):
    remotes = no_join(coordinator, dataset_fn, step_fn, num_steps)
    coordinator.join()
    return remotes

for fn in (right, stub, captured, ones_after_join, no_join, remote_values):
    print("RUN_STEPS", fn.__name__, verdict(cu.grading.check_run_steps, fn))

# exercise 2: the dataset_fn
def make(shard=True, shuffle=True, repeat=True, batch_size=None):
    def make_dataset_fn(features, labels, size, num_workers):
        def dataset_fn():
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            data = tf.data.Dataset.from_tensor_slices((features, labels))
            if shard:
                data = data.shard(num_workers, worker)
            if shuffle:
                data = data.shuffle(1000, seed=tf.cast(worker, tf.int64) + 1)
            data = data.batch(batch_size or size)
            return data.repeat() if repeat else data
        return dataset_fn
    return make_dataset_fn

for name, fn in [("right", make()), ("stub", stub), ("no_repeat", make(repeat=False)),
                 ("no_shard", make(shard=False)), ("no_shuffle", make(shuffle=False)),
                 ("wrong_batch", make(batch_size=3))]:
    print("DATASET", name, verdict(cu.grading.check_make_dataset_fn, fn))

# exercise 3: the counter
def atomic(counter, labels):
    return counter.assign_add(tf.cast(tf.size(labels), counter.dtype))

def read_then_write(counter, labels):
    return counter.assign(counter + tf.cast(tf.size(labels), counter.dtype))

def steps_not_examples(counter, labels):
    return counter.assign_add(1)

for fn in (atomic, stub, read_then_write, steps_not_examples):
    print("COUNT", fn.__name__, verdict(cu.grading.check_count_examples, fn))
'''


@pytest.mark.slow
def test_the_checks_pass_the_solutions_and_fail_lazy_and_wrong_answers():
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3",
               GRPC_FAIL_FAST="use_caller")
    env.pop("COURSE_STRICT_CHECKS", None)
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    verdicts = {}
    for line in result.stdout.splitlines():
        if line.startswith(("RUN_STEPS", "DATASET", "COUNT")):
            kind, name, rest = line.split(" ", 2)
            verdicts[(kind, name)] = rest
    expected = {
        ("RUN_STEPS", "right"): "PASS",
        ("RUN_STEPS", "stub"): "BLANK",
        ("RUN_STEPS", "captured"): "worker index",
        ("RUN_STEPS", "ones_after_join"): "you returned",
        ("RUN_STEPS", "no_join"): "join",
        ("RUN_STEPS", "remote_values"): "fetch",
        ("DATASET", "right"): "PASS",
        ("DATASET", "stub"): "BLANK",
        ("DATASET", "no_repeat"): "repeat()",
        ("DATASET", "no_shard"): "same examples",
        ("DATASET", "no_shuffle"): "shuffle",
        ("DATASET", "wrong_batch"): "asked for",
        ("COUNT", "atomic"): "PASS",
        ("COUNT", "stub"): "BLANK",
        ("COUNT", "read_then_write"): "lost",
        ("COUNT", "steps_not_examples"): "the counter reads",
    }
    for key, words in expected.items():
        got = verdicts.get(key, "missing")
        if words in ("PASS", "BLANK"):
            assert got == words, (key, got)
        else:
            assert got.startswith("FAIL") and words in got, (key, got)
