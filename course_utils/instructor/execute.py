"""Run one notebook in a fresh kernel of this Python, cell by cell, under one time limit.

Used by the grader's worker process. The kernel is ``sys.executable -m ipykernel_launcher``
(no registered kernelspec needed), starts in a given working directory with a given
environment, and is killed (SIGKILL) when the time limit is reached or the notebook is done.
Outputs are capped per cell so that a notebook printing megabytes cannot exhaust memory.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from course_utils.instructor.protection import JAIL
from course_utils.instructor.zygote import ZygoteProvisioner

__all__ = ["OUTPUT_CAP", "TRUNCATED_NOTE", "CellOutcome", "CurrentPythonKernelSpecs",
           "GradingClient", "SandboxKernelManager", "execute_notebook"]

#: Characters of output kept per cell; the rest is dropped with a note.
OUTPUT_CAP = 20_000
TRUNCATED_NOTE = "\n[... output truncated by the grader ...]\n"


@dataclass
class CellOutcome:
    """What happened to one code cell: ``ok``, ``error``, ``timeout``, ``dead`` or ``not run``."""

    index: int
    status: str
    ename: str = ""
    evalue: str = ""
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        """As a JSON-friendly dict."""
        return asdict(self)


class CurrentPythonKernelSpecs(KernelSpecManager):
    """Every kernel name resolves to an IPython kernel of the running interpreter, started
    through ``jail.py`` with ``jail`` (its user, limits and hidden folders) when given."""

    jail: dict[str, Any] | None = None

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:  # noqa: D102
        prefix = [] if self.jail is None else [
            sys.executable, "-I", str(JAIL), json.dumps(self.jail), "--"]
        return KernelSpec(
            argv=[*prefix, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (course grader)",
            language="python",
            env={},
        )


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager that hands the connection file to the kernel's user (``owner``)."""

    owner: int | None = None

    def write_connection_file(self, **kwargs: Any) -> None:  # noqa: D102
        super().write_connection_file(**kwargs)
        if self.owner is not None:
            os.chown(self.connection_file, self.owner, self.owner)


