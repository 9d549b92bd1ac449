"""Lesson 08's checks: the reference solutions pass, wrong ones fail usefully, stubs are skipped."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import course_utils as cu
from course_utils.grading.framework import NotAttemptedError, strict_checks

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from catalogue_routes import catalogue_params  # noqa: E402

pytestmark = pytest.mark.usefixtures("normal_check_mode")


@pytest.fixture(scope="module")
def tf():
    from course_utils.quiet import import_tensorflow

    return import_tensorflow()


@pytest.fixture(scope="module")
def keras(tf):
    import keras

    return keras


def stub(*args):
    raise NotImplementedError()


# --- choose_policy ---------------------------------------------------------------------------


def test_the_exercises_numbers_are_the_checks():
    """The exercise names the check's numbers as literals (the check's module is not the
    learner's): they must be the ones the check uses."""
    import json

    from course_utils.grading.checks import policy_choice

    for folder in ("solutions", "exercises"):
        notebook = Path(__file__).resolve().parents[1] / folder
        cells = json.loads(next(notebook.glob("08_*.ipynb")).read_text())["cells"]
        source = next("".join(cell["source"]) for cell in cells
                      if "".join(cell["source"]).lstrip().startswith("# What the check asks"))
        named: dict = {}
        exec(source, named)  # noqa: S102 - the course's own notebook cell
        for name in ("POLICIES", "EPOCHS", "BATCH_SIZE", "LOSS_TOLERANCE",
                     "ACCURACY_TOLERANCE"):
            assert named[name] == getattr(policy_choice, name), (folder, name)


