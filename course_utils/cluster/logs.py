"""Worker logs: one file per worker, read whole or by its tail, streamed as ``[worker i] ...``."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

__all__ = ["WorkerLogs", "indent", "remove_log_dir", "temporary_log_dir"]

_TEMPORARY_LOG_DIRS: set[Path] = set()


def temporary_log_dir(prefix: str) -> Path:
    """A new temporary folder for a cluster's logs: kept while the interpreter runs (the logs
    stay readable after the cluster stops), deleted when it exits or by :func:`remove_log_dir`."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    _TEMPORARY_LOG_DIRS.add(folder)
    return folder


def remove_log_dir(folder: Path) -> None:
    """Delete a folder made by :func:`temporary_log_dir` now."""
    shutil.rmtree(folder, ignore_errors=True)
    _TEMPORARY_LOG_DIRS.discard(folder)


@atexit.register
def _remove_temporary_log_dirs() -> None:
    for folder in list(_TEMPORARY_LOG_DIRS):
        remove_log_dir(folder)


def indent(text: str) -> str:
    """``text`` with every line indented four spaces ("    (empty)" for no text)."""
    return "\n".join("    " + line for line in text.splitlines()) or "    (empty)"


class WorkerLogs:
    """The log files ``worker-<i>.log`` of ``count`` workers in ``log_dir``."""

    def __init__(self, log_dir: Path, count: int) -> None:
        self.log_dir = Path(log_dir)
        self.count = count
        self._offsets = [0] * count

    @property
    def paths(self) -> list[Path]:
        """One log file per worker (stdout and stderr together)."""
        return [self.log_dir / f"worker-{i}.log" for i in range(self.count)]

    def read(self, index: int) -> str:
        """Everything worker ``index`` has written so far."""
        return self.paths[index].read_text(errors="replace")

    def tail(self, index: int, lines: int = 20) -> str:
        """The last ``lines`` lines of worker ``index``'s log."""
        return "\n".join(self.read(index).splitlines()[-lines:])

    def stream_new_lines(self) -> None:
        """Print the whole lines written since the last call, prefixed ``[worker i]``."""
        for index, path in enumerate(self.paths):
            try:
                with open(path, "rb") as handle:
                    handle.seek(self._offsets[index])
                    chunk = handle.read()
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1  # print whole lines only
            if end:
                self._offsets[index] += end
                for line in chunk[:end].decode(errors="replace").splitlines():
                    print(f"[worker {index}] {line}", flush=True)
