"""Lesson 03's checks: reference passes, wrong answers fail with a useful message, stubs wait."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_03
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def tf_config_for(hosts, port, index):
    return {"cluster": {"worker": [f"{h}:{port}" for h in hosts]},
            "task": {"type": "worker", "index": index}}


def shard_for_worker(dataset, num_workers, index):
    return dataset.shard(num_workers, index)


def train_on_local_cluster(script, num_workers):
    with cu.cluster.LocalCluster(script, num_workers, timeout=90, stream=False) as cluster:
        cluster.wait()
        logs = [cluster.log(i) for i in range(num_workers)]
    return cluster, logs


def stub(*args):
    raise NotImplementedError()


def test_lesson_03_registers_its_checks():
    for name in lesson_03.__all__:
        if name.startswith("check_"):
            assert getattr(cu.grading, name) is getattr(lesson_03, name)


@pytest.mark.parametrize("name, solution", [
    ("tf_config_for", tf_config_for), ("shard_for_worker", shard_for_worker)])
def test_the_reference_solutions_pass(name, solution):
    assert getattr(cu.grading, f"check_{name}")(solution) is True


def test_a_chief_task_or_a_wrong_index_fails_field_by_field():
    def as_chief(hosts, port, index):
        return {"cluster": {"worker": [f"{h}:{port}" for h in hosts]},
                "task": {"type": "chief", "index": index}}

    with pytest.raises(AssertionError, match="task type 'chief', expected 'worker'"):
        cu.grading.check_tf_config_for(as_chief)
    with pytest.raises(AssertionError, match="task index"):
        cu.grading.check_tf_config_for(
            lambda hosts, port, index: tf_config_for(hosts, port, index + 1))
    with pytest.raises(AssertionError, match="return a dict"):
        cu.grading.check_tf_config_for(lambda *a: "{}")


def test_unsharded_and_lossy_datasets_fail_with_the_element():
    with pytest.raises(AssertionError, match="is read by workers 0 and 1"):
        cu.grading.check_shard_for_worker(lambda dataset, n, i: dataset)
    with pytest.raises(AssertionError, match="no worker reads the elements"):
        cu.grading.check_shard_for_worker(lambda dataset, n, i: dataset.shard(n + 1, i))


@pytest.mark.parametrize("check", ["tf_config_for", "shard_for_worker",
                                   "train_on_local_cluster"])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(check, capsys):
    assert getattr(cu.grading, f"check_{check}")(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        getattr(cu.grading, f"check_{check}")(stub)

def test_a_wrong_return_value_is_named_without_starting_a_cluster():
    def wrong_return(script, num_workers):
        return None

    with pytest.raises(AssertionError, match="return \\(cluster, logs\\)"):
        cu.grading.check_train_on_local_cluster(wrong_return)


@pytest.mark.slow
def test_a_real_local_cluster_passes():
    assert cu.grading.check_train_on_local_cluster(train_on_local_cluster) is True
