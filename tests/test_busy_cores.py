"""``make test-busy``: the burst spinners (tests/tools/busy.py) and the script that stops them."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TOOLS = REPO / "tests" / "tools"
WRAPPER = TOOLS / "with_busy_cores.sh"

sys.path.insert(0, str(TOOLS))
import busy  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still running after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def _wait_for_child(pid: int, name: str) -> None:
    """Wait until process ``pid`` has started a child called ``name``."""
    deadline = time.monotonic() + 30
    while not any(child.name() == name for child in psutil.Process(pid).children()):
        assert time.monotonic() < deadline, f"{name} never started"
        time.sleep(0.05)


#: Runs the wrapper with Ctrl-C's default action, as a terminal gives it: a process that starts
#: with SIGINT ignored (this test's worker can have it so) hands that on, and a non-interactive
#: shell can then neither trap nor reset it (POSIX, "trap").
AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.argv[1], sys.argv[1:])")


def _start(*command: str) -> tuple[subprocess.Popen, list[int]]:
    """Start the wrapper around ``command`` in a session of its own; return it and its spinners."""
    process = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, str(WRAPPER),
                                sys.executable, *command], stderr=subprocess.PIPE,
                               text=True, start_new_session=True,
                               env={**os.environ, "BUSY_SECONDS": "60"})
    line = process.stderr.readline()
    pids = [int(pid) for pid in re.findall(r"\d+", line.partition("pids")[2])]
    assert len(pids) == 2, line
    return process, pids


def test_spin_returns_after_the_time_asked():
    start = time.perf_counter()
    busy.spin(0.2)
    assert 0.2 <= time.perf_counter() - start < 10


def test_busy_stops_by_itself_after_its_duration():
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(TOOLS / "busy.py"), "--seconds", "0.3",
                             "--max-on", "0.1", "--max-off", "0.1"], timeout=30)
    assert result.returncode == 0
    assert time.monotonic() - start < 10
    assert busy.run(0.3, 0.1, 0.1, seed=1) >= 1  # bursts alternate until the time is up
    assert busy.run(30, 0.1, 0.1, seed=1, parent=os.getpid() + 10**6) == 0  # parent gone: stop


def test_spinners_are_stopped_after_a_failing_run():
    process, pids = _start("sh", "-c", "exit 3")
    assert process.wait(timeout=30) == 3  # the command's status comes back
    assert _gone_within(pids, 5) == []


def test_spinners_are_stopped_after_a_successful_run():
    process, pids = _start("true")
    assert process.wait(timeout=30) == 0
    assert _gone_within(pids, 5) == []


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["ctrl-c", "term"])
def test_spinners_are_stopped_after_an_interrupted_run(sig, status):
    process, pids = _start("sleep", "60")
    _wait_for_child(process.pid, "sleep")  # the run is under way, as nbval would be
    assert all(_alive(pid) for pid in pids)
    os.killpg(process.pid, sig)  # as a terminal's Ctrl-C or a CI cancel: the whole group
    assert process.wait(timeout=30) == status
    assert _gone_within(pids, 5) == []


def test_spinners_stop_by_themselves_when_the_script_is_killed_outright():
    process, pids = _start("sleep", "60")
    process.kill()  # SIGKILL: no trap runs; the spinners see their parent gone
    process.wait(timeout=30)
    try:
        assert _gone_within(pids, 10) == []
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the orphaned `sleep 60`


def test_make_test_busy_runs_lessons_and_solutions_through_the_script():
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ntest-busy:")[1].split("\n\n")[0]
    assert "tests/tools/with_busy_cores.sh" in recipe
    assert "COURSE_STRICT_CHECKS=1 $(NBVAL) solutions" in recipe
    assert "$(NBVAL) notebooks" in recipe
