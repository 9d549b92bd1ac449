"""The first cell of every notebook: quiet TensorFlow, seed everything, create logical devices."""

from __future__ import annotations

import contextlib
import logging
import random

from course_utils import devices
from course_utils.quiet import import_tensorflow, native_stderr_silenced, quiet_tensorflow
from course_utils.settings import settings_line

__all__ = ["seed_everything", "setup"]


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
) -> None:
    """Prepare TensorFlow for a lesson and print one line describing the machine.

    Quiets TensorFlow (``quiet``), seeds everything (``seed``; op determinism when
    ``deterministic``), and splits the first CPU into ``logical_devices`` logical devices; on a
    machine with exactly one GPU it splits the GPU too, ``gpu_memory_limit_mb`` each (default
    1024), so that the GPU strategies have several replicas (``devices.logical_device_plan``).
    Safe to run twice with the same arguments; asking for another device layout after
    TensorFlow started raises a message that says to restart the kernel.
    It prints a second line saying which settings the course made (``cu.settings``): the
    logical devices, the seed, op determinism when asked (Keras then turns its automatic XLA
    off) and log filters; TensorFlow's math (oneDNN) keeps its defaults.
    Returns nothing, so the set-up cell shows its lines and no value under it;
    ``cu.hardware()`` gives the summary as an object.
    """
    if quiet:
        quiet_tensorflow()
    tf = import_tensorflow()
    if quiet:
        tf.get_logger().setLevel(logging.ERROR)
        tf.autograph.set_verbosity(0)
    # TensorFlow's C++ layer reports its platform probing ("failed call to cuInit" on a
    # machine without a GPU) on the native stderr while it lists and creates devices.
    with native_stderr_silenced() if quiet else contextlib.nullcontext():
        plan = devices.logical_device_plan(logical_devices,
                                           len(tf.config.list_physical_devices("GPU")))
        for device_type, count in plan.items():
            devices.configure_logical_devices(count, device_type, gpu_memory_limit_mb)
        tf.config.list_logical_devices()  # TensorFlow creates its devices here
    if seed is not None:
        seed_everything(seed, deterministic=deterministic)
    print(devices.describe_machine(devices.hardware()))
    print(settings_line(seed, split=bool(plan), deterministic=deterministic))
