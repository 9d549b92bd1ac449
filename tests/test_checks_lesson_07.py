"""Lesson 07's checks: the reference solutions pass, wrong ones fail usefully, stubs are skipped."""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest

import course_utils as cu
from course_utils.grading import framework
from course_utils.grading.checks import lesson_07 as checks_07
from course_utils.grading.checks import memory_budget, padded_accumulation, suspect_loops
from course_utils.grading.framework import NotAttemptedError

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def stub(*args):
    raise NotImplementedError()


def _tf():
    return cu.quiet.import_tensorflow()


def _real(labels):
    """The real examples among ``labels`` (the padding's label is -1)."""
    tf = _tf()
    return tf.reduce_sum(tf.cast(tf.not_equal(tf.cast(labels, tf.int32), -1), tf.float32))


def right_loop(model, optimizer, loss_fn, features, labels, micro_batch_size,
               accumulation_steps, *, weigh="real", skip=False, drop=False):
    """Right by default: each micro-batch's mean over its real examples weighed by its share
    of the group's real examples, counted before the first. ``weigh``: "k" (lesson 07's
    cells: the mean / k), "group" (the mean / the micro-batches in the group), "dropped"
    (section 2's loop: / k, the short group never applied), "none" (the sum of the means),
    "slots" (a mean over every slot, padding counted) or "so far" (the real examples of the
    group's micro-batches up to this one); ``skip``: a micro-batch of padding only not run;
    ``drop``: the short last group never run."""
    tf = _tf()
    micro_batches = list(tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        micro_batch_size))
    for start in range(0, len(micro_batches), accumulation_steps):
        group = micro_batches[start:start + accumulation_steps]
        if len(group) < accumulation_steps and (drop or weigh == "dropped"):
            return
        real, so_far = tf.add_n([_real(y) for _, y in group]), 0.0
        totals = [tf.zeros_like(v) for v in model.trainable_variables]
        for x, y in group:
            if skip and not _real(y):
                continue
            so_far += _real(y)
            share = {"k": 1 / accumulation_steps, "dropped": 1 / accumulation_steps,
                     "group": 1 / len(group), "none": 1.0,
                     "slots": _real(y) / (len(group) * micro_batch_size),
                     "so far": tf.math.divide_no_nan(_real(y), so_far)}.get(
                         weigh, _real(y) / real)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True)) * share
            totals = [t + g for t, g in zip(totals, tape.gradient(
                loss, model.trainable_variables), strict=True)]
        optimizer.apply_gradients(zip(totals, model.trainable_variables, strict=True))


def every_micro_batch(model, optimizer, loss_fn, features, labels, micro_batch_size,
                      accumulation_steps):
    right_loop(model, optimizer, loss_fn, features, labels, micro_batch_size, 1)


def without_dividing(*args):
    right_loop(*args, weigh="none")


# --- train_with_accumulation -----------------------------------------------------------------


@pytest.mark.solution_passes
def test_reference_accumulation_passes(capsys):
    assert cu.grading.check_train_with_accumulation(right_loop)
    assert "✅ train_with_accumulation: 2 cases passed" in capsys.readouterr().out


def sums_scaled_at_apply(model, optimizer, loss_fn, features, labels, micro, steps):
    """Right another way: each micro-batch's summed per-example losses (their own, not
    ``loss_fn``), the group's sum divided by its real examples once, at the update."""
    tf = _tf()
    import keras

    variables = model.trainable_variables
    for start in range(0, len(labels), micro * steps):
        sums, real = [tf.zeros_like(v) for v in variables], 0.0
        for i in range(start, min(start + micro * steps, len(labels)), micro):
            y = tf.constant(labels[i:i + micro])
            with tf.GradientTape() as tape:
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, model(features[i:i + micro], training=True), from_logits=True,
                    ignore_class=-1)
                loss = tf.reduce_sum(per_example)
            sums = [a + g for a, g in zip(sums, tape.gradient(loss, variables), strict=True)]
            real += _real(y)
        optimizer.apply_gradients(zip([a / real for a in sums], variables, strict=True))


@pytest.mark.solution_passes
def test_the_sums_scaled_once_at_the_update_pass():
    assert cu.grading.check_train_with_accumulation(sums_scaled_at_apply)


def test_the_right_loop_that_drops_the_short_group_is_named():
    with pytest.raises(AssertionError, match=r"case 2 .*short group, were never applied"):
        cu.grading.check_train_with_accumulation(functools.partial(right_loop, drop=True))


def test_the_lessons_loop_copied_averages_the_means_and_is_named():
    # lesson 07's eager loop (section 3, with_adam: each micro-batch's mean / k; the former
    # answer, / len(group), is the same in case 1): right only when every micro-batch holds as
    # many real examples as the others
    with pytest.raises(AssertionError, match=r"case 1 .*averaging the micro-batches' mean "
                                             r"losses .* weighs as much as one of \d"):
        cu.grading.check_train_with_accumulation(functools.partial(right_loop, weigh="k"))


def test_a_mean_over_every_slot_counting_the_padding_is_named():
    with pytest.raises(AssertionError, match=r"case 1 .*every example slot of the group, "
                                             r"padding included"):
        cu.grading.check_train_with_accumulation(functools.partial(right_loop, weigh="slots"))


def test_dividing_by_the_real_examples_seen_so_far_is_caught():
    with pytest.raises(AssertionError, match=r"case 1 .*differ from plain SGD with the loss you "
                                             r"were given on batches \d× larger"):
        cu.grading.check_train_with_accumulation(functools.partial(right_loop, weigh="so far"))


def test_skipping_the_padding_only_micro_batch_is_named():
    with pytest.raises(AssertionError, match=r"case 2 .*every micro-batch, its padding "
                                             r"included, goes through"):
        cu.grading.check_train_with_accumulation(functools.partial(right_loop, skip=True))


def test_applying_every_micro_batch_is_named():
    with pytest.raises(AssertionError) as info:
        cu.grading.check_train_with_accumulation(every_micro_batch)
    message = str(info.value)
    assert "match applying every micro-batch" in message and "Hint:" in message


def test_summing_without_dividing_is_named():
    with pytest.raises(AssertionError, match=r"without dividing: each update is about \d× too"):
        cu.grading.check_train_with_accumulation(without_dividing)


def _fed_differently(model, optimizer, loss_fn, features, labels, micro, steps, *, how):
    """xf07's answers, the right weights but other examples or calls in training mode:
    "skipped" (L1: a micro-batch of padding only skipped, a forward of zeros, freed by a
    zero backward, in its place), "zeros" (L2: each micro-batch's padding rows replaced by
    zeros) or "halves" (L3: micro-batches of half micro_batch_size)."""
    tf = _tf()
    variables, size = model.trainable_variables, micro // 2 if how == "halves" else micro
    for start in range(0, len(labels), micro * steps):
        stop = min(start + micro * steps, len(labels))
        real, sums = float(np.sum(labels[start:stop] != -1)), [tf.zeros_like(v) for v in variables]
        for i in range(start, stop, size):
            x, y = features[i:i + size], labels[i:i + size]
            if how == "zeros":
                x = np.where((y != -1)[:, None], x, 0.0).astype("float32")
            with tf.GradientTape() as tape:
                if how == "skipped" and not np.any(y != -1):
                    out = model(tf.zeros_like(x), training=True)
                    loss = tf.reduce_sum(out) * 0.0
                else:
                    loss = loss_fn(y, model(x, training=True)) * float(np.sum(y != -1)) / real
            sums = [a + g for a, g in zip(sums, tape.gradient(loss, variables), strict=True)]
        optimizer.apply_gradients(zip(sums, variables, strict=True))


@pytest.mark.parametrize(("how", "says"), [
    ("skipped", r"case 2 .*not the micro-batches of features you were given, each once"),
    ("zeros", r"case 1 .*not the micro-batches of features you were given, each once"),
    ("halves", r"case 1 .*ran (\d+) times in training mode for (?!\1)\d+ micro-batches")])
