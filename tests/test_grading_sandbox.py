"""The grader's sandbox, piece by piece and without a kernel (each test well under a second):
limits and their feedback lines, the gradebook that notices a change behind its back, what is
hidden from the sandbox user, the jail that starts a command as that user, the probe that
checks what it can reach, and the one line a grader that is not root prints."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from course_utils.instructor import cli, protection
from course_utils.instructor.gradebook import Gradebook, Row, read_rows
from course_utils.instructor.limits import Limits, limits_hit
from course_utils.instructor.protection import JAIL, Protection, jail_spec, protect
from course_utils.instructor.sandbox import PACKAGE_DIR
from course_utils.instructor.sandbox_user import (
    can_switch_user,
    hidden_folders,
    kill_user,
    reserve_user,
)

REPO = Path(__file__).resolve().parents[1]
root_only = pytest.mark.skipif(not can_switch_user(), reason="switching users needs root")


def test_the_process_limit_applies_only_to_a_user_of_its_own():
    limits = Limits(memory_gb=2, processes=99)
    assert limits.rlimits(own_user=True)["nproc"] == 99
    assert "nproc" not in limits.rlimits(own_user=False)
    assert limits.rlimits(own_user=False)["data"] == 2 * 1024 ** 3


def test_each_limit_hit_becomes_one_feedback_line():
    result = {"cells": [{"ename": "MemoryError", "evalue": "", "text": ""},
                        {"ename": "BlockingIOError", "evalue": "[Errno 11] Resource "
                         "temporarily unavailable", "text": ""},
                        {"ename": "OSError", "evalue": "[Errno 27] File too large", "text": ""}]}
    lines = limits_hit(result, Limits(memory_gb=3, processes=64, file_gb=1))
    assert lines == [
        "the notebook used more than 3 GB of memory in one process (the grader's limit)",
        "the notebook started more than 64 processes and threads (the grader's limit)",
        "the notebook wrote a file larger than 1 GB (the grader's limit)"]
    assert limits_hit({"cells": [{"ename": "AssertionError", "evalue": "x"}]}, Limits()) == []


def test_the_gradebook_is_private_and_notices_a_change_behind_its_back(tmp_path):
    out = tmp_path / "gradebook.csv"
    book = Gradebook(out)
    book.add([Row("ana", "n.ipynb", "check_a", 0, 1, "failed", "x")])
    assert out.stat().st_mode & 0o777 == 0o600 and not book.changed()
    mine = out.read_bytes()
    with out.open("a", encoding="utf-8") as handle:
        handle.write("ana,n.ipynb,check_a,1,1,passed,\n")
    assert book.changed()
    book.restore()
    assert out.read_bytes() == mine and not book.changed()
    assert [r.points for r in read_rows(out)] == [0]


def test_folders_other_users_cannot_enter_are_found_with_what_is_needed_inside(tmp_path):
    shut = tmp_path / "shut"
    (shut / "python" / "bin").mkdir(parents=True)
    (shut / "secret").mkdir()
    tmp_path.chmod(0o755)
    shut.chmod(0o700)
    found = dict(hidden_folders([shut / "python" / "bin"]))
    assert found[str(shut)] == ["python"]


def test_a_grader_that_is_not_root_says_in_one_line_what_it_cannot_protect(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(protection, "can_switch_user", lambda: False)
    found = protect([tmp_path])
    assert not found.sandboxed and "not root" in found.note and "\n" not in found.note
    subs = tmp_path / "subs"
    (subs / "ivan").mkdir(parents=True)
    (subs / "ivan" / "00_setup_exercises.ipynb").write_text("{")
    cli.main(["grade", str(subs), "--solutions", str(REPO / "solutions"), "--out",
              str(tmp_path / "g.csv"), "--quiet"])
    assert "warning: not root: submissions run with your own rights" in capsys.readouterr().err


@root_only
def test_every_process_of_a_sandbox_user_is_killed_detached_ones_included():
    with reserve_user() as user:
        subprocess.run(["/bin/sh", "-c", "setsid sleep 300 & setsid sh -c 'sleep 300 &' &"],
                       user=user.uid, group=user.gid, extra_groups=[], check=True)
        time.sleep(0.3)
        assert kill_user(user.uid) >= 2
        assert [p for p in psutil.process_iter(["uids", "status"])  # zombies run nothing
                if p.info["uids"] and p.info["uids"].real == user.uid
                and p.info["status"] != psutil.STATUS_ZOMBIE] == []


@root_only
def test_the_jail_runs_as_the_sandbox_user_with_limits_and_shows_only_what_is_needed(tmp_path):
    found = protect([])
    assert found.sandboxed, found.note
    with reserve_user() as user:
        stage = tmp_path / "stage"
        stage.mkdir()
        spec = jail_spec(Protection(True, Limits(processes=77), hidden=found.hidden),
                         user.uid, stage)
        script = (f"id -u; grep 'Max processes' /proc/self/limits | tr -s ' ' | cut -d' ' -f3; "
                  f"grep NoNewPrivs /proc/self/status; "
                  f"touch {PACKAGE_DIR}/cuh_planted.py 2>/dev/null || echo read-only; "
                  f"test -r {PACKAGE_DIR}/__init__.py && echo readable")
        run = subprocess.run([sys.executable, "-I", str(JAIL), json.dumps(spec), "--",
                              "/bin/sh", "-c", script], cwd="/", capture_output=True,
                             text=True, check=True)
    lines = run.stdout.split()
    assert lines[:2] == [str(user.uid), "77"] and "NoNewPrivs:" in lines
    assert "read-only" in lines and "readable" in lines, run.stdout
    assert not (PACKAGE_DIR / "cuh_planted.py").exists()


@root_only
def test_a_kernel_left_as_root_runs_without_cap_sys_ptrace():
    # where no sandbox user can run the course, submissions run as root: without
    # CAP_SYS_PTRACE they cannot open an undumpable process's /proc/PID/fd (a check's log)
    spec = jail_spec(Protection(False, Limits()), None, Path("/nonexistent"))
    run = subprocess.run([sys.executable, "-I", str(JAIL), json.dumps(spec), "--",
                          "/bin/grep", "-E", "^Cap(Eff|Prm|Bnd)", "/proc/self/status"],
                         capture_output=True, text=True, check=True)
    sets = dict(line.split() for line in run.stdout.splitlines())
    assert len(sets) == 3 and not any(int(value, 16) >> 19 & 1 for value in sets.values()), sets


@root_only
@pytest.mark.skipif(not Path("/usr/sbin/capsh").exists() and not Path("/sbin/capsh").exists(),
                    reason="capsh drops capabilities before the jail runs")
@pytest.mark.parametrize("dropped", ["cap_setpcap,cap_sys_ptrace", "cap_setpcap"])
def test_the_jail_warns_of_cap_sys_ptrace_only_where_it_is_kept(dropped):
    # a container that never had CAP_SYS_PTRACE has nothing to drop: no warning; one that has
    # it without CAP_SETPCAP cannot drop it: the warning says so
    import shutil

    spec = jail_spec(Protection(False, Limits()), None, Path("/nonexistent"))
    command = " ".join([sys.executable, "-I", str(JAIL), f"'{json.dumps(spec)}'", "--",
                        "/bin/grep", "^CapBnd", "/proc/self/status"])
    run = subprocess.run([shutil.which("capsh"), f"--drop={dropped}", "--", "-c", command],
                         capture_output=True, text=True, check=True)
    kept = int(run.stdout.split()[-1], 16) >> 19 & 1
    assert kept == (dropped == "cap_setpcap"), run.stdout
    assert ("keeps CAP_SYS_PTRACE" in run.stderr) == bool(kept), run.stderr


@root_only
def test_as_root_the_grader_makes_its_folders_private_before_anything_runs(tmp_path):
    tmp_path.chmod(0o755)
    subs = tmp_path / "subs"
    subs.mkdir(mode=0o755)
    found = protect([subs, tmp_path / "missing.csv"])
    assert found.sandboxed and subs.stat().st_mode & 0o077 == 0
