"""The kernel zygote: sandboxed grading kernels forked from one process that imported
TensorFlow once, confined exactly as ``jail.py`` confines a fresh kernel; a zygote that cannot
answer costs a fresh kernel, never a grade."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import nbformat
import psutil
import pytest

from course_utils.instructor.execute import execute_notebook
from course_utils.instructor.kernel_env import PACKAGE_DIR, kernel_env
from course_utils.instructor.limits import Limits
from course_utils.instructor.protection import Protection, jail_spec, protect
from course_utils.instructor.sandbox_user import can_switch_user, kill_user, reserve_user
from course_utils.instructor.zygote import Zygote

pytestmark = pytest.mark.skipif(not can_switch_user(), reason="the sandbox needs root")

#: What the first cell sees: TensorFlow imported before any cell ran (the fork's point), who
#: runs it, its parent, its limits and what it may write.
PROBE = f"""import json, os, sys
limits = open("/proc/self/limits").read()
status = open("/proc/self/status").read()
try:
    open({str(PACKAGE_DIR / "cuh_planted.py")!r}, "w")
    planted = True
except OSError:
    planted = False
print(json.dumps({{"tensorflow": "tensorflow" in sys.modules, "uid": os.getuid(),
                  "ppid": os.getppid(), "cwd": os.getcwd(), "home": os.environ["HOME"],
                  "nproc": [l.split()[2] for l in limits.splitlines()
                            if l.startswith("Max processes")][0],
                  "no_new_privs": "NoNewPrivs:\\t1" in status, "planted": planted}}))
"""


def _home(uid: int) -> Path:
    home = Path(tempfile.mkdtemp(prefix="cu-box-", dir="/tmp"))
    for path in (home, home / "tmp", home / "ipc"):
        path.mkdir(exist_ok=True)
        os.chown(path, uid, uid)
    return home


@pytest.fixture(scope="module")
def zygote():
    folder = Path(tempfile.mkdtemp(prefix="cu-zygote-home-"))
    running = Zygote(kernel_env(folder))
    running.ready()
    yield running
    running.stop()
    shutil.rmtree(folder, ignore_errors=True)
    assert not psutil.pid_exists(running.process.pid) or \
        psutil.Process(running.process.pid).status() == psutil.STATUS_ZOMBIE


def _probe(tmp_path: Path, zygote_socket: str | None) -> tuple[dict, str]:
    found = protect([])
    with reserve_user() as user:
        home = _home(user.uid)
        stage = tmp_path / "stage"
        stage.mkdir()
        spec = jail_spec(Protection(True, Limits(processes=77), hidden=found.hidden),
                         user.uid, stage)
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROBE)])
        try:
            outcomes, status = execute_notebook(notebook, cwd=home, env=kernel_env(home),
                                                timeout=120, ipc_dir=home / "ipc",
                                                jail=spec, zygote=zygote_socket)
        finally:
            kill_user(user.uid)
            shutil.rmtree(home, ignore_errors=True)
    assert status == "ok" and outcomes[0].status == "ok", (status, outcomes)
    return json.loads(outcomes[0].text.strip().splitlines()[-1]) | {"user": user.uid}, str(home)


def test_a_forked_kernel_is_confined_like_a_fresh_one_with_tensorflow_already_imported(
        zygote, tmp_path):
    seen, home = _probe(tmp_path, zygote.socket)
    assert seen["tensorflow"] and seen["ppid"] == zygote.process.pid  # forked, not started
    assert seen["uid"] == seen["user"] != 0 and seen["nproc"] == "77" and seen["no_new_privs"]
    assert seen["cwd"] == seen["home"] == home
    assert not seen["planted"] and not (PACKAGE_DIR / "cuh_planted.py").exists()


def test_a_zygote_that_does_not_answer_costs_a_fresh_kernel_not_a_grade(tmp_path):
    seen, _ = _probe(tmp_path, str(tmp_path / "no-such.sock"))
    assert not seen["tensorflow"]  # a fresh kernel: nothing imported before its first cell
    assert seen["uid"] == seen["user"] and seen["nproc"] == "77" and seen["no_new_privs"]


def test_a_batch_of_one_notebook_starts_no_zygote_and_a_batch_of_two_does(monkeypatch):
    from course_utils.instructor import sandbox

    started = []
    monkeypatch.setattr(sandbox, "Zygote", lambda env: started.append(env) or Zygote(env))
    with sandbox.kernel_zygote(1, Protection(True)):
        assert started == []
    with sandbox.kernel_zygote(2, Protection(False)):  # not sandboxed: kernels start fresh
        assert started == []
    with sandbox.kernel_zygote(2, Protection(True)):
        assert len(started) == 1 and started[0]["HOME"].startswith(tempfile.gettempdir())
    assert sandbox._ready_zygote() is None  # stopped with its batch


def test_the_zygote_socket_is_root_s_alone(zygote):
    folder = Path(zygote.socket).parent
    assert folder.stat().st_mode & 0o077 == 0 and folder.stat().st_uid == 0
    assert Path(zygote.socket).stat().st_mode & 0o077 == 0