def test_other_examples_or_smaller_calls_in_training_mode_are_caught(how, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_train_with_accumulation(functools.partial(_fed_differently, how=how))


def test_weights_applied_to_the_gradients_after_the_tape_are_named():
    # xf07 R1, refused and stated in the exercise: each micro-batch's plain mean-loss gradients
    # weighed by its real examples' share after tape.gradient; equal in value to a forward by
    # hand after counted passes of the plain loss, which one factor per update keeps out
    tf = _tf()

    def weighed_after(model, optimizer, loss_fn, features, labels, micro, steps):
        variables = model.trainable_variables
        for start in range(0, len(labels), micro * steps):
            stop = min(start + micro * steps, len(labels))
            real, sums = float(np.sum(labels[start:stop] != -1)), None
            for i in range(start, stop, micro):
                with tf.GradientTape() as tape:
                    loss = loss_fn(labels[i:i + micro], model(features[i:i + micro],
                                                              training=True))
                share = float(np.sum(labels[i:i + micro] != -1)) / real
                grads = [g * share for g in tape.gradient(loss, variables)]
                sums = grads if sums is None else [a + g for a, g in zip(sums, grads,
                                                                         strict=True)]
            optimizer.apply_gradients(zip(sums, variables, strict=True))

    with pytest.raises(AssertionError, match=r"case 1 .*weights are right.*weighed inside its "
                                             r"tape, in its loss"):
        cu.grading.check_train_with_accumulation(weighed_after)


def test_a_batch_over_the_memory_limit_fails_like_out_of_memory():
    def whole_groups(model, optimizer, loss_fn, features, labels, micro, steps):
        right_loop(model, optimizer, loss_fn, features, labels, micro * steps, 1)

    with pytest.raises(AssertionError, match="out of memory"):
        cu.grading.check_train_with_accumulation(whole_groups)


def test_one_tape_over_all_micro_batches_runs_out_of_memory():
    def one_tape(model, optimizer, loss_fn, features, labels, micro, steps):
        tf = _tf()
        for start in range(0, len(labels), micro * steps):
            with tf.GradientTape() as tape:  # every micro-batch's activations kept at once
                loss = sum(loss_fn(labels[i:i + micro], model(features[i:i + micro],
                                                              training=True)) / steps
                           for i in range(start, start + micro * steps, micro))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

    with pytest.raises(AssertionError, match="activations alive at once"):
        cu.grading.check_train_with_accumulation(one_tape)


def test_a_training_mode_forward_without_a_tape_counts_and_the_message_says_so():
    def logs_the_loss_first(model, optimizer, loss_fn, features, labels, micro, steps):
        loss_fn(labels[:micro], model(features[:micro], training=True))  # no tape, never freed
        right_loop(model, optimizer, loss_fn, features, labels, micro, steps)

    # nb26-07: the text said a tape keeps activations until its gradient, the count also
    # keeps a forward in training mode with no tape: the message now says which counts
    with pytest.raises(AssertionError, match="with or without a tape, keeps them until a "
                                             "tape.gradient back-propagates through it"):
        cu.grading.check_train_with_accumulation(logs_the_loss_first)


def test_one_persistent_tape_freed_by_a_throw_away_backward_is_caught():
    def one_tape(model, optimizer, loss_fn, features, labels, micro, steps):
        tf = _tf()
        for start in range(0, len(labels), micro * steps):
            with tf.GradientTape(persistent=True) as tape:  # keeps every micro-batch
                losses = []
                for i in range(start, start + micro * steps, micro):
                    out = model(features[i:i + micro], training=True)
                    with tape.stop_recording():  # a backward that frees nothing
                        tape.gradient(out, model.trainable_variables)
                    losses.append(loss_fn(labels[i:i + micro], out))
                loss = tf.add_n(losses) / steps
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

    with pytest.raises(AssertionError, match="back-propagated twice"):
        cu.grading.check_train_with_accumulation(one_tape)


def test_training_the_model_inside_the_limit_on_whole_batches_is_caught():
    def around_the_limit(model, optimizer, loss_fn, features, labels, micro, steps):
        inner = next(layer for layer in model.layers if hasattr(layer, "layers"))
        right_loop(inner, optimizer, loss_fn, features, labels, micro * steps, 1)

    with pytest.raises(AssertionError, match=r"only 0 went through the memory limit"):
        cu.grading.check_train_with_accumulation(around_the_limit)


@pytest.mark.parametrize("reach", ["model", "layers"])
def test_training_around_the_limit_then_padding_its_count_is_caught(reach):
    def padded(model, optimizer, loss_fn, features, labels, micro, steps):
        tf = _tf()
        inner = next(layer for layer in model.layers if hasattr(layer, "layers"))
        if reach == "model":  # the whole group at once, through the model inside
            right_loop(inner, optimizer, loss_fn, features, labels, micro * steps, 1)
        else:  # the model's own layers, called one by one on the whole data
            x = features
            for layer in inner.layers[1:]:
                x = layer(x)
        for start in range(0, len(labels), micro):  # then dummy passes pad the counters
            with tf.GradientTape() as tape:
                out = model(features[start:start + micro], training=True)
            tape.gradient(out, model.trainable_variables)

    with pytest.raises(AssertionError, match=r"ran on \d+ examples, but only \d+ went"):
        cu.grading.check_train_with_accumulation(padded)


def test_the_whole_group_through_the_parent_dense_call_is_caught():
    # a reader's answer (nb24-07, L1c): no accumulation, each group's whole batch on one tape
    # through the inner layers' unbound keras.layers.Dense.call (which skipped the count),
    # the limited model run on each micro-batch only to pad its counters
    tf = _tf()
    import keras

    def whole_group(model, optimizer, loss_fn, features, labels, micro, steps):
        inner = next(layer for layer in model.layers if isinstance(layer, keras.Model))
        dense = [layer for layer in inner.layers if isinstance(layer, keras.layers.Dense)]
        for start in range(0, len(labels), micro * steps):
            x, y = features[start:start + micro * steps], labels[start:start + micro * steps]
            for m in range(0, len(y), micro):
                with tf.GradientTape() as throwaway:
                    out = model(x[m:m + micro], training=True)
                throwaway.gradient(out, model.trainable_variables)
            with tf.GradientTape() as tape:
                h = tf.convert_to_tensor(x)
                for layer in dense:
                    h = keras.layers.Dense.call(layer, h)
                loss = loss_fn(y, h)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

    with pytest.raises(AssertionError, match=r"kernel read outside its own call"):
        cu.grading.check_train_with_accumulation(whole_group)


def test_skipping_the_work_or_training_mode_is_caught():
    def nothing(*args):
        return None

    with pytest.raises(AssertionError, match="0 examples went forward"):
        cu.grading.check_train_with_accumulation(nothing)

    with pytest.raises(AssertionError, match="training=True"):
        cu.grading.check_train_with_accumulation(_not_training)


def _not_training(model, optimizer, loss_fn, features, labels, micro, steps):
    tf = _tf()
    sums = None
    for index, start in enumerate(range(0, len(labels), micro), start=1):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels[start:start + micro], model(features[start:start + micro]))
        grads = tape.gradient(loss / steps, model.trainable_variables)
        sums = grads if sums is None else [a + b for a, b in zip(sums, grads, strict=True)]
        if index % steps == 0:
            optimizer.apply_gradients(zip(sums, model.trainable_variables, strict=True))
            sums = None


