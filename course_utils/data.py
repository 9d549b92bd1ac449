"""Offline datasets and input-pipeline builders.

Nothing here downloads anything. The synthetic tasks are made so that models really learn
(labels come from a fixed random "teacher"), and the UCI handwritten digits, which ship inside
this package (``datasets/``), are exposed as a real TFDS builder so ``tfds.load`` works with no
network.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = [
    "DIGITS_NAME", "teacher_classification", "sequence_task",
    "make_pipeline", "without_default_optimizations", "add_latency", "write_tfrecord_shards",
    "parse_tfrecord_fn", "read_tfrecord_shards", "default_data_dir", "DIGITS_FILE", "digits_arrays",
    "digits_builder", "load_digits",
]

DIGITS_NAME = "course_digits"


# ----------------------------------------------------------------------------- synthetic tasks


def teacher_classification(
    num_examples: int = 4096,
    num_features: int = 32,
    num_classes: int = 4,
    seed: int = 0,
    label_noise: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """A classification task labelled by a fixed random two-layer "teacher" network.

    Returns ``x`` (float32, ``[num_examples, num_features]``) and integer labels ``y``. A small
    MLP reaches well above chance in a few epochs, so accuracy really rises. With
    ``label_noise``, that fraction of labels is replaced by random classes.
    """
    if num_examples < 1 or num_features < 1 or num_classes < 2:
        raise ValueError("need num_examples >= 1, num_features >= 1 and num_classes >= 2")
    if not 0.0 <= label_noise <= 1.0:
        raise ValueError(f"label_noise must be in [0, 1], got {label_noise}")
    teacher = np.random.default_rng(seed)  # the teacher is fixed by the seed ...
    hidden = 2 * num_features
    w1 = teacher.normal(size=(num_features, hidden)) / np.sqrt(num_features)
    w2 = teacher.normal(size=(hidden, num_classes)) / np.sqrt(hidden)
    rng = np.random.default_rng(seed + 1)  # ... and the inputs drawn separately
    x = rng.normal(size=(num_examples, num_features)).astype(np.float32)
    logits = np.tanh(x @ w1) @ w2
    y = logits.argmax(axis=1).astype(np.int32)
    if label_noise:
        flip = rng.random(num_examples) < label_noise
        y[flip] = rng.integers(0, num_classes, size=int(flip.sum()))
    return x, y


def sequence_task(
    num_examples: int = 2048,
    sequence_length: int = 20,
    num_features: int = 4,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """A sequence task that needs memory: is the signal's sum in the first half larger?

    Each example is ``[sequence_length, num_features]``; the label is 1 when the first
    feature's sum over the first half of the sequence exceeds its sum over the second half.
    The other features are distractors. An RNN must carry a running total to solve it.
    """
    if sequence_length < 2:
        raise ValueError(f"sequence_length must be at least 2, got {sequence_length}")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, sequence_length, num_features)).astype(np.float32)
    half = sequence_length // 2
    y = (x[:, :half, 0].sum(axis=1) > x[:, half:, 0].sum(axis=1)).astype(np.int32)
    return x, y


# ----------------------------------------------------------------------------- pipelines


def make_pipeline(
    dataset: Any,
    batch_size: int,
    *,
    preprocess: Callable[..., Any] | None = None,
    augment: Callable[..., Any] | None = None,
    cache: bool = True,
    shuffle_buffer: int | None = 1024,
    repeat: bool = False,
    drop_remainder: bool = False,
    prefetch: bool = True,
    num_parallel_calls: int | None = None,
    seed: int | None = None,
) -> Any:
    """Build a ``tf.data`` pipeline with its steps in the right order.

    ``preprocess`` (deterministic work, run in parallel) -> ``cache`` -> ``shuffle`` (of
    elements, before batching) -> ``repeat`` -> ``augment`` (random work, after the cache so it
    differs every epoch) -> ``batch`` -> ``prefetch``. ``num_parallel_calls`` defaults to
    ``tf.data.AUTOTUNE``.

    Draw ``augment``'s randomness from a ``tf.random.Generator`` (or Keras random layers): with
    a global seed set, ``tf.random.uniform`` and the other stateful ops restart with every new
    iterator, so each epoch would get the same "random" augmentation.
    """
    tf = _tf()
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    parallel = tf.data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls
    if preprocess is not None:
        dataset = dataset.map(preprocess, num_parallel_calls=parallel)
    if cache:
        dataset = dataset.cache()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    if augment is not None:
        dataset = dataset.map(augment, num_parallel_calls=parallel)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    if prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset


def without_default_optimizations(dataset: Any, autotune: bool = True) -> Any:
    """Turn off tf.data's automatic graph rewrites, for an honest "naive" baseline.

    By default tf.data rewrites a plain pipeline (it injects a ``prefetch``, fuses and
    parallelizes some maps), which hides what ``prefetch`` and parallel ``map`` buy. Autotuning
    stays on, so parameters set to ``tf.data.AUTOTUNE`` are really tuned; ``autotune=False``
    switches it off too: every ``num_parallel_calls=tf.data.AUTOTUNE`` then stays at its
    starting value (``options.autotune.initial_parallelism``, 16 unless set, and at most the
    pool's threads: ``GetAutotuneDefaultParallelism`` in ``tensorflow/core/data/dataset_utils.cc``),
    while a ``prefetch(tf.data.AUTOTUNE)`` buffer still grows by its older heuristic
    (``legacy_autotune`` in ``tensorflow/python/data/ops/prefetch_op.py``).
    """
    tf = _tf()
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    options.autotune.enabled = autotune
    return dataset.with_options(options)


def add_latency(dataset: Any, seconds: float, num_parallel_calls: int | None = None) -> Any:
    """Make every element of ``dataset`` cost ``seconds`` of waiting, like reading from disk.

    The wait is a real ``time.sleep`` in a ``tf.py_function``: it occupies no core, just as an
    I/O wait does not, so parallel reads (``num_parallel_calls``, e.g. ``tf.data.AUTOTUNE``)
    and prefetching can hide it. As in ``Dataset.map``, ``None`` means one element at a time,
    in order; note that even ``num_parallel_calls=1`` already runs one element ahead in the
    background. Elements pass through unchanged.
    """
    import time

    tf = _tf()
    if seconds < 0:
        raise ValueError(f"seconds must be non-negative, got {seconds}")

    @tf.autograph.experimental.do_not_convert  # nothing to convert; saves seconds in interleave
    def wait(*element: Any) -> Any:
        def sleep() -> Any:
            time.sleep(seconds)
            return np.int32(0)

        done = tf.py_function(sleep, [], tf.int32)
        with tf.control_dependencies([done]):
            passed = tuple(tf.identity(part) for part in element)
        return passed if len(passed) > 1 else passed[0]

    return dataset.map(wait, num_parallel_calls=num_parallel_calls)


# ----------------------------------------------------------------------------- TFRecord shards


def _example(x: np.ndarray, y: int) -> bytes:
    tf = _tf()
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(x).tolist())),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecord_shards(
    x: np.ndarray, y: np.ndarray, directory: str | os.PathLike, num_shards: int = 4,
    prefix: str = "data",
) -> list[str]:
    """Write ``(x, y)`` as ``num_shards`` TFRecord files of ``tf.train.Example``; return paths.

    Examples are dealt round-robin, so shards are the same size to within one example.
    """
    tf = _tf()
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [str(directory / f"{prefix}-{i:05d}-of-{num_shards:05d}.tfrecord")
             for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(path) for path in paths]
    try:
        for index, (features, label) in enumerate(zip(x, y, strict=True)):
            writers[index % num_shards].write(_example(features, label))
    finally:
        for writer in writers:
            writer.close()
    return paths


def parse_tfrecord_fn(feature_shape: Sequence[int]) -> Callable[[Any], tuple[Any, Any]]:
    """A function that parses one serialized example written by ``write_tfrecord_shards``."""
    tf = _tf()
    size = int(np.prod(feature_shape))
    spec = {
        "x": tf.io.FixedLenFeature([size], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record: Any) -> tuple[Any, Any]:
        parsed = tf.io.parse_single_example(record, spec)
        return tf.reshape(parsed["x"], feature_shape), tf.cast(parsed["y"], tf.int32)

    return parse


def read_tfrecord_shards(
    paths: Sequence[str], feature_shape: Sequence[int], *, interleave: bool = True,
    cycle_length: int | None = None, num_parallel_calls: int | None = None,
) -> Any:
    """Read shards written by ``write_tfrecord_shards`` as a dataset of ``(x, y)`` pairs.

    With ``interleave``, several files are read at once (``cycle_length`` of them, by default
    all), in parallel; otherwise they are read one after another.
    """
    tf = _tf()
    if not paths:
        raise ValueError("no TFRecord files given")
    parallel = tf.data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls
    files = tf.data.Dataset.from_tensor_slices(list(paths))
    if interleave:
        records = files.interleave(
            tf.data.TFRecordDataset,
            cycle_length=cycle_length or len(paths),
            num_parallel_calls=parallel,
            deterministic=False,
        )
    else:
        records = tf.data.TFRecordDataset(list(paths))
    return records.map(parse_tfrecord_fn(feature_shape), num_parallel_calls=parallel)


# ----------------------------------------------------------------------------- TFDS digits


def default_data_dir() -> str:
    """Where the course's TFDS datasets are prepared: ``$COURSE_DATA_DIR`` or a user cache."""
    path = os.environ.get("COURSE_DATA_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "scaling_tensorflow", "tensorflow_datasets"
    )
    return path


DIGITS_FILE = pathlib.Path(__file__).parent / "datasets" / "optdigits_test.csv.gz"


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The shipped digits as (images 1797x8x8 of 0..16 as float64, labels 1797 of int64).

    The same arrays as ``sklearn.datasets.load_digits()``'s ``images`` and ``target``: the
    file is the one scikit-learn ships (see ``datasets/README.md``).
    """
    table = np.loadtxt(DIGITS_FILE, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def _digits_builder_class() -> type:
    """Define (once) the TFDS builder of the UCI handwritten digits shipped with the course."""
    global _DIGITS_BUILDER
    if _DIGITS_BUILDER is not None:
        return _DIGITS_BUILDER
    import tensorflow_datasets as tfds

    class CourseDigits(tfds.core.GeneratorBasedBuilder):
        """The UCI 8x8 handwritten digits (1,797 images, 10 classes), offline."""

        VERSION = tfds.core.Version("1.0.0")
        RELEASE_NOTES = {"1.0.0": "First release: the UCI test set as scikit-learn ships it."}

        def _info(self) -> Any:
            return self.dataset_info_from_configs(
                description="UCI ML handwritten digits (the test set scikit-learn ships): 8x8 "
                "grey images scaled to 0-255.",
                features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(8, 8, 1)),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }),
                supervised_keys=("image", "label"),
                homepage="https://doi.org/10.24432/C50P49",
            )

        def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
            del dl_manager  # nothing to download: the data ships with the course
            pixels, labels = digits_arrays()
            images = np.round(pixels * (255.0 / 16.0)).astype(np.uint8)[..., None]
            order = np.random.default_rng(0).permutation(len(images))
            cut = int(len(images) * 0.8)
            return {
                "train": self._generate_examples(images, labels, order[:cut]),
                "test": self._generate_examples(images, labels, order[cut:]),
            }

        def _generate_examples(self, images: np.ndarray, labels: np.ndarray,
                               indices: np.ndarray) -> Any:
            for index in indices:
                yield int(index), {"image": images[index], "label": int(labels[index])}

    CourseDigits.name = DIGITS_NAME
    _DIGITS_BUILDER = CourseDigits
    return CourseDigits


_DIGITS_BUILDER: type | None = None


def digits_builder(data_dir: str | os.PathLike | None = None) -> Any:
    """The TFDS builder of the course's digits dataset (registered as ``course_digits``)."""
    builder_class = _digits_builder_class()
    return builder_class(data_dir=str(data_dir or default_data_dir()))


def load_digits(
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    as_supervised: bool = True,
    **kwargs: Any,
) -> Any:
    """``tfds.load("course_digits", ...)``: prepares the dataset offline on first use.

    Images are ``uint8`` ``[8, 8, 1]``, labels 0-9; splits ``train`` (1,437) and ``test``
    (360). Extra keyword arguments go to ``tfds.load``.
    """
    import tensorflow_datasets as tfds

    _digits_builder_class()  # registers the builder under its name
    return tfds.load(
        DIGITS_NAME,
        split=split,
        data_dir=str(data_dir or default_data_dir()),
        as_supervised=as_supervised,
        download=True,  # "download" here only prepares: the builder downloads nothing
        **kwargs,
    )
