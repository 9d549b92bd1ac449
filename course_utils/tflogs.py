"""TensorFlow's own log lines, captured from a fresh Python process.

A lesson's set-up cell quiets TensorFlow (``TF_CPP_MIN_LOG_LEVEL``), and TensorFlow reads its log
settings once, when it starts: a warning it would print to a learner who did not quiet it can no
longer be shown in that kernel. :func:`tensorflow_log_lines` runs code in a new process with the
log level of a fresh install (or with verbose logging of chosen source files) and returns what
TensorFlow's C++ core wrote while each snippet ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["LOG_LINE", "tensorflow_log_lines"]

#: TensorFlow's C++ log lines: a level letter (Info, Warning, Error, Fatal), then ``MMDD`` (or
#: ``0000``), a time, a thread id and ``file.cc:line]``, e.g.
#: ``I0000 00:00:1795409551.025166   27254 auto_shard.cc:799] AUTO sharding policy ...``.
LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.\-]+:\d+\] ")

_MARKER = "@@course_utils.tflogs@@"


def tensorflow_log_lines(
    snippets: Mapping[str, str],
    *,
    setup: str = "",
    vmodule: str | None = None,
    timeout: float = 300.0,
) -> dict[str, list[str]]:
    """Run ``setup``, then each snippet, in a fresh Python; return each snippet's TF log lines.

    TensorFlow logs at its default level there (``TF_CPP_MIN_LOG_LEVEL=0``), as on a fresh
    install; ``vmodule`` (e.g. ``"auto_shard=2"``) also turns on the verbose logs of those
    source files (``TF_CPP_VMODULE``). Lines written by ``setup`` (TensorFlow's start-up) are
    not returned. Raises RuntimeError, with the end of stderr, if the process fails.
    """
    lines = [setup, "import sys"]
    for name, code in snippets.items():
        lines.append(f"print({_MARKER + name!r}, file=sys.stderr, flush=True)")
        lines.append(code)
        lines.append("sys.stderr.flush()")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    env.pop("TF_CPP_VMODULE", None)
    if vmodule:
        env["TF_CPP_VMODULE"] = vmodule
    result = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True,
                            text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"the snippets failed (exit code {result.returncode}):\n"
                           + result.stderr[-3000:])
    captured: dict[str, list[str]] = {name: [] for name in snippets}
    current = None
    for line in result.stderr.splitlines():
        if line.startswith(_MARKER):
            current = line[len(_MARKER):]
        elif current is not None and LOG_LINE.match(line):
            captured[current].append(line)
    return captured
