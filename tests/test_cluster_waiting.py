"""cluster.waiting: WorkerWaiter and poll_until on fake workers (no cluster, no TensorFlow).

A fake worker is a process stand-in whose exit code the test sets, a log file the test writes,
and a port that a test socket listens on (a server that came up) or that nothing listens on (one
that never did). Every wait here ends in a result or a clear error, never a hang.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import portpicker
import pytest

from course_utils.cluster import ClusterTimeoutError, WorkerError
from course_utils.cluster.errors import error_summary
from course_utils.cluster.logs import WorkerLogs
from course_utils.cluster.waiting import WorkerWaiter, poll_until

#: Far above anything a fake worker takes, even with both cores busy: a wait that gets near it
#: has hung.
HANG = 60.0


class FakeWorker:
    """A worker process stand-in: ``poll()`` says ``code`` (None while it "runs")."""

    def __init__(self, code: int | None = None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


class Cluster:
    """Fake workers, their log files and ports, and a ``stop`` that records its calls."""

    def __init__(self, folder: Path, codes: list[int | None], logs: list[str],
                 ports: list[int]) -> None:
        folder.mkdir(exist_ok=True)
        self.workers = [FakeWorker(code) for code in codes]
        self.logs = WorkerLogs(folder, len(codes))
        for path, text in zip(self.logs.paths, logs, strict=True):
            path.write_text(text)
        self.ports = ports
        self.stops = 0

    def stop(self) -> None:
        """As the cluster's stop does: every live worker ends (killed by SIGKILL)."""
        self.stops += 1
        for worker in self.workers:
            if worker.code is None:
                worker.code = -9

    def waiter(self, **kwargs) -> WorkerWaiter:
        kwargs.setdefault("stream", False)
        return WorkerWaiter(self.workers, self.logs, self.ports, self.stop, **kwargs)

    def write(self, index: int, text: str) -> None:
        with open(self.logs.paths[index], "a") as handle:
            handle.write(text)


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port a server accepts connections on (a worker whose server came up)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("localhost", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.fixture
def silent_port() -> int:
    """A port nothing listens on (a worker whose server never came up)."""
    return portpicker.pick_unused_port()


def later(seconds: float, action) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_wait_for_returns_when_a_worker_writes_its_serving_line(tmp_path, silent_port):
    fake = Cluster(tmp_path, [None, None], ["importing\n", ""], [silent_port, silent_port])
    waiter = fake.waiter()
    timer = later(0.3, lambda: fake.write(1, "serving on 1234\n"))
    try:
        seen_after = waiter.wait_for(r"^serving", worker=1, timeout=HANG)
    finally:
        timer.cancel()
    assert 0.3 <= seen_after < HANG
    assert waiter.wait_for("serving", timeout=HANG) >= seen_after  # any worker's log
    assert fake.stops == 0 and waiter.poll() == [None, None]  # found: the cluster runs on
    with pytest.raises(ClusterTimeoutError):  # worker 0 never wrote it
        waiter.wait_for("serving", worker=0, timeout=0.2)


def test_a_worker_that_dies_raises_a_worker_error_naming_it(tmp_path, silent_port):
    fake = Cluster(tmp_path, [None, None], ["step 1\n", "Traceback\nValueError: boom\n"],
                   [silent_port, silent_port])
    waiter = fake.waiter()
    timer = later(0.2, lambda: setattr(fake.workers[1], "code", 1))
    started = time.monotonic()
    try:
        with pytest.raises(WorkerError) as failure:
            waiter.wait_for("serving", timeout=HANG)
    finally:
        timer.cancel()
    assert time.monotonic() - started < HANG / 2  # raised when it died, not at the time-out
    error = failure.value
    assert (error.worker, error.returncode) == (1, 1) and error.elapsed >= 0.2
    assert str(error).startswith("worker 1 failed (exit code 1): ValueError: boom. Last lines")
    assert "ValueError: boom" in error.log_tail
    assert "worker 0 (still running), last lines:" in str(error)  # seen before the stop
    assert fake.stops >= 1 and fake.workers[0].code == -9  # and then stopped


def test_a_worker_killed_on_purpose_is_named_before_the_one_that_failed(tmp_path, silent_port):
    killed: set[int] = set()
    fake = Cluster(tmp_path, [1, -9], ["lost its peer\n", "epoch 2\n"], [silent_port] * 2)
    waiter = fake.waiter(killed=killed)
    killed.add(1)  # the owner marks it after the waiter was made: read at every check
    with pytest.raises(WorkerError, match="worker 1 was killed on purpose") as failure:
        waiter.wait()
    assert failure.value.worker == 1 and failure.value.log_tail == "epoch 2"


def test_a_worker_that_never_starts_times_out_naming_it(tmp_path, listening_port, silent_port):
    fake = Cluster(tmp_path, [None, None], ["listening\n", "starting\n"],
                   [listening_port, silent_port])
    waiter = fake.waiter(start_timeout=0.3)
    assert waiter.serving() == [True, False]
    started = time.monotonic()
    with pytest.raises(ClusterTimeoutError, match=r"worker\(s\) 1 did not start a server"):
        waiter.wait(timeout=HANG)
    assert 0.3 <= time.monotonic() - started < HANG / 2
    assert fake.stops >= 1 and [w.code for w in fake.workers] == [-9, -9]
    again = Cluster(tmp_path / "again", [None, None], ["listening\n", "starting\n"],
                    [listening_port, silent_port])
    with pytest.raises(ClusterTimeoutError, match=r"worker\(s\) 1 did not start") as failure:
        again.waiter().wait_until_serving(timeout=0.3)
    assert "worker 1 (still running), last lines:\n    starting" in str(failure.value)
    assert again.stops >= 1


def test_wait_until_serving_returns_once_every_server_listens(tmp_path, listening_port):
    ports = [listening_port, portpicker.pick_unused_port()]
    fake = Cluster(tmp_path, [None, 0], ["", "done\n"], ports)
    waiter = fake.waiter(start_timeout=HANG)
    assert waiter.serving() == [True, True]  # worker 1 has finished: nothing to wait for
    assert 0 <= waiter.wait_until_serving() < HANG
    assert fake.stops == 0


def test_a_hung_wait_times_out_with_every_workers_state(tmp_path, silent_port):
    fake = Cluster(tmp_path, [None, 0], ["epoch 1\n", "done\n"], [silent_port] * 2)
    waiter = fake.waiter(timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ClusterTimeoutError) as failure:
        waiter.wait()
    assert 0.3 <= time.monotonic() - started < HANG / 2
    message = str(failure.value)
    assert message.startswith("the workers did not finish within 0 s; stopping the cluster.")
    assert "worker 0 (still running)" in message and "worker 1 (exit code 0)" in message
    assert "epoch 1" in message and f"Full logs: {tmp_path}" in message
    assert fake.stops >= 1 and fake.workers[0].code == -9
    again = Cluster(tmp_path / "again", [None], ["epoch 1\n"], [silent_port])
    with pytest.raises(ClusterTimeoutError, match="no log line matched 'never' within 0 s"):
        again.waiter().wait_for("never", timeout=0.2)
    assert again.stops >= 1


def test_wait_returns_the_exit_codes_and_stops_once_every_worker_finished(tmp_path, silent_port):
    fake = Cluster(tmp_path, [0, None], ["done\n", "almost\n"], [silent_port] * 2)
    waiter = fake.waiter()
    timer = later(0.2, lambda: setattr(fake.workers[1], "code", 0))
    try:
        assert waiter.wait(timeout=HANG) == [0, 0]
    finally:
        timer.cancel()
    assert fake.stops == 1  # closes the logs, forgets the exit hook


def test_ctrl_c_while_waiting_stops_the_workers(tmp_path, silent_port, monkeypatch):
    fake = Cluster(tmp_path, [None, None], ["", ""], [silent_port] * 2)
    waiter = fake.waiter()

    def interrupt() -> list[int | None]:
        raise KeyboardInterrupt

    monkeypatch.setattr(waiter, "poll", interrupt)
    with pytest.raises(KeyboardInterrupt):
        waiter.wait(timeout=HANG)
    assert fake.stops == 1 and [w.code for w in fake.workers] == [-9, -9]


def test_new_lines_are_streamed_with_the_worker_prefix_and_the_last_ones_after_a_stop(
    tmp_path, silent_port, capsys
):
    fake = Cluster(tmp_path, [None, None], ["a\nb\n", "partial"], [silent_port] * 2)
    fake.waiter(stream=True).wait_for("^b$", timeout=HANG)
    assert capsys.readouterr().out == "[worker 0] a\n[worker 0] b\n"
    fake.write(1, " line\nValueError: boom\n")
    fake.workers[1].code = 1
    with pytest.raises(WorkerError):
        fake.waiter(stream=True).wait()
    assert "[worker 1] ValueError: boom" in capsys.readouterr().out


def test_the_waiter_needs_one_log_and_one_port_per_worker(tmp_path):
    with pytest.raises(ValueError, match="2 processes, 3 logs, 2 ports"):
        WorkerWaiter([FakeWorker(), FakeWorker()], WorkerLogs(tmp_path, 3), [1, 2], lambda: None)


def test_poll_until_returns_the_first_value_and_stops_on_every_other_way_out():
    events: list[str] = []
    answers = iter([None, None, "ready"])
    assert poll_until(lambda: next(answers), HANG, RuntimeError, lambda: events.append("stop"),
                      poll_interval=0.01) == "ready"
    assert events == []  # success leaves the cluster running

    def timed_out() -> Exception:
        events.append("error built")
        return TimeoutError("late")

    with pytest.raises(TimeoutError, match="late"):
        poll_until(lambda: None, 0.1, timed_out, lambda: events.append("stop"), 0.01)
    assert events == ["error built", "stop"]  # the error sees the workers before the stop

    def broken() -> None:
        raise ValueError("step failed")

    with pytest.raises(ValueError, match="step failed"):
        poll_until(broken, HANG, timed_out, lambda: events.append("stop"), 0.01)
    assert events[-1] == "stop"


def test_a_cluster_runs_a_script_or_a_module_never_both_or_neither(tmp_path):
    from course_utils.cluster import LocalCluster

    script = tmp_path / "w.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ValueError, match="script or a module"):
        LocalCluster(script, module="course_utils.works_where.worker", start=False)
    with pytest.raises(ValueError, match="script or a module"):
        LocalCluster(start=False)
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        LocalCluster(module="course_utils.no_such_module", start=False)
    cluster = LocalCluster(module="course_utils.works_where.worker", start=False)
    assert cluster.module == "course_utils.works_where.worker" and cluster.script is None


def test_the_error_summary_gives_a_graph_errors_op_message_not_its_header():
    """TensorFlow prints "Graph execution error:" on the exception's line and the op's own
    message last, after the frames of the node's definition (as a worker's log ends)."""
    log = ("step 1 loss 1.0\nTraceback (most recent call last):\n  File \"worker.py\", line 9\n"
           "tensorflow.python.framework.errors_impl.DeadlineExceededError: Graph execution "
           "error:\n\nDetected at node CollectiveReduceV2 defined at (most recent call last):\n"
           "  File \"worker.py\", line 9, in <module>\n\nCollective has timed out during "
           "execution [[{{node CollectiveReduceV2}}]] [Op:__inference_train_step_7]\n")
    assert error_summary(log) == ("DeadlineExceededError: Collective has timed out during "
                                  "execution [[{{node CollectiveReduceV2}}]] "
                                  "[Op:__inference_train_step_7]")
    assert error_summary("Traceback\nKeyError: 'x'\n") == "KeyError: 'x'"
    assert error_summary("step 1\nstep 2\n") is None
