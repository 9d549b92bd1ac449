"""course_utils.memory (counted step memory, a simulated batch limit), equality.largest_difference
and plots.draw_gradient_accumulation."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_utils import equality, memory, models, plots  # noqa: E402


def test_activation_bytes_count_every_layer_output_but_the_input():
    model = models.mlp(8, 3, hidden_units=(16, 4))
    assert memory.activation_bytes_per_example(model) == (16 + 4 + 3) * 4


def test_activation_bytes_of_a_cnn_follow_its_shapes():
    model = models.cnn((8, 8, 1), 10, filters=(2, 3))
    expected = sum(int(np.prod(layer.output.shape[1:])) * 4 for layer in model.layers[1:])
    assert memory.activation_bytes_per_example(model) == expected > 0


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
    layer = 4096 * 512 * 4  # one layer's output, bytes (8 MiB)
    rises = memory.gradient_step_peak_rises(width=512, depth=4, blocks=6, batch=4096)
    assert rises["plain"] > 20 * layer  # the 24 layers' outputs are alive at once
    assert rises["recomputed"] < rises["plain"] - 10 * layer  # 14 are not kept (6 + 4 are)
    with pytest.raises(ValueError, match="at least 1"):
        memory.gradient_step_peak_rises(0, 1, 1, 1)
