"""Checks of lesson 08's exercises (registered by name with ``@register``).

* ``check_choose_policy(choose_policy)``: three policies trained from one start in
  interleaved epochs, timed, evaluated on held-out data, and the fastest one that keeps
  float32's quality chosen (:mod:`~course_utils.grading.checks.policy_choice`).
* ``check_loss_scaled_train_step(loss_scaled_train_step)``: steps of a mixed_float16 model with
  a ``LossScaleOptimizer`` and a global-norm clip (amid the applied steps' norms, drawn from
  a trial run: some steps are clipped, some not, so clipping differs from rescaling every step
  to the bound) on fresh inputs equal a reference step that clips the UNSCALED
  gradients (weights, loss, norm, loss scale, which steps were skipped), and a batch planted to
  overflow is skipped (weights unchanged, scale halved). The loss is weighted by ``LOSS_WEIGHT``
  (2^-18): its true gradients underflow float16, so a step that never computes them at the loss
  scale differs. The scale starts at the largest power of two at which the first batch's
  gradients are finite and doubles after ``GROWTH_STEPS`` (2) finite steps, so later steps
  overflow in the backward pass and must be skipped: a step that computes its gradients at a
  fixed loss scale of its own (the optimizer's scale used only to apply) is applied there, and
  one that grows the scale itself after every finite step differs in the scale.
* ``check_first_overflowing_layer(first_overflowing_layer)``: fresh mixed_float16 MLPs whose
  activations grow layer by layer, on batches with two outlier rows scaled so that the same
  model overflows at different layers (or nowhere): the answer depends on the outputs, not on
  the weights. One model grows in layers without weights (a recomputation from the Dense
  weights misses it); another has a decoy: the layer with by far the largest (negative) weights,
  whose output is finite wherever its input is (ReLU makes its pre-activations 0); every batch
  holds two loud rows that never overflow (the largest examples, but where the outlier rows are
  scaled past them), and up to two batches of each model have every row but the loud ones
  scaled, each by its own factor and
  below them, the overflow starting in a row of middling size (no outlier rows, nor the k
  largest, to pick out: never among the 12 largest, nor the 8 smallest, by max or L2 norm). Each
  model's outlier rows lie in one half and parity of the batch, the other model's in the other
  half and parity: an answer that looks at a fixed half of the batch misses one model's. Last,
  8 batches of each model in which one drawn row alone overflows (every other row left alone):
  an answer that looks at a random 3/4 of the rows passes each with probability 3/4.
"""

from __future__ import annotations

from course_utils.grading.checks.loss_scaling import (  # noqa: F401
    GROWTH_STEPS,
    LOSS_WEIGHT,
    OVERFLOW_FACTOR,
    check_loss_scaled_train_step,
)
from course_utils.grading.checks.overflow import check_first_overflowing_layer  # noqa: F401
from course_utils.grading.checks.policy_choice import (  # noqa: F401
    ACCURACY_TOLERANCE,
    BATCH_SIZE,
    EPOCHS,
    LOSS_TOLERANCE,
    POLICIES,
    check_choose_policy,
)

__all__ = ["ACCURACY_TOLERANCE", "BATCH_SIZE", "EPOCHS", "GROWTH_STEPS", "LOSS_TOLERANCE",
           "LOSS_WEIGHT", "OVERFLOW_FACTOR", "POLICIES", "check_choose_policy",
           "check_first_overflowing_layer", "check_loss_scaled_train_step"]
