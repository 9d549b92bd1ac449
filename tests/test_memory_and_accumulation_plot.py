"""course_utils.memory (counted step memory, a simulated batch limit), equality.largest_difference
and plots.draw_gradient_accumulation."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_utils import equality, memory, models, plots  # noqa: E402


def test_activation_bytes_count_the_input_batch_and_every_layer_output():
    model = models.mlp(8, 3, hidden_units=(16, 4))
    assert memory.activation_bytes_per_example(model) == (8 + 16 + 4 + 3) * 4
    assert memory.activation_bytes_per_example(model, include_input=False) == (16 + 4 + 3) * 4


def test_activation_bytes_of_a_cnn_follow_its_shapes():
    model = models.cnn((8, 8, 1), 10, filters=(2, 3))
    expected = sum(int(np.prod(layer.output.shape[1:])) * 4 for layer in model.layers)
    assert memory.activation_bytes_per_example(model) == expected > 8 * 8 * 4


def test_activation_bytes_of_a_nested_model_count_its_layers_once():
    from course_utils.quiet import import_tensorflow

    import_tensorflow()
    import keras

    inner = models.mlp(8, 5, hidden_units=(16,), name="inner")
    inputs = keras.Input((8,))
    outer = keras.Model(inputs, keras.layers.Dense(2)(inner(inputs)))
    assert memory.activation_bytes_per_example(outer) == (8 + 16 + 5 + 2) * 4


def _budget_model():  # 8 -> 16 -> 3: 195 float32 weights, all trainable
    return models.mlp(8, 3, hidden_units=(16,))


def test_step_budget_counts_each_term_per_replica():
    model, weights = _budget_model(), 195 * 4
    per_example = (8 + 16 + 3) * 4
    budget = memory.step_budget(model, global_batch=64)
    assert budget == memory.StepBudget(weights, weights, 0, 2 * weights, 64 * per_example)
    assert budget.total == 4 * weights + 64 * per_example
    assert [row["term"] for row in budget.rows()] == [
        "parameters", "gradients", "accumulation", "optimizer_slots", "activations"]
    assert sum(row["bytes"] for row in budget.rows()) == budget.total
    split = memory.step_budget(model, global_batch=64, replicas=2, accumulation_steps=4,
                               optimizer_slots=1)
    assert split.accumulation == weights  # one gradient-sized running sum
    assert split.optimizer_slots == weights
    assert split.activations == 64 // 2 // 4 * per_example  # per replica, per micro-batch
    with pytest.raises(dataclasses.FrozenInstanceError):
        split.activations = 0


def test_step_budget_zero_stages_divide_slots_then_gradients_then_parameters():
    model, weights = _budget_model(), 195 * 4
    terms = ("parameters", "gradients", "optimizer_slots")
    got = [tuple(getattr(memory.step_budget(model, global_batch=8, replicas=4,
                                            zero_stage=stage), term) for term in terms)
           for stage in range(4)]
    assert got == [(weights, weights, 2 * weights), (weights, weights, 2 * weights // 4),
                   (weights, weights // 4, 2 * weights // 4),
                   (weights // 4, weights // 4, 2 * weights // 4)]
    with_sum = memory.step_budget(model, global_batch=8, replicas=4, accumulation_steps=2,
                                  zero_stage=3)
    assert with_sum.accumulation == weights  # summed locally before the one reduction
    assert with_sum.gradients == weights  # each micro-batch's gradient is whole too
    assert with_sum.parameters == weights // 4 and with_sum.optimizer_slots == 2 * weights // 4
    for stage in (1, 2):  # whole gradients and sum under every stage, not ZeRO-3 alone
        staged = memory.step_budget(model, global_batch=8, replicas=4, accumulation_steps=2,
                                    zero_stage=stage)
        assert staged.gradients == staged.accumulation == weights, stage


def test_step_budget_refuses_batches_that_do_not_split():
    model = _budget_model()
    for kwargs, message in (({"replicas": 3}, "replicas"),
                            ({"accumulation_steps": 3}, "micro-batches"),
                            ({"zero_stage": 4}, "zero_stage"),
                            ({"optimizer_slots": -1}, "optimizer_slots"),
                            ({"replicas": 0}, "replicas")):
        with pytest.raises(ValueError, match=message):
            memory.step_budget(model, global_batch=8, **kwargs)


def test_smallest_accumulation_counts_the_buffer_it_adds():
    model, weights = _budget_model(), 195 * 4
    per_example = (8 + 16 + 3) * 4
    fixed = 4 * weights

    def smallest(budget, **kwargs):
        return memory.smallest_accumulation(model, global_batch=64, budget_bytes=budget,
                                            **kwargs)

    assert smallest(fixed + 64 * per_example) == 1
    assert smallest(fixed + 64 * per_example - 1) == 2 == smallest(
        fixed + weights + 32 * per_example)
    assert smallest(fixed + weights + 16 * per_example) == 4  # 3 does not divide 64
    assert smallest(fixed + 16 * per_example) == 8  # the activations alone would say 4
    assert smallest(fixed + weights + per_example) == 64
    assert smallest(fixed + weights + per_example, max_steps=32) is None
    assert smallest(fixed + weights + 4 * per_example, replicas=2) == 8


def test_variable_bytes_are_four_per_float32_weight():
    model = models.mlp(8, 3, hidden_units=(16,))
    assert memory.variable_bytes(model) == model.count_params() * 4
    assert model.count_params() == 8 * 16 + 16 + 16 * 3 + 3


def test_a_limited_model_refuses_large_batches_and_shares_weights():
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    inner = models.mlp(4, 2, hidden_units=(5,))
    limited = memory.limit_batch_size(inner, max_batch_size=3)
    assert limited.trainable_weights[0] is inner.trainable_weights[0]
    np.testing.assert_allclose(limited(np.ones((3, 4), "float32")),
                               inner(np.ones((3, 4), "float32")))
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of memory"):
        limited(np.ones((4, 4), "float32"))
    assert limited.get_layer("batch_size_limit").get_config()["max_batch_size"] == 3


def test_largest_difference_is_the_largest_absolute_element_difference():
    a = [np.zeros((2, 2)), np.array([1.0, 2.0])]
    b = [np.full((2, 2), 0.5), np.array([1.0, -1.0])]
    assert equality.largest_difference(a, b) == 3.0
    assert equality.largest_difference(a, a) == 0.0
    with pytest.raises(ValueError, match="compare like with like"):
        equality.largest_difference(a, b[:1])


def test_accumulation_diagram_draws_one_box_row_per_micro_batch():
    ax = plots.draw_gradient_accumulation(3)
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.startswith("micro-batch") for t in texts) == 3
    assert sum("loss / 3" in t for t in texts) == 3
    assert "one optimizer\nupdate" in texts and "sum" in texts
    with pytest.raises(ValueError, match="at least 1"):
        plots.draw_gradient_accumulation(0)


def test_accumulation_on_replicas_draws_k_boxes_per_replica_and_one_all_reduce():
    ax = plots.draw_accumulation_on_replicas(3, 4)
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.startswith("μ") for t in texts) == 12
    assert sum(t.startswith("replica") for t in texts) == 3
    assert sum("all-\nreduce" in t for t in texts) == 1
    with pytest.raises(ValueError, match="at least 1"):
        plots.draw_accumulation_on_replicas(0, 4)


def test_memory_budget_stacks_one_bar_segment_per_term():
    terms = {"plain": {"parameters": 1.0, "activations": 8.0},
             "accumulated": {"parameters": 1.0, "activations": 2.0}}
    ax = plots.draw_memory_budget(terms)
    widths = [patch.get_width() for patch in ax.patches]
    assert sorted(widths) == [1.0, 1.0, 2.0, 8.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["accumulated", "plain"]
    with pytest.raises(ValueError, match="empty"):
        plots.draw_memory_budget({})


@pytest.mark.slow
def test_recomputation_lowers_the_measured_peak_of_a_gradient_step():
    # One layer's output is 8 MiB, as with 512 units and 4096 examples, but narrow layers and a
    # long batch need a quarter of the multiplications (the memory asserted is the same).
    layer = 16384 * 128 * 4  # one layer's output, bytes (8 MiB)
    rises = memory.gradient_step_peak_rises(width=128, depth=4, blocks=6, batch=16384)
    assert rises["plain"] > 20 * layer  # the 24 layers' outputs are alive at once
    assert rises["recomputed"] > 4 * layer  # at least one block's inside; no fall asserted:
    # with TensorFlow's default CPU kernels the host peak need not fall by the counted saving
    with pytest.raises(ValueError, match="at least 1"):
        memory.gradient_step_peak_rises(0, 1, 1, 1)


def test_recomputation_diagram_keeps_block_inputs_and_redoes_one_block():
    ax = plots.draw_recomputation(3, 4)
    hatched = [p for p in ax.patches if p.get_hatch() == "//"]
    assert len(hatched) == 3 + 1  # the last block's 3 inner outputs, and the legend's box
    assert sum(t.get_text().startswith("block") for t in ax.texts) == 3
    with pytest.raises(ValueError, match="at least 1"):
        plots.draw_recomputation(0, 4)


def test_the_probe_starts_its_children_with_the_course_cpu_only_helper(monkeypatch):
    import course_utils.child

    started = []

    def fake_start(arguments):
        started.append(arguments)
        raise RuntimeError("not started")

    monkeypatch.setattr(course_utils.child, "start_cpu_only", fake_start)
    with pytest.raises(RuntimeError, match="not started"):
        memory.gradient_step_peak_rises(8, 1, 1, 4)
    assert started[0][:2] == ["-m", "course_utils.peak_probe"]


def test_the_limit_counts_examples_alive_on_the_tape():
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    limited = memory.limit_batch_size(models.mlp(4, 2, hidden_units=(5,)), max_batch_size=3)
    on_tape = limited.get_layer("activations_on_tape")
    x = np.ones((3, 4), "float32")
    for _ in range(2):  # one tape per micro-batch: its activations are freed by the gradient
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(limited(x, training=True))
        tape.gradient(loss, limited.trainable_variables)
    assert (on_tape.examples_alive, on_tape.examples_trained, on_tape.peak_examples_alive) == (
        0, 6, 3)
    limited(x)  # inference keeps nothing
    assert on_tape.examples_trained == 6
    with pytest.raises(tf.errors.InvalidArgumentError, match="activations alive at once"):
        with tf.GradientTape() as tape:  # one tape over two micro-batches keeps both
            loss = tf.reduce_sum(limited(x, training=True)) + tf.reduce_sum(
                limited(x, training=True))
    assert on_tape.get_config()["max_examples"] == 3
