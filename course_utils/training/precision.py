"""Mixed precision for the Trainer: the policy scope, loss scaling and non-finite steps.

Under ``"mixed_float16"`` and ``"mixed_bfloat16"`` layers compute in 16 bits and keep float32
variables. Keras's global dtype policy is set only while the model is created and built
(:func:`policy_scope`), never left changed. float16 needs loss scaling: the optimizer is wrapped
in a ``LossScaleOptimizer``, whose ``scale_loss`` multiplies the loss before the gradients and
whose ``apply`` unscales them and skips a step with non-finite gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from course_utils.quiet import import_tensorflow

tf = import_tensorflow()

import keras  # noqa: E402  (after TensorFlow, which must be imported quietly first)

__all__ = [
    "PRECISION_POLICIES",
    "check_policy",
    "policy_scope",
    "scale_loss",
    "skip_everywhere_if_not_finite",
    "to_float32",
    "uses_loss_scaling",
    "with_loss_scaling",
]

#: Precision policies the Trainer accepts (``None`` means float32).
PRECISION_POLICIES = (None, "float32", "mixed_float16", "mixed_bfloat16")


def check_policy(policy: str | None) -> str | None:
    """Validate a precision policy; return it, or None for float32."""
    if policy not in PRECISION_POLICIES:
        raise ValueError(
            f"unknown precision policy {policy!r}; use one of "
            f"{', '.join(repr(p) for p in PRECISION_POLICIES)}"
        )
    return None if policy == "float32" else policy


@contextlib.contextmanager
def policy_scope(policy: str | None) -> Iterator[None]:
    """Set Keras's global dtype policy to ``policy`` inside the block and restore it after."""
    previous_policy = keras.config.dtype_policy()
    try:
        if policy is not None:
            keras.mixed_precision.set_dtype_policy(policy)
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(previous_policy)


def with_loss_scaling(optimizer: Any, policy: str | None) -> Any:
    """The optimizer, wrapped in a ``LossScaleOptimizer`` when ``policy`` is float16."""
    if policy == "mixed_float16" and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def uses_loss_scaling(optimizer: Any) -> bool:
    """True when the optimizer scales the loss (a ``LossScaleOptimizer``)."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def scale_loss(optimizer: Any, loss: tf.Tensor) -> tf.Tensor:
    """The loss to differentiate: scaled up by a ``LossScaleOptimizer``, else unchanged."""
    return optimizer.scale_loss(loss) if uses_loss_scaling(optimizer) else loss


def to_float32(structure: Any) -> Any:
    """Cast every tensor of a (nested) structure to float32 (model outputs for losses, metrics)."""
    return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), structure)


def skip_everywhere_if_not_finite(context: Any, grads: list[Any]) -> list[Any]:
    """Poison every replica's gradients when any replica's are not finite.

    Keras's LossScaleOptimizer decides from the first replica's (not yet all-reduced)
    gradients, so an inf on another replica would be applied. Agreeing first makes every
    replica skip the step and lower the loss scale together. Call it in replica context.
    """
    present = [g for g in grads if g is not None]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present])
    bad = context.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
    first = next(i for i, g in enumerate(grads) if g is not None)
    poison = tf.where(bad > 0, tf.constant(float("nan")), tf.constant(1.0))
    grads = list(grads)
    grads[first] = grads[first] * tf.cast(poison, grads[first].dtype)
    return grads
