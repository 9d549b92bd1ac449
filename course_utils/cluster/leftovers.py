"""What a finished cluster left behind: worker processes still alive, ports still bound."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["leftovers"]


def leftovers(pids: Sequence[int], ports: Sequence[int]) -> dict[str, list[int]]:
    """``{"processes": [...], "ports": [...]}``: pids still running, ports still bound."""
    import portpicker
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(int(pid))
        except psutil.NoSuchProcess:
            pass
    bound = [int(port) for port in ports if not portpicker.is_port_free(port)]
    return {"processes": alive, "ports": bound}
