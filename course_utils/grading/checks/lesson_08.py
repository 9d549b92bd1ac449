"""Checks of lesson 08's exercises (registered by name with ``@register``).

* ``check_train_with_policy(train_with_policy)``: the same model trained under ``"float32"``
  and ``"mixed_float16"`` on fresh data; both trained (the loss fell), the policy really applied
  (16-bit compute in the hidden layers, float32 variables and outputs, a LossScaleOptimizer for
  float16), the global policy restored, and a time per step reported. It prints the comparison.
* ``check_loss_scaled_train_step(loss_scaled_train_step)``: steps of a mixed_float16 model with
  a ``LossScaleOptimizer`` on fresh inputs equal a reference step (weights, loss, loss scale),
  and a batch planted to overflow is skipped (weights unchanged, scale halved).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.environment import import_tensorflow as _tf  # quiet, on first use
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["OVERFLOW_FACTOR", "check_loss_scaled_train_step", "check_train_with_policy"]

#: The planted batch is the inputs times this: float16 activations overflow (max 65504).
OVERFLOW_FACTOR = 1e6


def _keras() -> Any:
    _tf()
    import keras

    return keras


def _task(rng: Any, num_examples: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Fresh inputs and labels of a learnable task (a random teacher), with its sizes."""
    from course_utils.data import teacher_classification

    num_features, num_classes = rng.choice([8, 12, 16]), rng.choice([3, 4, 5])
    x, y = teacher_classification(num_examples, num_features, num_classes,
                                  seed=rng.randint(0, 10_000))
    return x, y, num_features, num_classes


def _model_builder(num_features: int, num_classes: int, units: int) -> Callable[[], Any]:
    from course_utils.models import mlp

    return lambda: mlp(num_features, num_classes, hidden_units=(units, units))


# --- Exercise 1 · regular versus mixed-precision training ------------------------------------


def _policy_problem(model: Any, policy: str, x: np.ndarray) -> str | None:
    """What is wrong with the dtypes of a model trained under ``policy`` (None if nothing)."""
    keras = _keras()
    compute = "float16" if policy == "mixed_float16" else "float32"
    hidden = [layer for layer in model.layers if layer.weights][:-1]
    wrong = [f"{layer.name}: {layer.compute_dtype}" for layer in hidden
             if layer.compute_dtype != compute]
    if wrong:
        return (f"under {policy!r} the hidden layers should compute in {compute}, got "
                f"{', '.join(wrong)}: build the model inside the policy (policy_scope)")
    not_float32 = [v.path for v in model.weights if v.dtype != "float32"]
    if not_float32:
        return f"every variable should stay float32, got other dtypes for {not_float32[:3]}"
    output_dtype = keras.backend.standardize_dtype(model(x[:4]).dtype)
    if output_dtype != "float32":
        return f"the model's output should be float32 (for the loss), got {output_dtype}"
    scaled = isinstance(getattr(model, "optimizer", None), keras.optimizers.LossScaleOptimizer)
    if policy == "mixed_float16" and not scaled:
        return ("under 'mixed_float16' the model should be compiled with a LossScaleOptimizer "
                "(Keras wraps the optimizer when the model is compiled under the policy)")
    return None


@register
def check_train_with_policy(fn: Any) -> bool:
    """Check ``train_with_policy(make_model, policy, x, y, epochs)``: trained, policy applied."""
    keras = _keras()
    rng = fresh_rng()
    x, y, num_features, num_classes = _task(rng, 512)
    make_model = _model_builder(num_features, num_classes, rng.choice([32, 48]))
    epochs = 3
    seconds: dict[str, float] = {}

    def verifier(policy: str) -> Callable[[Any], str | None]:
        def verify(result: Any) -> str | None:
            if keras.mixed_precision.global_policy().name != "float32":
                name = keras.mixed_precision.global_policy().name
                keras.mixed_precision.set_global_policy("float32")
                return (f"the global policy was left at {name!r}: restore 'float32' after "
                        "building (a try/finally, or cu.training.policy_scope)")
            if not isinstance(result, dict) or set(result) != {"model", "losses",
                                                                "seconds_per_step"}:
                return ("expected a dict with the keys 'model', 'losses' and "
                        f"'seconds_per_step', got {type(result).__name__} "
                        f"{sorted(result) if isinstance(result, dict) else ''}")
            losses = [float(v) for v in result["losses"]]
            if len(losses) != epochs:
                return f"expected one loss per epoch ({epochs}), got {len(losses)}"
            if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0]:
                return f"the model did not train: losses per epoch {losses}"
            problem = _policy_problem(result["model"], policy, x)
            if problem:
                return problem
            step = result["seconds_per_step"]
            if isinstance(step, bool) or not isinstance(step, (int, float)) or not (
                    0 < step < 60):
                return f"seconds_per_step should be a positive number of seconds, got {step!r}"
            seconds[policy] = float(step)
            return None

        return verify

    cases = [Case(args=(make_model, policy, x, y, epochs), verify=verifier(policy),
                  label=f"(make_model, {policy!r}, x, y, epochs={epochs})")
             for policy in ("float32", "mixed_float16")]
    passed = run_check(
        "train_with_policy", fn, cases,
        hint="build the model inside cu.training.policy_scope(policy), compile it "
             "there with Adam and SparseCategoricalCrossentropy(from_logits=True), fit, and "
             "divide the time of the epochs after the first by their steps (lesson 08, "
             "sections 3 and 4).")
    if passed:
        ratio = seconds["mixed_float16"] / seconds["float32"]
        print(f"   your timings: float32 {seconds['float32'] * 1e3:.1f} ms/step, mixed_float16 "
              f"{seconds['mixed_float16'] * 1e3:.1f} ms/step (×{ratio:.2f})")
    return passed