class GradingClient(NotebookClient):
    """A NotebookClient that keeps each cell's reply and caps the output it stores."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replies: dict[int, dict[str, Any]] = {}
        self._kept: dict[int, int] = {}

    def output(self, outs: list[Any], msg: dict[str, Any], display_id: str | None,
               cell_index: int) -> Any:
        kept = self._kept.get(cell_index, 0)
        if kept >= OUTPUT_CAP:
            return None
        out = super().output(outs, msg, display_id, cell_index)
        if out is None:
            return None
        text = out.get("text")
        if isinstance(text, str):
            if kept + len(text) > OUTPUT_CAP:
                out["text"] = text[: OUTPUT_CAP - kept] + TRUNCATED_NOTE
            self._kept[cell_index] = kept + len(text)
        else:  # rich output: keep plain text only, count its size
            data = out.get("data", {})
            out["data"] = {k: v for k, v in data.items() if k == "text/plain"}
            self._kept[cell_index] = kept + sum(len(str(v)) for v in data.values())
        return out

    async def _check_raise_for_error(self, cell: Any, cell_index: int,
                                     exec_reply: dict[str, Any] | None) -> None:
        if exec_reply is not None:
            self.replies[cell_index] = dict(exec_reply.get("content", {}))
        await super()._check_raise_for_error(cell, cell_index, exec_reply)


def _cell_text(cell: Any) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")))
    return "".join(parts)[-OUTPUT_CAP:]


def execute_notebook(nb: Any, *, cwd: Path, env: dict[str, str], timeout: float,
                     startup_timeout: float = 60, ipc_dir: Path | None = None,
                     attempts: int = 2, jail: dict[str, Any] | None = None,
                     zygote: str | None = None) -> tuple[list[CellOutcome], str]:
    """Execute every code cell of ``nb`` in place; return each cell's outcome and the run's.

    The run's status is ``ok``, ``timeout`` (the time limit hit, the remaining cells are
    ``not run``), ``dead`` (the kernel died) or ``kernel failed: ...`` (it never started, also
    after ``attempts`` tries). With ``ipc_dir`` the kernel talks over Unix sockets there instead
    of TCP ports, which parallel graders could race for. ``jail``: the spec ``jail.py`` applies
    to the kernel (its sandbox user, limits and hidden folders). ``zygote``: the socket of a
    kernel zygote (``zygote.py``) that forks the kernel, confined by ``jail``, instead of a
    fresh process importing everything again; a kernel it failed to start is started fresh.
    """
    deadline = time.monotonic() + timeout
    for attempt in range(1, attempts + 1):
        outcomes, status = _execute_once(nb, cwd=cwd, env=env, deadline=deadline,
                                         startup_timeout=startup_timeout, ipc_dir=ipc_dir,
                                         jail=jail, zygote=zygote)
        if not status.startswith("kernel failed") or attempt == attempts \
                or time.monotonic() >= deadline:
            return outcomes, status
        zygote = None  # the next try starts a fresh kernel
    raise AssertionError("unreachable")  # pragma: no cover


def _execute_once(nb: Any, *, cwd: Path, env: dict[str, str], deadline: float,
                  startup_timeout: float, ipc_dir: Path | None,
                  jail: dict[str, Any] | None,
                  zygote: str | None = None) -> tuple[list[CellOutcome], str]:
    timeout = max(1.0, deadline - time.monotonic())
    transport: dict[str, Any] = {}
    if ipc_dir is not None:
        ipc_dir.mkdir(parents=True, exist_ok=True)
        transport = {"transport": "ipc", "ip": str(ipc_dir / "kernel"),
                     "connection_file": str(ipc_dir / f"kernel-{time.monotonic_ns()}.json")}
    specs = CurrentPythonKernelSpecs()
    specs.jail = jail
    km = SandboxKernelManager(kernel_name="python3", kernel_spec_manager=specs, **transport)
    km.owner = (jail or {}).get("uid")
    if zygote is not None and km.owner is not None:
        km.kernel_id = str(uuid.uuid4())
        km.provisioner = ZygoteProvisioner(kernel_id=km.kernel_id, kernel_spec=km.kernel_spec,
                                           parent=km)
        km.provisioner.socket_path, km.provisioner.jail = zygote, jail
    client = GradingClient(
        nb, km=km, timeout=max(1, int(timeout)), startup_timeout=int(startup_timeout),
        allow_errors=True, interrupt_on_timeout=False, shutdown_kernel="immediate",
        record_timing=False, store_widget_state=False, resources={"metadata": {"path": str(cwd)}},
    )
    code_cells = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    outcomes: dict[int, CellOutcome] = {}
    run_status = "ok"
    try:
        with client.setup_kernel(env=env, cwd=str(cwd)):
            for index in code_cells:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    run_status = "timeout"
                    break
                client.timeout = max(1, int(remaining))
                cell = nb.cells[index]
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    outcomes[index] = CellOutcome(index, "timeout", text=_cell_text(cell))
                    run_status = "timeout"
                    break
                except DeadKernelError:
                    outcomes[index] = CellOutcome(index, "dead", text=_cell_text(cell))
                    run_status = "dead"
                    break
                reply = client.replies.get(index, {})
                if reply.get("status") == "error":
                    outcomes[index] = CellOutcome(index, "error", str(reply.get("ename", "")),
                                                  str(reply.get("evalue", ""))[:OUTPUT_CAP],
                                                  _cell_text(cell))
                else:
                    outcomes[index] = CellOutcome(index, "ok", text=_cell_text(cell))
    except (DeadKernelError, RuntimeError, TimeoutError) as error:
        if not outcomes and run_status == "ok":
            run_status = f"kernel failed: {type(error).__name__}: {error}"
        elif run_status == "ok":
            run_status = "dead"
    for index in code_cells:
        outcomes.setdefault(index, CellOutcome(index, "not run"))
    return [outcomes[i] for i in code_cells], run_status
