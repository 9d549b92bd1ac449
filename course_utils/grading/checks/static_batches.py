"""Lesson 05, exercise 1 (buckets): what a learner's pipeline runs besides tf.data steps, read
from its graph: the Python it runs instead of the dataset given (``py_function`` tokens,
``batch_shapes``) or hands on from an iterator, a queue or a variable made outside it (any handle
its functions capture, a lookup table's too, and the files they read: the exercise needs none);
steps that may hand out elements out of order; and the whole numbers its graph holds or computes
from its constants alone (a ``padded_batch``'s ``padded_shapes``, a ``tf.pad``'s target, through
``tf.identity``, a power, a ``reduce_max`` or ``tf.strings.to_number``): ``bucket_batches``
makes a sequence one token longer than the largest, so that a bound of the pipeline's own
(padding to it, then cutting) meets it.

Still passes: a bound the fold cannot see (one worked out in a called ``tf.function``, a
``tf.while_loop`` or a ``tf.cond``, through a tensor of unknown shape or of more than ``2**16``
numbers, or carried as data) of ``2**20`` tokens or more, or one of ``2**24`` or more."""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import (
    _OWN_STATE_OPS,
    _graph,
    graph_ops,
    handed_on,
    py_function_tokens,
)
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["graph_numbers", "order_problem", "python_behind", "python_problem"]


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