# --- Exercise 2 · the loss-scaled custom train step ------------------------------------------


def _reference_step(model: Any, optimizer: Any, loss_fn: Any, x: Any, y: Any) -> Any:
    tf = _tf()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        scaled_loss = optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled_loss, model.trainable_variables)
    optimizer.apply(gradients, model.trainable_variables)
    return loss


def _largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b, strict=True))


@register
def check_loss_scaled_train_step(fn: Any) -> bool:
    """Check ``loss_scaled_train_step(model, optimizer, loss_fn, x, y)`` against a reference."""
    tf = _tf()
    keras = _keras()
    from course_utils.training.precision import policy_scope

    rng = fresh_rng()
    x, y, num_features, num_classes = _task(rng, 8 * 32)
    make_model = _model_builder(num_features, num_classes, rng.choice([16, 24, 32]))
    with policy_scope("mixed_float16"):
        model, reference = make_model(), make_model()
    reference.set_weights(model.get_weights())
    scale = 2.0 ** rng.randint(10, 15)

    def optimizer() -> Any:
        inner = keras.optimizers.SGD(0.05)
        return keras.optimizers.LossScaleOptimizer(inner, initial_scale=scale,
                                                   dynamic_growth_steps=3)

    opt, reference_opt = optimizer(), optimizer()
    opt.build(model.trainable_variables)  # built before the first step, as in lesson 02
    reference_opt.build(reference.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    planted = rng.randint(2, 5)
    batches = [(tf.constant(x[i * 32:(i + 1) * 32] * (OVERFLOW_FACTOR if i == planted else 1)),
                tf.constant(y[i * 32:(i + 1) * 32])) for i in range(8)]

    def compare_step(i: int, loss: Any) -> str | None:
        expected = float(_reference_step(reference, reference_opt, loss_fn, *batches[i]))
        where = f"step {i + 1}{' (the planted overflow)' if i == planted else ''}"
        try:
            got = float(loss)
        except (TypeError, ValueError):
            return f"{where}: return the loss (a scalar tensor), got {type(loss).__name__}"
        if i != planted and not math.isclose(got, expected, rel_tol=1e-3, abs_tol=1e-5):
            ratio = f" ({got / expected:.3g}× the expected)" if expected else ""
            return f"{where}: returned loss {got:.6g}, expected the unscaled {expected:.6g}{ratio}"
        error = _largest_difference(model.get_weights(), reference.get_weights())
        if not error < 1e-4:
            return (f"{where}: the weights differ from the reference step's by up to {error:.3g} "
                    "(gradients of the scaled loss, applied by the LossScaleOptimizer)")
        if float(opt.dynamic_scale) != float(reference_opt.dynamic_scale):
            return (f"{where}: loss scale {float(opt.dynamic_scale):g}, expected "
                    f"{float(reference_opt.dynamic_scale):g}: let the LossScaleOptimizer itself "
                    "apply the gradients (it grows and halves the scale, and skips bad steps)")
        return None

    def verify(first_loss: Any) -> str | None:
        problem = compare_step(0, first_loss)
        for i in range(1, len(batches)):
            if problem:
                return problem
            before, scale_before = model.get_weights(), float(opt.dynamic_scale)
            loss = fn(model, opt, loss_fn, *batches[i])
            if i == planted and _largest_difference(before, model.get_weights()) != 0:
                return (f"step {i + 1}, the planted overflow, changed the weights: a step with "
                        "non-finite gradients must be skipped (optimizer.apply does it)")
            if i == planted and float(opt.dynamic_scale) != scale_before / 2:
                return (f"step {i + 1}, the planted overflow, was not seen as one: the loss scale "
                        f"should have halved from {scale_before:g}, it is "
                        f"{float(opt.dynamic_scale):g}; pass the gradients unchanged to "
                        "optimizer.apply, which checks them")
            problem = compare_step(i, loss)
        if problem:
            return problem
        skipped = len(batches) - int(opt.iterations)
        if skipped != 1:
            return f"expected exactly 1 skipped step (the planted overflow), got {skipped}"
        print(f"   {len(batches)} steps equal to the reference (scale 2^{math.log2(scale):.0f} "
              f"at the start); the planted overflow at step {planted + 1} was skipped")
        return None

    cases = [Case(args=(model, opt, loss_fn, *batches[0]), verify=verify,
                  label=f"(mixed_float16 MLP, LossScaleOptimizer(initial_scale={scale:g}), "
                        f"loss_fn, 8 batches of 32; batch {planted + 1} overflows)")]
    return run_check(
        "loss_scaled_train_step", fn, cases,
        hint="inside a tf.GradientTape compute the mean loss, then scaled = "
             "optimizer.scale_loss(loss); take the gradients of `scaled`, call "
             "optimizer.apply(gradients, model.trainable_variables) and return the unscaled "
             "loss (lesson 08, section 5).")
