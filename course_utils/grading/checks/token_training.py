"""Lesson 05 ex 3: a token tagger on padded sequences, trained under a strategy and judged
against one device's training on the mean over the global batch's real tokens.

``train_cases`` makes the two cases of ``check_train_steps`` (``lesson_05``): the notebook's
``MirroredStrategy``, then one device. Each global batch holds sequences padded with zeros at
the end, sorted by length (as a length-bucketing pipeline leaves them), so the replicas' shares
hold different numbers of real tokens; the labels at padding are drawn too. One device's weights
(``_one_device_weights``: a plain ``GradientTape`` step a batch, no strategy, the exercise's
one-device loss ``sum(loss * real) / sum(real)``) are the reference: the mean of the
replicas' own means, a replica's count times the replicas, a fixed count of sequences or of
slots (the lesson's ``compute_average_loss(..., global_batch_size)``), each sequence's mean
averaged, or no mask, all end elsewhere. Each of the model's layers notes where it was traced
(replica context, each replica's rows: ``strategy.run``): the global batch gathered and run
through the layers after the first, beside a call of the model on a replica's rows, is seen.
Still passes: a forward written by hand from the model's variables (no layer called). The
function returned must be a ``tf.function`` itself, not a subclass that says how often it
traced.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.grading.checks import answer_reach
from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.framework import Case
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["course_training_files", "noting_kerass_trainer", "train_cases"]

VOCABULARY = 40  # token ids 1 to 39; 0 is padding
YOURSELF = "write the training function yourself (cu.Trainer's is the course's answer)"
#: what runs while the answer's train_steps is traced and run (the check's own wrapper)
_RUN_BY_TRAINING = ("_train", "_context_watch", "_note", "_watched")


def course_training_files() -> tuple[str, ...]:
    """The files of ``cu.Trainer`` and its replica step (the course's own training)."""
    from course_utils.training import replica_step, trainer

    return trainer.__file__, replica_step.__file__


def noting_kerass_trainer(seen: list[str]) -> Any:
    """A guard's ``also`` noting the functions of Keras's trainer files run (they scale)."""
    import keras  # keras/src/trainers/trainer.py, keras/src/backend/tensorflow/trainer.py

    files = frozenset(getattr(keras.Model, name).__code__.co_filename
                      for name in ("compute_loss", "train_step"))
    return lambda frame, c_fn: (c_fn is None and frame.f_code.co_filename in files
                                and seen.append(frame.f_code.co_name))


def _mirrored_strategy() -> Any:
    from course_utils.strategies import make_strategy

    return make_strategy("mirrored", verbose=False)  # the notebook's own, cached: one per set


def _context_watch(seen: list[tuple[str, int]]) -> Any:
    """A weightless layer noting, each time it is traced, its context and batch rows."""
    import keras

    class ContextWatch(keras.layers.Layer):
        def call(self, inputs: Any) -> Any:
            _note(seen, inputs)
            return inputs

    return ContextWatch()


def _note(seen: list[tuple[str, int]], inputs: Any) -> None:
    tf = _tf()
    seen.append(("cross-replica" if tf.distribute.in_cross_replica_context() else "replica",
                 inputs.shape[0]))


def _watched(seen: list[tuple[str, int]], kind: Any, *args: Any) -> Any:
    """A layer of ``kind`` noting, as the watch does, where it was traced and on which rows: a
    forward through the model's layers after the first is seen too."""
    class Watched(kind):
        def call(self, inputs: Any) -> Any:
            _note(seen, inputs)
            return super().call(inputs)

    return Watched(*args)


def _model_and_optimizer(strategy: Any, seed: int, length: int, classes: int,
                         seen: list[tuple[str, int]] | None = None) -> Any:
    """A tagger: each token's embedding, then its class's logits; SGD, built in scope."""
    import keras

    seen = [] if seen is None else seen
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((length,), dtype="int32"), _context_watch(seen),
                                  _watched(seen, keras.layers.Embedding, VOCABULARY, 8),
                                  _watched(seen, keras.layers.Dense, classes)])
        optimizer = keras.optimizers.SGD(0.5)
        optimizer.build(model.trainable_variables)
    return model, optimizer


