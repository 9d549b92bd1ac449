"""Progress of a training run: a progress bar per epoch, or one line per epoch, or nothing.

``verbose`` follows Keras: ``"auto"`` (a bar only in a notebook), 0 (quiet), 1 (a bar) or 2 (one
line per epoch).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["VERBOSE_LEVELS", "check_verbose", "in_notebook", "progress_bar", "report_epoch"]

#: The values ``verbose`` accepts.
VERBOSE_LEVELS = ("auto", 0, 1, 2, True, False)


def in_notebook() -> bool:
    """Return True when running inside a Jupyter (ipykernel) kernel."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython always comes with ipykernel
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def check_verbose(verbose: int | str) -> int | str:
    """Validate a ``verbose`` setting and return it."""
    if verbose not in VERBOSE_LEVELS:
        raise ValueError(f"verbose must be 'auto', 0, 1 or 2, got {verbose!r}")
    return verbose


def progress_bar(verbose: int | str, total: int, epoch: int, epochs: int) -> Any:
    """A tqdm bar for one epoch of ``total`` steps when ``verbose`` asks for one, else None."""
    show = verbose == 1 or verbose is True or (verbose == "auto" and in_notebook())
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"epoch {epoch + 1}/{epochs}", unit="step", leave=True)


def report_epoch(
    bar: Any, logs: dict[str, float], epoch: int, epochs: int, verbose: int | str
) -> None:
    """Show an epoch's logs: on its bar (then closed), or as one printed line for verbose=2."""
    text = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
    if bar is not None:
        bar.set_postfix_str(text)
        bar.close()
    elif verbose == 2:
        print(f"epoch {epoch + 1}/{epochs} - {text}")
