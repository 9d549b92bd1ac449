"""JupyterLab and headless Chromium for the browser tests, each stopped however a test ends.

``running_lab`` starts JupyterLab as ``make lab`` does (``jupyter lab --port ...``,
``--ServerApp.root_dir``, ``--allow-root`` as root, the caller's environment: the course is
installed in ``.venv``) plus what a test needs to own it: a free port, a token, no browser, and a
runtime, settings and workspaces directory of its own in a temporary folder.
``running_classic_notebook`` starts the classic Notebook 6.5 of ``.venv-colab`` (Colab's
front end, ipywidgets 7.7) the same way. ``running_browser`` starts Debian's Chromium through
Debian's chromedriver (no download: both paths are given). Each stops every process it started,
kernels included (they run in sessions of their own, their command lines name the temporary
folder: ``-f <folder>/runtime/kernel-*.json``), and raises if one survives.
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
    """A running Jupyter server (JupyterLab or classic Notebook): URL, token, process, folder."""

    url: str
    token: str
    process: subprocess.Popen
    folder: pathlib.Path
    classic: bool = False

    def call(self, method: str, path: str, body: dict | None = None) -> bytes:
        """One request to the server's REST API, authenticated by the token."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}?token={self.token}", data=data,
                                         method=method)
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read()

    def kernel_processes(self) -> list[int]:
        """Live processes started for this server's kernels (they name its runtime folder)."""
        return processes_mentioning(str(self.folder / "runtime"))

    def start_kernel(self, relative: str, timeout_s: float = 60.0) -> list[int]:
        """Open a kernel session for ``relative`` as a front end does; its process ids."""
        self.call("POST", "/api/sessions", {"path": relative, "type": "notebook", "name": "",
                                            "kernel": {"name": "python3"}})
        deadline = time.monotonic() + timeout_s
        while not self.kernel_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.kernel_processes()

    def shut_down_kernels(self, wait_s: float = 30.0) -> int:
        """Stop every kernel session (one lesson's kernel before the next); count; raise if one
        kernel process is still alive ``wait_s`` later."""
        sessions = json.loads(self.call("GET", "/api/sessions"))
        for session in sessions:
            self.call("DELETE", f"/api/sessions/{session['id']}")
        deadline = time.monotonic() + wait_s
        while self.kernel_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self.kernel_processes()
        if left:
            raise RuntimeError(f"kernel processes survived their session's shutdown: {left}")
        return len(sessions)

    def notebook_url(self, relative: str) -> str:
        """The URL that opens ``relative`` (a path under the repository) in a fresh workspace."""
        if self.classic:
            return f"{self.url}/notebooks/{relative}?token={self.token}"
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


def stop_processes_mentioning(text: str, wait_s: float = 15.0, grace_s: float = 5.0) -> None:
    """Give processes naming ``text`` ``wait_s`` to end, SIGTERM them, SIGKILL after ``grace_s``."""
    for sig, seconds in ((None, wait_s), (signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in processes_mentioning(text) if sig else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + seconds
        while processes_mentioning(text) and time.monotonic() < deadline:
            time.sleep(0.2)


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
           "JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces")}
    port, token = free_port(), secrets.token_hex(16)
    command = [jupyter, "lab", "--port", str(port), f"--ServerApp.root_dir={REPO}",
               f"--ServerApp.token={token}", "--no-browser", "--ServerApp.ip=127.0.0.1"]
    if os.getuid() == 0:
        command.append("--allow-root")  # as make lab's LAB_FLAGS
    with _serving(command, env, folder, port, token, start_timeout_s) as lab:
        yield lab


@contextlib.contextmanager
def running_classic_notebook(jupyter: str | None = None,
                             start_timeout_s: float = 120.0) -> Iterator[Lab]:
    """Classic Notebook 6.5 (``.venv-colab``, ipywidgets 7.7) like ``running_lab``; stopped."""
    jupyter = jupyter or os.environ.get("COURSE_CLASSIC_JUPYTER",
                                        str(REPO / ".venv-colab/bin/jupyter"))
    folder = pathlib.Path(tempfile.mkdtemp(prefix="course-browser-classic-"))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(folder / "runtime")}
    port, token = free_port(), secrets.token_hex(16)
    command = [jupyter, "notebook", "--port", str(port), f"--NotebookApp.notebook_dir={REPO}",
               f"--NotebookApp.token={token}", "--no-browser", "--NotebookApp.ip=127.0.0.1"]
    if os.getuid() == 0:
        command.append("--allow-root")
    with _serving(command, env, folder, port, token, start_timeout_s, classic=True) as lab:
        yield lab


@contextlib.contextmanager
def _serving(command: list[str], env: dict[str, str], folder: pathlib.Path, port: int,
             token: str, start_timeout_s: float, classic: bool = False) -> Iterator[Lab]:
    """Run a Jupyter server ``command`` until it answers; on exit stop it, its kernels, folder."""
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
                    raise RuntimeError("the Jupyter server did not start:\n" + (
                        folder / "lab.log").read_text(errors="replace")[-3000:]) from None
                time.sleep(0.5)
        yield Lab(url, token, process, folder, classic)
    finally:
        _stop_group(process)
        log.close()
        # Kernels run in sessions of their own (not in the server's group): the server shuts
        # them down on SIGTERM; whatever still names the folder is stopped here, then checked.
        stop_processes_mentioning(str(folder))
        left = processes_in_group(process.pid) + processes_mentioning(str(folder))
        shutil.rmtree(folder, ignore_errors=True)
        if left:
            raise RuntimeError(f"the Jupyter server's or its kernels' processes survived: {left}")


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