def test_accumulation_stub_is_not_attempted(capsys):
    assert cu.grading.check_train_with_accumulation(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with framework.strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_train_with_accumulation(stub)


def test_a_stub_trains_no_reference(monkeypatch):
    built = []
    monkeypatch.setattr(padded_accumulation, "_references",
                        lambda problem: built.append(problem) or {})
    assert cu.grading.check_train_with_accumulation(stub) is False
    assert built == []  # the references are trained only once a loop has run


# --- largest_batch_that_fits -----------------------------------------------------------------


def largest_batch_that_fits(model, budget_bytes, optimizer_slots, *, layers_from=0,
                            gradients_of=None, boundary="fits"):
    gradients_of = model.trainable_weights if gradients_of is None else gradients_of
    trainable = sum(math.prod(v.shape) * 4 for v in gradients_of)
    fixed = sum(math.prod(v.shape) * 4 for v in model.weights) + trainable * (1 + optimizer_slots)
    per_example = sum(math.prod(layer.output.shape[1:]) * 4
                      for layer in model.layers[layers_from:])
    spare = {"fits": 0, "strictly below": -1, "rounded up": per_example - 1}[boundary]
    return max(0, (budget_bytes - fixed + spare) // per_example)


def test_reference_largest_batch_passes(capsys):
    assert cu.grading.check_largest_batch_that_fits(largest_batch_that_fits)
    assert "✅ largest_batch_that_fits: 9 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("boundary", ["strictly below", "rounded up"])
def test_off_by_one_at_the_budget_boundary_is_caught(boundary):
    # nb26-07's answer ("strictly below": (budget - fixed - 1) // per_example) passed while the
    # budgets' remainders were random: a budget exactly full came up once in per_example cases
    def off_by_one(model, budget_bytes, optimizer_slots):
        return largest_batch_that_fits(model, budget_bytes, optimizer_slots, boundary=boundary)

    with pytest.raises(AssertionError, match=r"case [12] .*: expected (\d+), got (?!\1)\d+"):
        cu.grading.check_largest_batch_that_fits(off_by_one)


def test_an_answer_that_reads_the_cases_from_the_checks_frames_finds_nothing():
    import importlib

    inspect = importlib.import_module("in" + "spect")  # names built at run time: no scan sees

    def from_the_frames(model, budget_bytes, optimizer_slots):
        for info in getattr(inspect, "st" + "ack")():
            found = getattr(info.frame, "f_" + "locals")
            for value in [found.get("case"), *found.get("cases", ())]:
                if value is not None and getattr(value, "expected", None) is not None:
                    return value.expected
            if isinstance(found.get("expected"), int):
                return found["expected"]
        return -1

    with pytest.raises(AssertionError, match="read the interpreter's frames"):
        cu.grading.check_largest_batch_that_fits(from_the_frames)


def test_the_reference_is_the_course_budget():
    model = cu.models.mlp(8, 3, hidden_units=(16,))
    batch = memory_budget._largest_batch(model, 10**6, 2)
    fits = cu.memory.step_budget(model, global_batch=batch, optimizer_slots=2).total
    assert fits <= 10**6 < cu.memory.step_budget(model, global_batch=batch + 1,
                                                 optimizer_slots=2).total


def test_leaving_out_the_input_batch_is_caught():
    def no_input(model, budget_bytes, optimizer_slots):  # the old count: model.layers[1:]
        return largest_batch_that_fits(model, budget_bytes, optimizer_slots, layers_from=1)

    with pytest.raises(AssertionError, match="off by|expected"):
        cu.grading.check_largest_batch_that_fits(no_input)


def test_gradients_for_weights_without_gradients_are_caught():
    def every_weight(model, budget_bytes, optimizer_slots):
        return largest_batch_that_fits(model, budget_bytes, optimizer_slots,
                                       gradients_of=model.weights)

    with pytest.raises(AssertionError, match="normalized_mlp"):
        cu.grading.check_largest_batch_that_fits(every_weight)


def test_a_constant_or_the_activations_alone_are_caught():
    with pytest.raises(AssertionError, match="expected"):
        cu.grading.check_largest_batch_that_fits(lambda model, budget, slots: 64)

    def activations_only(model, budget_bytes, optimizer_slots):
        per_example = sum(math.prod(layer.output.shape[1:]) * 4 for layer in model.layers)
        return budget_bytes // per_example

    with pytest.raises(AssertionError, match="expected"):
        cu.grading.check_largest_batch_that_fits(activations_only)


def test_the_course_budget_under_the_answer_name_is_refused():
    budget = cu.memory.step_budget  # bound before the check: the guard is by code identity

    def course_counts(model, budget_bytes, optimizer_slots):  # section 9's helper does it all
        per_example = cu.memory.activation_bytes_per_example(model)
        fixed = budget(model, global_batch=1, optimizer_slots=optimizer_slots).total
        return max(0, (budget_bytes - fixed + per_example) // per_example)

    with pytest.raises(AssertionError, match=r"ran the course's (step_budget|activation_)"):
        cu.grading.check_largest_batch_that_fits(course_counts)


def test_the_course_zero_counter_for_the_fixed_terms_is_refused():
    zero = cu.parallel.zero_bytes_per_device  # bound before the check: refused by identity

    def zero_counts(model, budget_bytes, optimizer_slots):  # nb31-07's answer (2f)
        trainable = sum(math.prod(v.shape) for v in model.trainable_weights)
        fixed = zero(trainable, 1, 0, optimizer_slots=optimizer_slots)["total"] + 4 * (
            model.count_params() - trainable)
        per_example = sum(math.prod(layer.output.shape[1:]) * 4 for layer in model.layers)
        return max(0, (budget_bytes - fixed) // per_example)

    with pytest.raises(AssertionError, match=r"ran the course's zero_bytes_per_device"):
        cu.grading.check_largest_batch_that_fits(zero_counts)


def test_an_execd_copy_of_the_course_counters_is_refused(monkeypatch):
    import pathlib
    import sys
    import types

    module = types.ModuleType("my_memory")  # dataclasses look their module up
    monkeypatch.setitem(sys.modules, "my_memory", module)
    source = pathlib.Path(cu.memory.__file__).read_text()
    exec(compile("\n" + source, "my_memory.py", "exec"), module.__dict__)  # a line lower
    copied = module.__dict__

    def from_a_copy(model, budget_bytes, optimizer_slots):
        per_example = copied["activation_bytes_per_example"](model)
        fixed = copied["step_budget"](model, global_batch=1,
                                      optimizer_slots=optimizer_slots).total
        return max(0, (budget_bytes - fixed + per_example) // per_example)

    with pytest.raises(AssertionError, match=r"ran the course's \w+ \(a copy of it\)"):
        cu.grading.check_largest_batch_that_fits(from_a_copy)


def test_the_course_counters_private_helpers_are_refused():
    from course_utils.memory import _layer_output_bytes, _tensor_bytes

    def private_counts(model, budget_bytes, optimizer_slots):  # the weights counted by hand
        fixed = sum(int(np.prod(v.shape)) * 4 for v in model.weights) + (
            1 + optimizer_slots) * sum(int(np.prod(v.shape)) * 4 for v in model.trainable_weights)
        per_example = _layer_output_bytes(model) + sum(_tensor_bytes(t) for t in model.inputs)
        return max(0, (budget_bytes - fixed) // per_example)

    with pytest.raises(AssertionError, match=r"ran the course's _(layer_output|tensor)_bytes"):
        cu.grading.check_largest_batch_that_fits(private_counts)


def test_forgetting_the_optimizer_slots_is_caught():
    def no_slots(model, budget_bytes, optimizer_slots):
        return largest_batch_that_fits(model, budget_bytes, 0)

    with pytest.raises(AssertionError, match=r"optimizer_slots=2.*off by"):
        cu.grading.check_largest_batch_that_fits(no_slots)


def test_a_float_answer_or_a_negative_one_is_caught():
    def as_float(model, budget_bytes, optimizer_slots):
        return float(largest_batch_that_fits(model, budget_bytes, optimizer_slots))

    with pytest.raises(AssertionError, match="should be an int"):
        cu.grading.check_largest_batch_that_fits(as_float)

    def negative(model, budget_bytes, optimizer_slots):
        trainable = sum(math.prod(v.shape) * 4 for v in model.trainable_weights)
        fixed = sum(math.prod(v.shape) * 4 for v in model.weights) + trainable * (
            1 + optimizer_slots)
        per_example = sum(math.prod(layer.output.shape[1:]) * 4 for layer in model.layers)
        return (budget_bytes - fixed) // per_example

    with pytest.raises(AssertionError, match="only the weights"):
        cu.grading.check_largest_batch_that_fits(negative)


def test_largest_batch_stub_is_not_attempted():
    with framework.strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_largest_batch_that_fits(stub)


# --- diagnose_accumulation -------------------------------------------------------------------


def diagnose_accumulation(loop):
    import keras
    import numpy as np

    data = np.random.default_rng(0)
    features = data.normal(size=(48, 6)).astype("float32")
    labels = data.integers(0, 3, size=48)
    micro, steps, rate = 4, 3, 0.2
    start = cu.models.mlp(6, 3, hidden_units=(8,)).get_weights()

    def run(train, learning_rate):
        model = cu.models.mlp(6, 3, hidden_units=(8,))
        model.set_weights(start)
        train(model, keras.optimizers.SGD(learning_rate=learning_rate),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True), features, labels,
              micro, steps)
        return model.get_weights()

    suspect = run(loop, rate)
    candidates = {
        "correct": run(right_loop, rate),
        "applies every micro-batch": run(every_micro_batch, rate),
        "sums without dividing": run(right_loop, steps * rate),
    }
    return min(candidates,
               key=lambda name: cu.equality.largest_difference(suspect, candidates[name]))


@pytest.mark.solution_passes
def test_reference_diagnosis_passes(capsys):
    assert cu.grading.check_diagnose_accumulation(diagnose_accumulation)
    assert "✅ diagnose_accumulation: 4 cases passed" in capsys.readouterr().out


def test_a_wrong_diagnosis_is_caught():
    with pytest.raises(AssertionError, match="returned 'correct' without running the loop"):
        cu.grading.check_diagnose_accumulation(lambda loop: "correct")
    assert set(checks_07.DIAGNOSES) == {"correct", "applies every micro-batch",
                                        "sums without dividing"}
    with pytest.raises(ValueError, match="kind must be one of"):
        checks_07.suspect_loop("off by one")


def test_reading_the_loop_instead_of_running_it_is_caught():
    import inspect

    def from_closure(loop):
        text = repr(inspect.getclosurevars(loop)) + repr(loop.__defaults__)
        return next((kind for kind in checks_07.DIAGNOSES if kind in text), "correct")

    def from_name(loop):
        name = loop.__qualname__
        return "applies every micro-batch" if "every" in name else (
            "sums without dividing" if "divid" in name else "correct")

    def from_token(loop):  # the closure's token, looked up in the check's own plans
        every, divide = suspect_loops._SUSPECT_PLANS[loop.__closure__[0].cell_contents]
        return {plan: kind for kind, plan in suspect_loops._PLANS.items()}[(every, divide)]

    loops = [checks_07.suspect_loop(kind) for kind in checks_07.DIAGNOSES]
    assert len({loop.__code__ for loop in loops}) == 1  # one code, one name, no defaults
    assert {loop.__defaults__ for loop in loops} == {None}
    for reader, says in ((from_closure, "reads how the check built the loop"),
                         (from_token, r"__closure__.*reads how the check built the loop"),
                         (from_name, "without running the loop")):
        with pytest.raises(AssertionError, match=says):
            cu.grading.check_diagnose_accumulation(reader)


def _plan_of(loop):
    """The plan a loop's token maps to, every name built at run time (no guarded name in the
    code): what a learner who hides the reading from the name guard would write."""
    import sys

    token = getattr(getattr(loop, "".join(["__clo", "sure__"]))[0],
                    "".join(["cell_", "contents"]))
    module = sys.modules[getattr(loop, "".join(["__mod", "ule__"]))]
    for value in vars(module).values():
        if isinstance(value, dict) and token in value and isinstance(value[token], tuple):
            every, divide = value[token]
            return ("applies every micro-batch" if every else
                    "correct" if divide else "sums without dividing")
    return None


def test_a_loop_read_before_it_ran_tells_nothing():
    def hidden_reader(loop):  # reads the check's plans under names built at run time
        return _plan_of(loop) or "correct"

    def never_runs(loop):  # guesses: the loop is never called
        return "correct"

    for reader in (hidden_reader, never_runs):
        with pytest.raises(AssertionError, match="without running the loop"):
            cu.grading.check_diagnose_accumulation(reader)


def _cell(loop, kind):  # a value of ``kind`` in the loop's closure, by names built at run time
    for cell in getattr(loop, "".join(["__clo", "sure__"])):
        value = getattr(cell, "".join(["cell_", "contents"]))
        if isinstance(value, kind):
            return value
    return None


def _run_once(loop):  # on one micro-batch of nothing much: the loop's kind is drawn
    import keras

    loop(cu.models.mlp(4, 2, hidden_units=(4,)), keras.optimizers.SGD(0.1),
         keras.losses.SparseCategoricalCrossentropy(from_logits=True),
         np.ones((2, 4), "float32"), np.zeros(2, "int32"), 2, 2)


def test_a_plan_read_after_one_run_is_not_in_this_process():
    def run_once_then_read(loop):  # x0509's lazy answer: the kind drawn, then looked up
        _run_once(loop)
        return _plan_of(loop) or "correct"

    def run_once_then_search(loop):  # every dict of the check's module, for the loop's token
        import sys

        _run_once(loop)
        token = _cell(loop, str)
        module = sys.modules[getattr(loop, "".join(["__mod", "ule__"]))]
        for value in vars(module).values():
            if isinstance(value, dict) and token in value:
                found = value[token]
                return found.get("kind", "correct") if isinstance(found, dict) else "correct"
        return "correct"

    def asks_the_check(loop):  # the copy's reveal request, sent through the check's own code
        _run_once(loop)
        return suspect_loops._reveal(_cell(loop, suspect_loops.ForkedCall), _cell(loop, str))[0]

    for wrong, says in ((run_once_then_read, "differs from what this loop does"),
                        (run_once_then_search, "differs from what this loop does"),
                        (asks_the_check, "asked the check's process what this loop is")):
        with pytest.raises(AssertionError, match=says):
            cu.grading.check_diagnose_accumulation(wrong)


def test_the_copy_asked_directly_through_the_closure_is_refused():
    def via_closure(loop):  # nb26-07's answer: no model, the copy fed ones (run-time names)
        ask, token = _cell(loop, suspect_loops.ForkedCall), _cell(loop, str)
        ask("begin", token)
        updates = [ask("step", token, [[1.0]], 3) for _ in range(3)]
        return "applies every micro-batch" if updates[0] is not None else (
            "correct" if abs(float(updates[2][0][0]) - 1) < 1e-6 else "sums without dividing")

    def reveal_asked(loop):  # the copy's reveal request, sent from the answer
        ask = _cell(loop, suspect_loops.ForkedCall)
        return ask("re" + "veal", _cell(loop, str))[0]

    for wrong in (via_closure, reveal_asked):
        with pytest.raises(AssertionError, match=r"case 1 .*asked the check's process directly"):
            cu.grading.check_diagnose_accumulation(wrong)


def test_a_diagnosis_that_cannot_tell_the_mistakes_apart_is_caught():
    def with_one_micro_batch_per_group(loop):  # k = 1: every loop is the same loop
        import keras

        model = cu.models.mlp(4, 2, hidden_units=(4,))
        start = model.get_weights()
        loop(model, keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(),
             np.ones((8, 4), "float32"), np.zeros(8, "int32"), 4, 1)
        return "correct" if cu.equality.largest_difference(model.get_weights(), start) else "?"

    def counting_updates(loop):  # right and "without dividing" both apply once per group
        import keras

        optimizer = keras.optimizers.SGD(0.1)
        loop(cu.models.mlp(4, 2, hidden_units=(4,)), optimizer,
             keras.losses.SparseCategoricalCrossentropy(from_logits=True),
             np.ones((16, 4), "float32"), np.zeros(16, "int32"), 2, 4)
        return "correct" if int(optimizer.iterations) == 2 else "applies every micro-batch"

    def two_candidates(loop):  # never considers "sums without dividing"
        answer = diagnose_accumulation(loop)
        return "correct" if answer == "sums without dividing" else answer

    for wrong in (with_one_micro_batch_per_group, counting_updates, two_candidates):
        with pytest.raises(AssertionError, match="differs from what this loop does"):
            cu.grading.check_diagnose_accumulation(wrong)


def test_diagnosis_stub_is_not_attempted(capsys):
    assert cu.grading.check_diagnose_accumulation(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


# --- train_mirrored_with_accumulation ---------------------------------------------------------


def _penalty(model, tf, scaled=True):  # the model's L2 penalty, this replica's share
    total = tf.add_n(model.losses)
    return tf.nn.scale_regularization_loss(total) if scaled else total


def mirrored_accumulation(strategy, model, optimizer, loss_object, micro_batches,
                          accumulation_steps, global_batch_size, divide_by_group=True,
                          penalty="once"):
    tf = _tf()

    def replica_step(*group):
        examples = (len(group) if divide_by_group else accumulation_steps) * global_batch_size
        sums = None
        for index, (x, y) in enumerate(group):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                  global_batch_size=examples)
                if penalty == "once" and index == 0 or penalty == "every micro-batch":
                    loss += _penalty(model, tf)
                elif penalty == "unscaled" and index == 0:
                    loss += _penalty(model, tf, scaled=False)
            grads = tape.gradient(loss, model.trainable_variables)
            sums = grads if sums is None else [s + g for s, g in zip(sums, grads, strict=True)]
        optimizer.apply_gradients(zip(sums, model.trainable_variables, strict=True))

    @tf.function
    def step(group):
        strategy.run(replica_step, args=group)

    total = int(micro_batches.cardinality())
    iterator = iter(strategy.experimental_distribute_dataset(micro_batches))
    for start in range(0, total, accumulation_steps):
        step(tuple(next(iterator) for _ in range(min(accumulation_steps, total - start))))


def _run_in_groups(strategy, replica_step, micro_batches, steps):
    """``replica_step`` on every replica, once per group of ``steps`` micro-batches (the last
    group shorter): the loop the wrong answers below share."""
    total = int(micro_batches.cardinality())
    iterator = iter(strategy.experimental_distribute_dataset(micro_batches))
    step = _tf().function(lambda group: strategy.run(replica_step, args=group))
    for start in range(0, total, steps):
        step(tuple(next(iterator) for _ in range(min(steps, total - start))))


def one_inference_tape_over_the_group(model, optimizer, loss_fn, features, labels,
                                      micro_batch_size, accumulation_steps):
    """Each micro-batch touched in training mode (freed at once), then the group's gradients
    from one tape over every micro-batch in inference mode: k micro-batches alive at once,
    uncounted, unless no gradient flows back through an inference-mode call."""
    import tensorflow as tf

    variables = model.trainable_variables
    batches = list(tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        micro_batch_size))
    for start in range(0, len(batches), accumulation_steps):
        group = batches[start:start + accumulation_steps]
        for x, _ in group:
            with tf.GradientTape() as touch:
                touched = 0.0 * tf.reduce_sum(model(x, training=True))
            touch.gradient(touched, variables)
        with tf.GradientTape() as tape:
            loss = tf.add_n([loss_fn(y, model(x, training=False)) for x, y in group])
        grads = tape.gradient(loss / len(group), variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))


def test_gradients_through_an_inference_mode_call_are_none_so_one_tape_fails():
    with pytest.raises(AssertionError, match="raised ValueError"):
        cu.grading.check_train_with_accumulation(one_inference_tape_over_the_group)


@pytest.mark.solution_passes
def test_reference_mirrored_accumulation_passes(capsys):
    assert cu.grading.check_train_mirrored_with_accumulation(mirrored_accumulation)
    assert "✅ train_mirrored_with_accumulation: 2 cases passed" in capsys.readouterr().out


def test_the_lessons_step_without_the_penalty_is_named():  # section 5's step, copied
    def lessons_step(*args):
        mirrored_accumulation(*args, penalty=None)

    with pytest.raises(AssertionError, match="the model's L2 penalty .* never entered an update"):
        cu.grading.check_train_mirrored_with_accumulation(lessons_step)


@functools.cache
def _penalty_problem():
    """One problem for the penalty tests below (three groups of 3 and a short one): built once."""
    import random

    problem = checks_07._problem(random.Random(7))
    problem["penalty"], problem["steps"] = 0.02, 3
    n = problem["micro"] * (3 * 3 + 1)  # three groups and a short one
    data = np.random.default_rng(7)
    problem["features"] = data.normal(size=(n, problem["features"].shape[1])).astype("float32")
    problem["labels"] = data.integers(0, problem["classes"], size=n).astype("int32")
    return problem


_LARGE_BATCH_WEIGHTS = checks_07._large_batch_weights
_penalty_weights: dict[tuple, list] = {}


def _shared_large_batch_weights(problem, group, penalty_times=lambda g: 1.0):
    """``checks_07._large_batch_weights`` on the shared problem, each result kept, keyed by
    its inputs (the group and the penalty's multiple for every batch's micro-batch count)."""
    if problem is not _penalty_problem():
        return _LARGE_BATCH_WEIGHTS(problem, group, penalty_times)
    key = (group, tuple(penalty_times(g) for g in range(1, group + 1)))
    if key not in _penalty_weights:
        _penalty_weights[key] = _LARGE_BATCH_WEIGHTS(problem, group, penalty_times)
    return _penalty_weights[key]


@pytest.mark.parametrize(("mistake", "times", "says"), [
    ("every micro-batch", lambda g: g, "once per micro-batch, not once per update"),
    ("unscaled", lambda g: 2, "each replica added the whole penalty.*2× the penalty"),
    ("both", lambda g: 2 * g, "once per micro-batch on every replica"),
    ("ignored, every micro-batch applied", None, "match applying every micro-batch"),
])
def test_a_penalty_added_the_wrong_number_of_times_is_named(mistake, times, says, monkeypatch):
    # the weights such a loop reaches on 2 replicas (plain SGD with that penalty, cheap: no
    # strategy); the end-to-end runs of these loops cost 10-18 s each under load. The plain
    # SGD runs (the same for every mistake) are made once, on one problem, and kept
    monkeypatch.setattr(checks_07, "_large_batch_weights", _shared_large_batch_weights)
    problem = _penalty_problem()
    weights = (checks_07._large_batch_weights(problem, problem["steps"], times) if times else
               checks_07._large_batch_weights(problem, 1, lambda g: 0.0))
    assert re.search(says, checks_07._penalty_mistake(problem, weights, 2))


def test_the_penalty_once_per_update_is_no_mistake(monkeypatch):
    monkeypatch.setattr(checks_07, "_large_batch_weights", _shared_large_batch_weights)
    problem = _penalty_problem()  # the problem of the test above, the mistakes' weights kept
    right = checks_07._large_batch_weights(problem, problem["steps"])
    assert checks_07._penalty_mistake(problem, right, 2) is None


def test_applying_every_micro_batch_under_the_strategy_is_named():
    def every(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        mirrored_accumulation(strategy, model, optimizer, loss_object, micro_batches, 1, batch)

    with pytest.raises(AssertionError, match="applying every micro-batch"):
        cu.grading.check_train_mirrored_with_accumulation(every)


def test_a_short_last_group_divided_by_a_full_group_is_caught():
    def full_divisor(*args):
        mirrored_accumulation(*args, divide_by_group=False)

    with pytest.raises(AssertionError, match="short last group"):
        cu.grading.check_train_mirrored_with_accumulation(full_divisor)


def test_all_reducing_every_micro_batch_is_counted():
    def reduce_each(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        tf = _tf()
        total = int(micro_batches.cardinality())
        iterator = iter(strategy.experimental_distribute_dataset(micro_batches))

        def replica_step(*group):
            context, sums = tf.distribute.get_replica_context(), None
            for x, y in group:
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                      global_batch_size=len(group) * batch)
                    if x is group[0][0]:
                        loss += _penalty(model, tf)
                grads = context.all_reduce("sum", tape.gradient(loss,
                                                                model.trainable_variables))
                sums = grads if sums is None else [s + g for s, g in zip(sums, grads, strict=True)]
            optimizer.apply_gradients(zip([s / strategy.num_replicas_in_sync for s in sums],
                                          model.trainable_variables, strict=True))

        step = tf.function(lambda g: strategy.run(replica_step, args=g))  # one trace a size
        for start in range(0, total, steps):
            step(tuple(next(iterator) for _ in range(min(steps, total - start))))

    with pytest.raises(AssertionError, match=r"all-reduced \d.* times the gradients per update"):
        cu.grading.check_train_mirrored_with_accumulation(reduce_each)


def test_training_outside_the_replicas_is_caught():
    def outside(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        tf = _tf()
        features, labels = zip(*micro_batches, strict=True)
        right_loop(model, optimizer, lambda y, p: tf.reduce_mean(loss_object(y, p)),
                   tf.concat(features, 0), tf.concat(labels, 0), batch, steps)

    with pytest.raises(AssertionError, match="no gradient crossed the replicas"):
        cu.grading.check_train_mirrored_with_accumulation(outside)

    def reaches_around(strategy, model, optimizer, *rest):  # the layers inside the limit
        mirrored_accumulation(strategy, model.layers[1], optimizer, *rest)

    with pytest.raises(AssertionError, match="only 0 went through the memory limit"):
        cu.grading.check_train_mirrored_with_accumulation(reaches_around)


def test_doing_nothing_or_dropping_the_short_group_is_caught():
    def nothing(*args):
        return None

    with pytest.raises(AssertionError, match="differ from plain SGD"):
        cu.grading.check_train_mirrored_with_accumulation(nothing)

    def whole_groups_only(strategy, model, optimizer, loss_object, micro_batches, steps,
                          batch):  # section 5's step: always k micro-batches, the rest dropped
        total = int(micro_batches.cardinality())
        mirrored_accumulation(strategy, model, optimizer, loss_object,
                              micro_batches.take(total - total % steps), steps, batch)

    with pytest.raises(AssertionError, match=r"case 2 .*differ from plain SGD"):
        cu.grading.check_train_mirrored_with_accumulation(whole_groups_only)


def test_the_course_trainer_under_the_answers_name_is_refused():
    # lesson 07, section 7 shows cu.Trainer applying a short last group: exercises 1 and 4
    tf = _tf()

    # Each answer is section 7's cell, built but not fit: the guard refuses the first call into
    # the Trainer's code, so the fit changes nothing but the time (about 27 s under the
    # check's profiler). Fit, exercise 1's answer passed the check before (the mean loss given
    # once for every example: loss_fn(y, logits) * tf.ones_like(y)); exercise 4's failed only
    # on the all-reduce count, because the Trainer also all-reduces its loss totals.
    def trainer_loop(model, optimizer, loss_fn, features, labels, micro, steps):
        def per_example(y, logits):  # the mean loss, once for every example of the batch
            return loss_fn(y, logits) * tf.ones_like(tf.cast(y, tf.float32))

        cu.Trainer(lambda: model, lambda: optimizer, per_example, accumulation_steps=steps,
                   verbose=0)

    def mirrored_trainer(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        cu.Trainer(lambda: model, lambda: optimizer, loss_object, strategy=strategy,
                   accumulation_steps=steps, verbose=0)

    refused = "ran the course's .*cu.Trainer's accumulation"
    with pytest.raises(AssertionError, match=refused):
        cu.grading.check_train_with_accumulation(trainer_loop)
    with pytest.raises(AssertionError, match=refused):
        cu.grading.check_train_mirrored_with_accumulation(mirrored_trainer)


def test_the_checks_own_loop_under_the_answers_name_is_refused():
    def check_helper(model, optimizer, loss_fn, features, labels, micro, steps):  # nb26-07's
        full = len(labels) // (micro * steps) * micro * steps  # the full groups, then the rest
        suspect_loops.accumulate(model, optimizer, loss_fn, features[:full], labels[:full],
                                 micro, steps, steps)
        if rest := (len(labels) - full) // micro:
            suspect_loops.accumulate(model, optimizer, loss_fn, features[full:], labels[full:],
                                     micro, rest, rest)

    with pytest.raises(AssertionError, match="ran the course's accumulate.*the check's own loops"):
        cu.grading.check_train_with_accumulation(check_helper)


def _hand_forward(model, optimizer, loss_fn, features, labels, micro, steps,
                  listed_twice=False):
    """nb26-07's answer: each micro-batch run through the model (counted, its gradients thrown
    away), then the whole group forward by hand from the variables, all its activations at
    once. ``listed_twice`` (nb32-07, ex1 L2): one weight applied a second time with a zero
    gradient, so that the pairs' count no longer matched and the comparison was skipped."""
    tf = _tf()
    inner = next(layer for layer in model.layers if hasattr(layer, "layers"))
    dense = [layer for layer in inner.layers if hasattr(layer, "units")]
    variables = model.trainable_variables
    for start in range(0, len(labels), micro * steps):
        x, y = features[start:start + micro * steps], labels[start:start + micro * steps]
        for i in range(0, len(y), micro):  # counted and freed, its gradients thrown away
            with tf.GradientTape() as throw_away:
                out = model(x[i:i + micro], training=True)
            throw_away.gradient(out, variables)
        with tf.GradientTape() as tape:  # the whole group's activations at once
            h = tf.constant(x)
            for n, layer in enumerate(dense):
                h = layer.activation(tf.matmul(h, variables[2 * n]) + variables[2 * n + 1])
            loss = loss_fn(y, h)
        grads = tape.gradient(loss, variables)
        if listed_twice:
            grads, variables_applied = (grads + [tf.zeros_like(variables[0])],
                                        variables + [variables[0]])
        else:
            variables_applied = variables
        optimizer.apply_gradients(zip(grads, variables_applied, strict=True))


def test_a_group_forward_written_by_hand_from_the_variables_is_caught():
    with pytest.raises(AssertionError, match=r"case 1 .*weights are right, but the gradients "
                                             r"applied .* not those that flowed back"):
        cu.grading.check_train_with_accumulation(_hand_forward)


def test_a_group_forward_by_hand_with_a_weight_listed_twice_is_caught():
    def listed_twice(model, optimizer, loss_fn, features, labels, micro, steps):
        _hand_forward(model, optimizer, loss_fn, features, labels, micro, steps,
                      listed_twice=True)

    with pytest.raises(AssertionError, match=r"case 1 .*weights are right, but the gradients "
                                             r"applied .* not those that flowed back"):
        cu.grading.check_train_with_accumulation(listed_twice)


def test_weights_trained_elsewhere_written_in_inside_apply_are_caught():
    # nb32-07's answer (ex1 L6): the undivided sums applied, while the optimizer instance's
    # _backend_update_step (which apply calls) writes in a plain copy's weights instead
    import keras

    def inside_apply(model, optimizer, loss_fn, features, labels, micro, steps):
        inner = next(layer for layer in model.layers if isinstance(layer, keras.Model))
        copy = keras.Sequential([keras.Input((features.shape[1],))] + [
            keras.layers.Dense(layer.units, activation=layer.activation)
            for layer in inner.layers if hasattr(layer, "units")])
        copy.set_weights(model.get_weights())
        targets = []
        other = keras.optimizers.SGD(float(optimizer.learning_rate))
        for start in range(0, len(labels), micro * steps):
            right_loop(copy, other, loss_fn, features[start:start + micro * steps],
                       labels[start:start + micro * steps], micro * steps, 1)
            targets.append(copy.get_weights())
        queue = iter(targets)

        def written_in(grads, variables, learning_rate):
            for v, w in zip(variables, next(queue), strict=True):
                v.assign(w)

        optimizer._backend_update_step = written_in
        right_loop(model, optimizer, loss_fn, features, labels, micro, steps, weigh="none")

    with pytest.raises(AssertionError, match=r"case 1 .*weights are right, but an update "
                                             r"moved them by other than the learning rate"):
        cu.grading.check_train_with_accumulation(inside_apply)


def _trained_elsewhere(model, optimizer, loss_fn, features, labels, micro, steps, *, when,
                       decoy):
    """nb31-07's answers (1f, 1h): a plain copy of the model, with no memory limit, trained on
    whole groups; the model given runs each micro-batch (counted, its gradients summed) and
    the optimizer applies ``decoy`` times the sum once a group; the copy's weights are written
    in with set_weights ``when``: after the last update, or before it."""
    tf = _tf()
    import keras

    inner = next(layer for layer in model.layers if isinstance(layer, keras.Model))
    copy = keras.Sequential([keras.Input((features.shape[1],))] + [
        keras.layers.Dense(layer.units, activation=layer.activation)
        for layer in inner.layers if hasattr(layer, "units")])
    copy.set_weights(model.get_weights())
    right_loop(copy, keras.optimizers.SGD(float(optimizer.learning_rate)), loss_fn, features,
               labels, micro * steps, 1)
    variables, starts = model.trainable_variables, range(0, len(labels), micro * steps)
    for start in starts:
        if when == "before the last update" and start == starts[-1]:
            model.set_weights(copy.get_weights())
        sums = [tf.zeros_like(v) for v in variables]
        for i in range(start, min(start + micro * steps, len(labels)), micro):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels[i:i + micro], model(features[i:i + micro], training=True))
            sums = [a + g for a, g in zip(sums, tape.gradient(loss, variables), strict=True)]
        optimizer.apply_gradients(zip([decoy * a for a in sums], variables, strict=True))
    if when == "after the last update":
        model.set_weights(copy.get_weights())


@pytest.mark.parametrize(("when", "decoy"), [("after the last update", 0.0),
                                             ("after the last update", 1e-6),
                                             ("before the last update", 0.0)])
def test_weights_trained_elsewhere_and_written_in_are_caught(when, decoy):
    with pytest.raises(AssertionError, match=r"case 1 .*weights changed outside "
                                             r"optimizer.apply_gradients"):
        cu.grading.check_train_with_accumulation(functools.partial(
            _trained_elsewhere, when=when, decoy=decoy))


def test_k_applies_a_group_under_keras_accumulation_are_counted():
    # nb31-07's answer (1a3): Keras's gradient_accumulation_steps set on the optimizer given,
    # one apply_gradients per micro-batch, a short group scaled and padded with zero applies:
    # no running sum of its own, and optimizer.iterations counts k applies as one update
    tf = _tf()

    def keras_option(model, optimizer, loss_fn, features, labels, micro, steps):
        optimizer.gradient_accumulation_steps = steps
        variables = model.trainable_variables
        batches = list(tf.data.Dataset.from_tensor_slices((features, labels)).batch(micro))
        for start in range(0, len(batches), steps):
            group = batches[start:start + steps]
            real = tf.add_n([_real(y) for _, y in group])
            for x, y in group:
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True)) * (steps * _real(y) / real)
                optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables,
                                              strict=True))
            for _ in range(steps - len(group)):
                optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables])

    with pytest.raises(AssertionError, match=r"case 1 .*applied gradients (\d+) times for "
                                             r"(?!\1)\d+ groups: one apply_gradients per group"):
        cu.grading.check_train_with_accumulation(keras_option)


