"""Fresh CPU-only TensorFlow processes: the one way the course starts a probe process.

A probe (a memory peak, logical devices split from scratch) needs TensorFlow started anew. Every
such process gets TensorFlow's defaults, the course's log filters and no GPU, so that it neither
competes with the notebook for a GPU nor measures a device the notebook's step does not use.
This module imports nothing from ``course_utils`` but the settings list.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .settings import ENVIRONMENT

__all__ = ["cpu_only_environment", "run_cpu_only", "start_cpu_only"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


def cpu_only_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with no GPU visible, quiet logs and this course_utils first."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", ENVIRONMENT["TF_CPP_MIN_LOG_LEVEL"].value)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def start_cpu_only(arguments: Sequence[str], **popen: object) -> subprocess.Popen:
    """Start ``python *arguments`` as a fresh CPU-only TensorFlow process (text pipes)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, *arguments], env=cpu_only_environment(),
                            text=True, **popen)  # type: ignore[call-overload]


def run_cpu_only(arguments: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``python *arguments`` to the end in a fresh CPU-only TensorFlow process."""
    return subprocess.run([sys.executable, *arguments], env=cpu_only_environment(),
                          capture_output=True, text=True, timeout=timeout, check=False)
