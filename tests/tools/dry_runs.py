"""pip's two dry runs of ``tests/test_dependencies.py``, started in the background.

Each mostly waits on the package registry. pytest's main process starts them as the run
begins (``conftest.py``: under pytest-xdist it runs no test itself), and the test reads what
they wrote, so that no worker waits for the registry. Without that head start the test's
fixture starts them itself. Results go to a folder: ``index.rc`` and ``index.out`` (whether the
registry answers), then ``NAME.json`` (pip's report), ``NAME.err`` and ``NAME.rc`` per run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COLAB_STACK = REPO / "requirements" / "colab.txt"
#: The environment variable that names the folder of runs started by pytest's main process.
FOLDER_ENV = "COURSE_DRY_RUNS"

#: The two questions for pip's resolver (``pip install --dry-run --report``): the course beside
#: Colab's exact versions; the course with all extras under the lock.
DRY_RUNS = {
    "colab": [str(REPO), "-r", str(COLAB_STACK)],
    "lock": ["-c", str(REPO / "requirements" / "lock.txt"), f"{REPO}[lab,grading,dev,book]"],
}

_RUNNER = r"""
import json, os, subprocess, sys
folder, runs = sys.argv[1], json.loads(sys.argv[2])
pip = [sys.executable, "-m", "pip"]


def put(name, text):  # whole or not at all: a reader waits for the name
    with open(f"{folder}/{name}.part", "w") as out:
        out.write(text)
    os.replace(f"{folder}/{name}.part", f"{folder}/{name}")


try:
    index = subprocess.run([*pip, "index", "versions", "keras"], capture_output=True,
                           text=True, timeout=120)
    code, out = index.returncode, index.stdout
except subprocess.TimeoutExpired:
    code, out = 124, ""
put("index.out", out)
put("index.rc", str(code))
if code == 0:
    started = {name: subprocess.Popen(
        [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
         f"{folder}/{name}.json", *args], stdout=subprocess.DEVNULL,
        stderr=open(f"{folder}/{name}.err", "w")) for name, args in runs.items()}
    for name, process in started.items():
        put(f"{name}.rc", str(process.wait(timeout=900)))
"""


def start(folder: Path) -> subprocess.Popen:
    """Start the registry probe and both dry runs, writing into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", _RUNNER, str(folder), json.dumps(DRY_RUNS)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def read(folder: Path, name: str, timeout: float = 1020.0) -> str:
    """The text of ``folder / name`` once it has been written (waits up to ``timeout`` s)."""
    path, deadline = folder / name, time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not written within {timeout:.0f} s")
        time.sleep(0.5)
    return path.read_text()  # written whole (renamed into place)
