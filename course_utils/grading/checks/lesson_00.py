"""Checks of lesson 00's exercises (set-up): batch sizes, learning-rate scaling, devices.

Each check takes the learner's function, builds cases from fresh random inputs, computes the
expected results with a reference and hands both to :func:`run_check`. A check is registered by
name with ``@register`` (TensorFlow imported inside the function, never at module level) and
called from a check cell as ``cu.grading.check_<function name>(<function>)``.
"""

from __future__ import annotations

from typing import Any

from course_utils.environment import import_tensorflow as _tf  # quiet, on first use
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["check_global_batch_size", "check_logical_cpu_names", "check_mirrored_strategy",
           "check_scaled_learning_rate"]

# --- 00 · set-up --------------------------------------------------------------------------


@register
def check_global_batch_size(fn: Any) -> bool:
    """Check ``global_batch_size(per_replica_batch_size, num_replicas)``."""
    rng = fresh_rng()
    pairs = [(1, 1), (rng.randint(2, 512), 1)]
    pairs += [(rng.randint(1, 512), rng.randint(2, 64)) for _ in range(4)]
    cases = [Case(args=(batch, replicas), expected=batch * replicas) for batch, replicas in pairs]
    return run_check("global_batch_size", fn, cases,
                     hint="every replica takes its own per-replica batch in each step.")


@register
def check_scaled_learning_rate(fn: Any) -> bool:
    """Check ``scaled_learning_rate(base_learning_rate, base_batch_size, global_batch_size)``."""
    rng = fresh_rng()
    cases = [Case(args=(0.1, 256, 256), expected=0.1), Case(args=(0.1, 256, 128), expected=0.05)]
    for _ in range(4):
        base_lr = round(10 ** rng.uniform(-4, -1), 6)
        base_batch = rng.choice([32, 64, 128, 256])
        global_batch = 8 * rng.randint(1, 512)
        cases.append(Case(args=(base_lr, base_batch, global_batch),
                          expected=base_lr * global_batch / base_batch))
    return run_check("scaled_learning_rate", fn, cases, rtol=1e-6,
                     hint="the linear scaling rule multiplies the learning rate by "
                          "global_batch_size / base_batch_size (use true division).")


@register
def check_logical_cpu_names(fn: Any) -> bool:
    """Check ``logical_cpu_names()`` against TensorFlow's list of logical CPU devices."""
    tf = _tf()
    expected = [device.name for device in tf.config.list_logical_devices("CPU")]
    return run_check("logical_cpu_names", fn, [Case(expected=expected, label="()")],
                     hint='tf.config.list_logical_devices("CPU") lists them; '
                          "return each device's .name, in order.")


@register
def check_mirrored_strategy(fn: Any) -> bool:
    """Check ``mirrored_strategy(device_names)``: a MirroredStrategy over exactly those devices."""
    tf = _tf()
    names = [device.name for device in tf.config.list_logical_devices("CPU")]
    rng = fresh_rng()
    subsets = [names]
    if len(names) > 1:
        subsets.append(sorted(rng.sample(names, rng.randint(1, len(names) - 1)),
                              key=names.index))

    def key(device: str) -> tuple[str, int]:
        spec = tf.DeviceSpec.from_string(device)
        return (spec.device_type or "", spec.device_index or 0)

    def verifier(devices: list[str]) -> Any:
        def verify(strategy: Any) -> str | None:
            if not isinstance(strategy, tf.distribute.MirroredStrategy):
                return (f"expected a tf.distribute.MirroredStrategy, got "
                        f"{type(strategy).__name__}")
            if strategy.num_replicas_in_sync != len(devices):
                return (f"expected {len(devices)} replicas in sync, got "
                        f"{strategy.num_replicas_in_sync}")
            used = sorted(key(d) for d in strategy.extended.worker_devices)
            if used != sorted(key(d) for d in devices):
                return (f"expected replicas on {devices}, got "
                        f"{list(strategy.extended.worker_devices)}")
            return None

        return verify

    cases = [Case(args=(subset,), label=f"({subset!r})", verify=verifier(subset))
             for subset in subsets]
    return run_check("mirrored_strategy", fn, cases,
                     hint="tf.distribute.MirroredStrategy(devices=...) takes the device names.")

