"""Worker script: the Trainer under MultiWorkerMirroredStrategy (or 2-replica Mirrored).

Run by tests/test_cluster.py through ``LocalCluster`` (``--mode cluster``) or as one process
with two logical CPUs (``--mode mirrored``) for the reference. Prints ``epoch E step S`` after
each epoch and ``DONE {json}`` at the end; writes the final weights to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["cluster", "mirrored"], default="cluster")
parser.add_argument("--out", required=True)
parser.add_argument("--checkpoint-dir", default=None)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--epoch-delay", type=float, default=0.0)
parser.add_argument("--accumulation-steps", type=int, default=1)
args = parser.parse_args()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import course_utils.cluster as cluster  # noqa: E402
from course_utils.training import Trainer  # noqa: E402

if args.mode == "cluster":
    strategy = cluster.worker_strategy()
    name = f"worker{cluster.task()[1]}"
else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    name = "mirrored"
print(f"strategy ready: {type(strategy).__name__} with {strategy.num_replicas_in_sync} replicas",
      flush=True)

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = np.argmax(x @ rng.normal(size=(8, 3)), axis=1).astype("int32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().with_options(options)

keras.utils.set_random_seed(1)
initial = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
).get_weights()


def model_fn() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
    )
    model.set_weights(initial)
    return model


def loss_fn(y_true, logits):
    return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)


trainer = Trainer(
    model_fn,
    lambda: keras.optimizers.SGD(0.1),
    loss_fn,
    strategy=strategy,
    accumulation_steps=args.accumulation_steps,
    checkpoint_dir=args.checkpoint_dir,
    verbose=0,
)


def on_epoch_end(epoch: int, logs: dict) -> None:
    print(f"epoch {epoch + 1} step {trainer.run_step} loss {logs['loss']:.4f}", flush=True)
    time.sleep(args.epoch_delay)


history = trainer.fit(data, epochs=args.epochs, steps_per_epoch=args.steps,
                      on_epoch_end=on_epoch_end)
os.makedirs(args.out, exist_ok=True)
np.savez(os.path.join(args.out, f"{name}.npz"), *trainer.model.get_weights())
print("DONE " + json.dumps({"history": history, "run_step": trainer.run_step,
                            "steps": trainer.steps, "resumed_from": trainer.resumed_from_step}),
      flush=True)