def _token_batches(data: Any, global_batch: int, batches: int, length: int,
                   classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens padded with zeros at the end, 1 to ``length`` real ones a row, each global batch
    sorted longest first (its replicas' shares: different real counts), and every token's
    label, padding's too."""
    lengths = data.integers(1, length + 1, size=(batches, global_batch))
    lengths[:, 0], lengths[:, -1] = length, 1  # the first share longer than the last
    lengths = -np.sort(-lengths, axis=1).reshape(-1)
    tokens = np.zeros((len(lengths), length), "int32")
    for row, real in enumerate(lengths):
        tokens[row, :real] = data.integers(1, VOCABULARY, size=real)
    return tokens, data.integers(0, classes, size=tokens.shape).astype("int32")


def _one_device_weights(model: Any, optimizer: Any, dataset: Any, steps: int) -> list[Any]:
    """``model``'s weights after ``steps`` global batches of ``dataset`` trained as the exercise
    says one device trains (each token's cross-entropy, summed over the real tokens and divided
    by their count), by a plain GradientTape step a batch, no strategy."""
    import keras

    tf = _tf()

    @tf.function
    def step(x: Any, y: Any) -> None:
        with tf.GradientTape() as tape:
            per_token = keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True)
            real = tf.cast(x != 0, tf.float32)
            loss = tf.reduce_sum(per_token * real) / tf.reduce_sum(real)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    for x, y in dataset.take(steps):
        step(x, y)
    return model.get_weights()


def _train(train_steps: Any, strategy: Any, dataset: Any, calls: tuple[int, ...]) -> None:
    tf = _tf()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for steps in calls:
        train_steps(iterator, tf.constant(steps))


def _problem(train_steps: Any, run: Any, strategy: Any, name: str, dataset: Any,
             calls: tuple[int, ...], kerass: list[str]) -> str | None:
    """What went wrong while ``train_steps`` was traced and run, before the weights count."""
    tf = _tf()
    if type(train_steps) is not type(tf.function(len)):  # not a subclass: its trace count
        return (f"make_train_steps returned {type(train_steps).__name__}, expected a "
                "tf.function (a compiled function: lesson 05, section 5), itself")
    try:  # traced here, not in make_train_steps: refused while it is traced and run
        run(train_steps, strategy, dataset, calls)
    except AssertionError as error:
        return f"while train_steps was traced and run: {error}"
    except tf.errors.OpError as error:  # e.g. jit_compile=True (lesson 05, section 5)
        return (f"{type(error).__name__} under {name}: {str(error).splitlines()[0]}"
                ". jit_compile=True fails under this MirroredStrategy over CPUs "
                "(section 5); TPUStrategy compiles the step with XLA itself")
    if kerass:  # Keras's own compile and train_step scale for you
        return (f"your function ran Keras's {kerass[0]} (Keras's trainer): write the replica "
                "step yourself (section 9)")
    return None


def train_cases(rng: Any, kerass: list[str], also_refused: list[Any]) -> list[Case]:
    """The same training under the notebook's MirroredStrategy, then on one device
    (``kerass``: the functions of Keras's trainer the answer ran, noted as it runs;
    ``also_refused``: the calling check module's functions)."""
    tf = _tf()
    length, classes = rng.choice([6, 10]), rng.choice([3, 4])
    global_batch, calls = 2 * rng.choice([4, 8, 12]), (rng.randint(3, 6), rng.randint(7, 10))
    seed = rng.randint(0, 10_000)
    x, y = _token_batches(np.random.default_rng(seed), global_batch, 8, length, classes)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch,
                                                               drop_remainder=True).repeat()
    one_device = tf.distribute.get_strategy()
    reference: list[Any] = []  # trained on first use: an answer refused early costs nothing
    refused = [*also_refused, *own_functions(sys.modules[__name__], but=_RUN_BY_TRAINING),
               *course_training_files()]

    def expected_weights() -> Any:
        if not reference:  # one device, the same seed, hence the same start
            alone, opt = _model_and_optimizer(one_device, seed, length, classes)
            reference.append(_one_device_weights(alone, opt, dataset, sum(calls)))
        return reference[0]

    def case(strategy: Any, name: str) -> Case:
        seen: list[tuple[str, int]] = []
        model, optimizer = _model_and_optimizer(strategy, seed, length, classes, seen)
        initial, settings = answer_reach.weights_of(model), optimizer.get_config()
        replicas = strategy.num_replicas_in_sync
        count = f"{replicas} replica{'s' * (replicas != 1)}"

        def verify(train_steps: Any) -> str | None:
            seen.clear()
            run = refusing(_train, refused, YOURSELF, noting_kerass_trainer(kerass))
            problem = _problem(train_steps, run, strategy, name, dataset, calls, kerass)
            if problem:
                return problem
            if optimizer.get_config() != settings:
                return ("the optimizer's settings (its learning rate) changed: leave the "
                        "optimizer as given and fix each replica's loss (section 9)")
            if largest_difference(answer_reach.weights_of(model), initial) < 1e-6:
                return "the weights did not change: were any gradients applied?"
            if not seen:
                return ("the model never ran while train_steps was traced: does your step "
                        "run it in every replica, through strategy.run (section 9)?")
            wrong = [(c, r) for c, r in seen if c != "replica" or r != global_batch // replicas]
            if wrong:
                context, rows = wrong[0]
                return (f"the model ran in {context} context on batches of {rows} sequences "
                        f"(of a global {global_batch}), not in each replica on its own "
                        f"{global_batch // replicas} through strategy.run (section 9)")
            difference = largest_difference(answer_reach.weights_of(model), expected_weights())
            if difference > 1e-5:
                return (f"after {sum(calls)} steps on {count} the weights differ from one "
                        f"device's by {difference:.2e} (more than 1e-05) on the same global "
                        "batches, whose replicas' shares hold different numbers of real "
                        "tokens. The replicas' gradients are summed: what must each replica "
                        "divide its tokens' summed loss by? Did each call run every step?")
            traces = train_steps.experimental_get_tracing_count()
            if traces != 1:
                return (f"train_steps traced {traces} times for {len(calls)} step counts, "
                        "expected once: what makes a tf.function trace again? (section 5)")
            return None

        return Case(args=(strategy, model, optimizer, global_batch), verify=verify,
                    label=f"({name}: {count}, sequences of {length} tokens, "
                          f"global_batch_size={global_batch}, calls of {calls[0]} then "
                          f"{calls[1]} steps)")

    return [case(_mirrored_strategy(), "MirroredStrategy"),
            case(one_device, "one device, the default strategy")]
