"""Lesson 05, exercise 1 (a TPU-ready pipeline): what is wrong with one epoch of a learner's
pipeline: its shapes, the Python its graph runs instead of the dataset given (``py_function``
tokens, ``batch_shapes``) or hands on from an iterator, a queue or a variable made outside it
(any handle its functions capture, a lookup table's too, and the files they read: the exercise
needs none), an epoch that never ends, its traces, batches and reads, and their values; a bound
of its own (the largest whole number in its graph: a ``padded_batch``'s ``padded_shapes``, a
``tf.pad``'s target) meets a sequence one longer than that bound.

Still passes: a bound above ``2**20`` tokens reached by ``tf.pad`` (or passed on to a
``padded_batch`` through another op, ``tf.identity``), or one computed in the graph from smaller
numbers (``tf.constant(128) * sequence_length``) or from a string (``tf.strings.to_number``),
then a cut."""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import (
    _graph,
    graph_ops,
    handed_on,
    py_function_tokens,
)
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["largest_number", "order_problem", "padded_bound", "python_problem",
           "verify_pipeline"]


#: Parts of the names of ops that hand on elements made outside the pipeline's graph (an
#: iterator's get_next, a queue's or a staging area's take, that another pipeline or a thread
#: fills; a pipeline serialized in a string, run inside a step): the work behind them is out
#: of the graph's sight.
_HANDED_ON = ("IteratorGetNext", "QueueDequeue", "Unstage", "DatasetFromGraph")


def python_problem(dataset: Any, given: set[str]) -> str | None:
    """What Python the pipeline runs instead of the given dataset's steps, or None: its graph
    must hold the given dataset's ``py_function`` tokens (its reads) and no other, and pull
    nothing from an iterator, a queue or other state made outside it (a resource its functions
    capture, such as a variable a Python thread fills, or a stateful op of theirs that takes
    none and reads outside state, such as a file read, or a pipeline serialized in a string;
    lessons 00 and 01's ``handed_on``)."""
    tf = _tf()
    try:
        tokens = py_function_tokens(dataset)
        pulls = sorted({op for op in graph_ops(dataset)
                        if any(kind in op for kind in _HANDED_ON)})
        captured = handed_on(dataset, given)[1]
    except AssertionError as error:  # batch_shapes' reader: a step that cannot be serialized
        return str(error)
    except (tf.errors.OpError, ValueError, TypeError) as error:
        return (f"the check could not read your pipeline's graph: {type(error).__name__}: "
                f"{str(error).strip().splitlines()[0][:160]}")
    if not given <= tokens:
        return ("your dataset is not made from the one given: no step of its graph reads "
                "`dataset` (a Python generator that iterates it, or data from elsewhere, hands "
                "out the batches). "
                "Transform `dataset` with tf.data steps (section 3)")
    if tokens - given:
        return (f"your pipeline calls Python ({len(tokens - given)} op(s) of tf.py_function, "
                "tf.numpy_function or from_generator): tf.data's threads run TensorFlow ops in "
                "parallel, Python code takes turns while it computes (it holds the GIL: "
                "Dataset.map's docstring). Which TensorFlow ops cut and pad a sequence?")
    if pulls or captured:
        named = (", ".join(pulls) if pulls else
                 f"{captured} captured handle(s) or stateful op(s) of its functions")
        return (f"your pipeline reads state made outside it ({named}: an iterator, a queue, a "
                "variable, a table, a file, a pipeline serialized in a string): what another "
                "pipeline or a Python thread puts there is work out of this graph's sight. "
                "Transform `dataset` itself with tf.data steps (section 3)")
    return None


#: The longest sequence the check makes to pass a bound of the pipeline's own (4 MiB of tokens,
#: a padded batch of 16 of them 64 MiB); a ``padded_batch``'s bound above it is named.
_LONGEST = 2**20


def padded_bound(dataset: Any, length: int) -> int | None:
    """The largest bound above ``length`` that a ``padded_batch`` of the pipeline pads to (its
    ``padded_shapes`` in the graph), or None."""
    tf = _tf()
    graph = _graph(dataset)
    scopes = [graph.node, *(function.node_def for function in graph.library.function)]
    bounds = {length}
    for nodes in scopes:
        by_name = {node.name: node for node in nodes}
        for node in nodes:
            if not node.op.startswith("PaddedBatchDataset"):
                continue
            for name in node.input[2:2 + node.attr["N"].i]:  # its padded_shapes
                shape = by_name.get(name.lstrip("^").split(":")[0])
                if shape is not None and shape.op == "Const":
                    bounds |= {int(size) for size in
                               np.ravel(tf.make_ndarray(shape.attr["value"].tensor))}
    return max(bounds) if max(bounds) > length else None


def largest_number(dataset: Any) -> int:
    """The largest whole number below ``_LONGEST`` among the numeric constants of the
    pipeline's graph and its functions (a ``padded_batch``'s ``padded_shapes``, the target of a
    ``tf.pad``, passed through ``tf.identity`` or not, or cast from another integer or a float
    type), or 0."""
    tf = _tf()
    graph = _graph(dataset)
    numeric = {dtype.as_datatype_enum for dtype in (
        tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64,
        tf.float16, tf.bfloat16, tf.float32, tf.float64)}
    numbers = {0}
    for nodes in [graph.node, *(function.node_def for function in graph.library.function)]:
        for node in nodes:
            if node.op == "Const" and node.attr["dtype"].type in numeric:
                numbers |= {int(number) for number in map(float, np.ravel(
                    tf.make_ndarray(node.attr["value"].tensor)))
                    if number.is_integer() and number < _LONGEST}
    return max(numbers)


