"""Lesson 08, exercise 2: the loss-scaled custom train step with gradient clipping (registered
with ``@register``; the contract is in :mod:`course_utils.grading.checks.lesson_08`'s docstring)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from course_utils.equality import largest_difference
from course_utils.grading.checks.answer_reach import guarded, plain_number, weights_of
from course_utils.grading.checks.overflow import _inputs as _task
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["GROWTH_STEPS", "LOSS_WEIGHT", "OVERFLOW_FACTOR", "check_loss_scaled_train_step"]

#: The planted batch is the inputs times this: float16 activations overflow (max 65504).
OVERFLOW_FACTOR = 1e6
#: Exercise 2's loss scale doubles after this many finite steps: from the edge of float16's
#: range (where the check starts it), some later steps overflow in the backward pass. Not 1:
#: a step that doubles the scale itself after every finite step misses (r08 L10).
GROWTH_STEPS = 2
#: Exercise 2's loss is weighted by this (an auxiliary loss's small weight): its true gradients
#: lie mostly below float16's smallest normal number, so only a step that computes them at the
#: loss scale matches the reference; the learning rate is divided by it (updates of usual size).
LOSS_WEIGHT = 2.0 ** -18



def _keras() -> Any:
    _tf()
    import keras

    return keras


def _model_builder(num_features: int, num_classes: int, units: int) -> Callable[[], Any]:
    from course_utils.models import mlp

    return lambda: mlp(num_features, num_classes, hidden_units=(units, units))


# --- Exercise 2 · the loss-scaled custom train step, with gradient clipping ------------------


def _reference_step(model: Any, optimizer: Any, loss_fn: Any, x: Any, y: Any,
                    clip_norm: float) -> tuple[Any, Any]:
    """The step done right: unscale, clip the global norm, scale again, let the optimizer apply
    (it divides by the scale and skips non-finite gradients: clipping an inf norm gives nan)."""
    tf = _tf()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        scaled_loss = optimizer.scale_loss(loss)
    scaled = tape.gradient(scaled_loss, model.trainable_variables)
    unscaled = [g / optimizer.dynamic_scale for g in scaled]
    clipped, norm = tf.clip_by_global_norm(unscaled, clip_norm)
    optimizer.apply([g * optimizer.dynamic_scale for g in clipped], model.trainable_variables)
    return loss, norm


def _applied_norms(model: Any, optimizer: Any, loss_fn: Any, batches: list[Any]) -> list[float]:
    """The unscaled gradients' global norms of the steps the reference applies, unclipped (on
    a copy: ``model`` and ``optimizer`` are the check's spares)."""
    norms = []
    for x, y in batches:
        before = int(optimizer.iterations)
        _, norm = _reference_step(model, optimizer, loss_fn, x, y, 1e30)
        if int(optimizer.iterations) > before:
            norms.append(float(norm))
    return norms


def _weighted_loss(keras: Any) -> Callable[[Any, Any], Any]:
    """Per-example cross-entropy times LOSS_WEIGHT: a loss whose gradients need the scale."""
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                               reduction=None)

    def loss_fn(labels: Any, logits: Any) -> Any:
        return cross_entropy(labels, logits) * LOSS_WEIGHT

    return loss_fn


def _edge_scale(model: Any, loss_fn: Any, x: Any, y: Any) -> float:
    """The largest power of two at which this batch's scaled gradients are still finite:
    twice it, the backward pass overflows float16."""
    tf = _tf()
    exponent = 0
    while exponent < 120:
        with tf.GradientTape() as tape:
            scaled = tf.reduce_mean(loss_fn(y, model(x, training=True))) * 2.0 ** (exponent + 1)
        gradients = tape.gradient(scaled, model.trainable_variables)
        if not all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in gradients):
            return 2.0 ** exponent
        exponent += 1
    raise RuntimeError("the check's gradients never overflowed float16")


def _read_after_apply(before: float, after: float) -> Callable[[float, float], str]:
    """A note for a returned value off by the ratio of the loss scale before the step's
    ``apply`` to after it: the learner divided by ``dynamic_scale`` read after ``apply``."""

    def note(got: float, expected: float) -> str:
        if before == after or not expected or not math.isclose(got / expected, before / after,
                                                               rel_tol=1e-3):
            return ""
        return (f": the loss scale before this step's apply over the scale after it, "
                f"2^{math.log2(before):.0f} over 2^{math.log2(after):.0f}. optimizer.apply "
                "changes optimizer.dynamic_scale (it doubles it after "
                f"dynamic_growth_steps={GROWTH_STEPS} finite steps in a row): read the scale "
                "before you apply")

    return note


