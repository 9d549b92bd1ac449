"""Lesson 01's exercise 4: the records a colleague wrote (the image as its raw bytes, a weight
in some records only), what differs between a parsed image and the stored one, whether the
answer parses in the graph (:func:`parse_ops_problem`), and the records it is judged on, drawn
after it was traced (:func:`parsed_problem`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["PARSE_OPS", "PYTHON_OPS", "RECORD_IMAGE_SHAPE", "parse_ops_problem", "parsed_problem",
           "pixels_problem", "record_example", "records"]

#: The shape of the images in ``check_parse_record``'s records.
RECORD_IMAGE_SHAPE = (2, 2, 3)

#: The op types of ``tf.io.parse_single_example`` / ``tf.io.parse_example`` (TF 2.21 makes
#: ``ParseExampleV2`` for both; the older kernels are accepted too).
PARSE_OPS = frozenset(("ParseExampleV2", "ParseExample", "ParseSingleExample"))
#: The op types that run Python: ``tf.py_function`` (``EagerPyFunc``) and
#: ``tf.numpy_function`` (``PyFunc``, ``PyFuncStateless``).
PYTHON_OPS = frozenset(("EagerPyFunc", "PyFunc", "PyFuncStateless"))


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


def parse_ops_problem(fn: object) -> str | None:
    """What is wrong with the graph of ``fn`` traced on one scalar ``tf.string`` record (None:
    nothing): an op that runs Python (``tf.py_function``, ``tf.numpy_function``: a parse in
    Python, one record at a time under the GIL), or no parse op (``tf.io.parse_single_example``,
    ``tf.io.parse_example``). The ops of the functions it calls are read too."""
    tf = _tf()
    graph = tf.function(fn).get_concrete_function(tf.TensorSpec([], tf.string)).graph
    graph_def = graph.as_graph_def()
    ops = {node.op for node in graph_def.node} | {
        node.op for function in graph_def.library.function for node in function.node_def}
    python = sorted(ops & PYTHON_OPS)
    if python:
        return (f"parse_record's graph (traced on one tf.string record) has {', '.join(python)} "
                "op(s): it parses in Python (tf.py_function or tf.numpy_function), one record "
                "at a time under the GIL; parse it in the graph with "
                "tf.io.parse_single_example and a feature spec")
    if not ops & PARSE_OPS:
        return ("parse_record's graph (traced on one tf.string record) has no ParseExample op "
                f"(its ops: {', '.join(sorted(ops))}): parse the record with "
                "tf.io.parse_single_example (or tf.io.parse_example) and a feature spec")
    return None


def records(generator: Any, count: int) -> tuple[Any, Any, list[Any], list[bytes]]:
    """``count`` fresh records: images, labels, weights (None: not stored) and the bytes."""
    images = generator.integers(0, 256, (count, *RECORD_IMAGE_SHAPE), dtype=np.uint8)
    labels = generator.integers(0, 100, count)
    weights = [None if index % 3 == 0 else float(np.float32(generator.uniform(0.1, 5.0)))
               for index in range(count)]
    return images, labels, weights, [record_example(*row) for row in zip(
        images, labels, weights, strict=True)]


def parsed_problem(traced: Any, generator: Any, count: int) -> str | None:
    """The records, drawn now, written to a file and mapped through the traced answer."""
    import os
    import shutil
    import tempfile

    tf = _tf()
    images, labels, weights, serialized = records(generator, count)
    folder = tempfile.mkdtemp(prefix="check_parse_record_")
    path = os.path.join(folder, "records.tfrecord")
    try:
        with tf.io.TFRecordWriter(path) as writer:
            for record in serialized:
                writer.write(record)
        parsed = list(tf.data.TFRecordDataset(path).map(traced).as_numpy_iterator())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if len(parsed) != count:
        return f"expected {count} parsed records, got {len(parsed)}"
    for index, element in enumerate(parsed):
        if not isinstance(element, tuple) or len(element) != 3:
            return f"record {index}: expected (image, label, weight), got {element!r:.80}"
        image, label, weight = (np.asarray(part) for part in element)
        if image.shape != RECORD_IMAGE_SHAPE or image.dtype != np.float32:
            return (f"record {index}: expected a float32 image of shape "
                    f"{RECORD_IMAGE_SHAPE}, got {image.dtype} {image.shape}")
        problem = pixels_problem(index, image, images[index])
        if problem:
            return problem
        if label.dtype != np.int32 or int(label) != int(labels[index]):
            return (f"record {index}: expected the label {int(labels[index])} as int32, "
                    f"got {label!r}")
        want = 1.0 if weights[index] is None else weights[index]
        if weight.shape != () or not np.isclose(float(weight), want):
            return (f"record {index}{' (no weight stored)' if weights[index] is None else ''}"
                    f": expected the weight {want}, got {weight!r}")
    return None
