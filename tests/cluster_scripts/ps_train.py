"""Parameter-server training with the Trainer on an in-process cluster (run as a subprocess).

Prints one line ``RESULT {json}`` with the loss and accuracy per epoch, the step count the
trainer kept, the optimizer's own (unreliable) count, and the error for partitioned variables.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from course_utils.cluster import start_in_process_cluster  # noqa: E402
from course_utils.grading.checks.lesson_04 import barrier_fn  # noqa: E402
from course_utils.training import Trainer  # noqa: E402
from course_utils.training.parameter_server import CoordinatorLoop  # noqa: E402

EPOCHS, STEPS = 3, 20

rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 8)).astype("float32")
y = np.argmax(x @ rng.normal(size=(8, 3)), axis=1).astype("int32")


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = context.get_per_replica_batch_size(64)
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shard(context.num_input_pipelines, context.input_pipeline_id)
        .shuffle(1024, seed=context.input_pipeline_id)
        .batch(batch)
        .repeat()
    )


def model_fn() -> keras.Model:
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)]
    )


def loss_fn(y_true, logits):
    return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)


cluster = start_in_process_cluster(num_workers=2, num_ps=1)
strategy = cluster.strategy()
# start_in_process_cluster starts once per size and reuses its strategy (tests/test_training.py
# asserts it from this run, which also holds tests/test_cluster.py's old separate process).
in_process = {"same": start_in_process_cluster(2, 1) is cluster, "spec": cluster.cluster,
              "servers": len(cluster.servers), "reused": cluster.strategy() is strategy,
              "kind": type(strategy).__name__, "refused": ""}
try:
    start_in_process_cluster(0, 1)
except ValueError as error:
    in_process["refused"] = str(error)
trainer = Trainer(
    model_fn,
    lambda: keras.optimizers.Adam(1e-2),
    loss_fn,
    strategy=strategy,
    metrics=[keras.metrics.SparseCategoricalAccuracy("accuracy")],
    verbose=0,
)
history = trainer.fit(dataset_fn, epochs=EPOCHS, steps_per_epoch=STEPS)

# A plain dataset (not a function), accumulation and several steps per closure.
accumulating = Trainer(
    model_fn, lambda: keras.optimizers.SGD(0.1), loss_fn, strategy=strategy,
    accumulation_steps=2, steps_per_execution=2, verbose=0,
)
plain = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
accumulating_history = accumulating.fit(plain, epochs=1, steps_per_epoch=10)


# Each worker's dataset function sees its own input_pipeline_id: one step per worker (a
# barrier holds each until both arrived), each returning its index and its first batch.
def order_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    pipeline = tf.cast(context.input_pipeline_id, tf.int64)
    pipelines = tf.cast(context.num_input_pipelines, tf.int64)
    return (
        tf.data.Dataset.range(64)
        .shuffle(64, seed=pipeline + 7)
        .batch(8)
        .map(lambda batch: (batch, pipeline, pipelines))
    )


barrier = barrier_fn(strategy)
loop = CoordinatorLoop(strategy, replica_step=None)
order_iterator = loop.per_worker_iterator(order_fn)


@tf.function
def first_batch(iterator):
    with tf.control_dependencies([barrier()]):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        batch, pipeline, pipelines = next(iterator)
        return worker, batch, pipeline, pipelines


firsts = [loop.coordinator.schedule(first_batch, args=(order_iterator,)) for _ in range(2)]
loop.coordinator.join()
first_batches = {
    int(worker): {"batch": batch.tolist(), "pipeline": int(pipeline), "of": int(pipelines)}
    for worker, batch, pipeline, pipelines in (remote.fetch() for remote in firsts)
}

partitioned_error, partitioned_message = None, ""
try:
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=64, max_shards=2
    )
    Trainer(model_fn, keras.optimizers.Adam, loss_fn, strategy=cluster.strategy(partitioner))
except Exception as error:  # noqa: BLE001 - reported to the test
    partitioned_error, partitioned_message = type(error).__name__, str(error)

print(
    "RESULT "
    + json.dumps(
        {
            "loss": history["loss"],
            "accuracy": history["accuracy"],
            "steps": trainer.steps,
            "planned_steps": EPOCHS * STEPS,
            "optimizer_iterations": int(trainer.optimizer.iterations.numpy()),
            "accumulating_steps": accumulating.steps,
            "accumulating_updates": accumulating.updates,
            "accumulating_loss": accumulating_history["loss"],
            "partitioned_error": partitioned_error,
            "partitioned_message": partitioned_message,
            "first_batches": first_batches,
            "in_process": in_process,
        }
    ),
    flush=True,
)