@register
def check_loss_scaled_train_step(fn: Any) -> bool:
    """Check ``loss_scaled_train_step(model, optimizer, loss_fn, x, y, clip_norm)`` against a
    reference: weights, loss, the unscaled gradients' global norm, the loss scale and which
    steps were skipped."""
    tf = _tf()
    keras = _keras()
    from course_utils.training.precision import policy_scope

    fn = guarded("loss_scaled_train_step", fn, [sys.modules[__name__]],
                 "write the step yourself (section 5), not the check's reference",
                 but=["_weighted_loss"])  # it makes the loss_fn the step is handed
    rng = fresh_rng()
    x, y, num_features, num_classes = _task(rng, 8 * 32)
    make_model = _model_builder(num_features, num_classes, rng.choice([16, 24, 32]))
    with policy_scope("mixed_float16"):
        model, reference, trial = make_model(), make_model(), make_model()
    reference.set_weights(model.get_weights())
    trial.set_weights(model.get_weights())
    loss_fn = _weighted_loss(keras)
    planted = rng.randint(2, 5)
    batches = [(tf.constant(x[i * 32:(i + 1) * 32] * (OVERFLOW_FACTOR if i == planted else 1)),
                tf.constant(y[i * 32:(i + 1) * 32])) for i in range(8)]
    # the scale starts at the edge of float16's range for the first batch and doubles after
    # every finite step: later steps overflow in the backward pass and are skipped
    scale = _edge_scale(reference, loss_fn, *batches[0])

    def optimizer() -> Any:
        inner = keras.optimizers.SGD(0.05 / LOSS_WEIGHT)
        return keras.optimizers.LossScaleOptimizer(inner, initial_scale=scale,
                                                   dynamic_growth_steps=GROWTH_STEPS)

    opt, reference_opt, trial_opt = optimizer(), optimizer(), optimizer()
    opt.build(model.trainable_variables)  # built before the first step, as in lesson 02
    reference_opt.build(reference.trainable_variables)
    trial_opt.build(trial.trainable_variables)
    # a bound amid the applied steps' norms: some steps are clipped, some not (r08 L9)
    # (the widest gap between two norms with at least two on each side, at its middle: no
    # step lies near the bound, where a rounding would decide)
    norms = sorted(_applied_norms(trial, trial_opt, loss_fn, batches))
    gap = max(range(1, len(norms) - 2) or range(len(norms) - 1),
              key=lambda j: norms[j + 1] / norms[j])
    clip_norm = float(f"{math.sqrt(norms[gap] * norms[gap + 1]):.4g}")
    clipped_steps: list[int] = []
    unclipped_steps: list[int] = []
    backward_skips: list[int] = []

    def compare_step(i: int, returned: Any, applied: bool) -> str | None:
        where = f"step {i + 1}{' (the planted overflow)' if i == planted else ''}"
        # read at once, exact types only: a float subclass's __float__ ran later, by the check
        pair = [plain_number(v) for v in returned] if type(returned) in (tuple, list) else []
        if len(pair) != 2 or None in pair:
            return (f"{where}: return (loss, norm), two scalars (Python's or NumPy's numbers, "
                    f"or scalar tensors, not a subclass of them), got {type(returned).__name__}"
                    f"{[type(v).__name__ for v in returned] if pair else ''}")
        got, got_norm = (float(v) for v in pair)
        scale_before = float(reference_opt.dynamic_scale)
        updates_before = int(reference_opt.iterations)
        expected_loss, expected_norm = (float(v) for v in _reference_step(
            reference, reference_opt, loss_fn, *batches[i], clip_norm))
        expected_applied = int(reference_opt.iterations) > updates_before
        grown = _read_after_apply(scale_before, float(reference_opt.dynamic_scale))
        if i != planted and not math.isclose(got, expected_loss, rel_tol=1e-3,
                                          abs_tol=1e-5 * LOSS_WEIGHT):
            ratio = f" ({got / expected_loss:.3g}× the expected)" if expected_loss else ""
            return (f"{where}: returned loss {got:.6g}, expected the unscaled "
                    f"{expected_loss:.6g}{ratio}{grown(got, expected_loss)}")
        if i != planted and not expected_applied and applied:
            return (f"{where}: at the loss scale 2^{math.log2(scale_before):.0f} this batch's "
                    "gradients overflow float16 in the backward pass, so the step is skipped "
                    "and the scale halved; yours was applied. At which scale did your tape "
                    "compute the gradients, and did optimizer.apply get them as they were, inf "
                    "included?")
        if expected_applied and not math.isclose(got_norm, expected_norm, rel_tol=1e-3):
            ratio = f", {got_norm / expected_norm:.3g}× the expected" if expected_norm else ""
            return (f"{where}: returned norm {got_norm:.6g}, expected {expected_norm:.6g}, the "
                    f"global norm of the unscaled gradients before clipping{ratio}"
                    f"{grown(got_norm, expected_norm)}")
        if not expected_applied and math.isfinite(got_norm):
            return (f"{where}: returned a finite norm {got_norm:.6g} for gradients that "
                    "overflowed (inf or nan): what changed them before you measured?")
        if i != planted and not expected_applied:
            backward_skips.append(i)
        if expected_applied and expected_norm > clip_norm:
            clipped_steps.append(i)
        elif expected_applied:
            unclipped_steps.append(i)
        error = largest_difference(weights_of(model), reference.get_weights())
        if not error < 1e-4:
            return (f"{where}: the weights differ from the reference step's by up to {error:.3g} "
                    f"(unscaled gradient norm {expected_norm:.4g}, clip_norm {clip_norm:g}): "
                    "at which scale did you clip, and at which did optimizer.apply get them?")
        if float(opt.dynamic_scale) != float(reference_opt.dynamic_scale):
            return (f"{where}: loss scale {float(opt.dynamic_scale):g}, expected "
                    f"{float(reference_opt.dynamic_scale):g}: the LossScaleOptimizer itself "
                    "grows and halves it when it applies: which optimizer applied yours?")
        return None

    def verify(first: Any) -> str | None:
        problem = compare_step(0, first, int(opt.iterations) > 0)
        for i in range(1, len(batches)):
            if problem:
                return problem
            before, scale_before = weights_of(model), float(opt.dynamic_scale)
            updates_before = int(opt.iterations)
            returned = fn(model, opt, loss_fn, *batches[i], clip_norm)
            if i == planted and largest_difference(before, weights_of(model)) != 0:
                return (f"step {i + 1}, the planted overflow, changed the weights: a step with "
                        "non-finite gradients is skipped (section 5)")
            if i == planted and float(opt.dynamic_scale) != scale_before / 2:
                return (f"step {i + 1}, the planted overflow, was not seen as one: the loss scale "
                        f"should have halved from {scale_before:g}, it is "
                        f"{float(opt.dynamic_scale):g}. What did optimizer.apply receive "
                        "for this step?")
            problem = compare_step(i, returned, int(opt.iterations) > updates_before)
        if problem:
            return problem
        skipped = len(batches) - int(opt.iterations)
        expected = len(batches) - int(reference_opt.iterations)
        if skipped != expected:
            return f"expected {expected} skipped steps, like the reference, got {skipped}"
        print(f"   {len(batches)} steps equal to the reference (scale "
              f"2^{math.log2(scale):.0f} at the start, "
              f"clip_norm {clip_norm:g}, {len(clipped_steps)} steps clipped, "
              f"{len(unclipped_steps)} under it); the planted "
              f"overflow at step {planted + 1} was skipped, and so were "
              f"{len(backward_skips)} steps whose gradients overflowed in the backward pass")
        return None

    cases = [Case(args=(model, opt, loss_fn, *batches[0], clip_norm), verify=verify,
                  label=f"(mixed_float16 MLP, LossScaleOptimizer("
                        f"initial_scale=2^{math.log2(scale):.0f}, "
                        f"dynamic_growth_steps={GROWTH_STEPS}), "
                        f"loss_fn weighted 2^{math.log2(LOSS_WEIGHT):.0f}, 8 batches of 32, "
                        f"clip_norm={clip_norm:g}; batch {planted + 1} overflows)")]
    return run_check(
        "loss_scaled_train_step", fn, cases,
        hint="lesson 08, section 5 (loss scaling in a custom loop): at which scale are the "
             "gradients your tape returns, at which must the clip measure them, and at "
             "which does optimizer.apply expect them?")
