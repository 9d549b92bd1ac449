"""What one graded notebook may use (memory, processes, file size, open files), as resource
limits its kernel starts with, and the feedback line that says which limit a notebook hit."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DEFAULT_MEMORY_GB", "DEFAULT_PROCESSES", "Limits", "limits_hit"]

#: Memory per process of a notebook, in GB (RLIMIT_DATA: heap, anonymous maps, thread stacks).
#: Lesson 00's exercises use about 0.5 GB of it on 2 cores (measured on Python 3.11, TF 2.20).
DEFAULT_MEMORY_GB = 8.0
#: Processes and threads of one notebook together (RLIMIT_NPROC of its own sandbox user):
#: TensorFlow starts a few threads per core, so the default grows with the cores.
DEFAULT_PROCESSES = max(1024, 64 * (os.cpu_count() or 1))  # a local cluster: ~300 threads
_GB = 1024 ** 3


@dataclass(frozen=True)
class Limits:
    """The limits of one notebook; ``processes`` holds only where it runs as its own user."""

    memory_gb: float = DEFAULT_MEMORY_GB
    processes: int = DEFAULT_PROCESSES
    file_gb: float = 4.0
    open_files: int = 4096

    def rlimits(self, own_user: bool) -> dict[str, int]:
        """``resource`` limits by name (``data`` for ``RLIMIT_DATA``, ...) and value (the number
        of processes only for ``own_user``: otherwise it would count all the grader's)."""
        values = {"data": int(self.memory_gb * _GB), "fsize": int(self.file_gb * _GB),
                  "nofile": self.open_files, "core": 0}
        if own_user:
            values["nproc"] = self.processes
        return values

    def to_dict(self) -> dict[str, Any]:
        """As a JSON-friendly dict."""
        return asdict(self)


_SIGNS = (  # (words in an error or output, what the learner reads)
    (("MemoryError", "Cannot allocate memory", "bad_alloc", "OOM when allocating"),
     "the notebook used more than {memory_gb:g} GB of memory in one process (the grader's limit)"),
    (("BlockingIOError", "Resource temporarily unavailable", "can't start new thread"),
     "the notebook started more than {processes} processes and threads (the grader's limit)"),
    (("File too large",), "the notebook wrote a file larger than {file_gb:g} GB (the grader's "
                          "limit)"),
    (("Too many open files",), "the notebook opened more than {open_files} files at once (the "
                               "grader's limit)"),
)


def limits_hit(result: dict[str, Any], limits: Limits) -> list[str]:
    """One feedback line for each limit the executed notebook ran into."""
    seen = " ".join(f"{c.get('ename', '')} {c.get('evalue', '')} {c.get('text', '')}"
                    for c in result.get("cells", []))
    return [line.format(**limits.to_dict()) for signs, line in _SIGNS
            if any(sign in seen for sign in signs)]
