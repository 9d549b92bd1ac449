"""cluster.ProcessCluster and serve_task: one process per task, killable, nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils import cluster
from course_utils.cluster import process_cluster, serve_task

NOTHING = {"processes": [], "ports": []}


def test_a_cluster_needs_a_worker_and_a_ps():
    with pytest.raises(ValueError, match="at least one worker and one ps"):
        cluster.ProcessCluster(num_workers=0, num_ps=1, start=False)
    with pytest.raises(ValueError, match="at least one worker and one ps"):
        cluster.ProcessCluster(num_workers=1, num_ps=0, start=False)


def test_an_unstarted_cluster_lists_its_tasks_and_starts_nothing():
    unstarted = cluster.ProcessCluster(num_workers=2, num_ps=1, start=False)
    assert unstarted.tasks == [("ps", 0), ("worker", 0), ("worker", 1)]
    assert unstarted.pids == [] and unstarted.processes == {}
    assert "0 alive" in repr(unstarted)
    assert unstarted.stop() == {}


@pytest.mark.slow
def test_every_task_serves_a_killed_one_is_gone_and_stop_leaves_nothing():
    # Each task is serve_task.py run with its TF_CONFIG (process_cluster starts nothing else):
    # this cluster's tasks also prove that serve_task serves the task TF_CONFIG names, prints
    # exactly one "serving" line and keeps serving (join) - no separate TensorFlow process.
    assert Path(process_cluster._SERVE_TASK).resolve() == Path(serve_task.__file__).resolve()
    with cluster.ProcessCluster(num_workers=2, num_ps=1) as ps_cluster:
        pids, ports, log_dir = ps_cluster.pids, ps_cluster.ports, ps_cluster.log_dir
        assert len(pids) == len(set(ports)) == 3
        assert ps_cluster.wait_serving(timeout=180) >= 0
        for job, index in ps_cluster.tasks:
            address = ps_cluster.cluster[job][index]
            serving = [line for line in ps_cluster.log(job, index).splitlines()
                       if line.startswith("serving")]
            assert serving == [f"serving {job}:{index} at grpc://{address}"], (
                f"serve_task's line for {job}:{index}: {serving}")
            assert ps_cluster.processes[(job, index)].poll() is None, (
                f"serve_task {job}:{index} stopped serving (join() should keep it up)")
        assert ps_cluster.kill("worker", 1) == -9  # SIGKILL, as a machine failure
        assert cluster.leftovers([pids[2]], [ports[2]]) == NOTHING
        assert cluster.leftovers(pids[:2], ports[:2]) == {"processes": pids[:2],
                                                          "ports": ports[:2]}
    assert cluster.leftovers(pids, ports) == NOTHING
    assert log_dir is not None and not Path(log_dir).exists()


@pytest.mark.slow
def test_a_task_that_dies_before_serving_stops_the_cluster_with_a_clear_error():
    ps_cluster = cluster.ProcessCluster(num_workers=1, num_ps=1)
    try:
        ps_cluster.kill("ps", 0)
        with pytest.raises(cluster.ClusterTimeoutError, match=r"task \('ps', 0\) ended"):
            ps_cluster.wait_serving(timeout=180)
        assert cluster.leftovers(ps_cluster.pids, ps_cluster.ports) == NOTHING
    finally:
        ps_cluster.cleanup()


def test_log_folders_left_at_exit_are_removed():
    # A cluster's log folder (cluster.logs.temporary_log_dir) outlives the cluster and goes
    # with the interpreter, even when nobody called stop() or cleaned up.
    script = ("from course_utils.cluster.logs import temporary_log_dir\n"
              "folder = temporary_log_dir('cu_ps_cluster_')\n"
              "(folder / 'ps-0.log').write_text('x')\n"
              "print(folder, flush=True)\n")
    root = str(Path(process_cluster.__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.name.startswith("cu_ps_cluster_") and not folder.exists()


@pytest.mark.slow
def test_tasks_die_with_the_coordinator_even_when_it_is_killed():
    script = (
        "import json\n"
        "from course_utils.cluster import ProcessCluster\n"
        "c = ProcessCluster(num_workers=1, num_ps=1)\n"
        "c.wait_serving(timeout=180)\n"
        "print(json.dumps([c.pids, c.ports, str(c.log_dir)]), flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    root = str(Path(process_cluster.__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get(
        "PYTHONPATH", "")) if p))
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert parent.stdout is not None
        pids, ports, log_dir = json.loads(parent.stdout.readline())
        assert cluster.leftovers(pids, ports) == {"processes": pids, "ports": ports}
    finally:
        parent.kill()  # SIGKILL: no atexit runs; the tasks' death signal (Linux) must do it
        parent.wait()
    shutil.rmtree(log_dir, ignore_errors=True)  # the killed parent's atexit never ran
    deadline = time.monotonic() + 30
    while cluster.leftovers(pids, ports) != NOTHING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.leftovers(pids, ports) == NOTHING
