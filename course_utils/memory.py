"""Memory of a training step, counted from shapes: activations per example, weights, batch limits.

On a GPU TensorFlow reports its allocator's peak; on a CPU it reports nothing per step, and the
process's peak resident memory only grows. Counting from the layers' shapes is exact, works
everywhere, and is what decides whether a batch fits: the activations a backward pass keeps
grow with the batch, the weights, gradients and optimizer slots do not.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

__all__ = ["activation_bytes_per_example", "gradient_step_peak_rises", "limit_batch_size",
           "variable_bytes"]


def _dtype_bytes(dtype: Any) -> int:
    from course_utils.quiet import import_tensorflow

    return import_tensorflow().as_dtype(dtype).size


def activation_bytes_per_example(model: Any) -> int:
    """Bytes of every layer's output for one example: what the backward pass keeps, per example.

    Input layers are left out (the batch itself is not an activation). A lower bound: some
    layers also keep intermediate values (e.g. a Dense layer's pre-activation).
    """
    total = 0
    for layer in model.layers:
        if type(layer).__name__ == "InputLayer":
            continue
        outputs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
        for output in outputs:
            total += math.prod(int(d) for d in output.shape[1:]) * _dtype_bytes(output.dtype)
    return total


def variable_bytes(model: Any) -> int:
    """Bytes of the model's weights (trainable and not)."""
    return sum(math.prod(int(d) for d in v.shape) * _dtype_bytes(v.dtype)
               for v in model.weights)


def _keras() -> Any:
    from course_utils.quiet import import_tensorflow

    import_tensorflow()
    import keras

    return keras


_LIMIT_CLASS: list[type] = []


def _batch_size_limit_class() -> type:
    """The layer class (made on first use, so that importing this module stays cheap)."""
    if _LIMIT_CLASS:
        return _LIMIT_CLASS[0]
    keras = _keras()
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()

    class BatchSizeLimit(keras.layers.Layer):
        """Passes its input on, or fails like an out-of-memory error above ``max_batch_size``."""

        def __init__(self, max_batch_size: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_batch_size = int(max_batch_size)

        def call(self, inputs: Any) -> Any:
            check = tf.debugging.assert_less_equal(
                tf.shape(inputs)[0], self.max_batch_size,
                message=f"out of memory (simulated): a batch larger than {self.max_batch_size} "
                        "examples does not fit")
            with tf.control_dependencies([check]):
                return tf.identity(inputs)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "max_batch_size": self.max_batch_size}

    _LIMIT_CLASS.append(BatchSizeLimit)
    return BatchSizeLimit


def limit_batch_size(model: Any, max_batch_size: int) -> Any:
    """``model`` behind a layer that fails on batches over ``max_batch_size`` (shared weights)."""
    keras = _keras()
    inputs = keras.Input(shape=model.input_shape[1:], name="features")
    limited = _batch_size_limit_class()(max_batch_size, name="batch_size_limit")(inputs)
    return keras.Model(inputs, model(limited), name=f"{model.name}_limited")


# --- measured: the rise of a fresh process's peak memory over one gradient step ----------------


def _reset_peak_rss() -> bool:
    """Reset this process's peak resident memory to its current size (Linux: ``5`` written to
    ``/proc/self/clear_refs`` resets ``VmHWM``); False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    """This process's peak resident memory: ``VmHWM`` on Linux (resettable), else rusage."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux: KiB


def _probe(width: int, depth: int, blocks: int, batch: int, recompute: bool) -> int:
    """In this (fresh) process: trace the step, then run it once; the peak's rise in bytes."""
    import keras
    import tensorflow as tf  # stderr is the parent's to read; oneDNN as TensorFlow ships it

    stack = [keras.Sequential([keras.layers.Dense(width, activation="relu")
                               for _ in range(depth)]) for _ in range(blocks)]
    for block in stack:
        block.build((None, width))
    variables = [v.value for block in stack for v in block.trainable_variables]
    features = tf.random.normal([batch, width])

    @tf.function
    def gradients(x: Any) -> Any:
        with tf.GradientTape() as tape:
            for block in stack:
                x = tf.recompute_grad(block)(x) if recompute else block(x)
            loss = tf.reduce_mean(x)
        return tape.gradient(loss, variables)

    gradients.get_concrete_function(features)  # tracing is not the step
    _reset_peak_rss()  # else tracing's own peak may hide the step's (then the rise reads 0)
    before = _peak_rss_bytes()
    gradients(features)
    return _peak_rss_bytes() - before


def gradient_step_peak_rises(width: int, depth: int, blocks: int, batch: int,
                             timeout: float = 240.0) -> dict[str, int]:
    """``{"plain": bytes, "recomputed": bytes}``: how far one gradient step raises the peak
    resident memory of a **fresh** process, without and with ``tf.recompute_grad``.

    The model is ``blocks`` blocks of ``depth`` Dense layers of ``width`` units, each block
    wrapped in ``tf.recompute_grad`` for the second number. A process's peak only grows, so
    each measurement gets a process of its own; the two run side by side. Works on any machine
    (CPU memory), where TensorFlow's ``get_memory_info`` reports GPUs only. The children run
    TensorFlow's default kernels (oneDNN on, which the course's quiet import turns off):
    without them the CPU executor's peak varies from run to run by more than recomputation
    saves.
    """
    if min(width, depth, blocks, batch) < 1:
        raise ValueError("width, depth, blocks and batch must all be at least 1")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    children = {name: subprocess.Popen(
        [sys.executable, "-m", "course_utils.memory",
         json.dumps([width, depth, blocks, batch, recompute])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, recompute in (("plain", False), ("recomputed", True))}
    rises = {}
    try:
        for name, child in children.items():
            out, err = child.communicate(timeout=timeout)
            if child.returncode != 0:
                raise RuntimeError(f"the memory probe ({name}) failed: {err.strip()[-1500:]}")
            rises[name] = int(out.strip().splitlines()[-1])
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    return rises


if __name__ == "__main__":  # the probe's child process: python -m course_utils.memory '[...]'
    print(_probe(*json.loads(sys.argv[1])))
