"""Lesson 08's checks: the reference solutions pass, wrong ones fail usefully, stubs are skipped."""

from __future__ import annotations

import time

import pytest

import course_utils as cu
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


@pytest.fixture(scope="module")
def tf():
    from course_utils.environment import import_tensorflow

    return import_tensorflow()


@pytest.fixture(scope="module")
def keras(tf):
    import keras

    return keras


def stub(*args):
    raise NotImplementedError()


# --- train_with_policy -----------------------------------------------------------------------


def _fit(model, x, y, epochs, keras):
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.perf_counter()
    history = model.fit(x, y, batch_size=64, epochs=epochs, verbose=0)
    steps = epochs * -(-len(x) // 64)
    return {"model": model, "losses": history.history["loss"],
            "seconds_per_step": (time.perf_counter() - start) / steps}


def test_reference_train_with_policy_passes_and_reports_timings(keras, capsys):
    def train_with_policy(make_model, policy, x, y, epochs):
        with cu.training.policy_scope(policy):
            model = make_model()
            model.compile(optimizer=keras.optimizers.Adam(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return _fit(model, x, y, epochs, keras)

    assert cu.grading.check_train_with_policy(train_with_policy)
    out = capsys.readouterr().out
    assert "✅ train_with_policy: 2 cases passed" in out
    assert "ms/step" in out and "mixed_float16" in out


def test_policy_ignored_is_reported(keras):
    def float32_always(make_model, policy, x, y, epochs):
        return _fit(make_model(), x, y, epochs, keras)

    with pytest.raises(AssertionError, match=r"case 2 .*should compute in float16"):
        cu.grading.check_train_with_policy(float32_always)


def test_policy_left_set_is_reported(keras):
    def leaves_policy(make_model, policy, x, y, epochs):
        keras.mixed_precision.set_global_policy(policy)
        return _fit(make_model(), x, y, epochs, keras)

    with pytest.raises(AssertionError, match="global policy was left at 'mixed_float16'"):
        cu.grading.check_train_with_policy(leaves_policy)
    assert keras.mixed_precision.global_policy().name == "float32"


def test_missing_timing_is_reported(keras):
    def no_timing(make_model, policy, x, y, epochs):
        with cu.training.policy_scope(policy):
            model = make_model()
        result = _fit(model, x, y, epochs, keras)
        result["seconds_per_step"] = None
        return result

    with pytest.raises(AssertionError, match="seconds_per_step should be a positive number"):
        cu.grading.check_train_with_policy(no_timing)


# --- loss_scaled_train_step ------------------------------------------------------------------


def step_with(tf, *, scale=True, return_scaled=False, zero_non_finite=False, inner=False):
    """A loss-scaled step, right by default; each flag makes one popular mistake."""

    def step(model, optimizer, loss_fn, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = optimizer.scale_loss(loss) if scale else loss
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        if zero_non_finite:  # inf/nan replaced by zeros: the optimizer sees finite gradients
            gradients = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) for g in gradients]
        if inner:  # unscaled by hand and applied by the inner optimizer, which never skips
            gradients = [g / optimizer.dynamic_scale for g in gradients]
            optimizer.inner_optimizer.apply(gradients, model.trainable_variables)
        else:
            optimizer.apply(gradients, model.trainable_variables)
        return scaled_loss if return_scaled else loss

    return step


def test_reference_loss_scaled_step_passes(tf, capsys):
    assert cu.grading.check_loss_scaled_train_step(step_with(tf))
    out = capsys.readouterr().out
    assert "✅ loss_scaled_train_step: 1 case passed" in out and "was skipped" in out


@pytest.mark.parametrize("mistake, message", [
    ({"scale": False}, r"(?s)step 1: the weights differ .*Hint: .*scale_loss"),
    ({"return_scaled": True}, "expected the unscaled"),
    ({"inner": True},
     "LossScaleOptimizer itself apply|the planted overflow, (was not seen|changed)"),
    ({"zero_non_finite": True}, "the planted overflow, (was not seen|changed the)"),
], ids=["without scaling", "scaled loss returned", "inner optimizer", "overflow applied"])
def test_wrong_loss_scaled_step_fails_usefully(tf, mistake, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_loss_scaled_train_step(step_with(tf, **mistake))


@pytest.mark.parametrize("name", ["check_train_with_policy", "check_loss_scaled_train_step"])
def test_stub_is_not_attempted(name, capsys):
    check = getattr(cu.grading, name)
    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)
