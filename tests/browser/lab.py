"""JupyterLab and headless Chromium for the browser tests, each stopped however a test ends.

``running_lab`` starts JupyterLab as ``make lab`` does (``jupyter lab --port ...``,
``--ServerApp.root_dir``, ``--allow-root`` as root) plus what a test needs to own it: a free
port, a token, no browser, and a runtime, settings and workspaces directory of its own in a
temporary folder. ``running_browser``
starts Debian's Chromium through Debian's chromedriver (no download: both paths are given).
Both stop every process they started, and raise if one survives.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("COURSE_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1000")
# User settings of the test's own JupyterLab: every cell in the page (JupyterLab 4 otherwise
# leaves cells outside the viewport out of it), no autosave (a run must not write outputs into
# the committed notebooks), no news pop-up over the screenshots.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},
}


@dataclass
class Lab:
    """A running JupyterLab: its URL with token, process and the folder it owns."""

    url: str
    token: str
    process: subprocess.Popen
    folder: pathlib.Path

    def shut_down_kernels(self) -> int:
        """Stop every kernel session of this lab (one lesson's kernel before the next); count."""
        def call(method: str, path: str) -> bytes:
            request = urllib.request.Request(f"{self.url}{path}?token={self.token}",
                                             method=method)
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.read()

        sessions = json.loads(call("GET", "/api/sessions"))
        for session in sessions:
            call("DELETE", f"/api/sessions/{session['id']}")
        return len(sessions)

    def notebook_url(self, relative: str) -> str:
        """The URL that opens ``relative`` (a path under the repository) in a fresh workspace."""
        return f"{self.url}/lab/tree/{relative}?reset&token={self.token}"


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes_in_group(pgid: int) -> list[int]:
    """Live (not zombie) process ids whose process group is ``pgid``."""
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def processes_mentioning(text: str) -> list[int]:
    """Live process ids whose command line contains ``text``."""
    found = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                status = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if status != "Z":
                    found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def _stop_group(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``grace_s``."""
    pgid = process.pid  # started with start_new_session=True: its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while processes_in_group(pgid) and time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


@contextlib.contextmanager
def running_lab(jupyter: str | None = None, start_timeout_s: float = 120.0) -> Iterator[Lab]:
    """JupyterLab on a free port with its own token and folders; stopped (whole group) on exit."""
    jupyter = jupyter or os.environ.get("COURSE_JUPYTER", str(REPO / ".venv/bin/jupyter"))
    folder = pathlib.Path(tempfile.mkdtemp(prefix="course-browser-lab-"))
    for plugin, values in LAB_SETTINGS.items():
        path = folder / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(folder / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    port, token = free_port(), secrets.token_hex(16)
    command = [jupyter, "lab", "--port", str(port), f"--ServerApp.root_dir={REPO}",
               f"--ServerApp.token={token}", "--no-browser", "--ServerApp.ip=127.0.0.1"]
    if os.getuid() == 0:
        command.append("--allow-root")  # as make lab's LAB_FLAGS
    log = open(folder / "lab.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (
                        folder / "lab.log").read_text(errors="replace")[-3000:]) from None
                time.sleep(0.5)
        yield Lab(url, token, process, folder)
    finally:
        _stop_group(process)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
        left = processes_in_group(process.pid)
        if left:
            raise RuntimeError(f"JupyterLab's processes survived: {left}")


@contextlib.contextmanager
def running_browser() -> Iterator[object]:
    """Headless Chromium driven by chromedriver, with a new empty profile; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="course-browser-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()
        with contextlib.suppress(Exception):
            service.stop()
        deadline = time.monotonic() + 10
        while processes_mentioning(profile) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in processes_mentioning(profile):  # Chromium's helpers, if quit left any
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        survived = processes_mentioning(profile)
        shutil.rmtree(profile, ignore_errors=True)
        if survived:
            raise RuntimeError(f"Chromium's processes survived: {survived}")