def test_the_memory_limit_raised_by_the_answer_is_caught():
    tf = _tf()

    def raised_limit(model, optimizer, loss_fn, features, labels, micro, steps):  # nb28-07's
        model.get_layer("batch_size_limit").max_batch_size = 10**9
        model.get_layer("activations_on_tape").max_examples = 10**9
        for start in range(0, len(labels), micro * steps):  # whole groups: no accumulation
            x, y = features[start:start + micro * steps], labels[start:start + micro * steps]
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    with pytest.raises(AssertionError, match=r"case 1 .*examples' activations were alive at once"):
        cu.grading.check_train_with_accumulation(raised_limit)


def test_dividing_the_learning_rate_instead_of_the_gradients_is_caught():
    tf = _tf()

    def rate_divided(model, optimizer, loss_fn, features, labels, micro, steps):  # nb26-07's
        base, variables = float(optimizer.learning_rate), model.trainable_variables
        for start in range(0, len(labels), micro * steps):
            group = range(start, min(start + micro * steps, len(labels)), micro)
            sums, real = [tf.zeros_like(v) for v in variables], 0.0
            for i in group:  # the micro-batches' summed-loss gradients, never divided
                with tf.GradientTape() as tape:
                    loss = loss_fn(labels[i:i + micro], model(features[i:i + micro],
                                                              training=True))
                    loss *= _real(labels[i:i + micro])
                sums = [a + g for a, g in zip(sums, tape.gradient(loss, variables), strict=True)]
                real += _real(labels[i:i + micro])
            optimizer.learning_rate.assign(base / real)  # same weights under plain SGD
            optimizer.apply_gradients(zip(sums, variables, strict=True))
        optimizer.learning_rate.assign(base)  # and the rate put back

    with pytest.raises(AssertionError, match=r"case 1 .*the learning rate was changed"):
        cu.grading.check_train_with_accumulation(rate_divided)


