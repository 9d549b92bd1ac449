"""Lesson 09 with ``DATASET = "cifar10"``, without a download: ``tfds.testing.mock_data`` fakes
the builder (random 32×32×3 uint8 images, 10 labels), and the capstone's pieces – the split by
class, the CNN, the job's pipeline and ``cu.Trainer`` – take its examples as they come."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_cifar10_path_loads_splits_and_trains_without_a_download(tmp_path):
    import keras
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    import course_utils as cu

    with tfds.testing.mock_data(num_examples=48):
        train, info = tfds.load("cifar10", split="train", data_dir=str(tmp_path / "none"),
                                as_supervised=True, with_info=True)
    image_shape = tuple(info.features["image"].shape)
    num_classes = info.features["label"].num_classes
    assert (image_shape, num_classes) == ((32, 32, 3), 10)
    assert not (tmp_path / "none").exists()  # nothing was downloaded or prepared
    images, labels = next(iter(train.batch(48)))
    assert images.dtype == tf.uint8 and images.shape == (48, 32, 32, 3)

    first = 5  # the lesson's PRETRAIN_CLASSES: fine-tune on labels 5-9, relabelled from 0
    part = train.filter(lambda image, label: label >= first).map(
        lambda image, label: (image, label - first))
    count = int(part.reduce(0, lambda n, _: n + 1))
    part = part.apply(tf.data.experimental.assert_cardinality(count))
    assert count == int(np.sum(labels.numpy() >= first)) and len(part) == count
    assert {int(label) for _, label in part} <= set(range(num_classes - first))

    trainer = cu.Trainer(
        lambda: cu.models.cnn(image_shape, num_classes - first, filters=(8, 16)),
        lambda: keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        strategy=tf.distribute.get_strategy(), metrics=["accuracy"], verbose=0)
    pipeline = cu.data.make_pipeline(cu.data.add_latency(part, 0.0), 4, shuffle_buffer=64,
                                     seed=0, drop_remainder=True)
    history = trainer.fit(pipeline, epochs=1)
    assert trainer.updates == count // 4 and np.isfinite(history["loss"][-1])