def chooser(keras, *, interleave=True, set_start=True, shuffle=False, first_two_apart=True,
            epoch_log=None):
    """``choose_policy``, right by default; each argument makes one mistake. ``epoch_log``
    receives what wrong answers that differ only in what they return would have reported."""
    from course_utils.grading.checks.policy_choice import (
        ACCURACY_TOLERANCE,
        BATCH_SIZE,
        EPOCHS,
        LOSS_TOLERANCE,
        POLICIES,
    )

    class StepClock(keras.callbacks.Callback):  # times the steps alone (a wrong timing)
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_train_batch_begin(self, batch, logs=None):
            self.begun = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self.begun)

    def choose_policy(make_model, initial_weights, x, y, held_out_x, held_out_y):
        models, seconds = {}, {policy: [] for policy in POLICIES}
        clocks, losses = {p: StepClock() for p in POLICIES}, {}
        for policy in POLICIES:
            with cu.training.policy_scope(policy):
                models[policy] = make_model()
            if set_start:
                models[policy].set_weights(initial_weights)
            models[policy].compile(optimizer=keras.optimizers.Adam(0.01), loss=(
                keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
        if not interleave:  # the lesson's train_from_start: each policy's whole fit, timed
            rounds = [(p, EPOCHS) for p in POLICIES]
        elif first_two_apart:
            rounds = [(p, 1) for _ in range(EPOCHS) for p in POLICIES]
        else:  # each policy's first two epochs back to back, then interleaved rounds
            rounds = [(p, 1) for p in POLICIES for _ in range(2)]
            rounds += [(p, 1) for _ in range(EPOCHS - 2) for p in POLICIES]
        for policy, epochs in rounds:
            start = time.perf_counter()
            history = models[policy].fit(x, y, batch_size=BATCH_SIZE, epochs=epochs,
                                         shuffle=shuffle, verbose=0,
                                         callbacks=[clocks[policy]])
            seconds[policy] += [(time.perf_counter() - start) / epochs] * epochs
            losses[policy] = history.history["loss"][-1]
        steps = -(-len(x) // BATCH_SIZE)
        runs = {}
        for policy, model in models.items():
            logits = model.predict(held_out_x, verbose=0)
            loss = keras.losses.sparse_categorical_crossentropy(held_out_y, logits,
                                                                from_logits=True)
            runs[policy] = {"model": model, "loss": float(np.mean(loss)),
                            "accuracy": float(np.mean(np.argmax(logits, -1) == held_out_y)),
                            "seconds_per_step": float(np.median(seconds[policy][1:])) / steps}
        if epoch_log is not None:
            step_times = {p: np.reshape(clocks[p].seconds, (EPOCHS, steps)).sum(1) / steps
                          for p in POLICIES}
            epoch_log.append({"epochs": {p: [s / steps for s in seconds[p]] for p in POLICIES},
                              "steps_alone": step_times, "train_loss": losses,
                              "len_x": len(x)})
        base = runs["float32"]
        keeps = [p for p, r in runs.items() if np.isfinite(r["loss"])
                 and abs(r["loss"] / base["loss"] - 1) <= LOSS_TOLERANCE
                 and abs(r["accuracy"] - base["accuracy"]) <= ACCURACY_TOLERANCE]
        return {"policy": min(keeps, key=lambda p: runs[p]["seconds_per_step"]),
                "runs": runs}

    return choose_policy


@pytest.fixture(scope="module")
def passed_choice(keras):
    """The right answer through the whole check (both cases), once: the cases, its results and
    its logs, for the wrong answers below that differ only in what they return."""
    from course_utils.grading.checks import policy_choice

    cases, results, logs = [], [], []
    make_case = policy_choice._case
    right = chooser(keras, epoch_log=logs)

    def recording(*args, **kwargs):
        results.append(right(*args, **kwargs))
        return results[-1]

    with pytest.MonkeyPatch.context() as patch:
        # one draw of the check's: the overflow case's choice float32, the coarse case's
        # float16 (the check draws which; a choice fixed per kind misses here, xf08 L3)
        patch.setattr(policy_choice, "_case", lambda rng, kind, found, _: cases.append(
            make_case(rng, kind, found, kind == "overflow")) or cases[-1])
        patch.setattr(policy_choice, "peeks_refused", lambda name, fn: None)
        passed = cu.grading.check_choose_policy(recording)
    kinds = ["overflow" if np.isnan(r["runs"]["mixed_float16"]["loss"]) else "coarse"
             for r in results]
    return passed, cases, results, logs, kinds


@pytest.mark.slow
def test_reference_choose_policy_passes_both_cases(passed_choice):
    passed, cases, results, logs, kinds = passed_choice
    assert passed and len(cases) == len(results) == 2 and sorted(kinds) == ["coarse",
                                                                            "overflow"]
    for result, log, kind in zip(results, logs, kinds, strict=True):
        runs = result["runs"]
        if kind == "overflow":  # float16 fastest, trains (xf08 L2), nan on held-out rows
            assert result["policy"] == "float32" and np.isnan(runs["mixed_float16"]["loss"])
            train = log["train_loss"]
            assert abs(train["mixed_float16"] / train["float32"] - 1) < 0.01, train
        else:  # bfloat16 fastest, finite, and out of the tolerance: the rule decides (L1)
            assert result["policy"] == "mixed_float16"
            assert np.isfinite(runs["mixed_bfloat16"]["loss"])
            assert runs["mixed_bfloat16"]["loss"] > 1.05 * runs["float32"]["loss"]  # out


def _seconds(result, per_policy):
    return {**result, "runs": {p: {**run, "seconds_per_step": float(per_policy(p))}
                               for p, run in result["runs"].items()}}


def _choice(result, rule):
    return {**result, "policy": rule(result["runs"])}


def _fastest(runs, keep=lambda run: True):
    return min((p for p in runs if keep(runs[p])), key=lambda p: runs[p]["seconds_per_step"])


def _keeps_float32s(losses, policy):
    return np.isfinite(losses[policy]) and abs(losses[policy] / losses["float32"] - 1) <= 0.05


def _models(case, result, keras, **compile_with):
    """Fresh models built, started and compiled as asked, in place of the trained ones."""
    make_model, initial_weights = case.args[1], case.args[2]
    runs = {}
    for policy, run in result["runs"].items():
        with cu.training.policy_scope(policy):
            model = make_model()
        model.set_weights(initial_weights)
        model.compile(**{"optimizer": keras.optimizers.Adam(0.01), "loss": (
            keras.losses.SparseCategoricalCrossentropy(from_logits=True)), **compile_with})
        runs[policy] = {**run, "model": model}
    return {**result, "runs": runs}


# Wrong answers that differ from the right one only in what they return: judged by the check's
# own verdict on the shared run's case (no training of their own). Each: the case's kind, the
# answer from (result, log, case, keras), the message expected.
RETURNED = {
    "a constant": ("overflow", lambda r, e, c, k: {"policy": "float32", "runs": {}},
                   "expected {'policy'"),
    "the fastest, quality ignored": ("overflow", lambda r, e, c, k: _choice(r, _fastest),
                                     "the fastest policy whose held-out quality"),
    "float32, speed ignored": ("coarse", lambda r, e, c, k: {**r, "policy": "float32"},
                               "the fastest policy whose held-out quality"),
    "the fastest with a finite loss (r08 L1)": ("coarse", lambda r, e, c, k: _choice(
        r, lambda runs: _fastest(runs, lambda run: np.isfinite(run["loss"]))),
        "the fastest policy whose held-out quality"),
    "a choice fixed per kind of model (xf08 L3)": ("coarse", lambda r, e, c, k: {
        **r, "policy": "float32" if any(layer.name == "center" for layer in r["runs"][
            "float32"]["model"].layers) else "mixed_bfloat16"},
        "the fastest policy whose held-out quality"),
    "a Rescaling layer: the faster of float32, bfloat16 (r08 L3)": ("coarse", lambda r, e, c, k:
        _choice(r, lambda runs: _fastest({p: runs[p] for p in runs if p != "mixed_float16"})),
        "the fastest policy whose held-out quality"),
    "the rule on the training loss (xf08 L2)": ("overflow", lambda r, e, c, k: _choice(
        r, lambda runs: _fastest(runs, lambda run: _keeps_float32s(
            e["train_loss"], next(p for p in runs if runs[p] is run)))),
        "the fastest policy whose held-out quality"),
    "the training loss reported": ("overflow", lambda r, e, c, k: {**r, "runs": {
        **r["runs"], "float32": {**r["runs"]["float32"],
                                 "loss": r["runs"]["float32"]["loss"] * 0.9}}},
        "reports held-out loss"),
    "the traced first epoch timed too (mean)": ("overflow", lambda r, e, c, k: _seconds(
        r, lambda p: np.mean(e["epochs"][p])), "the median of"),
    "the median of every epoch, the first too (r08 L8)": ("overflow", lambda r, e, c, k:
        _seconds(r, lambda p: np.median(e["epochs"][p])), "the median of"),
    "the last epoch only (r08 L8)": ("overflow", lambda r, e, c, k: _seconds(
        r, lambda p: e["epochs"][p][-1]), "the median of"),
    "the mean of the timed epochs (r08 L8)": ("coarse", lambda r, e, c, k: _seconds(
        r, lambda p: np.mean(e["epochs"][p][1:])), "the median of"),
    "the fastest timed epoch (r08 L8)": ("coarse", lambda r, e, c, k: _seconds(
        r, lambda p: np.min(e["epochs"][p][1:])), "the median of"),
    "whole batches only, the short one not counted (r08 L8)": ("coarse", lambda r, e, c, k:
        _seconds(r, lambda p: r["runs"][p]["seconds_per_step"] * 4 / 3), "the median of"),
    "len(x) / BATCH_SIZE steps (r08 L8)": ("coarse", lambda r, e, c, k: _seconds(
        r, lambda p: r["runs"][p]["seconds_per_step"] * 4 / (e["len_x"] / 64)),
        "the median of"),
    "the steps alone timed by a callback (r08 L5)": ("overflow", lambda r, e, c, k: _seconds(
        r, lambda p: np.median(e["steps_alone"][p][1:])), "the median of"),
    "fresh untrained models returned (r08 L7)": ("coarse", lambda r, e, c, k: _models(
        c, r, k), "is not the model your function trained"),
    "from_logits=False (r08 L6)": ("overflow", lambda r, e, c, k: _models(
        c, r, k, loss=k.losses.SparseCategoricalCrossentropy(from_logits=False)),
        r"SparseCategoricalCrossentropy\(from_logits=True\)"),
    "AdamW (r08 L6)": ("overflow", lambda r, e, c, k: _models(
        c, r, k, optimizer=k.optimizers.AdamW(0.01, weight_decay=0.5)), "has AdamW"),
    "Adam with weight decay (r08 L6)": ("coarse", lambda r, e, c, k: _models(
        c, r, k, optimizer=k.optimizers.Adam(0.01, weight_decay=0.5)), "weight_decay=0.5"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind, wrong, message", RETURNED.values(), ids=list(RETURNED))
def test_a_wrong_return_fails_with_what_differed(passed_choice, keras, kind, wrong, message):
    _, cases, results, logs, kinds = passed_choice
    index = kinds.index(kind)
    answer = wrong(results[index], logs[index], cases[index], keras)
    keras.mixed_precision.set_global_policy(cases[index].args[0])  # as the answer left it
    try:
        reason = cases[index].verify(answer)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert reason and re.search(message, reason), reason


@pytest.mark.slow
def test_make_models_closure_holds_no_waits_nor_log(passed_choice):
    """r08 L4: the drawn waits and the step log live under an opaque key, not in the closure."""
    _, cases, _, _, _ = passed_choice
    for case in cases:
        held = [cell.cell_contents for cell in case.args[1].__closure__]
        assert not [v for v in held if isinstance(v, dict | list | tuple | float)], held


@pytest.mark.slow
def test_a_global_policy_left_set_fails(passed_choice, keras):
    _, cases, results, _, _ = passed_choice
    keras.mixed_precision.set_global_policy("mixed_float16")  # not the one found
    assert "the global policy was left at 'mixed_float16'" in cases[0].verify(results[0])
    assert keras.mixed_precision.global_policy().name == cases[0].args[0]
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("mistake, message", catalogue_params({
    "the lesson cell copied": ({"interleave": False}, "interleaved rounds"),
    "no same start": ({"set_start": False}, "start every policy from initial_weights"),
    "shuffled batches": ({"shuffle": True}, "same batches in the same order"),
    "the first two epochs back to back (r08 L8)": ({"first_two_apart": False},
                                                   "model's epoch 1 ended after"),
}))
def test_wrong_training_fails_usefully(keras, mistake, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_choose_policy(chooser(keras, **mistake))
    assert keras.mixed_precision.global_policy().name == "float32"


def test_held_out_quality_by_any_batching_is_accepted(keras):
    """r08 R1: under mixed_bfloat16, predict's batches of 32 and one call on all rows give
    logits up to ~0.02 apart, so near-tied rows flip; the check must accept either."""
    import random

    from course_utils.grading.checks import policy_choice
    from course_utils.grading.checks.overflow import _inputs

    for seed in range(4):
        x, y, features, classes = _inputs(random.Random(seed), 448)
        with cu.training.policy_scope("mixed_bfloat16"):
            policy_choice._PACES["t"] = {"waits": {"mixed_bfloat16": 0.0}, "trace": {},
                                         "loads": [], "steps": 3, "log": {"runs": []}}
            model = policy_choice._builder(features, classes, 32, "plain", "t")()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss=(
            keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
        model.fit(x[:192], y[:192], batch_size=64, epochs=3, shuffle=False, verbose=0)
        held_x, held_y = x[192:], y[192:]
        for batch_size in (1, 32, 64, 100):
            logits = model.predict(held_x, batch_size=batch_size, verbose=0)
            loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(
                held_y, logits, from_logits=True)))
            accuracy = float(np.mean(np.argmax(logits, -1) == held_y))
            assert policy_choice._quality_problem("mixed_bfloat16", model, loss, accuracy,
                                                  held_x, held_y) is None, (seed, batch_size)
        wrong = policy_choice._quality_problem("mixed_bfloat16", model, loss,
                                               accuracy + 0.1, held_x, held_y)
        assert "evaluate the trained model" in wrong


def test_the_checks_own_rule_under_the_answers_name_fails():
    from course_utils.grading.checks import policy_choice

    with pytest.raises(AssertionError, match="the course's own code"):
        cu.grading.check_choose_policy(policy_choice._expected)


# --- loss_scaled_train_step ------------------------------------------------------------------


def step_with(tf, *, scale=True, divide=True, return_scaled=False, zero_non_finite=False,
              inner=False, clip="unscaled", rescale=True, norm_after=False, keras_clip=False,
              scale_read_after_apply=False):
    """A loss-scaled, clipped step, right by default; each flag makes one popular mistake."""

    def step(model, optimizer, loss_fn, x, y, clip_norm):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = optimizer.scale_loss(loss) if scale else loss
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        if zero_non_finite:  # inf/nan replaced by zeros: the optimizer sees finite gradients
            gradients = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) for g in gradients]
        unscaled = [g / optimizer.dynamic_scale for g in gradients] if divide else gradients
        norm = tf.linalg.global_norm(unscaled)
        if keras_clip:  # Keras clips after the LossScaleOptimizer unscaled: also right
            optimizer.inner_optimizer.global_clipnorm = clip_norm
            optimizer.apply(gradients, model.trainable_variables)
            return loss, norm
        if clip == "unscaled":
            applied, _ = tf.clip_by_global_norm(unscaled, clip_norm)
        elif clip == "scaled":  # the pitfall: clips the gradients while they are scaled
            clipped, _ = tf.clip_by_global_norm(gradients, clip_norm)
            applied = [g / optimizer.dynamic_scale for g in clipped]
        elif clip == "per tensor":
            applied = [tf.clip_by_norm(g, clip_norm) for g in unscaled]
        elif clip == "normalize":  # r08 L9: every step rescaled TO clip_norm, small ones too
            applied = [g * (clip_norm / norm) for g in unscaled]
        else:  # the lesson's step: no clipping
            applied = unscaled
        if norm_after:
            norm = tf.linalg.global_norm(applied)
        if inner:  # applied by the inner optimizer, which never skips
            optimizer.inner_optimizer.apply(applied, model.trainable_variables)
        else:
            optimizer.apply([g * optimizer.dynamic_scale for g in applied] if rescale
                            else applied, model.trainable_variables)
        if scale_read_after_apply:  # the next step's scale: apply doubled it
            norm = tf.linalg.global_norm(gradients) / optimizer.dynamic_scale
        return (scaled_loss if return_scaled else loss), norm

    return step


def fixed_scale_step(tf, scale):
    """Clipped right, but its gradients computed at a fixed loss scale of its own (the manual
    loss scaling of old tutorials), not at the optimizer's dynamic scale."""

    def step(model, optimizer, loss_fn, x, y, clip_norm):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = loss * scale
        unscaled = [g / scale for g in tape.gradient(scaled_loss, model.trainable_variables)]
        clipped, norm = tf.clip_by_global_norm(unscaled, clip_norm)
        optimizer.apply([g * optimizer.dynamic_scale for g in clipped],
                        model.trainable_variables)
        return loss, norm

    return step


def lesson_cell_step(tf):
    """Lesson 08's make_loss_scaled_step, copied: no clipping, the loss alone returned."""

    def step(model, optimizer, loss_fn, x, y, clip_norm):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    return step


def test_reference_loss_scaled_step_passes(tf, capsys):
    assert cu.grading.check_loss_scaled_train_step(step_with(tf))
    out = capsys.readouterr().out
    assert "✅ loss_scaled_train_step: 1 case passed" in out and "was skipped" in out
    assert "0 steps clipped" not in out and " 0 under it" not in out  # r08 L9: both kinds


def test_keras_own_clipping_after_unscaling_passes(tf):
    assert cu.grading.check_loss_scaled_train_step(step_with(tf, keras_clip=True))


@pytest.mark.parametrize("scale", [2.0**12, 2.0**15, 2.0**24])
def test_a_fixed_loss_scale_fails(tf, scale):
    with pytest.raises(AssertionError, match="overflow float16 in the backward pass"):
        cu.grading.check_loss_scaled_train_step(fixed_scale_step(tf, scale))


def test_the_lesson_cell_copied_fails(tf):
    with pytest.raises(AssertionError, match=r"return \(loss, norm\)"):
        cu.grading.check_loss_scaled_train_step(lesson_cell_step(tf))


@pytest.mark.parametrize("mistake, message", [
    ({"scale": False}, r"step 1: (returned norm|the weights differ)"),
    ({"scale": False, "divide": False},
     r"step 1: (returned norm .*before clipping|the weights differ)"),
    ({"return_scaled": True}, "expected the unscaled"),
    ({"inner": True},
     "LossScaleOptimizer itself|the planted overflow, (was not seen|changed)"
     "|overflow float16 in the backward pass"),
    ({"zero_non_finite": True},
     "the planted overflow, (was not seen|changed the)|overflow float16 in the backward pass"),
    ({"clip": None}, r"step \d: (the weights differ .*which scale did you clip|returned norm)"),
    ({"clip": "scaled"}, r"step 1: the weights differ"),
    ({"clip": "per tensor"}, r"step \d: the weights differ"),
    ({"rescale": False}, r"step 1: the weights differ"),
    ({"norm_after": True}, r"step \d: returned norm .*before clipping"),
    ({"clip": "normalize"}, r"step \d: (the weights differ|returned norm)"),
    # r08: the norm unscaled by dynamic_scale read after apply had doubled it (0.5x)
    ({"scale_read_after_apply": True},
     r"step \d: returned norm .*0\.5× the expected: the loss scale before this step's apply "
     r"over the scale after it.*read the scale before you apply"),
], ids=["without scaling", "true gradients in float16, never scaled", "scaled loss returned",
        "inner optimizer", "overflow applied",
        "no clipping", "scaled gradients clipped", "per-tensor clipping",
        "clipped gradients not rescaled", "norm after clipping", "normalized, not clipped",
        "scale read after apply"])
def test_wrong_loss_scaled_step_fails_usefully(tf, mistake, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_loss_scaled_train_step(step_with(tf, **mistake))


def test_a_step_that_grows_the_scale_itself_fails(tf):
    """r08 L10: the inner optimizer applies, the step doubles the scale after every finite
    step itself: the LossScaleOptimizer waits GROWTH_STEPS (2) finite steps."""

    def manual_double_step(model, optimizer, loss_fn, x, y, clip_norm):
        scale = optimizer.dynamic_scale
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled_loss = loss * tf.cast(scale, loss.dtype)
        true = [g / scale for g in tape.gradient(scaled_loss, model.trainable_variables)]
        clipped, norm = tf.clip_by_global_norm(true, clip_norm)
        if all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in true):
            optimizer.inner_optimizer.apply(clipped, model.trainable_variables)
            scale.assign(scale * 2.0)
        else:
            scale.assign(scale / 2.0)
        return loss, norm

    with pytest.raises(AssertionError, match=r"step 1: loss scale .*, expected .*grows and "):
        cu.grading.check_loss_scaled_train_step(manual_double_step)


def test_the_checks_own_reference_step_under_the_answers_name_fails(tf):
    # nb23-08 L3: the check's reference, imported and called, passed
    from course_utils.grading.checks.loss_scaling import _reference_step

    def loss_scaled_train_step(model, optimizer, loss_fn, x, y, clip_norm):
        return _reference_step(model, optimizer, loss_fn, x, y, clip_norm)

    with pytest.raises(AssertionError, match="ran the course's _reference_step"):
        cu.grading.check_loss_scaled_train_step(loss_scaled_train_step)


# --- first_overflowing_layer -----------------------------------------------------------------


def first_overflowing_layer(model, x, keras, tf):
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    every_output = keras.Model(model.input, [layer.output for layer in layers])
    for layer, output in zip(layers, every_output(x), strict=True):
        if not bool(tf.reduce_all(tf.math.is_finite(tf.cast(output, tf.float32)))):
            return layer.name
    return None


def test_reference_first_overflowing_layer_passes(keras, tf, capsys):
    assert cu.grading.check_first_overflowing_layer(
        lambda model, x: first_overflowing_layer(model, x, keras, tf))
    assert "✅ first_overflowing_layer:" in capsys.readouterr().out


def test_an_answer_equal_to_every_layer_name_fails():
    # nb23-08 L1: an object whose == is always True passed all 30 cases (== came first)
    class EqualToAll:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    with pytest.raises(AssertionError, match=r"case 1 .*a str\) or None, not EqualToAll"):
        cu.grading.check_first_overflowing_layer(lambda model, x: EqualToAll())


def test_reading_the_expected_layer_from_the_checks_frames_fails():
    # nb23-08 L2: inspect.stack() to run_check's Case, then `expected` from its verify's
    # closure, the names folded by the compiler from constants: passed 30 of 30
    import inspect

    def first_overflowing_layer(model, x):
        for info in inspect.stack():
            case = getattr(info.frame, "f_" + "locals").get("case")
            if case is not None and getattr(case, "verify", None) is not None:
                cells = getattr(case.verify, "__clo" + "sure__")
                index = case.verify.__code__.co_freevars.index("expected")
                return getattr(cells[index], "cell_" + "contents")
        return None

    with pytest.raises(AssertionError, match="__closure__, cell_contents, f_locals"):
        cu.grading.check_first_overflowing_layer(first_overflowing_layer)


def test_the_checks_frames_hold_no_expected_layer_while_the_answer_runs():
    # the walk above with its names joined at run time (no scan sees them) passed 30 of 30
    # before the answer was found after the call: now no frame or closure holds a layer name
    import importlib

    inspect = importlib.import_module("".join(["in", "spect"]))

    def first_overflowing_layer(model, x):
        names = {layer.name for layer in model.layers}
        for info in getattr(inspect, "".join(["st", "ack"]))():
            case = getattr(info.frame, "".join(["f_", "locals"])).get("case")
            cells = getattr(getattr(case, "verify", None), "".join(["__clo", "sure__"]), None)
            for cell in cells or ():
                value = getattr(cell, "".join(["cell_", "contents"]))
                if isinstance(value, str) and value in names:
                    return value  # a layer's name the check holds (the decoy at most)
        return None

    with pytest.raises(AssertionError, match="first_overflowing_layer: case"):
        cu.grading.check_first_overflowing_layer(first_overflowing_layer)


def test_an_answer_that_changes_the_weights_fails(keras, tf):
    def changes_weights(model, x):  # makes the first layer overflow, then says so
        dense = next(layer for layer in model.layers if layer.weights)
        dense.kernel.assign(dense.kernel * 60000.0)
        return first_overflowing_layer(model, x, keras, tf)

    with pytest.raises(AssertionError, match="changed the model's weights"):
        cu.grading.check_first_overflowing_layer(changes_weights)


def test_the_checks_own_outputs_model_under_the_answers_name_fails():
    # nb23-08 L3: the check's every-layer model, imported and called, passed 30 of 30
    from course_utils.grading.checks.overflow_rows import outputs_model

    def first_overflowing_layer(model, x):
        layers, every_output = outputs_model(model)
        for layer, out in zip(layers, every_output(x), strict=True):
            if not np.all(np.isfinite(np.asarray(out, np.float32))):
                return layer.name
        return None

    with pytest.raises(AssertionError, match="ran the course's outputs_model"):
        cu.grading.check_first_overflowing_layer(first_overflowing_layer)


def test_the_loud_logits_case_is_made_where_even_the_rows_left_alone_overflow(tf):
    # about 1 model in 100 overflowed on every batch the check tried: the case was left out,
    # and an answer that reads float16's range from a float64 forward passed
    import random

    from course_utils.grading.checks import overflow

    x, _, features, classes = overflow._inputs(random.Random(0), 32)
    cases = overflow._loud_logits_case(features, classes, 16, 4, x * 1e4, [1, 2],
                                       random.Random(1), dead_feature=0)
    assert len(cases) == 1


def _hidden(model):
    return [layer for layer in model.layers if layer.weights][:-1]


def _numpy_forward(model, x, dtype):
    """Every Dense layer's output, computed in NumPy in ``dtype``: (name, output) pairs."""
    outputs, h = [], np.asarray(x, dtype)
    for layer in [layer for layer in model.layers if layer.weights]:
        kernel, bias = (np.asarray(w, dtype) for w in layer.get_weights())
        h = h @ kernel + bias
        if layer is not model.layers[-1]:
            h = np.maximum(h, 0)
        outputs.append((layer.name, h))
    return outputs


def _lazy_overflow_answers(keras, tf):
    """Wrong ``first_overflowing_layer`` answers, as a learner would write them."""
    def largest_weights(model, x):  # reads the weights, computes nothing
        return max(_hidden(model), key=lambda layer: float(np.max(np.abs(layer.kernel))))

    def output_only(model, x):  # looks at the logits alone
        return None if np.all(np.isfinite(model(x).numpy())) else model.layers[-1].name

    def last_overflowing(model, x):  # walks the layers backwards
        for layer in [layer for layer in model.layers if layer.weights][::-1]:
            sub = keras.Model(model.input, layer.output)
            if not np.all(np.isfinite(np.asarray(sub(x), dtype=np.float32))):
                return layer.name
        return None

    def first_example_only(model, x):  # skips most of the batch
        return first_overflowing_layer(model, x[:1], keras, tf)

    def in_float32(model, x):  # ignores the float16 this task is about
        for name, output in _numpy_forward(model, x, np.float32):
            if not np.all(np.isfinite(output)):
                return name
        return None

    def numpy_float16_range(model, x):  # float64 forward from the weights, float16's range
        for name, output in _numpy_forward(model, x, np.float64):
            if np.max(np.abs(output)) > 65504:
                return name
        return None

    def lesson_cell(model, x):  # lesson 08's backward_signal body: the last hidden layer only
        body = keras.Model(model.input, model.layers[-2].output)
        return None if np.all(np.isfinite(np.asarray(body(x), np.float32))) else (
            model.layers[-2].name)

    def dense_weights_in_their_range(model, x):  # float64 from the Dense weights, each layer
        for name, output in _numpy_forward(model, x, np.float64):  # against its own dtype
            dtype = model.get_layer(name).compute_dtype
            if not np.all(np.isfinite(output)) or np.max(np.abs(output)) > np.finfo(dtype).max:
                return name
        return None

    def dense_weights_in_float16(model, x):  # float16 emulated from the Dense weights
        h = np.asarray(x, np.float16)
        for layer in [layer for layer in model.layers if layer.weights]:
            dtype = np.dtype(layer.compute_dtype)
            kernel, bias = (np.asarray(w, np.float32) for w in layer.get_weights())
            with np.errstate(over="ignore", invalid="ignore"):
                h = (np.asarray(h, np.float32) @ kernel + bias).astype(dtype)
            if layer is not model.layers[-1]:
                h = np.maximum(h, 0)
            if not np.all(np.isfinite(h)):
                return layer.name
        return None

    def largest_example_only(model, x):  # the example with the largest values
        row = int(np.argmax(np.max(np.abs(x), axis=1)))
        return first_overflowing_layer(model, x[row:row + 1], keras, tf)

    def rows_far_above_the_median(model, x):  # the rows that look like outliers
        loudness = np.max(np.abs(x), axis=1)
        loud = loudness > 10 * np.median(loudness)
        return first_overflowing_layer(model, x[loud] if loud.any() else x[:1], keras, tf)

    def two_largest_examples(model, x):  # the label says 2 outlier rows
        rows = np.argsort(np.max(np.abs(x), axis=1))[-2:]
        return first_overflowing_layer(model, x[rows], keras, tf)

    def four_largest_examples(model, x):  # the 2 loud rows and, past them, 2 more
        rows = np.sort(np.argsort(np.max(np.abs(x), axis=1))[-4:])
        return first_overflowing_layer(model, x[rows], keras, tf)

    def eight_largest_by_norm(model, x):  # rows by their L2 norm
        rows = np.sort(np.argsort(np.linalg.norm(x, axis=1))[-8:])
        return first_overflowing_layer(model, x[rows], keras, tf)

    def four_largest_and_four_smallest(model, x):  # the extremes of the batch
        order = np.argsort(np.max(np.abs(x), axis=1))
        return first_overflowing_layer(model, x[np.sort(np.r_[order[:4], order[-4:]])],
                                       keras, tf)

    def row_by_row_first_found(model, x):  # loops over the rows outside the layers
        for row in range(len(x)):
            name = first_overflowing_layer(model, x[row:row + 1], keras, tf)
            if name is not None:
                return name
        return None

    def halves_first_found(model, x):  # two halves, the first half's answer first
        half = len(x) // 2
        return (first_overflowing_layer(model, x[:half], keras, tf)
                or first_overflowing_layer(model, x[half:], keras, tf))

    def halves_second_first(model, x):  # two halves, the second half's answer first
        half = len(x) // 2
        return (first_overflowing_layer(model, x[half:], keras, tf)
                or first_overflowing_layer(model, x[:half], keras, tf))

    def largest_rows_first(model, x):  # the rows by max, largest first, first overflow found
        for row in np.argsort(-np.max(np.abs(x), axis=1)):
            name = first_overflowing_layer(model, x[row:row + 1], keras, tf)
            if name is not None:
                return name
        return None

    def all_but_eight_smallest(model, x):  # drops the rows that look harmless
        rows = np.sort(np.argsort(np.max(np.abs(x), axis=1))[8:])
        return first_overflowing_layer(model, x[rows], keras, tf)

    def index_not_name(model, x):  # the position instead of the name
        name = first_overflowing_layer(model, x, keras, tf)
        return None if name is None else [layer.name for layer in model.layers].index(name)

    return {"constant None": lambda model, x: None,
            "constant first layer": lambda model, x: model.layers[1].name,
            "largest weights": lambda model, x: largest_weights(model, x).name,
            "logits only": output_only, "last, not first": last_overflowing,
            "first example only": first_example_only, "computed in float32": in_float32,
            "lesson cell: last hidden layer": lesson_cell, "index, not name": index_not_name,
            "NumPy, every layer against float16's range": numpy_float16_range,
            "NumPy from the Dense weights, each against its dtype's range":
                dense_weights_in_their_range,
            "NumPy float16 from the Dense weights": dense_weights_in_float16,
            "the largest example only": largest_example_only,
            "the rows far above the median only": rows_far_above_the_median,
            "the two largest examples only": two_largest_examples,
            "the four largest examples only": four_largest_examples,
            "the eight largest rows by L2 norm only": eight_largest_by_norm,
            "the four largest and the four smallest examples only":
                four_largest_and_four_smallest,
            "the first half of the batch only":
                lambda model, x: first_overflowing_layer(model, x[:len(x) // 2], keras, tf),
            "every other example only":
                lambda model, x: first_overflowing_layer(model, x[::2], keras, tf),
            "every third example only":  # rows in each half at each parity
                lambda model, x: first_overflowing_layer(model, x[::3], keras, tf),
            "every example but the first":  # off by one
                lambda model, x: first_overflowing_layer(model, x[1:], keras, tf),
            "every example but the last":  # off by one
                lambda model, x: first_overflowing_layer(model, x[:-1], keras, tf),
            "row by row, first row that overflows": row_by_row_first_found,
            "two halves, the first half's answer first": halves_first_found,
            "two halves, the second half's answer first": halves_second_first,
            "rows ordered largest first by max, first found": largest_rows_first,
            "every row but the 8 smallest": all_but_eight_smallest}


@pytest.mark.parametrize("mistake", ["constant None", "constant first layer", "largest weights",
                                     "logits only", "last, not first", "first example only",
                                     "computed in float32", "lesson cell: last hidden layer",
                                     "index, not name",
                                     "NumPy, every layer against float16's range",
                                     "NumPy from the Dense weights, each against its dtype's "
                                     "range",
                                     "NumPy float16 from the Dense weights",
                                     "the largest example only",
                                     "the rows far above the median only",
                                     "the two largest examples only",
                                     "the four largest examples only",
                                     "the eight largest rows by L2 norm only",
                                     "the four largest and the four smallest examples only",
                                     "the first half of the batch only",
                                     "every other example only",
                                     "every third example only",
                                     "every example but the first",
                                     "every example but the last",
                                     "row by row, first row that overflows",
                                     "two halves, the first half's answer first",
                                     "two halves, the second half's answer first",
                                     "rows ordered largest first by max, first found",
                                     "every row but the 8 smallest"])
def test_lazy_first_overflowing_layer_fails_usefully(keras, tf, mistake):
    lazy = _lazy_overflow_answers(keras, tf)[mistake]
    # rows walked largest first pass where no two rows of a model can be scaled so that the
    # larger overflows later (1 check in 100 by max, in 100 draws): three tries
    for _ in range(3 if mistake.startswith("rows ordered largest first") else 1):
        try:
            cu.grading.check_first_overflowing_layer(lazy)
        except AssertionError as error:
            assert re.search("finite|you answered None|return a layer's name|"
                             "largest weights|already is not finite", str(error))
            return
    pytest.fail(f"{mistake!r} passed")


def test_a_random_three_quarters_of_the_batch_fails(keras, tf):
    # 16 batches (8 per model) in which one drawn row alone overflows: such an answer passes
    # each with probability 3/4, all of them about 1 check in 100 (0 of 80 draws): three tries
    def three_quarters(model, x):
        rows = np.sort(np.random.default_rng().choice(len(x), 3 * len(x) // 4, replace=False))
        return first_overflowing_layer(model, x[rows], keras, tf)

    messages = []
    for _ in range(3):
        try:
            cu.grading.check_first_overflowing_layer(three_quarters)
        except AssertionError as error:
            messages.append(str(error))
            break
    assert messages and re.search("finite|you answered None|already is not finite", messages[0])


def _per_row_firsts(model, x, keras):
    """The first overflowing layer's name of every row that overflows, in one forward pass."""
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    finite = np.stack([np.all(np.isfinite(np.asarray(output, np.float32)).reshape(
        len(x), -1), axis=1) for output in keras.Model(model.input, [
            layer.output for layer in layers])(x)])  # [layer, row]
    return [layers[i].name for i in np.argmin(finite, axis=0)[~finite.all(axis=0)]]


def test_answers_that_merge_rows_or_strided_halves_wrongly_fail(keras, tf, monkeypatch):
    # on the same cases (built at most three times: the strided halves passed 2 draws in 100):
    # neither the smallest nor the largest name is the earliest layer in both models (one
    # model's names ascend in layer order, the other's descend), the layer
    # most rows overflow at is not the answer (a third row at the later row's layer), and
    # x[::2]'s answer before x[1::2]'s (or after) misses a batch whose rows differ in parity
    from course_utils.grading.checks import overflow

    def first(model, x):
        return first_overflowing_layer(model, x, keras, tf)

    def most_common(model, x):
        names = _per_row_firsts(model, x, keras)
        return max(set(names), key=names.count) if names else None

    lazy = {"the smallest name over the rows":
                lambda model, x: min(_per_row_firsts(model, x, keras), default=None),
            "the smallest name of the two halves": lambda model, x: min(
                [name for name in (first(model, x[:16]), first(model, x[16:])) if name],
                default=None),
            "the largest name over the rows":
                lambda model, x: max(_per_row_firsts(model, x, keras), default=None),
            "the largest name of the strided halves": lambda model, x: max(
                [name for name in (first(model, x[::2]), first(model, x[1::2])) if name],
                default=None),
            "the layer most rows overflow at": most_common,
            "even rows' answer first": lambda model, x: first(model, x[::2])
                or first(model, x[1::2]),
            "odd rows' answer first": lambda model, x: first(model, x[1::2])
                or first(model, x[::2])}
    made = []
    monkeypatch.setattr(overflow, "run_check", lambda name, fn, cases, hint: made.extend(cases))
    for _ in range(3):
        made.clear()
        overflow.check_first_overflowing_layer(stub)
        for mistake, answer in list(lazy.items()):
            message = next((message for case in made
                            if (message := case.verify(answer(*case.args)))), None)
            if message is not None:
                assert re.search("finite|already is not finite", message), (mistake, message)
                del lazy[mistake]
        if not lazy:
            return
    pytest.fail(f"passed: {sorted(lazy)}")


def test_the_one_row_batches_overflow_in_exactly_one_row(monkeypatch):
    from course_utils.grading.checks import overflow

    made = []
    monkeypatch.setattr(overflow, "run_check", lambda name, fn, cases, hint: made.extend(cases))
    overflow.check_first_overflowing_layer(stub)
    one_row = [case for case in made if "x with one row times" in case.label]
    assert len(one_row) >= overflow.ONE_ROW_CASES  # 16 in each of 60 draws
    for case in one_row:
        model, batch = case.args
        layers, every_output = overflow.outputs_model(model)
        finite = np.stack([np.all(np.isfinite(np.asarray(output, np.float32)).reshape(
            len(batch), -1), axis=1) for output in every_output(batch)])
        first = np.where(finite.all(axis=0), len(layers), np.argmin(finite, axis=0))
        assert first.min() < len(layers) and np.sum(first == first.min()) == 1
        assert case.verify(layers[first.min()].name) is None


@pytest.mark.parametrize("name", ["check_choose_policy", "check_loss_scaled_train_step",
                                  "check_first_overflowing_layer"])
def test_stub_is_not_attempted(name, capsys):
    check = getattr(cu.grading, name)
    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)


@pytest.mark.parametrize("limit", [65504.0, 65520.0])
def test_a_float64_recomputation_read_against_float16s_range_fails(keras, tf, limit):
    # nb27-08: each layer recomputed in float64, the first float16 layer at 65504 or more
    # named, passed 5 runs in 6; the float16-edge batches refuse it at 65504 and at 65520
    def first_overflowing_layer(model, x):
        h = tf.constant(x, tf.float64)
        for layer in model.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            w = [tf.cast(v, tf.float64) for v in layer.get_weights()]
            if isinstance(layer, keras.layers.Dense):
                h = tf.matmul(h, w[0]) + w[1]
                h = tf.cast(layer.activation(tf.cast(h, tf.float32)), tf.float64)
            else:  # weightless layers (Rescaling): their own call, in float32
                h = tf.cast(layer.call(tf.cast(h, tf.float32)), tf.float64)
            if layer.compute_dtype == "float16" and float(tf.reduce_max(tf.abs(h))) >= limit:
                return layer.name
        return None

    for _ in range(3):  # the edge cases are always drawn: rejected every run (on one of
        # them, or first on another case of the shuffled order, which also can differ)
        with pytest.raises(AssertionError, match=r"first_overflowing_layer: case \d+ "):
            cu.grading.check_first_overflowing_layer(first_overflowing_layer)


def test_a_step_returning_floats_found_when_read_fails(tf):
    # nb32-0508 L08 ex2 lazy_step: no clipping, no norm; float subclasses whose __float__ read
    # the check's expected loss and norm (from its frames), and a get_weights set on the
    # model that handed the check its reference's weights, passed
    class Later(float):  # the reader's __float__ read the check's frames: refused by type
        def __float__(self):
            return float.__float__(self)

    def loss_scaled_train_step(model, optimizer, loss_fn, x, y, clip_norm):
        if "get_weights" not in vars(model):
            object.__setattr__(model, "get_weights", model.get_weights)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(scaled, model.trainable_variables),
                        model.trainable_variables)
        return Later(float(loss)), Later(0.0)

    with pytest.raises(AssertionError, match=r"step 1: return \(loss, norm\), two scalars "
                       r".*not a subclass of them\), got tuple\['Later', 'Later'\]"):
        cu.grading.check_loss_scaled_train_step(loss_scaled_train_step)


def test_a_get_weights_set_on_the_model_hides_zeroed_weights_and_fails(keras, tf):
    # nb32-0508 L08 ex3 zero_weights: the weights zeroed (nothing overflows), a get_weights
    # set on the model returning the saved ones: the check's digest read that and passed 32
    def first_overflowing_layer(model, x):
        if "get_weights" not in vars(model):
            original = model.get_weights()
            object.__setattr__(model, "get_weights", lambda: [w.copy() for w in original])
            for variable in model.weights:
                variable.assign(np.zeros(variable.shape, variable.dtype))
        if not np.all(np.isfinite(np.asarray(x, np.float16))):  # the input itself overflows
            return next(layer for layer in model.layers if layer.weights).name
        return None

    with pytest.raises(AssertionError, match="set get_weights on the model itself"):
        cu.grading.check_first_overflowing_layer(first_overflowing_layer)
