"""Lesson 04's checks: reference passes, wrong answer fails, stub waits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_04
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")
REPO = Path(__file__).resolve().parents[1]


def embedding_partitioner(num_ps):
    import tensorflow as tf

    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=num_ps)


def build_cluster_spec(ps_hosts, worker_hosts, port):
    import tensorflow as tf

    return tf.train.ClusterSpec({"ps": [f"{h}:{port}" for h in ps_hosts],
                                 "worker": [f"{h}:{port}" for h in worker_hosts]})


def stub(*args):
    raise NotImplementedError()


def test_lesson_04_registers_its_checks():
    for name in lesson_04.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_04, name)


def test_shard_rows_splits_like_a_sharded_variable():
    assert lesson_04.shard_rows(10, 3) == [4, 3, 3]
    assert sum(lesson_04.shard_rows(20_001, 4)) == 20_001


def test_the_partitioner_reference_passes_and_fixed_shards_fail():
    import tensorflow as tf

    assert cu.grading.check_embedding_partitioner(embedding_partitioner) is True
    fixed = tf.distribute.experimental.partitioners.FixedShardsPartitioner
    with pytest.raises(AssertionError, match="MinSizePartitioner"):
        cu.grading.check_embedding_partitioner(lambda num_ps: fixed(num_ps))


def test_the_cluster_spec_reference_passes_and_a_dict_fails():
    assert cu.grading.check_build_cluster_spec(build_cluster_spec) is True
    with pytest.raises(AssertionError, match="ClusterSpec"):
        cu.grading.check_build_cluster_spec(
            lambda ps, workers, port: {"ps": ps, "worker": workers})
    with pytest.raises(AssertionError, match="expected the jobs"):
        cu.grading.check_build_cluster_spec(
            lambda ps, workers, port: build_cluster_spec(workers, ps, port))


def test_stubs_are_not_attempted_and_fail_in_strict_mode(capsys):
    assert cu.grading.check_build_cluster_spec(stub) is False
    assert cu.grading.check_embedding_partitioner(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_build_cluster_spec(stub)


RUN_STEPS_SCRIPT = """
import course_utils as cu
from course_utils.grading.framework import strict_checks
cluster = cu.cluster.start_in_process_cluster(2, 1)
strategy = cluster.strategy()

def right(coordinator, step_fn, iterator, num_steps):
    remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(num_steps)]
    coordinator.join()
    return [r.fetch() for r in remotes]

def one_short(coordinator, step_fn, iterator, num_steps):
    return right(coordinator, step_fn, iterator, num_steps - 1)

def remote_values(coordinator, step_fn, iterator, num_steps):
    remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(num_steps)]
    coordinator.join()
    return remotes

def stub(coordinator, step_fn, iterator, num_steps):
    raise NotImplementedError()

print("RIGHT", cu.grading.check_run_steps(right, strategy))
for wrong in (one_short, remote_values):
    try:
        cu.grading.check_run_steps(wrong, strategy)
    except AssertionError as error:
        print("WRONG", wrong.__name__, str(error).replace(chr(10), " "))
print("STUB", cu.grading.check_run_steps(stub, strategy))
"""


def test_the_coordinator_loop_check_on_a_real_cluster():
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", RUN_STEPS_SCRIPT], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines()
             if line.startswith(("RIGHT", "WRONG", "STUB"))]
    assert lines[0] == "RIGHT True"
    assert lines[1].startswith("WRONG one_short") and "steps were applied" in lines[1]
    assert lines[2].startswith("WRONG remote_values") and "fetch" in lines[2]
    assert lines[3] == "STUB False"
