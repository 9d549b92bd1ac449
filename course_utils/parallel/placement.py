"""Manual placement: a Sequential model split into stages on devices, and where TensorFlow ran it.

Placement is read from TensorFlow itself: an eager tensor's ``.device`` names the device that
computed it, a variable's ``.value.device`` the device that holds it.
(``tf.debugging.set_log_device_placement`` logs nothing once the first op has run.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from course_utils.memory import activation_bytes_per_example, variable_bytes

__all__ = ["fresh_layer", "memory_per_stage", "model_parallel_devices", "short_device",
           "split_sequential", "split_step", "variable_devices"]


def short_device(name: str) -> str:
    """``'/job:localhost/replica:0/task:0/device:CPU:1'`` -> ``'CPU:1'``."""
    return name.rsplit("device:", 1)[-1] if "device:" in name else name


def model_parallel_devices(count: int = 2) -> list[str]:
    """``count`` devices to split a model across: GPUs when there are that many physical GPUs,
    each whole, else logical CPUs.

    A GPU split into logical GPUs (``cu.setup`` splits a lone GPU) does not count: its logical
    GPUs share one chip. Raises ValueError, saying how to create logical devices, when there are
    not ``count`` logical CPUs either.
    """
    import tensorflow as tf

    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    physical_gpus = len(tf.config.list_physical_devices("GPU"))
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if physical_gpus >= count and len(gpus) == physical_gpus:  # whole GPUs, one device each
        return gpus[:count]
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) >= count:
        return devices[:count]
    raise ValueError(f"{count} devices needed but only {len(devices)} logical CPU(s) exist: run "
                     f"cu.setup(logical_devices={count}) first, in a fresh kernel")


def variable_devices(model: Any) -> list[str]:
    """The short device name of every weight of ``model``, as TensorFlow reports it."""
    return [short_device(v.value.device) for v in model.weights]


def fresh_layer(layer: Any) -> Any:
    """A new, unbuilt layer with ``layer``'s configuration.

    ``type(layer).from_config(layer.get_config())``, except that a GRU or LSTM keeps its
    ``use_cudnn``: Keras leaves it out of their ``get_config`` (``keras/src/layers/rnn/gru.py``,
    ``get_config``), so a plain copy would fall back to ``"auto"``.
    """
    import keras

    config = layer.get_config()
    if isinstance(layer, (keras.layers.GRU, keras.layers.LSTM)):
        config["use_cudnn"] = layer.use_cudnn
    return type(layer).from_config(config)


def split_sequential(model: Any, cuts: Sequence[int], devices: Sequence[str]) -> list[Any]:
    """Split a chain of layers (Sequential, ``cu.models.mlp``) before ``cuts``, a stage per device.

    Each stage is a new Sequential created under ``tf.device`` (so its weights live there) with
    the same layer configurations (``fresh_layer``) and a copy of the model's weights.
    """
    import keras
    import tensorflow as tf

    chain = [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]
    bounds = [0, *cuts, len(chain)]
    if len(bounds) - 1 != len(devices) or sorted(bounds) != bounds:
        raise ValueError(f"{len(bounds) - 1} stages from cuts {list(cuts)} but "
                         f"{len(devices)} devices")
    stages = []
    shape = model.inputs[0].shape[1:]
    for index, device in enumerate(devices):
        layers = chain[bounds[index]:bounds[index + 1]]
        with tf.device(device):
            stage = keras.Sequential([keras.Input(shape)] + [
                fresh_layer(layer) for layer in layers],
                name=f"stage_{index}")
        for new, old in zip(stage.layers, layers, strict=False):
            new.set_weights(old.get_weights())
        shape = stage.outputs[0].shape[1:]
        stages.append(stage)
    return stages


def split_step(stages: Sequence[Any], devices: Sequence[str], x: Any, y: Any,
               loss_fn: Callable[[Any, Any], Any]) -> dict[str, Any]:
    """One forward and backward pass through ``stages``, each stage's both passes on its device.

    The backward pass runs stage by stage, last first, each under its own ``tf.device`` (a
    single ``GradientTape.gradient`` call outside the scopes would run it all on one device).
    Returns the loss, the gradients (stage by stage, concatenated) and the placement read from
    the tensors: ``{"forward": [...], "backward": [...]}``, one short device name per stage.
    """
    import tensorflow as tf

    tapes, inputs, outputs = [], [], []
    value = tf.convert_to_tensor(x)
    for stage, device in zip(stages, devices, strict=False):
        with tf.device(device), tf.GradientTape() as tape:
            tape.watch(value)
            inputs.append(value)
            value = stage(value)
            if stage is stages[-1]:
                loss = loss_fn(y, value)
        tapes.append(tape)
        outputs.append(value)
    grads: list[list[Any]] = [[] for _ in stages]
    backward = [""] * len(stages)
    upstream = None
    for index in reversed(range(len(stages))):
        stage, tape = stages[index], tapes[index]
        with tf.device(devices[index]):
            target = loss if upstream is None else outputs[index]
            result = tape.gradient(target, [inputs[index], *stage.trainable_variables],
                                   output_gradients=upstream)
        upstream, grads[index] = result[0], result[1:]
        backward[index] = short_device(grads[index][0].device)
    return {"loss": loss, "grads": [g for stage_grads in grads for g in stage_grads],
            "placement": {"forward": [short_device(t.device) for t in outputs],
                          "backward": backward}}


def memory_per_stage(stages: Sequence[Any], batch_size: int,
                     optimizer_slots: int = 2) -> list[dict[str, int]]:
    """Bytes each stage needs on its device: parameters, gradients, optimizer state, activations.

    Gradients are as large as the parameters; ``optimizer_slots`` copies of them for the
    optimizer (Adam: 2, SGD with momentum: 1); activations from the stage's layer outputs (and
    the first stage's input batch) for ``batch_size`` examples
    (``course_utils.memory.activation_bytes_per_example``), so the stages add up to the whole.
    """
    rows = []
    for index, stage in enumerate(stages):
        params = variable_bytes(stage)
        row = {"stage": index, "parameters": params, "gradients": params,
               "optimizer_state": optimizer_slots * params,
               "activations": batch_size * activation_bytes_per_example(
                   stage, include_input=index == 0)}  # later inputs: counted one stage up
        row["total"] = sum(v for k, v in row.items() if k != "stage")
        rows.append(row)
    return rows
