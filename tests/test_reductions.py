"""course_utils.reductions: loss reductions in the replicas against the one-device truth.

The unit tests run with 4 logical CPUs (tests/conftest.py): 4 replicas."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import course_utils as cu
from course_utils import reductions

REPLICAS = 4
GLOBAL_BATCH = 8 * REPLICAS
per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _right(labels, logits):
    return tf.nn.compute_average_loss(per_example(labels, logits),
                                      global_batch_size=GLOBAL_BATCH)


def _mean_per_replica(labels, logits):
    return tf.reduce_mean(per_example(labels, logits))


def _counted(labels, logits):
    count = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
    return tf.nn.compute_average_loss(per_example(labels, logits), global_batch_size=count)


@pytest.fixture(scope="module")
def setting():
    strategy = cu.make_strategy("mirrored", verbose=False)
    assert strategy.num_replicas_in_sync == REPLICAS
    with strategy.scope():
        model = cu.models.mlp(6, 3, hidden_units=(8,))
    x, y = cu.data.teacher_classification(64, 6, 3)
    losses = {"right": _right, "mean per replica": _mean_per_replica, "counted": _counted,
              "keras default": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    return strategy, model, losses, x, y


def test_even_batch_right_reductions_match_one_device_and_a_mean_is_n_times_too_large(setting):
    strategy, model, losses, x, y = setting
    before = model.get_weights()
    measured = reductions.measure_reductions(
        strategy, model, losses, (x[:GLOBAL_BATCH], y[:GLOBAL_BATCH]), per_example)
    for name in ("right", "counted", "keras default"):
        assert measured[name].right, (name, measured[name])
        assert measured[name].loss_mean_ratio == pytest.approx(1 / REPLICAS, rel=1e-4)
    wrong = measured["mean per replica"]
    assert not wrong.right
    assert wrong.gradient_ratio == pytest.approx(REPLICAS, rel=1e-4)
    assert wrong.loss_sum_ratio == pytest.approx(REPLICAS, rel=1e-4)
    assert measured["right"].examples_per_replica == (8,) * REPLICAS
    for old, new in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)


def test_short_uneven_batch_only_the_counted_reduction_stays_right(setting):
    strategy, model, losses, x, y = setting
    measured = reductions.measure_reductions(strategy, model, losses, (x[:5], y[:5]),
                                             per_example)
    assert measured["counted"].examples_per_replica == (2, 2, 1, 0)
    assert measured["counted"].right
    assert measured["right"].gradient_ratio == pytest.approx(5 / GLOBAL_BATCH, rel=1e-4)
    assert not measured["keras default"].right  # each replica's mean weighs 1/N
    losses = per_example(y[:5], model(x[:5])).numpy()  # the split (2, 2, 1, 0), empty one 0
    means = [losses[:2].mean(), losses[2:4].mean(), losses[4]]
    assert measured["keras default"].loss_sum_ratio == pytest.approx(
        sum(means) / REPLICAS / losses.mean(), rel=1e-4)