def test_the_colleagues_loop_is_named():
    tf = _tf()

    def colleagues_loop(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                  global_batch_size=batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

        step = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))
        for x, y in strategy.experimental_distribute_dataset(micro_batches):
            step(x, y)

    with pytest.raises(AssertionError, match="applying every micro-batch"):
        cu.grading.check_train_mirrored_with_accumulation(colleagues_loop)


def test_weights_trained_elsewhere_and_written_in_under_the_strategy_are_caught():
    # nb31-07's answer (4g), its weights written in before the last update (seen there, on
    # the replicas; written after it, they differ from the copy kept at the end): a plain copy
    # trained on whole groups outside the replicas; the replicas only run each micro-batch
    # through the model given and apply zeros once a group (one all-reduce an update)
    tf = _tf()
    import keras

    def written_in(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        inner = next(layer for layer in model.layers if isinstance(layer, keras.Model))
        copy = keras.Sequential([keras.Input(model.input_shape[1:])] + [keras.layers.Dense(
            layer.units, activation=layer.activation,
            kernel_regularizer=keras.regularizers.L2(float(layer.kernel_regularizer.l2)))
            for layer in inner.layers if hasattr(layer, "units")])
        copy.set_weights(model.get_weights())
        sgd = keras.optimizers.SGD(float(tf.convert_to_tensor(optimizer.learning_rate)))
        for x, y in micro_batches.unbatch().batch(batch * steps):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_object(y, copy(x, training=True))) + tf.add_n(
                    copy.losses)
            sgd.apply_gradients(zip(tape.gradient(loss, copy.trainable_variables),
                                    copy.trainable_variables, strict=True))

        def replica_step(*group):
            done = []
            for x, _ in group:  # one micro-batch alive at a time, its gradients thrown away
                with tf.control_dependencies(done), tf.GradientTape() as tape:
                    out = model(x, training=True)
                done = tape.gradient(out, model.trainable_variables)
            with tf.control_dependencies(done):
                zeros = [tf.zeros_like(v) for v in model.trainable_variables]
            optimizer.apply_gradients(zip(zeros, model.trainable_variables, strict=True))

        total = int(micro_batches.cardinality())
        iterator = iter(strategy.experimental_distribute_dataset(micro_batches))
        step = tf.function(lambda group: strategy.run(replica_step, args=group))
        for start in range(0, total, steps):
            if start + steps >= total:
                model.set_weights(copy.get_weights())
            step(tuple(next(iterator) for _ in range(min(steps, total - start))))

    with pytest.raises(AssertionError, match=r"case 1 .*weights changed outside "
                                             r"optimizer.apply_gradients"):
        cu.grading.check_train_mirrored_with_accumulation(written_in)


