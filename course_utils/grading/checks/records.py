"""Lesson 01's exercise 4: the records a colleague wrote (the image as its raw bytes, a weight
in some records only), and what differs between a parsed image and the stored one."""

from __future__ import annotations

import numpy as np

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["pixels_problem", "record_example"]


def record_example(pixels: np.ndarray, label: int, weight: float | None = None) -> bytes:
    """One serialized ``tf.train.Example`` as the exercise describes it: ``pixels`` (the
    image's bytes, one uint8 per channel, row by row, in one bytes feature), ``label`` (an
    integer) and, in some records only, ``weight`` (a float)."""
    tf = _tf()
    raw = np.asarray(pixels, dtype=np.uint8).tobytes()
    feature = {
        "pixels": tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    if weight is not None:
        feature["weight"] = tf.train.Feature(float_list=tf.train.FloatList(value=[weight]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def pixels_problem(index: int, image: np.ndarray, stored: np.ndarray) -> str | None:
    """What differs between a parsed image and the stored bytes / 255 (None: nothing)."""
    wanted = stored.astype(np.float32) / 255.0
    if np.allclose(image, wanted, atol=1e-6):
        return None
    if np.allclose(image, stored.astype(np.float32)):
        return (f"record {index}: the pixels are the stored bytes as they are (values up to "
                f"{float(image.max()):g}); expected each byte / 255, in [0, 1]")
    where = np.unravel_index(int(np.argmax(np.abs(image - wanted))), wanted.shape)
    return (f"record {index}: the pixels differ from the stored bytes / 255: at "
            f"{list(map(int, where))} expected {float(wanted[where]):.4f} (byte "
            f"{int(stored[where])}), got {float(image[where]):.4f}")
