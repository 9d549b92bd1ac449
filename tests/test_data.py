"""course_utils.data: synthetic tasks that learn, offline TFDS digits, pipelines, TFRecords."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from course_utils import data, models


@pytest.mark.slow
def test_teacher_task_is_deterministic_balanced_enough_and_learnable():
    x, y = data.teacher_classification(2048, 16, 4, seed=3)
    x2, y2 = data.teacher_classification(2048, 16, 4, seed=3)
    assert x.shape == (2048, 16) and x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(x, x2)
    assert np.bincount(y, minlength=4).min() > 2048 * 0.05
    model = models.mlp(16, 4, (64,))
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    # No global seed here (it would leak into later tests): 5 epochs ended anywhere in 0.79-0.83
    # from one initialization to the next, 10 end near 0.87 on Keras 3.13 and 3.15 alike.
    history = model.fit(x, y, epochs=10, batch_size=64, verbose=0)
    assert history.history["accuracy"][-1] > 0.8
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_label_noise_changes_some_labels():
    _, clean = data.teacher_classification(1000, 8, 3, seed=0)
    _, noisy = data.teacher_classification(1000, 8, 3, seed=0, label_noise=0.5)
    assert 0.2 < (clean != noisy).mean() < 0.5


@pytest.mark.parametrize("kwargs", [{"num_classes": 1}, {"num_examples": 0},
                                    {"label_noise": 1.5}])
def test_teacher_task_rejects_bad_sizes(kwargs):
    with pytest.raises(ValueError):
        data.teacher_classification(**kwargs)


@pytest.mark.slow
def test_sequence_task_needs_memory_and_an_rnn_learns_it():
    x, y = data.sequence_task(2048, sequence_length=10, num_features=3, seed=1)
    assert x.shape == (2048, 10, 3) and set(np.unique(y)) == {0, 1}
    half = x[:, :5, 0].sum(1) > x[:, 5:, 0].sum(1)
    np.testing.assert_array_equal(y, half.astype(np.int32))
    model = models.rnn(10, 3, units=16)
    model.compile(tf.keras.optimizers.Adam(0.01),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, epochs=6, batch_size=64, verbose=0)
    assert history.history["accuracy"][-1] > 0.8


def test_sequence_task_rejects_too_short_sequences():
    with pytest.raises(ValueError):
        data.sequence_task(sequence_length=1)


def test_make_pipeline_shuffles_elements_before_batching():
    dataset = tf.data.Dataset.range(64)
    batches = list(data.make_pipeline(dataset, 8, shuffle_buffer=64, seed=0).as_numpy_iterator())
    first = batches[0]
    assert len(batches) == 8 and sorted(np.concatenate(batches).tolist()) == list(range(64))
    # Elements from far apart land in one batch: the examples were shuffled, not the batches.
    assert first.max() - first.min() > 8


def test_make_pipeline_applies_preprocess_once_and_augment_every_epoch():
    tf.random.set_seed(0)  # as a learner's seeded notebook does (other tests in this worker too)
    calls = tf.Variable(0)
    generator = tf.random.Generator.from_seed(1)

    def preprocess(x):
        calls.assign_add(1)
        return x

    def augment(x):
        return x + generator.uniform([], 0, 1000, dtype=tf.int64)

    dataset = data.make_pipeline(tf.data.Dataset.range(10), 10, preprocess=preprocess,
                                 augment=augment, shuffle_buffer=None)
    first = next(iter(dataset)).numpy()
    second = next(iter(dataset)).numpy()
    assert int(calls.numpy()) == 10  # cached after the deterministic preprocessing
    assert not np.array_equal(first, second)  # augmentation runs after the cache


def test_seeded_stateful_random_ops_repeat_every_epoch_which_make_pipeline_documents():
    """The pitfall the docstring warns of: under a global seed, ``tf.random.uniform`` in a map
    restarts with every new iterator, so each epoch gets the same "random" augmentation."""
    tf.random.set_seed(0)

    def augment(x):
        return x + tf.random.uniform([], 0, 1000, dtype=tf.int64)

    dataset = data.make_pipeline(tf.data.Dataset.range(10), 10, augment=augment,
                                 shuffle_buffer=None, num_parallel_calls=1)
    assert np.array_equal(next(iter(dataset)).numpy(), next(iter(dataset)).numpy())
    assert "tf.random.Generator" in data.make_pipeline.__doc__


def test_make_pipeline_drop_remainder_and_repeat():
    dataset = data.make_pipeline(tf.data.Dataset.range(10), 4, drop_remainder=True,
                                 repeat=True, shuffle_buffer=None, cache=False)
    batches = list(dataset.take(5).as_numpy_iterator())
    assert all(len(b) == 4 for b in batches)
    with pytest.raises(ValueError):
        data.make_pipeline(tf.data.Dataset.range(3), 0)


def test_without_default_optimizations_sets_the_options():
    dataset = data.without_default_optimizations(tf.data.Dataset.range(3))
    assert dataset.options().experimental_optimization.apply_default_optimizations is False
    assert dataset.options().autotune.enabled is True  # AUTOTUNE still tunes
    assert list(dataset.as_numpy_iterator()) == [0, 1, 2]
    fixed = data.without_default_optimizations(tf.data.Dataset.range(3), autotune=False)
    assert fixed.options().autotune.enabled is False


def test_add_latency_waits_and_passes_elements_through():
    dataset = data.add_latency(tf.data.Dataset.from_tensor_slices(([1, 2, 3], [4, 5, 6])), 0.05)
    start = time.perf_counter()
    elements = list(dataset.as_numpy_iterator())
    assert time.perf_counter() - start >= 0.14
    assert [(int(a), int(b)) for a, b in elements] == [(1, 4), (2, 5), (3, 6)]
    single = data.add_latency(tf.data.Dataset.range(2), 0.0)
    assert list(single.as_numpy_iterator()) == [0, 1]
    with pytest.raises(ValueError):
        data.add_latency(tf.data.Dataset.range(2), -1)


def test_parallel_latency_overlaps_waits():
    base = tf.data.Dataset.range(8)
    start = time.perf_counter()
    list(data.add_latency(base, 0.5, num_parallel_calls=8).as_numpy_iterator())
    # 8 waits in a row take 4 s. The waits run on TensorFlow's inter-op threads (one per core),
    # so on 2 cores they overlap two at a time: 2 s. The bound, 3 s, leaves 1 s for overhead on
    # a busy machine (0.05 s waits under a 0.35 s bound failed there; 2.2 s measured).
    assert time.perf_counter() - start < 3.0


def test_tfrecord_shards_round_trip(tmp_path):
    x, y = data.teacher_classification(103, 6, 3)
    paths = data.write_tfrecord_shards(x.reshape(103, 2, 3), y, tmp_path, num_shards=4)
    assert len(paths) == 4 and all(p.endswith(".tfrecord") for p in paths)
    for interleave in (True, False):
        records = list(data.read_tfrecord_shards(paths, (2, 3), interleave=interleave)
                       .as_numpy_iterator())
        assert len(records) == 103
        got = {int(label): None for _, label in records}
        assert set(got) <= {0, 1, 2}
        features = np.stack([f for f, _ in records])
        assert features.shape == (103, 2, 3)
        np.testing.assert_allclose(np.sort(features.ravel()), np.sort(x.ravel()), rtol=1e-6)


def test_tfrecord_writer_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError):
        data.write_tfrecord_shards(np.zeros((3, 2)), np.zeros(2), tmp_path)
    with pytest.raises(ValueError):
        data.write_tfrecord_shards(np.zeros((3, 2)), np.zeros(3), tmp_path, num_shards=0)
    with pytest.raises(ValueError):
        data.read_tfrecord_shards([], (2,))


@pytest.mark.slow
def test_digits_load_offline_through_tfds(tmp_path):
    import tensorflow_datasets as tfds

    train = data.load_digits("train", data_dir=tmp_path)
    images, labels = next(iter(train.batch(2000)))
    assert images.shape == (1437, 8, 8, 1) and images.dtype == tf.uint8
    assert set(np.unique(labels.numpy())) == set(range(10))
    assert int(tfds.load("course_digits", split="test", data_dir=str(tmp_path))
               .cardinality()) == 360
    builder = data.digits_builder(tmp_path)
    assert builder.info.features["label"].num_classes == 10
    assert builder.info.splits["train"].num_examples == 1437


def test_the_shipped_digits_are_the_uci_test_set():
    images, labels = data.digits_arrays()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert images.min() == 0 and images.max() == 16 and np.all(images == np.round(images))
    # The UCI test set's class counts (optdigits.tes): 178, 182, 177, 183, 181, ...
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_default_data_dir_respects_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    assert data.default_data_dir() == str(tmp_path)


def test_parse_tfrecord_fn_reads_one_written_example(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    (path,) = data.write_tfrecord_shards(x, np.array([7]), tmp_path, num_shards=1)
    record = next(iter(tf.data.TFRecordDataset(path)))
    features, label = data.parse_tfrecord_fn((2, 3))(record)
    np.testing.assert_array_equal(features.numpy(), x[0])
    assert int(label) == 7 and label.dtype == tf.int32