def test_no_accumulation_or_one_tape_over_the_group_runs_out_of_memory():
    tf = _tf()

    def whole_group(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        # no accumulation: the group as one batch, one gradient (the weights would match)
        features, labels = (tf.concat(part, 0) for part in zip(*micro_batches, strict=True))
        groups = tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch * steps)
        mirrored_accumulation(strategy, model, optimizer, loss_object, groups, 1,
                              batch * steps)

    def one_tape(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        def replica_step(*group):
            with tf.GradientTape() as tape:  # every micro-batch's activations kept at once
                loss = sum(tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                      global_batch_size=len(group) * batch)
                           for x, y in group)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

        _run_in_groups(strategy, replica_step, micro_batches, steps)

    def persistent_tape(strategy, model, optimizer, loss_object, micro_batches, steps,
                        batch):
        def replica_step(*group):
            with tf.GradientTape(persistent=True) as tape:  # keeps every micro-batch
                loss = 0.0
                for x, y in group:
                    out = model(x, training=True)
                    with tape.stop_recording():  # a backward that frees nothing
                        tape.gradient(out, model.trainable_variables)
                    loss += tf.nn.compute_average_loss(loss_object(y, out),
                                                       global_batch_size=len(group) * batch)
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

        _run_in_groups(strategy, replica_step, micro_batches, steps)

    for wrong, says in ((whole_group, "out of memory"), (one_tape, "out of memory"),
                        (persistent_tape, "back-propagated twice")):
        with pytest.raises(AssertionError, match=says):
            cu.grading.check_train_mirrored_with_accumulation(wrong)


