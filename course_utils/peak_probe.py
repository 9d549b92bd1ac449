"""The measured side of ``cu.memory``: how far one gradient step raises the peak resident memory
of a fresh CPU-only TensorFlow process, without and with ``tf.recompute_grad``."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["gradient_step_peak_rises"]


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
    import tensorflow as tf  # stderr is the parent's to read; TensorFlow's defaults

    if tf.config.list_physical_devices("GPU"):
        raise RuntimeError("the memory probe must run in a CPU-only process")

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


def _forked_probes(width: int, depth: int, blocks: int, batch: int) -> dict[str, int]:
    """In this (fresh) process: import TensorFlow once, run nothing, then fork one child per
    version, side by side; each child measures its own step (``_probe``)."""
    import os
    import traceback

    import keras  # noqa: F401  imported before the fork: the children skip the import
    import tensorflow  # noqa: F401  no op, device or context made before the fork

    children = {}
    for name, recompute in (("plain", False), ("recomputed", True)):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own TensorFlow runtime, made after the fork
            os.close(read)
            code = 1
            try:
                os.write(write, str(_probe(width, depth, blocks, batch, recompute)).encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        children[name] = (pid, read)
    rises = {}
    for name, (pid, read) in children.items():
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read()
        if os.waitpid(pid, 0)[1] != 0 or not answer:
            raise RuntimeError(f"the memory probe ({name}) failed")
        rises[name] = int(answer)
    return rises


def gradient_step_peak_rises(width: int, depth: int, blocks: int, batch: int,
                             timeout: float = 240.0) -> dict[str, int]:
    """``{"plain": bytes, "recomputed": bytes}``: how far one gradient step raises the peak
    resident memory of a **fresh CPU-only** TensorFlow process, without and with
    ``tf.recompute_grad``.

    The model is ``blocks`` blocks of ``depth`` Dense layers of ``width`` units, each block
    wrapped in ``tf.recompute_grad`` for the second number. A process's peak holds
    whatever the process ran before (Linux resets it only to the current size, and memory an
    allocator freed stays resident for reuse), so each measurement gets a process of its own,
    the two side by side: on Linux one fresh
    process (``course_utils.child.start_cpu_only``: every GPU hidden, TensorFlow's defaults
    otherwise) imports TensorFlow once and forks one child per version before it runs
    anything, as lesson 03's check workers are forked; elsewhere two fresh processes. What they
    measure is host memory of a step that runs on the CPU, on any machine; on a GPU, read
    ``tf.config.experimental.get_memory_info`` instead.
    """
    if min(width, depth, blocks, batch) < 1:
        raise ValueError("width, depth, blocks and batch must all be at least 1")
    from course_utils.child import start_cpu_only

    sizes = [width, depth, blocks, batch]
    if sys.platform == "linux":  # one import, two forked children
        jobs = {"both": [*sizes, None]}
    else:
        jobs = {"plain": [*sizes, False], "recomputed": [*sizes, True]}
    children = {name: start_cpu_only(["-m", "course_utils.peak_probe", json.dumps(arguments)])
                for name, arguments in jobs.items()}
    rises: dict[str, int] = {}
    try:
        for name, child in children.items():
            out, err = child.communicate(timeout=timeout)
            if child.returncode != 0:
                raise RuntimeError(f"the memory probe ({name}) failed: {err.strip()[-1500:]}")
            answer = json.loads(out.strip().splitlines()[-1])
            rises.update(answer if isinstance(answer, dict) else {name: int(answer)})
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    return rises


if __name__ == "__main__":  # the probe's process: python -m course_utils.peak_probe '[...]'
    _width, _depth, _blocks, _batch, _recompute = json.loads(sys.argv[1])
    if _recompute is None:  # both versions, forked from this process
        print(json.dumps(_forked_probes(_width, _depth, _blocks, _batch)))
    else:
        print(json.dumps(_probe(_width, _depth, _blocks, _batch, _recompute)))
