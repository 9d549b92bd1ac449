"""TensorFlow's own log lines, captured from a fresh Python process.

A lesson's set-up cell quiets TensorFlow (``TF_CPP_MIN_LOG_LEVEL``), and TensorFlow reads its log
settings once, when it starts: a warning it would print to a learner who did not quiet it can no
longer be shown in that kernel. :func:`tensorflow_log_lines` runs code in new processes, with the
log level of a fresh install or with verbose logging of chosen source files, and returns what
TensorFlow's C++ core wrote while each snippet ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["LOG_LINE", "tensorflow_log_lines", "writes_verbose_auto_shard_line"]

#: TensorFlow's C++ log lines. TensorFlow 2.21 (absl's format): a level letter (Info, Warning,
#: Error, Fatal), then ``MMDD`` (or ``0000``), a time, a thread id and ``file.cc:line]``, e.g.
#: ``I0000 00:00:1795409551.025166   27254 auto_shard.cc:799] AUTO sharding policy ...``.
#: TensorFlow 2.20 (Colab's): a date and time, the level letter and the source path, e.g.
#: ``2026-11-23 08:04:57.616056: I tensorflow/core/common_runtime/eager/execute.cc:1244] ...``.
LOG_LINE = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ [\w.\-]+:\d+\] "
                      r"|\d{4}-\d\d-\d\d [\d:.]+: [IWEF] [\w./\-]+:\d+\] )")

_MARKER = "@@course_utils.tflogs@@"


def tensorflow_log_lines(
    snippets: Mapping[str, str],
    *,
    setup: str = "",
    vmodules: Sequence[str | None] = (None,),
    timeout: float = 300.0,
) -> dict[str | None, dict[str, list[str]]]:
    """Run ``setup``, then each snippet, in fresh Pythons; return each snippet's TF log lines.

    One process per entry of ``vmodules``, run side by side: ``None`` logs at TensorFlow's
    default level (``TF_CPP_MIN_LOG_LEVEL=0``), as on a fresh install; a string such as
    ``"auto_shard=2"`` also turns on the verbose logs of those source files
    (``TF_CPP_VMODULE``). Returns ``{vmodule: {snippet name: lines}}``. Lines written by
    ``setup`` (TensorFlow's start-up) are not returned. Raises RuntimeError, with the end of
    stderr, if a process fails.
    """
    lines = [setup, "import sys"]
    for name, code in snippets.items():
        lines.append(f"print({_MARKER + name!r}, file=sys.stderr, flush=True)")
        lines.append(code)
        lines.append("sys.stderr.flush()")
    processes = {}
    for vmodule in vmodules:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
        env.pop("TF_CPP_VMODULE", None)
        if vmodule:
            env["TF_CPP_VMODULE"] = vmodule
        processes[vmodule] = subprocess.Popen(
            [sys.executable, "-c", "\n".join(lines)], stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env=env)
    captured: dict[str | None, dict[str, list[str]]] = {}
    try:
        for vmodule, process in processes.items():
            _, stderr = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"the snippets failed (exit code {process.returncode}):\n"
                                   + stderr[-3000:])
            captured[vmodule] = _split(stderr, snippets)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return captured


def _split(stderr: str, snippets: Mapping[str, str]) -> dict[str, list[str]]:
    """The log lines of ``stderr``, by the snippet that was running when each was written."""
    by_snippet: dict[str, list[str]] = {name: [] for name in snippets}
    current = None
    for line in stderr.splitlines():
        if line.startswith(_MARKER):
            current = line[len(_MARKER):]
        elif current is not None and LOG_LINE.match(line):
            by_snippet[current].append(line)
    return by_snippet


def writes_verbose_auto_shard_line(version: str | None = None) -> bool:
    """Whether this TensorFlow writes the auto-shard pass's ``AUTO sharding policy ...`` line.

    TensorFlow 2.21 writes it (as information) when ``TF_CPP_VMODULE=auto_shard=2`` asks for the
    verbose log; 2.20 (Colab's today) writes nothing about sharding at any log level, even with
    ``TF_CPP_MAX_VLOG_LEVEL=2`` (measured), although it applies the policy all the same.
    ``version`` defaults to the installed TensorFlow's.
    """
    if version is None:
        import tensorflow as tf

        version = tf.__version__
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return (major, minor) >= (2, 21)