def python_behind(dataset: Any) -> list[Any]:
    """The Python objects behind ``dataset``'s ``py_function`` ops, to compare by identity
    before and after a learner's function ran: each registered function and its code, what
    its closure holds (a generator's state: its generator, that one's code and closure, the
    state's class's functions) down to a few levels. A function that swaps any of them (a
    generator of its own behind the given dataset's ops) changes the list."""
    from tensorflow.python.ops import script_ops

    found: list[Any] = []

    def walk(value: Any, depth: int) -> None:
        found.extend((value, getattr(value, "__code__", None)))
        generator = getattr(value, "_generator", None)
        if generator is not None:  # from_generator's state: its class's functions too
            found.extend(vars(type(value)).values())
            walk(generator, depth + 1)
        for cell in getattr(value, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            found.append(inner)
            if depth < 4 and (callable(inner) or hasattr(inner, "_generator")):
                walk(inner, depth + 1)

    for token in sorted(py_function_tokens(dataset)):
        walk(script_ops._py_funcs.get(token), 0)
    return found


def _flat_scope(function: Any) -> tuple[list[Any], dict[str, str]]:
    """A function's body as GraphDef nodes (its arguments left out: inputs named by them are
    no node's) and the map from its tensor names ("node:output:0") to a graph's ("node:0")."""
    from tensorflow.python.framework import op_def_registry

    flat = {argument.name: argument.name for argument in function.signature.input_arg}
    for node in function.node_def:
        op = op_def_registry.get(node.op)
        index = 0
        for output in (op.output_arg if op is not None else ()):
            count = (node.attr[output.number_attr].i if output.number_attr else
                     len(node.attr[output.type_list_attr].list.type)
                     if output.type_list_attr else 1)
            for k in range(count):
                flat[f"{node.name}:{output.name}:{k}"] = f"{node.name}:{index + k}"
            index += count
    nodes = []
    for node in function.node_def:
        copy = type(node)()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(name if name.startswith("^") else flat.get(name, name)
                          for name in node.input)
        nodes.append(copy)
    return nodes, flat


def _folded(nodes: list[Any]) -> dict[str, np.ndarray]:
    """The values of the numeric tensors (at most 1024 numbers each) among ``nodes`` that
    depend on no input, no step, no called function and no stateful op but one that keeps no
    state but its own (a random number, a timestamp: drawn once here), only on small tensors
    (at most 2**16 numbers): what the graph computes from its constants ("node:0": value)."""
    from tensorflow.python.framework import op_def_registry

    tf = _tf()
    by_name = {node.name: node for node in nodes}
    known: dict[str, bool] = {}

    def foldable(name: str) -> bool:
        if name not in known:
            known[name] = False  # a cycle folds nothing
            node, op = by_name.get(name), None
            if node is not None:
                op = op_def_registry.get(node.op)
            known[name] = (op is not None and (not op.is_stateful or node.op in _OWN_STATE_OPS)
                           and node.op not in ("Placeholder", "PlaceholderWithDefault")
                           and not any(kind in node.op for kind in ("Dataset", "Iterator"))
                           and not any(attr.type in ("func", "list(func)") for attr in op.attr)
                           and all(foldable(source.lstrip("^").split(":")[0])
                                   for source in node.input))
        return known[name]

    values = {f"{node.name}:0": tf.make_ndarray(node.attr["value"].tensor) for node in nodes
              if node.op == "Const" and node.attr["dtype"].type in _NUMERIC}
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.extend(node for node in nodes if foldable(node.name))
    for node in graph_def.node:
        node.attr.pop("_class", None)  # colocation with a node left out would refuse it
    if all(node.op == "Const" for node in graph_def.node):
        return values
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(graph_def, name="")
        except (ValueError, TypeError, tf.errors.OpError):
            return values
    small, fetches = set(), []
    for operation in graph.get_operations():
        if (all(source.op.name in small for source in operation.inputs)
                and all(source.name in small for source in operation.control_inputs)
                and all(output.shape.is_fully_defined() and output.shape.num_elements() <= 2**16
                        for output in operation.outputs)):
            small.add(operation.name)
            fetches += [output for output in operation.outputs if operation.type != "Const"
                        and output.dtype.as_datatype_enum in _NUMERIC
                        and output.shape.num_elements() <= 1024]
    with tf.compat.v1.Session(graph=graph) as session:
        try:
            values.update(zip([output.name for output in fetches], session.run(fetches),
                              strict=True))
        except (tf.errors.OpError, ValueError, TypeError):  # one at a time: which fails?
            for output in fetches:
                try:
                    values[output.name] = session.run(output)
                except (tf.errors.OpError, ValueError, TypeError):
                    continue  # an op that fails on its constants pads nothing
    return values


#: The numeric types whose whole values are read as bounds.
_NUMERIC: set[int] = set()


def _numeric() -> set[int]:
    tf = _tf()
    if not _NUMERIC:
        _NUMERIC.update(dtype.as_datatype_enum for dtype in (
            tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64,
            tf.float16, tf.bfloat16, tf.float32, tf.float64))
    return _NUMERIC


def graph_numbers(dataset: Any) -> tuple[set[int], set[int]]:
    """The whole numbers the pipeline's graph knows before it reads an element: those its
    constants hold or its ops compute from them alone (``tf.identity``, ``tf.cast``, a power,
    a ``reduce_max`` over a list, ``tf.strings.to_number`` of a string; not through a called
    function, a loop, a conditional or a tensor of unknown shape (a ``tf.strings.bytes_split``'s)
    or of more than ``2**16`` numbers), in its steps and in each of their functions; and among
    them the sizes a ``padded_batch``'s ``padded_shapes``
    pad to."""
    _numeric()
    graph = _graph(dataset)
    scopes = [(list(graph.node), {}),
              *(_flat_scope(function) for function in graph.library.function)]
    numbers, bounds = set(), set()
    for nodes, flat in scopes:
        values = _folded(nodes)
        for value in values.values():
            numbers |= {int(number) for number in map(float, np.ravel(value))
                        if number.is_integer()}
        for node in nodes:
            if node.op.startswith("PaddedBatchDataset"):
                for name in node.input[2:2 + node.attr["N"].i]:  # its padded_shapes
                    name = flat.get(name, name)
                    value = values.get(name if ":" in name else f"{name}:0")
                    if value is not None:
                        bounds |= {int(size) for size in np.ravel(value)}
    return numbers, bounds


def order_problem(dataset: Any) -> str | None:
    """Which steps of the pipeline may hand out elements out of order (``deterministic=False``,
    in a step or in the options), or None: a cheap map mostly keeps the order anyway, so the
    batches alone would not tell."""
    graph = _graph(dataset)
    nodes = [*graph.node, *(node for function in graph.library.function
                            for node in function.node_def)]
    steps = sorted({node.op for node in nodes if "deterministic" in node.attr
                    and node.attr["deterministic"].s == b"false"})
    # the option only decides for the steps that leave it to the option ("default"): an
    # explicit deterministic=True wins over it, and a pipeline without such steps keeps order
    left = sorted({node.op for node in nodes if "deterministic" in node.attr
                   and node.attr["deterministic"].s == b"default"})
    if dataset.options().deterministic is False and left:
        steps.append(f"tf.data.Options().deterministic for {', '.join(left)}")
    if steps:
        return (f"deterministic=False in your pipeline ({', '.join(steps)}) lets it hand out "
                "elements in the order they finish, not the order they came: keep the order")
    return None
