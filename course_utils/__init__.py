"""Scaling TensorFlow: the course's support package.

Notebooks import it as ``import course_utils as cu``. Importing the package is cheap: it does
not import TensorFlow. Submodules load on first use (``cu.devices``, ``cu.data``, ...), and the
most used functions are re-exported here (``cu.setup``, ``cu.doctor``, ``cu.make_strategy``).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: GitHub repository of the course, used for Colab badges and the Colab install cell.
COURSE_REPO = "scaling-tensorflow/scaling-tensorflow"
#: Branch the Colab badges point at.
COURSE_BRANCH = "main"

_SUBMODULES = (
    "bench",
    "book",
    "child",
    "cluster",
    "data",
    "devices",
    "environment",
    "equality",
    "grading",
    "grid",
    "instructor",
    "memory",
    "mixed_precision",
    "models",
    "monitor",
    "notebooks",
    "parallel",
    "peak_probe",
    "plots",
    "profiling",
    "quiet",
    "reductions",
    "settings",
    "strategies",
    "tables",
    "tpu",
    "training",
    "widgets",
    "works_where",
)

# Public name -> submodule that defines it.
_EXPORTS = {
    "setup": "environment",
    "quiet_tensorflow": "quiet",
    "seed_everything": "environment",
    "doctor": "devices",
    "configure_logical_devices": "devices",
    "hardware": "devices",
    "describe_machine": "devices",
    "make_strategy": "strategies",
    "show_table": "tables",
    "Trainer": "training",
}


#: The public face: the submodules and re-exported names above (loaded on first use, so
#: ``from course_utils import *`` imports them all) and the two constants. A test keeps the
#: notebooks to these names and the names of each submodule's own ``__all__``.
__all__ = [
    "COURSE_BRANCH", "COURSE_REPO",
    # submodules
    "bench", "book", "child", "cluster", "data", "devices", "environment", "equality", "grading",
    "grid",
    "instructor", "memory", "mixed_precision", "models", "monitor", "notebooks", "parallel",
    "peak_probe", "plots", "profiling", "quiet", "reductions", "settings", "strategies", "tables",
    "tpu", "training", "widgets", "works_where",
    # re-exported
    "Trainer", "configure_logical_devices", "describe_machine", "doctor", "hardware",
    "make_strategy", "quiet_tensorflow", "seed_everything", "setup", "show_table",
]


def __getattr__(name: str) -> Any:
    """Load submodules and re-exported functions lazily (PEP 562)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'course_utils' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, *_EXPORTS})
