"""Batches of one epoch, what is wrong with their sizes or elements, an epoch timed, and the
steps of a pipeline's graph (lesson 01's checks): its kinds of steps, and which of the check's
own ``tf.py_function`` ops (known by their tokens) the pipeline runs, and which of them feed a
given step such as a cache (lessons 00 and 01: the work was done by the dataset returned, where
the exercise says), and the pipeline rebuilt with its own caches in files (a constant filename)
caching in memory, so that they start empty and only its own steps fill them."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["batches", "dataset_steps", "epoch_seconds",
           "expected_sizes", "fresh_caches", "graph_ops", "handed_on", "multiset_problem",
           "py_function_token", "py_function_tokens", "size_problem"]


def batches(dataset: Any) -> list[np.ndarray]:
    """One epoch of ``dataset`` as NumPy arrays, one per batch."""
    return [np.asarray(batch) for batch in dataset.as_numpy_iterator()]


def epoch_seconds(dataset: Any, kept: list[Any] | None = None) -> float:
    """Seconds one epoch of ``dataset`` takes to iterate; its batches (as they come: tensors)
    are appended to ``kept`` where given."""
    start = time.perf_counter()
    for batch in dataset:
        if kept is not None:
            kept.append(batch)
    return time.perf_counter() - start


def _graph(dataset: Any) -> Any:
    """``dataset``'s serialized graph (a GraphDef); stateful steps (a py_function, a random
    generator) are serialized, not refused (external state policy 1: ignore)."""
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    graph = tf.compat.v1.GraphDef()
    try:
        serialized = tf.raw_ops.DatasetToGraphV2(
            input_dataset=tf.data.experimental.to_variant(dataset), external_state_policy=1)
    except tf.errors.OpError as error:  # e.g. prefetch_to_device's step cannot be serialized
        raise AssertionError(
            f"the check could not read your pipeline's graph: {type(error).__name__}: "
            f"{str(error).strip().splitlines()[0][:160]}. A step that cannot be serialized "
            "(prefetch_to_device, for one) hides the pipeline from the check: end it with "
            "prefetch() instead") from error
    graph.ParseFromString(serialized.numpy())
    return graph


def dataset_steps(dataset: Any) -> list[str]:
    """The kinds of tf.data steps in ``dataset``'s serialized graph ("CacheDatasetV2", ...),
    sorted."""
    return sorted({node.op for node in _graph(dataset).node if "Dataset" in node.op})


def graph_ops(dataset: Any) -> set[str]:
    """The kinds of op in ``dataset``'s serialized graph and in every function of its library
    ("ParallelMapDatasetV2", "EagerPyFunc", "IteratorGetNext", ...)."""
    graph = _graph(dataset)
    return ({node.op for node in graph.node}
            | {node.op for function in graph.library.function for node in function.node_def})


def fresh_caches(dataset: Any) -> Any:
    """``dataset`` rebuilt from its graph with every cache of the pipeline itself that writes a
    file (its filename a constant) caching in memory instead, or ``dataset`` itself where it
    caches to no such file or cannot be rebuilt. Such a cache then starts empty in the rebuilt
    dataset and is filled by the steps upstream of it in this pipeline: there is no file that
    another pipeline or a thread could have written, or could write while it runs. A cache in
    a step's function (a ``flat_map``'s inner dataset) is left as it is: one constant filename
    is then shared by every inner dataset (TensorFlow reads the first one's elements back for
    the others), and ``handed_on`` counts it as a file read."""
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    graph = _graph(dataset)
    names = {node.name: node for node in graph.node}
    rewritten = 0
    for node in list(graph.node):
        if not node.op.startswith("CacheDataset") or len(node.input) < 2:
            continue
        source = names.get(node.input[1].split(":")[0])
        if (source is None or source.op != "Const"
                or list(source.attr["value"].tensor.string_val) == [b""]):
            continue  # in memory already, or a filename computed: read as a file (handed_on)
        memory = graph.node.add()
        memory.CopyFrom(source)  # a Const of its own: the filename may feed other nodes
        memory.attr["value"].tensor.string_val[:] = [b""]
        memory.name = f"{source.name}_in_memory_{rewritten}"
        node.input[1] = memory.name
        rewritten += 1
    if not rewritten:
        return dataset
    try:
        variant = tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
        rebuilt = tf.data.experimental.from_variant(variant, dataset.element_spec)
    except (tf.errors.OpError, ValueError, TypeError):
        return dataset  # its file caches then count as files read (handed_on)
    rebuilt._check_source = dataset  # its py_functions stay registered while it is iterated
    return rebuilt


def handed_on(dataset: Any, allowed: set[str]) -> tuple[int, int]:
    """The Python functions ``dataset``'s graph runs besides the py_function tokens ``allowed``
    (a generator, a py_function of the answer's own), and the state made outside the pipeline
    that it reaches: the handles its steps' functions capture (an iterator, a queue, a
    variable: a resource argument), their stateful ops that take no handle (they find state by
    name: a staging area's ``Unstage``, found by its ``shared_name`` or, where that is empty,
    by its node's name; or they act outside: ``WriteFile``), and its steps and ops that read
    files or a service (``ReadFile``, ``TextLineDataset``, ...) or run a pipeline serialized in
    a string (``DatasetFromGraph``: its steps, a generator's too, out of sight). Where work done
    by another pipeline or thread is handed on (a read op that never runs, ``take(0)``, can sit
    beside them). Not counted: ops that keep no state but their own and read none
    (``_OWN_STATE_OPS``: random ops, ``tf.debugging`` asserts, a timestamp), ``tf.print`` to the
    log, a shuffle's seed, a cache in memory (a cache in a file is read as a file, as are the
    descriptors ``tf.io.decode_proto`` loads from a file: their fields' defaults are values;
    ``fresh_caches`` turns the pipeline's own caches with a constant filename into caches in
    memory first)."""
    from tensorflow.python.framework import op_def_registry

    from course_utils.quiet import import_tensorflow

    resource = import_tensorflow().resource.as_datatype_enum
    graph = _graph(dataset)
    library = {function.signature.name: function for function in graph.library.function}
    captured = sum(argument.type == resource
                   for node in graph.node for name in _functions_called(node)
                   if name in library for argument in library[name].signature.input_arg)

    def cached_to_file(node: Any, scope: Any) -> bool:  # its filename not the empty Const
        if not node.op.startswith("CacheDataset"):
            return False
        names = {other.name: other for other in scope}
        source = names.get(node.input[1].split(":")[0]) if len(node.input) > 1 else None
        if source is None or source.op != "Const":
            return True
        return list(source.attr["value"].tensor.string_val) != [b""]

    def reaches(node: Any, scope: Any) -> bool:  # outside state without a captured handle
        if node.op.startswith(_OUTSIDE_OPS) or cached_to_file(node, scope) or any(
                key in node.attr and node.attr[key].s for key in ("shared_name", "container")):
            return True
        if "descriptor_source" in node.attr:  # a proto's descriptors (and defaults) from a file
            return not node.attr["descriptor_source"].s.startswith((b"local://", b"bytes://"))
        op = op_def_registry.get(node.op)
        if (op is None or not op.is_stateful or node.op in _PYTHON_OPS + _OWN_STATE_OPS
                or any(kind in node.op for kind in ("Dataset", "SeedGenerator", "MemoryCache"))
                or _functions_called(node)):  # a call's, a loop's body: read as a function
            return False
        if node.op == "PrintV2":
            return node.attr["output_stream"].s.startswith(b"file://")
        return not any(argument.type == resource for argument in op.input_arg)

    outside = (sum(node.op.startswith(_OUTSIDE_OPS) or cached_to_file(node, graph.node)
                   for node in graph.node)
               + sum(reaches(node, function.node_def) for function in graph.library.function
                     for node in function.node_def))
    return len(py_function_tokens(dataset) - allowed), captured + outside


#: Ops and steps that read files, a store or a service: another thread's or process's work
#: handed on through them (``handed_on``).
_OUTSIDE_OPS = ("ReadFile", "MatchingFiles", "TextLineDataset", "TFRecordDataset",
                "FixedLengthRecordDataset", "CSVDataset", "ExperimentalCSVDataset", "SqlDataset",
                "ExperimentalSqlDataset", "LMDBDataset", "ExperimentalLMDBDataset",
                "DataServiceDataset", "LoadDataset", "SnapshotDataset", "ImmutableConst",
                "IteratorFromStringHandle", "ExperimentalMatchingFilesDataset",
                "SnapshotChunkDataset", "ListSnapshotChunksDataset", "GenerateVocabRemapping",
                "InitializeTableFromTextFile", "LoadAndRemapMatrix",
                "DatasetFromGraph")  # a pipeline serialized in a string: its graph out of sight

#: Stateful ops that keep no state but their own and read none (``handed_on`` does not count
#: them): random ops (a map's augmentation), ``tf.debugging``'s asserts and checks, a timestamp.
_OWN_STATE_OPS = ("Assert", "CheckNumerics", "CheckNumericsV2", "Timestamp", "GuaranteeConst",
                  "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
                  "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson",
                  "RandomPoissonV2", "RandomShuffle", "RandomCrop", "Multinomial",
                  "NonDeterministicInts", "StatelessRandomGetAlg", "SampleDistortedBoundingBox",
                  "SampleDistortedBoundingBoxV2")


def py_function_token(tensor: Any) -> str | None:
    """The token of the ``tf.py_function`` op that made ``tensor`` while a function or a
    pipeline was traced (None for an eager call: no op in any graph)."""
    op = getattr(tensor, "op", None)
    try:
        return op.get_attr("token").decode() if op is not None else None
    except (AttributeError, ValueError):
        return None


def _functions_called(node: Any) -> list[str]:
    """The library functions a node's attributes name (a map's ``f``, a filter's ...)."""
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [func.name for func in value.list.func]
    return names


#: The ops that call Python: py_function, numpy_function and py_func (stateful or not).
_PYTHON_OPS = ("EagerPyFunc", "PyFunc", "PyFuncStateless")


def py_function_tokens(dataset: Any, feeding: str | None = None,
                       short_of: str | None = None) -> set[str]:
    """The tokens of the py_function ops ``dataset``'s graph runs, its functions' too; with
    ``feeding`` (a kind of step, e.g. ``"CacheDataset"``), only those of the steps upstream of
    a step of that kind in the pipeline itself: the work whose results that step receives;
    with ``short_of``, only those of the steps the pipeline's output reaches, upstream, by a
    path with no step of that kind on it: work whose results no such step keeps."""
    graph = _graph(dataset)
    library = {function.signature.name: function for function in graph.library.function}
    found: dict[str, set[str]] = {}

    def in_node(node: Any) -> set[str]:
        tokens = {node.attr["token"].s.decode()} if node.op in _PYTHON_OPS else set()
        for name in _functions_called(node):
            tokens |= in_function(name)
        return tokens

    def in_function(name: str) -> set[str]:
        if name not in found:
            found[name] = set()  # a function that calls itself: no cycle
            function = library.get(name)
            for node in function.node_def if function is not None else ():
                found[name] |= in_node(node)
        return found[name]

    nodes = {node.name: node for node in graph.node}
    if feeding is None and short_of is None:
        starts = list(nodes.values())
    else:
        inputs = {name.lstrip("^").split(":")[0] for node in graph.node for name in node.input}
        starts, seen = [], set()
        todo = ([node for node in graph.node if node.op.startswith(feeding)] if feeding else
                [node for node in graph.node if node.name not in inputs])  # the output's
        starts += [] if feeding else todo
        while todo:  # every step upstream of one of the kind asked for, or short of one
            for name in todo.pop().input:
                name = name.lstrip("^").split(":")[0]
                if (name in nodes and name not in seen
                        and not (short_of and nodes[name].op.startswith(short_of))):
                    seen.add(name)
                    starts.append(nodes[name])
                    todo.append(nodes[name])
    tokens: set[str] = set()
    for node in starts:
        tokens |= in_node(node)
    return tokens


def expected_sizes(num_elements: int, batch_size: int) -> list[int]:
    """The sizes of ``num_elements`` batched by ``batch_size`` (a short last batch kept)."""
    sizes = [batch_size] * (num_elements // batch_size)
    return sizes + ([num_elements % batch_size] if num_elements % batch_size else [])


def size_problem(batches: list[np.ndarray], num_elements: int, batch_size: int) -> str | None:
    """What is wrong with the batches' shapes or sizes, or None."""
    if any(batch.ndim != 1 for batch in batches):
        shapes = sorted({batch.shape for batch in batches})
        return (f"expected batches of scalars (shape [batch]), got shapes {shapes[:3]}: "
                "batch the elements once, with .batch(batch_size)")
    sizes = [len(batch) for batch in batches]
    expected = expected_sizes(num_elements, batch_size)
    if sorted(sizes) != sorted(expected):
        return (f"batch sizes differ: expected {len(expected)} batches of {batch_size}"
                f"{f' and one of {num_elements % batch_size}' if num_elements % batch_size else ''}"
                f", got sizes {sizes[:12]}{' ...' if len(sizes) > 12 else ''}")
    return None


def multiset_problem(got: np.ndarray, expected: np.ndarray) -> str | None:
    """How ``got``'s elements differ from ``expected``'s as a multiset, or None."""
    if len(got) != len(expected):
        return f"expected {len(expected)} elements in one epoch, got {len(got)}"
    got_sorted, want_sorted = np.sort(got), np.sort(expected)
    if not np.allclose(got_sorted, want_sorted):
        missing = sorted(set(want_sorted.tolist()) - set(got_sorted.tolist()))[:5]
        extra = sorted(set(got_sorted.tolist()) - set(want_sorted.tolist()))[:5]
        return (f"the elements differ from the slow pipeline's (as a multiset): missing e.g. "
                f"{missing}, unexpected e.g. {extra}")
    return None
