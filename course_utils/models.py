"""Small Keras 3 model builders shared by the lessons: MLP, CNN and RNN.

Every builder returns an uncompiled, already built ``keras.Model`` whose last layer produces
float32 logits (``dtype="float32"``), so the models are safe under mixed precision: pair them
with a loss that has ``from_logits=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["mlp", "cnn", "rnn"]


def _keras() -> Any:
    from course_utils.quiet import import_tensorflow

    import_tensorflow()
    import keras

    return keras


def mlp(
    input_dim: int,
    num_classes: int,
    hidden_units: Sequence[int] = (64, 64),
    dropout: float = 0.0,
    name: str = "mlp",
) -> Any:
    """A multilayer perceptron: Dense+ReLU layers, then float32 logits."""
    keras = _keras()
    if input_dim < 1 or num_classes < 1:
        raise ValueError("input_dim and num_classes must be positive")
    inputs = keras.Input(shape=(input_dim,), name="features")
    x = inputs
    for index, units in enumerate(hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"dense_{index}")(x)
        if dropout:
            x = keras.layers.Dropout(dropout, name=f"dropout_{index}")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def cnn(
    input_shape: Sequence[int] = (8, 8, 1),
    num_classes: int = 10,
    filters: Sequence[int] = (16, 32),
    rescale: bool = True,
    name: str = "cnn",
) -> Any:
    """A small convolutional network for images (default: the course's 8x8 digits).

    With ``rescale``, uint8 pixels in [0, 255] are scaled to [0, 1] inside the model.
    """
    keras = _keras()
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = keras.layers.Rescaling(1.0 / 255.0, name="rescale")(inputs) if rescale else inputs
    for index, count in enumerate(filters):
        x = keras.layers.Conv2D(count, 3, padding="same", activation="relu",
                                name=f"conv_{index}")(x)
        if min(x.shape[1], x.shape[2]) >= 4:
            x = keras.layers.MaxPooling2D(name=f"pool_{index}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def rnn(
    sequence_length: int,
    num_features: int,
    num_classes: int = 2,
    units: int = 32,
    cell: str = "gru",
    name: str = "rnn",
    embed_dim: int | None = None,
    recurrent_layers: int = 1,
    use_cudnn: str | bool = "auto",
) -> Any:
    """A recurrent classifier over ``[sequence_length, num_features]`` inputs (GRU or LSTM).

    With ``embed_dim``, a per-time-step Dense projection ("embed") comes first; with
    ``recurrent_layers`` > 1, stacked recurrent layers (all but the last return sequences).
    The defaults build one recurrent layer and the logits. ``use_cudnn`` is passed to each GRU
    or LSTM layer (Keras's own argument; ``"auto"`` takes cuDNN whenever a GPU is visible, even
    under a CPU device scope); a SimpleRNN has no cuDNN path and accepts only ``"auto"``.
    """
    keras = _keras()
    layers = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM,
              "simple": keras.layers.SimpleRNN}
    if cell not in layers:
        raise ValueError(f"unknown cell {cell!r}; choose one of {', '.join(layers)}")
    if recurrent_layers < 1:
        raise ValueError(f"recurrent_layers must be at least 1, got {recurrent_layers}")
    cudnn = {} if cell == "simple" else {"use_cudnn": use_cudnn}
    if cell == "simple" and use_cudnn != "auto":
        raise ValueError("a SimpleRNN has no cuDNN path: leave use_cudnn='auto'")
    inputs = keras.Input(shape=(sequence_length, num_features), name="sequence")
    x = keras.layers.Dense(embed_dim, name="embed")(inputs) if embed_dim else inputs
    for index in range(recurrent_layers):
        last = index == recurrent_layers - 1
        layer_name = cell if recurrent_layers == 1 else f"{cell}_{index}"
        x = layers[cell](units, return_sequences=not last, name=layer_name, **cudnn)(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


