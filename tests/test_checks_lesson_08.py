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
        with cu.training.precision.policy_scope(policy):
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
        with cu.training.precision.policy_scope(policy):
            model = make_model()
        result = _fit(model, x, y, epochs, keras)
        result["seconds_per_step"] = None
        return result

    with pytest.raises(AssertionError, match="seconds_per_step should be a positive number"):
        cu.grading.check_train_with_policy(no_timing)


def test_train_with_policy_stub_is_not_attempted(capsys):
    assert cu.grading.check_train_with_policy(stub) is False
    assert "not attempted" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_train_with_policy(stub)


# --- loss_scaled_train_step ------------------------------------------------------------------


def test_reference_loss_scaled_step_passes(tf, capsys):
    def loss_scaled_train_step(model, optimizer, loss_fn, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    assert cu.grading.check_loss_scaled_train_step(loss_scaled_train_step)
    out = capsys.readouterr().out
    assert "✅ loss_scaled_train_step: 1 case passed" in out and "was skipped" in out


def test_step_without_scaling_fails(tf):
    def unscaled(model, optimizer, loss_fn, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)  # divides unscaled gradients
        return loss

    expected = r"(?s)step 1: the weights differ .*Hint: .*scale_loss"
    with pytest.raises(AssertionError, match=expected):
        cu.grading.check_loss_scaled_train_step(unscaled)


def test_returning_the_scaled_loss_fails(tf):
    def scaled_returned(model, optimizer, loss_fn, x, y):
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(tf.reduce_mean(loss_fn(y, model(x, training=True))))
        optimizer.apply(tape.gradient(loss, model.trainable_variables),
                        model.trainable_variables)
        return loss

    with pytest.raises(AssertionError, match="expected the unscaled"):
        cu.grading.check_loss_scaled_train_step(scaled_returned)


def test_bypassing_the_loss_scale_optimizer_fails(tf):
    def inner_only(model, optimizer, loss_fn, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        gradients = [g / optimizer.dynamic_scale for g in gradients]  # unscaled by hand ...
        optimizer.inner_optimizer.apply(gradients, model.trainable_variables)  # ... never skips
        return loss

    expected = "LossScaleOptimizer itself apply|the planted overflow, (was not seen|changed)"
    with pytest.raises(AssertionError, match=expected):
        cu.grading.check_loss_scaled_train_step(inner_only)


def test_applying_the_planted_overflow_is_reported(tf):
    def never_skips(model, optimizer, loss_fn, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        # inf/nan replaced by zeros: the LossScaleOptimizer sees finite gradients and applies
        gradients = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) for g in gradients]
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    with pytest.raises(AssertionError, match="the planted overflow, (was not seen|changed the)"):
        cu.grading.check_loss_scaled_train_step(never_skips)


def test_loss_scaled_step_stub_is_not_attempted(capsys):
    assert cu.grading.check_loss_scaled_train_step(stub) is False
    assert "not attempted" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_loss_scaled_train_step(stub)