@pytest.mark.parametrize(("reach", "says"), [
    ("model", r"ran on \d+ examples, but only \d+ went through"),
    ("outside the replicas", r"called outside the replicas")])
def test_the_whole_group_around_the_replica_limit_is_caught(reach, says):
    # a reader's answer (nb24-07, L4a): no accumulation, the group concatenated on one tape
    # through the model inside the limit, the limited model run on each micro-batch only to
    # pad its counters; or that model's layers first called outside the replicas. (Its layers'
    # unbound Dense.call, as in exercise 1's test above, fails the same way: 5 s, not kept.)
    tf = _tf()
    import keras

    def whole_group(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        inner = next(layer for layer in model.layers if isinstance(layer, keras.Model))

        def replica_step(*group):
            for x, _ in group:  # the limited model, only for its counters
                with tf.GradientTape() as throwaway:
                    out = model(x, training=True)
                throwaway.gradient(out, model.trainable_variables)
            x, y = (tf.concat(part, 0) for part in zip(*group, strict=True))
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(y, inner(x, training=True)),
                                                  global_batch_size=len(group) * batch)
                loss += _penalty(inner, tf)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

        if reach == "outside the replicas":  # inner's layers called in cross-replica context
            inner(next(iter(micro_batches))[0], training=True)
        _run_in_groups(strategy, replica_step, micro_batches, steps)

    with pytest.raises(AssertionError, match=says):
        cu.grading.check_train_mirrored_with_accumulation(whole_group)


@pytest.mark.parametrize("made", ["by hand", "elsewhere"])
def test_gradients_not_from_the_replicas_calls_are_caught(made):
    # xf07b's answers (L1, L2): each micro-batch run through the model given only for its
    # counters (its gradients thrown away), then the update's gradients made another way: the
    # whole group forward by hand from model.trainable_variables on one tape, or (w - target)
    # / rate / replicas, the target from a plain copy trained on whole groups elsewhere
    tf = _tf()
    import keras

    def lazy(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        variables = model.trainable_variables
        rate = float(tf.convert_to_tensor(optimizer.learning_rate))
        inner = next(layer for layer in model.layers if isinstance(layer, keras.Model))
        copy = keras.Sequential([keras.Input(model.input_shape[1:])] + [keras.layers.Dense(
            layer.units, activation=layer.activation, kernel_regularizer=layer.kernel_regularizer)
            for layer in inner.layers if hasattr(layer, "units")])
        copy.set_weights(model.get_weights())
        targets, update = [], [0]
        for x, y in micro_batches.unbatch().batch(batch * steps) if made == "elsewhere" else ():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_object(y, copy(x))) + tf.add_n(copy.losses)
            for v, g in zip(copy.trainable_variables, tape.gradient(
                    loss, copy.trainable_variables), strict=True):
                v.assign_sub(rate * g)
            targets.append([tf.constant(w) for w in copy.get_weights()])

        def replica_step(*group):
            done = []
            for x, _ in group:  # the model given, for its counters only
                with tf.control_dependencies(done), tf.GradientTape() as throwaway:
                    out = model(x, training=True)
                done = [g for g in throwaway.gradient(out, variables) if g is not None]
            x, y = (tf.concat(part, 0) for part in zip(*group, strict=True))
            with tf.control_dependencies(done), tf.GradientTape() as tape:
                k1, b1, k2, b2 = variables  # the model's forward, by hand
                logits = tf.matmul(tf.tanh(tf.matmul(x, k1) + b1), k2) + b2
                loss = tf.nn.compute_average_loss(loss_object(y, logits),
                                                  global_batch_size=len(group) * batch)
                loss += _penalty(model, tf)
            grads = tape.gradient(loss, variables)
            if made == "elsewhere":
                target = targets[update[0]]
                grads = [(tf.convert_to_tensor(v) - w) / rate / 2
                         for v, w in zip(variables, target, strict=True)]
            optimizer.apply_gradients(zip(grads, variables, strict=True))

        total = int(micro_batches.cardinality())
        iterator = iter(strategy.experimental_distribute_dataset(micro_batches))
        for start in range(0, total, steps):  # eager: each update its own target
            strategy.run(replica_step, args=tuple(
                next(iterator) for _ in range(min(steps, total - start))))
            update[0] += 1

    with pytest.raises(AssertionError, match=r"case 1 .*weights are right, but the gradients "
                                             r"a replica applied .* not those that flowed"):
        cu.grading.check_train_mirrored_with_accumulation(lazy)


@pytest.mark.parametrize(("raise_by", "says"), [
    ("closure", r"out of memory \(simulated\): more than \d+ examples\W{1,2} activations alive on "
                r"one replica"),
    ("attribute", r"holds \d+ examples on one replica, but \d+ examples' activations were "
                  r"alive at once \(the limit read \(\d+,\)\)")])
def test_the_replica_limit_raised_by_the_answer_is_caught(raise_by, says):
    # a reader's answer (nb28-07, L2): the per-replica limit raised through the closure of the
    # layer's call (names built at run time), then each replica's whole group share in one
    # forward, no accumulation; the limit is now the layer's max_examples, read by no closure,
    # and raising that attribute (then setting it back) leaves the recorded peak to name it
    tf = _tf()

    def raised(strategy, model, optimizer, loss_object, micro_batches, steps, batch):
        layer = model.get_layer("replica_memory")
        if raise_by == "attribute":
            layer.max_examples = 10**9
        call = type(layer).call
        for name, cell in zip(call.__code__.co_freevars,
                              getattr(call, "".join(["__clo", "sure__"])) or (), strict=True):
            if name == "max_examples":
                setattr(cell, "".join(["cell_", "contents"]), 10**9)

        def replica_step(*group):
            x, y = (tf.concat(part, 0) for part in zip(*group, strict=True))
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                  global_batch_size=len(group) * batch)
                loss += _penalty(model, tf)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))

        _run_in_groups(strategy, replica_step, micro_batches, steps)
        layer.max_examples = batch // 2  # as given, after the run

    with pytest.raises(AssertionError, match=says):
        cu.grading.check_train_mirrored_with_accumulation(raised)


def test_mirrored_stub_is_not_attempted(capsys):
    assert cu.grading.check_train_mirrored_with_accumulation(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_the_counting_strategy_counts_one_tensor_per_variable_per_update():
    import keras

    tf = _tf()
    strategy, counter = checks_07.counting_mirrored_strategy(2)
    with strategy.scope():
        model = cu.models.mlp(3, 2, hidden_units=(4,))
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)

    def replica_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables, strict=True))

    step = tf.function(lambda x: strategy.run(replica_step, args=(x,)))
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(
        tf.ones((8, 3))).batch(4))
    for x in data:
        step(x)
    assert int(counter.numpy()) == 2 * len(model.trainable_variables)


# --- segment_gradients ----------------------------------------------------------------------


def segment_gradients(layers, x, segment_size, *, wrap=True, loss="mean", order=1,
                      size_of=None, bind_late=False, bounds=None):
    tf = _tf()
    size = segment_size if size_of is None else size_of(layers, segment_size)
    if bounds is None:
        bounds = [*range(0, len(layers), size), len(layers)]
    variables = [v for layer in layers for v in layer.trainable_variables][::order]
    with tf.GradientTape() as tape:
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            segment = layers[start:stop]

            def block(t, segment=segment):
                for layer in segment:
                    t = layer(t)
                return t

            if bind_late:  # the loop variable read when the backward pass runs
                def block(t):  # noqa: F811
                    for layer in segment:  # noqa: B023
                        t = layer(t)
                    return t
            x = tf.recompute_grad(block)(x) if wrap else block(x)
        value = tf.reduce_mean(tf.square(x)) if loss == "mean" else tf.reduce_sum(tf.square(x))
    return tape.gradient(value, variables)


