"""Local clusters: TF_CONFIG helpers, manifests, real multi-worker runs, failures, clean-up.

Multi-worker runs start real TensorFlow workers as subprocesses (collectives must be configured
at program start), so nothing here touches this test process's devices.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import portpicker
import psutil
import pytest

import course_utils.cluster as cluster
from course_utils.cluster import ClusterTimeoutError, LocalCluster, WorkerError, errors, processes
from course_utils.cluster.logs import WorkerLogs, indent

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "cluster_scripts"
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


def test_worker_strategy_explains_a_missing_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG is not set"):
        cluster.worker_strategy()


def test_cluster_spec_refuses_an_empty_cluster_and_wrong_port_counts():
    with pytest.raises(ValueError, match="at least one task"):
        cluster.cluster_spec(0)
    with pytest.raises(ValueError, match="need 2 ports, got 1"):
        cluster.cluster_spec(2, ports=[1])
    assert cluster.cluster_spec(0, 1, ports=[7]) == {"ps": ["localhost:7"]}


def test_describe_exit_names_codes_and_signals():
    assert processes.describe_exit(None) == "still running"
    assert processes.describe_exit(3) == "exit code 3"
    assert processes.describe_exit(-9) == "killed by SIGKILL"
    assert processes.describe_exit(-200) == "killed by signal 200"


def test_stop_processes_escalates_to_sigkill_and_reaps_every_worker(tmp_path):
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
                  "print('up', flush=True); time.sleep(60)"
    setter = processes.death_signal_setter()
    assert setter is None or callable(setter)
    started = [
        processes.start_worker([sys.executable, "-c", code], os.environ, tmp_path / f"{i}.log",
                               setter)
        for i, code in enumerate([ignore_term, "print('done')"])
    ]
    (stubborn, stubborn_log), (quick, quick_log) = started
    deadline = time.monotonic() + 20
    while "up" not in (tmp_path / "0.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.getpgid(stubborn.pid) == stubborn.pid  # its own process group
    assert quick.wait(timeout=30) == 0
    processes.signal_group(stubborn, 0)  # signal 0: the group exists
    codes = processes.stop_processes([stubborn, quick], grace=0.2)
    assert codes == [-signal.SIGKILL, 0]
    processes.signal_group(stubborn, signal.SIGKILL)  # a group already gone is no error
    for log in (stubborn_log, quick_log):
        log.close()
    assert (tmp_path / "1.log").read_text() == "done\n"
    assert_all_gone([stubborn.pid, quick.pid], [])


def test_stop_at_exit_stops_what_is_left_and_forget_at_exit_undoes_it():
    code = (
        "from course_utils.cluster import processes\n"
        "class Owner:\n"
        "    def __init__(self, name): self.name = name\n"
        "    def stop(self): print('stopped', self.name, flush=True)\n"
        "kept, forgotten = Owner('kept'), Owner('forgotten')\n"
        "processes.stop_at_exit(kept); processes.stop_at_exit(forgotten)\n"
        "processes.forget_at_exit(forgotten)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "stopped kept\n"


def test_worker_logs_read_tail_and_stream_whole_lines_once(tmp_path, capsys):
    logs = WorkerLogs(tmp_path, 2)
    assert logs.paths == [tmp_path / "worker-0.log", tmp_path / "worker-1.log"]
    logs.paths[0].write_text("a\nb\nc\npartial")
    logs.stream_new_lines()  # worker 1 has no file yet: skipped
    assert capsys.readouterr().out == "[worker 0] a\n[worker 0] b\n[worker 0] c\n"
    logs.paths[1].write_text("x\n")
    with open(logs.paths[0], "a") as handle:
        handle.write(" line\n")
    logs.stream_new_lines()
    assert capsys.readouterr().out == "[worker 0] partial line\n[worker 1] x\n"
    assert logs.read(0) == "a\nb\nc\npartial line\n" and logs.tail(0, 2) == "c\npartial line"
    logs.stream_new_lines()
    assert capsys.readouterr().out == ""  # nothing new
    assert indent("p\nq") == "    p\n    q" and indent("") == "    (empty)"


def test_worker_failure_and_timeout_error_carry_states_and_log_tails(tmp_path):
    logs = WorkerLogs(tmp_path, 3)
    for index, path in enumerate(logs.paths):
        path.write_text("".join(f"w{index} line {n}\n" for n in range(30)))
    assert errors.worker_failure([0, None, None], set(), logs, 1.0) is None
    failure = errors.worker_failure([1, -9, None], {1}, logs, 2.5)
    assert isinstance(failure, WorkerError)
    assert (failure.worker, failure.returncode, failure.elapsed) == (1, -9, 2.5)
    message = str(failure)
    assert message.startswith("worker 1 was killed on purpose (killed by SIGKILL)")
    assert "worker 0 (exit code 1), last lines:" in message
    assert "worker 2 (still running), last lines:" in message
    assert failure.log_tail == logs.tail(1) and f"Full logs: {tmp_path}" in message
    first = errors.worker_failure([None, 2, 3], set(), logs, 0.0)
    assert first.worker == 1 and "worker 1 failed (exit code 2)" in str(first)
    timeout = errors.timeout_error("the workers did not finish", 30, [None, 0, None], logs)
    assert isinstance(timeout, ClusterTimeoutError)
    assert str(timeout).startswith("the workers did not finish within 30 s; stopping the cluster.")
    assert "w2 line 29" in str(timeout) and "w2 line 19" not in str(timeout)


@pytest.fixture(scope="module")
def killed_and_restarted(tmp_path_factory) -> dict:
    """One run of clusters for the two tests below (5 TensorFlow processes, not 7).

    A 2-worker cluster (accumulating 2 micro-batches per update, a checkpoint every epoch) is
    killed after its epoch-2 checkpoint; a restarted cluster resumes from it and finishes, while
    a 2-replica MirroredStrategy process resumes from a copy of the same checkpoint beside it.
    """
    tmp_path = tmp_path_factory.mktemp("killed_and_restarted")
    checkpoints, copied = tmp_path / "checkpoints", tmp_path / "reference_checkpoints"
    args = ["--out", str(tmp_path), "--epochs", "6", "--steps", "4",
            "--accumulation-steps", "2"]
    local = LocalCluster(TRAIN, num_workers=2,
                         args=[*args, "--checkpoint-dir", str(checkpoints), "--epoch-delay", "1"],
                         timeout=120, collective_timeout=20, stream=False)
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
    shutil.copytree(checkpoints, copied)  # the reference resumes from the same checkpoint
    env = dict(os.environ, **cluster.WORKER_ENV)
    # The reference runs beside the restarted cluster (its workers wait on each other at times).
    with subprocess.Popen([sys.executable, str(TRAIN), "--mode", "mirrored", *args,
                           "--checkpoint-dir", str(copied)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as reference:
        with LocalCluster(TRAIN, num_workers=2, args=[*args, "--checkpoint-dir", str(checkpoints)],
                          timeout=120, stream=False) as restarted:
            restarted.wait()
            reports = [done_report(restarted.log(i)) for i in range(2)]
        out, err = reference.communicate(timeout=120)
    return {"tmp_path": tmp_path, "local": local, "failure": failure.value,
            "killed_at": killed_at, "detected_after": failure.value.elapsed - killed_time,
            "reported_after": reported_after, "restarted": restarted, "reports": reports,
            "reference": reference, "reference_out": out, "reference_err": err}


@pytest.mark.slow
def test_two_workers_train_and_match_two_replica_mirrored(killed_and_restarted):
    run = killed_and_restarted
    reference, out, err = run["reference"], run["reference_out"], run["reference_err"]
    assert reference.returncode == 0, out[-2000:] + err[-2000:]
    mirrored, reports, tmp_path = done_report(out), run["reports"], run["tmp_path"]
    assert mirrored["resumed_from"] == reports[0]["resumed_from"], (
        "the reference did not resume from the cluster's checkpoint", mirrored, reports[0])
    assert mirrored["steps"] == reports[0]["steps"] > 0, (mirrored, reports[0])
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


@pytest.mark.slow
def test_killed_worker_is_reported_and_a_restart_resumes(killed_and_restarted):
    run = killed_and_restarted
    failure, local, restarted = run["failure"], run["local"], run["restarted"]
    reports, killed_at = run["reports"], run["killed_at"]
    assert failure.worker == 1 and "killed on purpose" in str(failure)
    assert "epoch 2" in failure.log_tail
    assert_all_gone(local.pids, local.ports)
    assert_all_gone(restarted.pids, restarted.ports)
    resumed = reports[0]["resumed_from"]
    print(f"fault tolerance: killed after step {killed_at}, detected after "
          f"{run['detected_after']:.2f} s (raised after {run['reported_after']:.2f} s, clean-up "
          f"included), resumed from step {resumed} to {reports[0]['run_step']} steps")
    assert run["reported_after"] < 30
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

    monkeypatch.setattr(local.waiter, "poll", interrupt)
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


def test_waiting_on_a_cluster_that_was_never_started_says_so():
    local = LocalCluster(STAND_IN, num_workers=2, start=False)
    for wait in (local.wait, local.wait_until_serving, lambda: local.wait_for("x")):
        with pytest.raises(RuntimeError, match="has not been started; call start"):
            wait()


def test_a_stopped_cluster_can_be_started_again():
    local = LocalCluster(STAND_IN, num_workers=2, timeout=20, grace=0.1, stream=False)
    with pytest.raises(RuntimeError, match="running"):
        local.start()
    first_pids, first_waiter = local.pids, local.waiter
    local.stop()
    local.start()
    local.wait_for("listening", worker=1, timeout=20)
    assert set(local.pids).isdisjoint(first_pids) and local.running
    # Each start has its own waiter, holding that start's processes, ports and kill list.
    assert local.waiter is not first_waiter and local.waiter.processes == local.processes
    assert local.waiter.ports == local.ports and local.waiter.killed is local.killed
    local.cleanup()
    assert_all_gone(first_pids + local.pids, local.ports)


@pytest.mark.slow
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


def test_own_log_dir_outlives_the_cluster_and_goes_with_the_interpreter():
    # The logs stay readable after the with block; the temporary folder is deleted at exit,
    # while a folder the caller named is never touched.
    code = (
        "import json, sys, tempfile\n"
        "from course_utils.cluster import LocalCluster\n"
        "named = tempfile.mkdtemp()\n"
        f"with LocalCluster({str(STAND_IN)!r}, num_workers=2, grace=0.2, stream=False) as c:\n"
        "    c.wait_for('listening', worker=1, timeout=20)\n"
        "assert 'listening' in c.log(1), c.log(1)\n"
        f"with LocalCluster({str(STAND_IN)!r}, num_workers=1, grace=0.2, stream=False,\n"
        "                  log_dir=named) as d:\n"
        "    d.wait_for('listening', worker=0, timeout=20)\n"
        "print(json.dumps([str(c.log_dir), named]), flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    own, named = map(Path, json.loads(done.stdout.strip().splitlines()[-1]))
    assert not own.exists()
    assert (named / "worker-0.log").exists()
    shutil.rmtree(named)


def test_temporary_log_dir_is_kept_until_removed():
    from course_utils.cluster.logs import remove_log_dir, temporary_log_dir

    folder = temporary_log_dir("cu_test_")
    assert folder.is_dir() and folder.name.startswith("cu_test_")
    (folder / "worker-0.log").write_text("x")
    remove_log_dir(folder)
    assert not folder.exists()
    remove_log_dir(folder)  # twice is fine