def order_problem(dataset: Any) -> str | None:
    """Which steps of the pipeline may hand out elements out of order (``deterministic=False``,
    in a step or in the options), or None: a cheap map mostly keeps the order anyway, so the
    batches alone would not tell."""
    graph = _graph(dataset)
    nodes = [*graph.node, *(node for function in graph.library.function
                            for node in function.node_def)]
    steps = sorted({node.op for node in nodes if "deterministic" in node.attr
                    and node.attr["deterministic"].s == b"false"})
    if dataset.options().deterministic is False:
        steps.append("tf.data.Options().deterministic")
    if steps:
        return (f"deterministic=False in your pipeline ({', '.join(steps)}) lets it hand out "
                "elements in the order they finish, not the order they came: keep the order")
    return None


def verify_pipeline(dataset: Any, expected: list[tuple[np.ndarray, np.ndarray]], batch: int,
                    length: int, read: list[int], given: set[str],
                    lengthen: Any = None) -> str | None:
    """What is wrong with one epoch of the learner's ``dataset`` against the ``expected``
    batches, or None; ``read[0]`` counts the examples the dataset given has handed out, and
    ``given`` holds its ``py_function`` tokens. Where the pipeline's graph holds a whole number
    above ``length`` (``largest_number``: a ``padded_batch``'s bound or a ``tf.pad``'s target of
    its own), ``lengthen(number)`` makes the given dataset's long sequence (not read yet) longer
    than it and returns its new expected batches (None: it is longer already): padding to that
    bound, then cutting, fails on it; a cut first does not."""
    tf = _tf()
    if not isinstance(dataset, tf.data.Dataset):
        return f"expected a tf.data.Dataset, got {type(dataset).__name__}"
    specs = tf.nest.flatten(dataset.element_spec)
    shapes = [tuple(spec.shape.as_list()) if spec.shape.rank is not None else None
              for spec in specs]
    if any(shape is None or None in shape for shape in shapes):
        return (f"element_spec has unknown dimensions {shapes}: a TPU compiles one program "
                "for one shape (section 3). Which of your steps leaves a size unknown?")
    if shapes != [(batch, length), (batch,)]:
        return f"element shapes are {shapes}, expected [({batch}, {length}), ({batch},)]"
    python = python_problem(dataset, given) or order_problem(dataset)
    if python:
        return python
    bound, note = padded_bound(dataset, length), ""
    if bound is not None and bound >= _LONGEST and lengthen is not None:
        return (f"your padded_batch pads to {bound} tokens, a bound of your own: pad to "
                f"sequence_length ({length}) (section 3)")
    own = largest_number(dataset)
    if own > length and lengthen is not None:
        longer = lengthen(own)
        if longer is not None:
            expected = longer
            note = (f"; the long sequence made {own + 1} tokens, one more than "
                    + ("your padded_batch's bound" if own == bound else
                       "the largest number in your pipeline's graph"))
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        return (f"your pipeline never ends (it repeats): the check reads one epoch of "
                f"{len(expected)} batches; leave repeat() to the training (section 9)")

    @tf.function(jit_compile=True)
    def step(x: Any, y: Any) -> Any:
        return tf.reduce_sum(tf.cast(x, tf.float32)) + tf.cast(tf.reduce_sum(y), tf.float32)

    got = []
    try:  # one batch more than an epoch: a pipeline that never ends is still answered
        for x, y in dataset.take(len(expected) + 1):
            step(x, y)
            got.append((x.numpy(), y.numpy()))
    except (tf.errors.OpError, ValueError, TypeError, AssertionError) as error:
        said = str(error).strip().splitlines()[0].split("}}")[-1].strip()[:160]
        return (f"reading the pipeline failed at batch {len(got) + 1}: {type(error).__name__}: "
                f"{said} (some sequences are longer than sequence_length, one of them many "
                f"times longer{note}: which step of yours meets one?)")
    traces = step.experimental_get_tracing_count()
    if traces != 1:
        return f"a compiled step traced {traces} times over one epoch, expected once"
    if len(got) != len(expected):
        count = f"more than {len(expected)}" if len(got) > len(expected) else len(got)
        return f"the epoch has {count} batches, expected {len(expected)} (n // batch_size)"
    if read[0] < len(got) * batch:
        return (f"your {len(got)} batches hold {len(got) * batch} examples, but only {read[0]} "
                "were read from the dataset given: where do the others come from?")
    for number, ((x, y), (ex, ey)) in enumerate(zip(got, expected, strict=True), start=1):
        if not np.array_equal(y, ey):
            return f"batch {number}'s labels differ: keep the examples in order (no shuffle)"
        if not np.array_equal(x, ex):
            row = int(np.argmax(np.any(x != ex, axis=1)))
            if any(np.array_equal(x[row], other) for batch_x, _ in expected
                   for other in batch_x):
                return (f"batch {number}, row {row} holds another example than expected: "
                        "keep the examples in order (no shuffle)")
            return (f"batch {number}, row {row}: got {x[row].tolist()}, expected "
                    f"{ex[row].tolist()} (keep the first sequence_length tokens, pad with zeros "
                    "at the end)")
    return None
