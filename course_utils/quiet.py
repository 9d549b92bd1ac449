"""Import TensorFlow quietly: the environment variables, loggers and native stderr it writes to.

The lowest layer of the package: every module that needs TensorFlow imports it through
``import_tensorflow`` here, and this module imports nothing from ``course_utils``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["import_tensorflow", "native_stderr_silenced", "quiet_tensorflow"]

# Log filters that must be set before TensorFlow is imported to silence its start-up. Filters
# only: nothing here changes what TensorFlow computes (course_utils/settings.py lists every
# setting of the course, with its reason). oneDNN keeps TensorFlow's default for the CPU; its
# start-up notice goes to the native stderr, which ``import_tensorflow`` silences.
_QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",  # C++ INFO/WARNING/ERROR logs
    "GRPC_VERBOSITY": "ERROR",  # gRPC's own log lines; failed calls still raise in TensorFlow
    "ABSL_MIN_LOG_LEVEL": "3",
    "KMP_WARNINGS": "0",
}


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Send the process's native stderr (file descriptor 2) to /dev/null inside the block.

    TensorFlow's C++ start-up lines ("Could not find cuda drivers ...") bypass Python and its
    log levels; Jupyter would show them in red. Python exceptions are unaffected.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real file descriptor 2 (some embedded consoles)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow() -> Any:
    """Import TensorFlow quietly (see ``quiet_tensorflow``) and return the module."""
    quiet_tensorflow()
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    with native_stderr_silenced():
        import tensorflow as tf
    return tf


def quiet_tensorflow() -> None:
    """Silence TensorFlow's start-up noise and Python-side info logs (changes global settings).

    Sets environment variables for TensorFlow's C++ logs (effective when TensorFlow has not yet
    been imported) and lowers the ``tensorflow`` and ``absl`` Python loggers to errors.
    """
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="tensorflow")
    warnings.filterwarnings("ignore", message=".*np.object.*")
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:  # pragma: no cover - absl comes with TensorFlow
        pass
