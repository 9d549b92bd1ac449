"""The first cell of every notebook: quiet TensorFlow, seed everything, create logical devices."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
import warnings
from collections.abc import Iterator
from typing import Any

# Environment variables that must be set before TensorFlow is imported to silence its start-up.
_QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",  # C++ INFO/WARNING/ERROR logs
    "TF_ENABLE_ONEDNN_OPTS": "0",  # else TensorFlow prints a oneDNN notice on stderr at import
    "GRPC_VERBOSITY": "ERROR",
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


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy, TensorFlow and Keras; with ``deterministic``, enable op determinism."""
    quiet_tensorflow()
    import keras
    import numpy as np
    import tensorflow as tf

    random.seed(seed)
    np.random.seed(seed)
    keras.utils.set_random_seed(seed)
    tf.random.set_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def setup(
    logical_devices: int | None = None,
    seed: int | None = 42,
    deterministic: bool = False,
    quiet: bool = True,
    gpu_memory_limit_mb: int | None = None,
) -> Any:
    """Prepare TensorFlow for a lesson and print one line describing the machine.

    Quiets TensorFlow (``quiet``), seeds everything (``seed``; op determinism when
    ``deterministic``), and splits the first CPU into ``logical_devices`` logical devices (or
    the first GPU, with ``gpu_memory_limit_mb`` each, when a GPU is present and a limit is
    given). Safe to run twice with the same arguments; asking for another device layout after
    TensorFlow started raises a message that says to restart the kernel.
    Returns the ``course_utils.devices.Hardware`` summary.
    """
    from course_utils import devices

    if quiet:
        quiet_tensorflow()
    tf = import_tensorflow()
    if quiet:
        tf.get_logger().setLevel(logging.ERROR)
        tf.autograph.set_verbosity(0)
    # TensorFlow's C++ layer reports its platform probing ("failed call to cuInit" on a
    # machine without a GPU) on the native stderr while it lists and creates devices.
    with native_stderr_silenced() if quiet else contextlib.nullcontext():
        if logical_devices:
            if gpu_memory_limit_mb and tf.config.list_physical_devices("GPU"):
                devices.configure_logical_devices(logical_devices, "GPU", gpu_memory_limit_mb)
            else:
                devices.configure_logical_devices(logical_devices, "CPU")
        tf.config.list_logical_devices()  # TensorFlow creates its devices here
    if seed is not None:
        seed_everything(seed, deterministic=deterministic)
    hw = devices.hardware()
    print(devices.describe_machine(hw))
    return hw