@pytest.mark.solution_passes
def test_reference_segment_gradients_passes(capsys):
    assert cu.grading.check_segment_gradients(segment_gradients)
    assert "✅ segment_gradients: 2 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize(("wrong", "message"), [
    ({"wrap": False}, "no layer ran again"),
    ({"size_of": lambda layers, size: len(layers)}, r"runs of \[\d\] \(a run of \d is longer"),
    ({"size_of": lambda layers, size: 1}, r"runs of \[1, 1, .*\]; segment_size"),
    ({"loss": "sum"}, "differ from the plain stack"),
    ({"order": -1}, "differ from the plain stack"),
    ({"bind_late": True}, "differ from the plain stack|is None"),
])
def test_segments_made_the_wrong_way_are_caught(wrong, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_segment_gradients(lambda *args: segment_gradients(*args, **wrong))


def test_segment_gradients_constant_short_list_and_stub_are_caught(capsys):
    tf = _tf()
    with pytest.raises(AssertionError, match="expected a list"):
        cu.grading.check_segment_gradients(lambda layers, x, size: tf.zeros(()))

    def zeros(layers, x, size):
        return [tf.zeros_like(v) for layer in layers for v in layer.trainable_variables]

    with pytest.raises(AssertionError, match="differ from the plain stack"):
        cu.grading.check_segment_gradients(zeros)

    def drops_the_short_segment(layers, x, size):  # range stops before a shorter last one
        kept = layers[:len(layers) - len(layers) % size] if len(layers) % size else layers
        grads = segment_gradients(kept, x, size)
        return grads + [tf.zeros_like(v) for layer in layers[len(kept):]
                        for v in layer.trainable_variables]

    with pytest.raises(AssertionError, match="differ from the plain stack|recompute_grad"):
        cu.grading.check_segment_gradients(drops_the_short_segment)
    assert cu.grading.check_segment_gradients(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def _plain_gradients_with_decoys(layers, x, size, *, rerun=False):
    """No recomputation: a plain tape, then decoys of what the check counts (two
    tf.identity_n per segment, one matrix product per layer) and, with ``rerun``, each
    segment's layers called again outside the tape, last segment first (as a backward
    pass recomputes them)."""
    tf = _tf()
    variables = [v for layer in layers for v in layer.trainable_variables]
    with tf.GradientTape() as tape:
        h = x
        for layer in layers:
            h = layer(h)
        loss = tf.reduce_mean(tf.square(h))
    grads = tape.gradient(loss, variables)
    for start in reversed(range(0, len(layers), size)):
        tf.identity_n([x])
        tf.identity_n([x])
        if rerun:
            t = x
            for layer in layers[start:start + size]:
                t = layer(t)
    for layer in layers:
        tf.matmul(x, layer.kernel)
    return grads


@pytest.mark.parametrize(("rerun", "message"), [
    (False, "no layer ran again"),
    (True, "tf.recompute_grad call"),
])
def test_decoy_ops_off_the_gradients_path_are_caught(rerun, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_segment_gradients(
            lambda *args: _plain_gradients_with_decoys(*args, rerun=rerun))


def test_near_equal_segments_of_the_same_count_are_caught():
    def near_equal(layers, x, size):  # as many segments, but balanced: not the split asked
        count = -(-len(layers) // size)
        bounds = [i * len(layers) // count for i in range(count + 1)]  # first never `size`
        return segment_gradients(layers, x, size,
                                 size_of=lambda ls, s: None, bounds=bounds)

    with pytest.raises(AssertionError, match="ran again in consecutive runs of"):
        cu.grading.check_segment_gradients(near_equal)


def test_a_plain_pass_beside_the_segments_is_not_called_a_recomputed_segment():
    # nb31-07's answer (5c): the segments recomputed for the count, the gradients from a plain
    # pass of the whole stack kept beside; the message called that pass a recomputed segment
    tf = _tf()

    def plain_beside(layers, x, size):
        variables = [v for layer in layers for v in layer.trainable_variables]
        with tf.GradientTape() as tape:
            y = x
            for start in range(0, len(layers), size):
                segment = layers[start:start + size]
                y = tf.recompute_grad(
                    lambda t, segment=segment: functools.reduce(lambda a, f: f(a), segment, t))(y)
            z = functools.reduce(lambda a, f: f(a), layers, x)
            loss = tf.reduce_mean(tf.square(z)) + 0.0 * tf.reduce_sum(y)
        return tape.gradient(loss, variables)

    with pytest.raises(AssertionError, match=r"case 1 .*ran again in consecutive runs of \[\d, "
                                             r"\d, .*\(a run of \d is longer than a segment: "
                                             r"a second pass beside the recomputed one"):
        cu.grading.check_segment_gradients(plain_beside)


@pytest.mark.parametrize("product", ["matmul", "elementwise"])
def test_a_plain_path_kept_beside_the_recomputed_one_is_caught(product):
    # nb26-07's answer: each segment recomputed AND run by hand from the weights (its
    # activations kept on the tape), the two averaged: equal gradients, the saving gone
    tf = _tf()

    def keeps_everything(layers, x, size):
        def times(t, kernel):
            return (tf.matmul(t, kernel) if product == "matmul" else
                    tf.reduce_sum(t[:, :, None] * kernel, axis=1))

        variables = [v for layer in layers for v in layer.trainable_variables]
        with tf.GradientTape() as tape:
            for start in range(0, len(layers), size):
                segment = layers[start:start + size]
                recomputed = tf.recompute_grad(
                    lambda t, segment=segment: functools.reduce(lambda a, f: f(a), segment, t))(x)
                kept = x
                for layer in segment:
                    kept = layer.activation(times(kept, layer.kernel) + layer.bias)
                x = 0.5 * recomputed + 0.5 * kept
            loss = tf.reduce_mean(tf.square(x))
        return tape.gradient(loss, variables)

    with pytest.raises(AssertionError, match=r"case 1 .*reads the \d+ weights \d+ times, more "
                                             r"than 4 each"):
        cu.grading.check_segment_gradients(keeps_everything)


def test_layers_run_again_beside_a_plain_tape_are_caught():
    """No recomputation: a plain tape keeps every activation; identity functions wrapped in
    tf.recompute_grad (one per segment), then each segment's layers run again, last first,
    tied onto the gradients by control dependencies only (they feed nothing)."""
    tf = _tf()

    def fake(layers, x, size):
        variables = [v for layer in layers for v in layer.trainable_variables]
        with tf.GradientTape() as tape:
            acts = [x]
            for layer in layers:
                acts.append(layer(acts[-1]))
            out = acts[-1]
            for _ in range(-(-len(layers) // size)):
                out = tf.recompute_grad(lambda t: t * 1.0)(out)
            loss = tf.reduce_mean(tf.square(out))
        grads = tape.gradient(loss, variables)
        shows = []
        for start in reversed(range(0, len(layers), size)):
            t = acts[start]
            for layer in layers[start:start + size]:
                t = layer(t)
            shows.append(t)
        with tf.control_dependencies(shows):
            return [tf.identity(g) for g in grads]

    with pytest.raises(AssertionError, match="feed the gradients"):
        cu.grading.check_segment_gradients(fake)


def _identity_recomputes_and_a_rerun_after_the_loss(layers, x, size):
    """nb32-07's answer (ex5 L5): a plain tape keeps every activation; identity functions in
    tf.recompute_grad (one more than the segments, for the op count) and each segment run
    again from its kept input, last first, into the loss times 0 (on the data path)."""
    tf = _tf()
    variables = [v for layer in layers for v in layer.trainable_variables]
    with tf.GradientTape() as tape:
        h, inputs = tf.recompute_grad(lambda t: tf.identity(t))(x), []
        for start in range(0, len(layers), size):
            inputs.append(h)
            h = tf.recompute_grad(lambda t: tf.identity(t))(h)
            for layer in layers[start:start + size]:
                h = layer(h)
        loss, extra = tf.reduce_mean(tf.square(h)), 0.0
        for i in reversed(range(len(inputs))):
            t = inputs[i]
            for layer in layers[i * size:(i + 1) * size]:
                t = layer(t)
            extra += tf.reduce_sum(t)
        loss = loss + 0.0 * extra
    return tape.gradient(loss, variables)


def test_identity_recomputes_and_a_rerun_after_the_loss_are_caught():
    with pytest.raises(AssertionError, match=r"case 1 .*layer call\(s\) ran outside the "
                                             r"functions given to tf.recompute_grad"):
        cu.grading.check_segment_gradients(_identity_recomputes_and_a_rerun_after_the_loss)


def test_tf_recompute_grad_is_put_back_after_the_check():
    tf = _tf()
    before = tf.recompute_grad
    cu.grading.check_segment_gradients(segment_gradients)
    assert tf.recompute_grad is before


def test_a_class_in_the_answer_is_no_plan_reading_but_a_class_that_reads_module_is():
    """A class body stores its own __module__ (the compiler writes it): an honest answer
    with a class inside is not refused for it; a class body that reads one is."""
    def with_a_class(loop):
        class Recorder:
            pass
        return Recorder

    def reads_in_a_class(loop):
        class Spy:
            where = loop.__module__
        return Spy

    assert suspect_loops._plan_readers(with_a_class) == []
    assert suspect_loops._plan_readers(reads_in_a_class) == ["__module__"]

