"""The environment of a grading kernel, and where the course package lives.

Its own module so that the sandbox (which runs kernels) and the protection probe (which checks
what a sandbox user can reach) share it without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

import course_utils
from course_utils.grading.framework import STRICT_ENV

__all__ = ["PACKAGE_DIR", "kernel_env"]

#: The installed course package (what a grading kernel imports).
PACKAGE_DIR = Path(course_utils.__file__).resolve().parent


def kernel_env(home: Path) -> dict[str, str]:
    """The environment of a grading kernel: strict checks, quiet TensorFlow, no user config,
    ``home`` as its home and working folder, ``home/tmp`` as its temporary folder."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JPY_", "COURSE_", "JUPYTER_", "XDG_"))}
    root = str(PACKAGE_DIR.parent)
    env.update({
        STRICT_ENV: "1",
        "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"), "TEMP": str(home / "tmp"), "TMP": str(home / "tmp"),
        "IPYTHONDIR": str(home / ".ipython"),
        "MPLCONFIGDIR": str(home / ".matplotlib"),
        "MPLBACKEND": "Agg",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env
