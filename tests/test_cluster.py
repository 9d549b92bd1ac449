"""Local clusters: TF_CONFIG helpers, manifests, real multi-worker runs, failures, clean-up.

Multi-worker runs start real TensorFlow workers as subprocesses (collectives must be configured
at program start), so nothing here touches this test process's devices.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import portpicker
import psutil
import pytest

import course_utils.cluster as cluster
from course_utils.cluster import ClusterTimeoutError, LocalCluster, WorkerError

SCRIPTS = Path(__file__).resolve().parent / "cluster_scripts"
TRAIN = SCRIPTS / "mwms_train.py"
STAND_IN = SCRIPTS / "bind_port.py"


def assert_all_gone(pids: list[int], ports: list[int]) -> None:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert not alive, f"processes still alive: {alive}"
    listening = {
        c.laddr.port
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports
    }
    assert not listening, f"ports still bound: {sorted(listening)}"
    assert all(portpicker.is_port_free(p) for p in ports)


def done_report(log: str) -> dict:
    lines = [ln for ln in log.splitlines() if ln.startswith("DONE ")]
    assert lines, log[-2000:]
    return json.loads(lines[-1][len("DONE ") :])


def test_tf_config_helpers():
    spec = cluster.cluster_spec(2, 1, chief=True, ports=[1001, 1002, 1003, 1004])
    assert spec == {
        "chief": ["localhost:1001"],
        "worker": ["localhost:1002", "localhost:1003"],
        "ps": ["localhost:1004"],
    }
    config = cluster.tf_config(spec, "worker", 1)
    assert config["task"] == {"type": "worker", "index": 1}
    environ = {"TF_CONFIG": json.dumps(config)}
    assert cluster.task(environ) == ("worker", 1)
    assert not cluster.is_chief(environ)
    assert cluster.is_chief({"TF_CONFIG": json.dumps(cluster.tf_config(spec, "chief", 0))})
    no_chief = cluster.cluster_spec(2, ports=[1, 2])
    assert cluster.is_chief({"TF_CONFIG": json.dumps(cluster.tf_config(no_chief, "worker", 0))})
    assert cluster.task({}) == (None, None) and cluster.is_chief({})
    with pytest.raises(ValueError, match="out of range"):
        cluster.tf_config(spec, "worker", 2)
    ports = cluster.pick_ports(3)
    assert len(set(ports)) == 3


def test_tfjob_manifest_is_valid_yaml_for_the_training_operator():
    import yaml  # a dev dependency: the manifest must parse as real YAML
    manifest = cluster.tfjob_manifest(
        "mnist-mwms", "tensorflow/tensorflow:2.21.0", ["python", "worker.py", "--epochs", "3"],
        num_workers=4, num_ps=1, gpus_per_worker=1, env={"TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert manifest["kind"] == "TFJob" and manifest["apiVersion"] == "kubeflow.org/v1"
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert specs["Worker"]["replicas"] == 4 and specs["PS"]["replicas"] == 1
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "tensorflow"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "resources" not in specs["PS"]["template"]["spec"]["containers"][0]
    assert yaml.safe_load(cluster.to_yaml(manifest)) == manifest
    local = LocalCluster(STAND_IN, num_workers=3, args=["--x"], start=False)
    job = local.tfjob_manifest("local-job", "my/image:1")
    assert job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 3
    assert job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"
    ] == ["python", "bind_port.py", "--x"]
    with pytest.raises(ValueError, match="Kubernetes name"):
        cluster.tfjob_manifest("Bad_Name", "img", ["python"])


def test_two_workers_train_and_match_two_replica_mirrored(tmp_path):
    args = ["--out", str(tmp_path), "--epochs", "2", "--steps", "4", "--accumulation-steps", "2"]
    with LocalCluster(TRAIN, num_workers=2, args=args, timeout=120, stream=False) as local:
        first_step = local.wait_for(r"^epoch 1 ", timeout=90)
        local.wait()
        reports = [done_report(local.log(i)) for i in range(2)]
    print(f"2-worker cluster: start to first epoch {first_step:.1f} s")
    assert_all_gone(local.pids, local.ports)
    env = dict(os.environ, **cluster.WORKER_ENV)
    reference = subprocess.run(
        [sys.executable, str(TRAIN), "--mode", "mirrored", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    mirrored = done_report(reference.stdout)
    assert reports[0]["history"]["loss"][-1] < reports[0]["history"]["loss"][0]
    np.testing.assert_allclose(reports[0]["history"]["loss"], mirrored["history"]["loss"],
                               rtol=1e-5)
    worker0 = np.load(tmp_path / "worker0.npz")
    worker1 = np.load(tmp_path / "worker1.npz")
    reference_weights = np.load(tmp_path / "mirrored.npz")
    error = max(np.abs(worker0[k] - reference_weights[k]).max() for k in worker0.files)
    print(f"max abs weight difference, 2 workers vs 2-replica mirrored: {error:.2e}")
    assert error < 1e-5
    assert all(np.array_equal(worker0[k], worker1[k]) for k in worker0.files)


def test_killed_worker_is_reported_and_a_restart_resumes(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    args = ["--out", str(tmp_path), "--checkpoint-dir", str(checkpoints), "--epochs", "6",
            "--steps", "4"]
    local = LocalCluster(TRAIN, num_workers=2, args=[*args, "--epoch-delay", "1"], timeout=120,
                         collective_timeout=20, stream=False)
    with local:
        # Both have saved the epoch-2 checkpoint (printed after saving); worker 1 now sleeps.
        local.wait_for(r"^epoch 2 ", worker=0, timeout=90)
        local.wait_for(r"^epoch 2 ", worker=1, timeout=30)
        killed_at = int(re.findall(r"step (\d+)", local.log(1))[-1])
        killed_time = local.kill_worker(1)
        started = time.monotonic()
        with pytest.raises(WorkerError) as failure:
            local.wait(timeout=30)
        reported_after = time.monotonic() - started
    detected_after = failure.value.elapsed - killed_time
    assert failure.value.worker == 1 and "killed on purpose" in str(failure.value)
    assert "epoch 2" in failure.value.log_tail
    assert_all_gone(local.pids, local.ports)
    with LocalCluster(TRAIN, num_workers=2, args=args, timeout=120, stream=False) as restarted:
        restarted.wait()
        reports = [done_report(restarted.log(i)) for i in range(2)]
    assert_all_gone(restarted.pids, restarted.ports)
    resumed = reports[0]["resumed_from"]
    print(f"fault tolerance: killed after step {killed_at}, detected after {detected_after:.2f} s"
          f" (raised after {reported_after:.2f} s, clean-up included), resumed from step {resumed}"
          f" to {reports[0]['run_step']} steps")
    assert reported_after < 30
    assert resumed is not None and resumed >= killed_at and resumed % 4 == 0
    assert reports[0]["run_step"] == reports[1]["run_step"] == 24
    assert reports[0]["steps"] == 24 - resumed


def test_a_crashing_worker_raises_with_its_last_log_lines():
    with LocalCluster(STAND_IN, num_workers=2, args=["crash"], timeout=30, stream=False) as local:
        with pytest.raises(WorkerError) as failure:
            local.wait()
    assert failure.value.worker == 1 and failure.value.returncode == 1
    assert "worker 1 broke on purpose" in str(failure.value)
    assert_all_gone(local.pids, local.ports)


def test_a_hung_cluster_times_out_and_is_killed():
    local = LocalCluster(STAND_IN, num_workers=2, timeout=2, grace=0.2, stream=False)
    local.wait_for("listening", worker=1, timeout=20)
    with pytest.raises(ClusterTimeoutError, match="did not finish") as failure:
        local.wait()
    assert "listening on" in str(failure.value)
    assert_all_gone(local.pids, local.ports)


def test_start_timeout_names_a_worker_that_never_serves(tmp_path):
    up = LocalCluster(STAND_IN, num_workers=2, timeout=20, grace=0.1, stream=False)
    assert up.wait_until_serving() < 20
    up.stop()
    silent = tmp_path / "silent.py"
    silent.write_text("import time\nprint('starting', flush=True)\ntime.sleep(60)\n")
    down = LocalCluster(silent, num_workers=2, timeout=30, start_timeout=1.5, grace=0.1,
                        stream=False)
    with pytest.raises(ClusterTimeoutError, match="did not start a server") as failure:
        down.wait()
    assert "worker(s) 0, 1" in str(failure.value) and "starting" in str(failure.value)
    assert_all_gone(up.pids + down.pids, up.ports + down.ports)


def test_interrupt_while_waiting_stops_the_workers(monkeypatch):
    local = LocalCluster(STAND_IN, num_workers=2, timeout=30, grace=0.2, stream=False)
    local.wait_for("listening", worker=0, timeout=20)

    def interrupt():  # as if Ctrl-C arrived while the notebook waits
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "_stream_new_lines", interrupt)
    with pytest.raises(KeyboardInterrupt):
        local.wait()
    assert_all_gone(local.pids, local.ports)


def test_logs_are_streamed_with_the_worker_prefix(capsys):
    with LocalCluster(STAND_IN, num_workers=2, timeout=30, grace=0.2) as local:
        local.wait_for("listening", worker=0, timeout=20)
        local.wait_for("listening", worker=1, timeout=20)
    assert_all_gone(local.pids, local.ports)
    out = capsys.readouterr().out
    assert "[worker 0] listening on" in out and "[worker 1] listening on" in out


def test_a_stopped_cluster_can_be_started_again():
    local = LocalCluster(STAND_IN, num_workers=2, timeout=20, grace=0.1, stream=False)
    with pytest.raises(RuntimeError, match="running"):
        local.start()
    first_pids = local.pids
    local.stop()
    local.start()
    local.wait_for("listening", worker=1, timeout=20)
    assert set(local.pids).isdisjoint(first_pids) and local.running
    local.cleanup()
    assert_all_gone(first_pids + local.pids, local.ports)


def test_twenty_start_stop_cycles_leave_no_process_or_port():
    pids, ports = [], []
    for _ in range(20):
        with LocalCluster(STAND_IN, num_workers=2, timeout=20, grace=0.1, stream=False) as local:
            for index in range(2):
                local.wait_for("listening", worker=index, timeout=20)
            pids += local.pids
            ports += local.ports
        local.cleanup()
    assert len(set(pids)) == 40
    assert_all_gone(pids, ports)


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_workers_die_with_the_process_that_started_them(ending):
    # "exit": the notebook kernel shuts down (atexit stops the cluster); "sigkill": the kernel
    # dies hard (Linux's parent-death signal kills the workers).
    code = (
        "import json, sys, time\n"
        "from course_utils.cluster import LocalCluster\n"
        f"c = LocalCluster({str(STAND_IN)!r}, num_workers=2, grace=0.2, stream=False)\n"
        "for i in range(2): c.wait_for('listening', worker=i, timeout=20)\n"
        "print(json.dumps([c.pids, c.ports]), flush=True)\n"
        f"time.sleep(60 if {ending!r} == 'sigkill' else 0)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids, ports = json.loads(parent.stdout.readline())
        if ending == "sigkill":
            parent.kill()
        parent.wait(timeout=30)
    finally:
        parent.kill()
        parent.stdout.close()
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_all_gone(pids, ports)
