"""course_utils.models: builders return built Keras models with float32 logits."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from course_utils import models


@pytest.mark.parametrize(
    "model, batch",
    [
        (lambda: models.mlp(12, 3, (16, 8), dropout=0.1), np.zeros((2, 12), "float32")),
        (lambda: models.cnn((8, 8, 1), 10), np.zeros((2, 8, 8, 1), "float32")),
        (lambda: models.cnn((32, 32, 3), 5, rescale=False), np.zeros((2, 32, 32, 3), "float32")),
        (lambda: models.rnn(7, 3, 4, cell="lstm"), np.zeros((2, 7, 3), "float32")),
        (lambda: models.rnn(7, 3, 2, cell="simple"), np.zeros((2, 7, 3), "float32")),
    ],
)
def test_builders_produce_float32_logits(model, batch):
    built = model()
    outputs = built(batch)
    assert outputs.shape[0] == 2 and outputs.dtype.name == "float32"
    assert built.count_params() > 0


def test_logits_stay_float32_under_mixed_precision():
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        model = models.mlp(4, 2, (8,))
        assert model.get_layer("dense_0").compute_dtype == "bfloat16"
        assert model(np.ones((1, 4), "float32")).dtype.name == "float32"
    finally:
        keras.mixed_precision.set_dtype_policy(previous)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        models.rnn(5, 2, cell="transformer")
    with pytest.raises(ValueError):
        models.mlp(0, 2)
