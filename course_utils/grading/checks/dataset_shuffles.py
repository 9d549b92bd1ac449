"""The shuffles a worker's dataset holds, read from its graph where it is made, for lesson 04's
``check_make_dataset_fn``: :func:`shuffles_of` (each shuffle's buffer, the number of elements it
shuffles, whether it reshuffles each pass, the ways to the dataset's sources it lies on) and
:func:`unshuffled_share` (a way on which no shuffle shuffles a worker's share whole), and
:func:`share_message` (what the check says of it)."""

from __future__ import annotations

from typing import Any

from course_utils.grading.checks.dataset_functions import (
    SHUFFLES,
    calls_a_shuffle,
    function_ops,
    seeded_in_function,
)
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["share_message", "shuffles_of", "unshuffled_share"]


_UNBOUNDED = -2  # a buffer_size of tf.data.UNKNOWN_CARDINALITY: the shuffle holds its whole input
_UNKNOWN = -2  # a cardinality tf.data cannot tell ahead (after a ``filter``, say)
_PATHS = 62  # distinct sets of shuffles on the ways to the dataset's sources, one bit each


# the examples' own slices (``from_list``'s too), a ``range`` (ids of them), in stored order;
# an ``unbatch`` with no shuffle nor source below (the rows of tensors,
# ``from_tensors(...).unbatch()``) is one too
_SOURCES = frozenset(("TensorSliceDataset", "RangeDataset", "ListDataset"))
_UNBATCH = "UnbatchDataset"
_ZIPS = frozenset(("ZipDataset",))
# a function that reads datasets (a map making groups of a dataset it makes or captures)
_READS = ("Dataset", "DatasetV2", "DatasetV3", "DatasetToSingleElement")
_JOINS = frozenset(("ConcatenateDataset", "DirectedInterleaveDataset",
                    "ExperimentalDirectedInterleaveDataset"))  # pass elements on whole
# steps whose elements are groups of examples (batches, windows); an ``unbatch``, a source, a
# ``flat_map`` or an ``interleave`` (the datasets its function makes: examples again, unless it
# batches them or passes each element on whole, ``from_tensors``) stands between them and a shuffle
_BATCHES = frozenset(("BatchDataset", "BatchDatasetV2", "PaddedBatchDataset",
                      "PaddedBatchDatasetV2", "ParallelBatchDataset", "WindowDataset",
                      "MapAndBatchDataset", "ExperimentalMapAndBatchDataset",
                      "DenseToSparseBatchDataset", "ExperimentalDenseToSparseBatchDataset",
                      "SlidingWindowDataset", "ExperimentalSlidingWindowDataset",
                      "RebatchDataset", "RebatchDatasetV2"))
# steps whose elements may gather several of their input's (a ``scan``'s state, a reducer)
_GATHERS = ("ScanDataset", "ExperimentalScanDataset", "GroupByReducerDataset",
            "ExperimentalGroupByReducerDataset", "GroupByWindowDataset",
            "ExperimentalGroupByWindowDataset")
_FLATTENS = ("FlatMapDataset", "InterleaveDataset", "ParallelInterleaveDataset",
             "LegacyParallelInterleaveDataset", "GroupByWindowDataset",
             "ExperimentalGroupByWindowDataset")
# steps that store the elements of their input's first pass and read them again in the next ones
# (``cache()``, a snapshot): a shuffle below one reshuffles only until it is filled
_STORES = ("CacheDataset", "SnapshotDataset")
_GROUPS = -3  # the size of a shuffle of groups of examples (but one of them)
# marks on a way: it passed a zip; a step of several inputs read in turn; a step whose function
# draws random numbers
_ZIPPED, _IN_TURN, _MIXED = -1, -2, -3


def _shapes(op: Any) -> list[Any]:
    """The static shapes of ``op``'s elements (lists of sizes; ``None``: an unknown rank)."""
    try:
        shapes = op.get_attr("output_shapes")
    except (ValueError, AttributeError):
        return []
    return [None if shape.unknown_rank else [dim.size for dim in shape.dim] for shape in shapes]


def _groups_in(shapes: list[Any], ones: int, rank: int) -> bool:
    """Whether a component of ``shapes`` has a higher rank than an example's (``rank``) once the
    ``ones`` leading axes of batches of one are set aside, its added axes not all of one."""
    return any(dims is not None and len(dims) - ones > rank
               and any(size != 1 for size in dims[ones:len(dims) - rank]) for dims in shapes)


def _is_one(step: Any) -> bool:
    """Whether ``step`` is a ``batch(1)`` (a batch of one example)."""
    return step.type.startswith(("Batch", "ParallelBatch", "PaddedBatch")) and (
        step.inputs[1].op.type == "Const" and _tf().get_static_value(step.inputs[1]) == 1)


def _has_one(op: Any, seen: set[str] | None = None) -> bool:
    """Whether a batch of one (``batch(1)``) lies below ``op`` (down to an ``unbatch``, a
    source)."""
    seen = set() if seen is None else seen
    if op.name in seen or op.type == _UNBATCH or op.type in _SOURCES:
        return False
    seen.add(op.name)
    if op.type in _BATCHES and _is_one(op):
        return True
    return any(_has_one(tensor.op, seen) for tensor in op.inputs if tensor.dtype.name == "variant")


def _passes_on(step: Any) -> bool:
    """Whether ``step`` is no ``map`` (nor ``flat_map`` or ``interleave`` of ``from_tensors``),
    or one whose function returns its element's own components unchanged (reordered, some
    dropped: ``lambda f, l: (l, f)``); one that computes them may make them of several examples
    (gathered from captured tensors, constants, an iterator) with the shapes of a batch of
    one."""
    if not step.type.startswith(("MapDataset", "ParallelMapDataset") + _FLATTENS[:4]):
        # a step with a function of another kind may make its elements anew (a snapshot's
        # reader_func reads the batches of one it stored as groups); a filter's predicate only
        # keeps or drops them
        return not any(value.HasField("func") or value.list.func
                       for key, value in step.node_def.attr.items() if key != "predicate")
    try:
        function = step.graph._get_function(step.get_attr("f").name)
        definition = getattr(function, "cached_definition", None) or function.definition
        captured = len(step.get_attr("Targuments"))
    except (AttributeError, KeyError, ValueError):
        return False
    args = [arg.name for arg in definition.signature.input_arg]
    own = set(args[:len(args) - captured])
    nodes = {node.name: node for node in definition.node_def}

    def source(out: str) -> str:  # the node or argument an output comes from, through Identity
        name = out.split(":")[0]
        while name in nodes and nodes[name].op == "Identity":
            name = nodes[name].input[0].split(":")[0]
        return name

    outs = list(definition.ret.values())
    if step.type.startswith(_FLATTENS):  # the components of the from_tensors it returns
        made = [nodes.get(source(out)) for out in outs]
        if not all(node is not None and node.op == "TensorDataset" for node in made):
            return False
        outs = [name for node in made for name in node.input if not name.startswith("^")]
    return all(source(out) in own for out in outs)


def _of_groups(shuffle: Any, rank: int) -> tuple[bool, list[list[Any]]]:
    """Whether a batch or window lies below ``shuffle`` with no step between that makes examples
    of its groups again (see ``_BATCHES``), or a batch of one (``batch(1)``) of groups: the
    elements it shuffles are groups of examples; and the element shapes of the batches of one
    (each of one example) passed on the way, none where a way passes none (a ``concatenate``
    of groups and an empty ``batch(1)``)."""
    seen: set[tuple[str, bool]] = set()
    ones: list[list[Any]] = []
    bare = False  # a way down with no batch of one on it
    todo = [(shuffle.inputs[0].op, False)]
    while todo:
        step, one = todo.pop()
        if (step.name, one) in seen:
            continue
        seen.add((step.name, one))
        if not one and (step.type in _GATHERS or step.type in _ZIPS and sum(
                _has_one(tensor.op) for tensor in step.inputs
                if tensor.dtype.name == "variant") > 1 or step.type not in _ZIPS | _JOINS and any(
                _has_one(tensor.op) for tensor in step.inputs[1:]
                if tensor.dtype.name == "variant") or not step.type.startswith(_FLATTENS) and any(
                kind.endswith(_READS) for kind in function_ops(step)) or not _passes_on(step)):
            bare = True  # its elements may gather several batches of one below
        if step.type in _BATCHES:
            if not _is_one(step):
                return True, ones
            below, chain = step.inputs[0].op, 0
            while below.type in _BATCHES and _is_one(below):
                below, chain = below.inputs[0].op, chain + 1
            if _groups_in(_shapes(below), 0, rank):
                return True, ones  # a batch of one group is groups
            ones.append(_shapes(step))  # groups of one example: go on below it
            one = True
        if step.type == _UNBATCH or step.type in _SOURCES:
            bare = bare or not one
            continue
        if step.type.startswith(_FLATTENS):
            made = function_ops(step, "reduce_func" if "GroupBy" in step.type else "f")
            if made & _BATCHES:
                return True, ones
            if "TensorDataset" not in made or made & (_SOURCES | {_UNBATCH}):
                bare = bare or not one
                continue
        inputs = [tensor.op for tensor in step.inputs if tensor.dtype.name == "variant"]
        bare = bare or not (inputs or one)
        todo.extend((each, one) for each in inputs)
    return False, [] if bare else ones


def _holds_groups(shuffle: Any, rank: int) -> bool:
    """Whether the elements ``shuffle`` shuffles are groups of examples: a batch or window below
    (:func:`_of_groups`), or a component of a higher rank than an example's (``rank``) however
    it was made (batches unbatched from batches of them, a ``map`` or a reducer's groups) whose
    added dimensions are not all of one (``f[None]``; a ``batch(1)``'s axes, where the elements
    shuffled are that ``batch(1)``'s own, of its shapes)."""
    below, ones = _of_groups(shuffle, rank)
    if below:
        return True
    shapes = _shapes(shuffle)
    own = [dims for each in ones for dims in each]  # the batches of one's components
    return any(_groups_in([dims], len(ones) if dims in own else 0, rank) for dims in shapes)


def shuffles_of(dataset: Any) -> Any:
    """An ``[n, 4]`` tensor: for each shuffle (``ShuffleDataset``) of ``dataset``'s graph, made
    where the dataset is (the worker's ``dataset_fn``), its ``buffer_size`` (-2,
    ``tf.data.UNKNOWN_CARDINALITY``: unbounded, the whole input), the cardinality of the dataset
    it shuffles (-1 infinite, -2 unknown, -3 groups of examples, more than one or an unknown
    number: see :func:`_holds_groups`), whether it reshuffles each pass
    (1), and a bit mask of the ways from the dataset down to a source (a dataset made of no
    other: the slices, a ``range``) it lies on, ways with the same shuffles counted once. A
    branch of a ``zip`` or a ``concatenate`` is one such way. A ``from_tensor_slices``,
    ``from_list`` or ``range`` source, or an ``unbatch`` with neither a shuffle nor a source
    below it (rows of tensors), on a way with no shuffle at all stands as a shuffle with a
    buffer of 0 (stored order) of its elements, on that way alone (not below a step whose function
    makes a shuffle or draws random numbers, nor an ``unbatch`` above one: its elements are then not
    the examples read in stored order). Where there are more than 62 ways, every shuffle's mask is
    -1 (each is then judged alone) and the slices are not. A shuffle inside a function a dataset
    step calls (``flat_map``, ``interleave``) is not read: that step stands as a whole shuffle
    (``[-2, -2, 1, mask]``) on its ways; random draws (``tf.random.shuffle`` in a ``map``, or in
    a ``tf.cond`` branch or a ``tf.function`` it calls), a decoy as easily as a whole
    permutation, only exempt the slices below them. A shuffle below a ``cache()`` or a snapshot,
    or a step that stands as one, reads as one that never reshuffles: that step replays what its
    first passes read (its input's cardinality can read infinite where the input ends, a
    ``sample_from_datasets`` with ``stop_on_empty_dataset``, say), and of an endless input holds
    every element read; so does a step that stands as one whose function holds a ``cache()`` or
    snapshot too (32 passes cached inside a ``flat_map``'s, a ``map``'s or a
    ``group_by_window``'s ``reduce_func``: a right
    ``cache()`` then ``shuffle`` there is refused with them), and a shuffle below a step whose
    function holds one (a ``map`` of a dataset of datasets, ``lambda d: d.cache()``)."""
    tf = _tf()
    # an example's rank: that of the largest component of the dataset's batches, less one
    rank = max((spec.shape.rank for spec in tf.nest.flatten(dataset.element_spec)
                if getattr(spec, "shape", None) is not None and spec.shape.rank is not None),
               default=1) - 1
    shuffles: list[Any] = []  # the ops, in the order found (sources too)
    below: dict[str, frozenset[frozenset[int]]] = {}  # op name: the sets of shuffles per way

    def ways(op: Any) -> frozenset[frozenset[int]]:
        if op.name not in below:
            below[op.name] = frozenset()  # a cycle (none in a dataset graph) adds nothing
            inputs = [tensor.op for tensor in op.inputs if tensor.dtype == tf.variant]
            if inputs:
                found = frozenset().union(*(ways(each) for each in inputs))
                if len(inputs) > 1:  # a zip's branches are read side by side, others in turn
                    mark = _ZIPPED if op.type in _ZIPS else _IN_TURN
                    found = frozenset(way | {mark} for way in found)
                called = calls_a_shuffle(op)
                if called:  # the slices below are not the examples read
                    found = frozenset(frozenset(i for i in way if i < 0 or shuffles[i].type
                                                not in _SOURCES | {_UNBATCH}) for way in found)
                    if called & SHUFFLES:  # it stands as a whole shuffle on its ways
                        shuffles.append(op)
                    mark = len(shuffles) - 1 if called & SHUFFLES else _MIXED
                    found = frozenset(way | {mark} for way in found)
                elif op.type == _UNBATCH and all(i < 0 and i != _MIXED for way in found
                                                 for i in way):
                    shuffles.append(op)  # rows of tensors, in stored order
                    found = frozenset([frozenset([len(shuffles) - 1])])
            elif op.type in _SOURCES:
                shuffles.append(op)
                found = frozenset([frozenset([len(shuffles) - 1])])
            else:
                found = frozenset([frozenset()])
            if op.type in SHUFFLES:
                shuffles.append(op)
                found = frozenset(way | {len(shuffles) - 1} for way in found)
            below[op.name] = found
        return below[op.name]

    stores: dict[str, set[Any]] = {}  # shuffle name: the stores above it, on some way
    todo, seen = [(dataset._variant_tensor.op, frozenset())], set()
    while todo:
        op, above = todo.pop()
        if (op.name, above) in seen:
            continue
        seen.add((op.name, above))
        stores.setdefault(op.name, set()).update(above)
        if op.type.startswith(_STORES) or any(  # or a step whose function stores (a map's
                kind.startswith(_STORES) for kind in function_ops(op, None)):  # d.cache()
            above = above | {op}
        todo.extend((tensor.op, above) for tensor in op.inputs if tensor.dtype == tf.variant)

    # a way with no shuffle whose only branching steps are zips is read beside the others in
    # every pass (ids zipped to shuffled examples, say): stored order there shows in the passes
    found = sorted({frozenset(i for i in way if i >= 0) for way in ways(
        dataset._variant_tensor.op) if _IN_TURN in way or _ZIPPED not in way
        or any(i >= 0 and shuffles[i].type in SHUFFLES for i in way)}, key=sorted)
    many = len(found) > _PATHS
    rows = []
    for index, op in enumerate(shuffles):
        if op.type in _SOURCES or op.type == _UNBATCH:  # judged on a way with no shuffle at all
            mask = 0 if many else sum(1 << bit for bit, way in enumerate(found)
                                      if way == {index})
            rows.append(tf.stack([
                tf.constant(0, tf.int64),
                tf.raw_ops.DatasetCardinality(input_dataset=op.outputs[0]),
                tf.constant(1, tf.int64), tf.constant(mask, tf.int64)]))
            continue
        # below a store, later passes read the orders its first ones kept (its input's
        # cardinality can read infinite where the input ends, and a store of an endless input
        # holds every element read: no right answer stores a shuffle's orders)
        again = tf.constant(not stores.get(op.name))
        if op.type not in SHUFFLES:  # a step whose function makes a shuffle: read as whole
            mask = -1 if many else sum(1 << bit for bit, way in enumerate(found) if index in way)
            # a store in that function too (its cache() of passes) may replay them
            stored = any(kind.startswith(_STORES) for kind in function_ops(op, None)) or (
                seeded_in_function(op))  # or a seed that replays its orders at each call
            rows.append(tf.stack([tf.constant(_UNBOUNDED, tf.int64), tf.constant(-2, tf.int64),
                                  tf.cast(again & (not stored), tf.int64),
                                  tf.constant(mask, tf.int64)]))
            continue
        try:
            reshuffle = bool(op.get_attr("reshuffle_each_iteration"))
        except ValueError:  # V2: a seed generator's, reshuffled each pass
            reshuffle = True
        mask = -1 if many else sum(1 << bit for bit, way in enumerate(found) if index in way)
        size = tf.raw_ops.DatasetCardinality(input_dataset=op.inputs[0])
        if _holds_groups(op, rank):  # groups, whatever their number (but one)
            size = tf.where((size == -2) | (size > 1), tf.constant(_GROUPS, tf.int64), size)
        rows.append(tf.stack([
            tf.cast(op.inputs[1], tf.int64),
            size,
            tf.cast(again & reshuffle, tf.int64), tf.constant(mask, tf.int64)]))
    return tf.stack(rows) if rows else tf.zeros([0, 4], tf.int64)


def unshuffled_share(shuffles: set[tuple[int, int, int, int]],
                     share: int) -> tuple[int, int] | None:
    """``(buffer_size, elements)`` of the largest reshuffling buffer on a way to the dataset's
    sources (see :func:`shuffles_of`) where none on that way shuffles it whole: holds all the
    elements it shuffles (a known number, more than one) and they are ``share`` (a worker's
    examples) or more; None where every way has one that does. A buffer of 0 is a way that
    reads its slices in stored order; ``elements`` below ``share`` with a buffer that holds them
    all, a shuffle of groups of examples (batches, a part of the share), which stay together;
    ``(-1, elements)``, a way with a shuffle that never reshuffles (the same order every pass)
    and none that reshuffles more than one element (or an unknown or infinite number with a
    buffer of ``share`` or more). A reshuffling shuffle of an unknown number of elements (-2:
    after a ``filter``, say) shuffles them whole where its buffer holds ``share`` examples or is
    unbounded; ``(buffer_size, -2)`` where it does not. One of groups of examples (-3: batches,
    windows), whatever their number, never does: ``(buffer_size, -3)``.
    With more than 62 ways (mask -1), each such shuffle must shuffle its input whole."""

    def whole(buffer: int, size: int) -> bool:
        if size == _GROUPS:
            return False
        if size == _UNKNOWN:
            return buffer == _UNBOUNDED or buffer >= share
        return (buffer >= size or buffer == _UNBOUNDED) and size >= share

    def judged(buffer: int, size: int, reshuffle: int) -> bool:  # stored order (0): known sizes
        return bool(reshuffle) and (size > 1 or size in (_UNKNOWN, _GROUPS) and buffer != 0)

    def least(pairs: list[tuple[int, int]]) -> tuple[int, int]:  # the largest buffer, for its size
        return max(pairs, key=lambda pair: pair[0] / (
            share if pair[1] in (_UNKNOWN, _GROUPS) else pair[1]))

    alone = [(buffer, size) for buffer, size, reshuffle, mask in shuffles
             if mask == -1 and judged(buffer, size, reshuffle) and not whole(buffer, size)]
    if alone:
        return least(alone)
    bits = {bit for *_, mask in shuffles if mask > 0
            for bit in range(mask.bit_length()) if mask >> bit & 1}
    for bit in sorted(bits):
        on = [row for row in shuffles if row[3] > 0 and row[3] >> bit & 1 and row[0] != 0]
        fixed = [(buffer, size) for buffer, size, reshuffle, _ in on
                 if size > 1 or (buffer, size) == (_UNBOUNDED, _UNKNOWN)]  # a step read as whole
        if fixed and not any(reshuffle and (size > 1 or size < 0 and (
                buffer == _UNBOUNDED or buffer >= share)) for buffer, size, reshuffle, _ in on):
            return (-1, max(size for _, size in fixed))
        way = [(buffer, size) for buffer, size, reshuffle, mask in shuffles
               if mask > 0 and mask >> bit & 1 and judged(buffer, size, reshuffle)]
        if way and not any(whole(buffer, size) for buffer, size in way):
            return least(way)
    return None


def share_message(worker: int, shuffles: set[tuple[int, int, int, int]], share: int) -> str | None:
    """What is wrong with how worker ``worker``'s dataset shuffles its ``share`` examples (the
    rows of :func:`shuffles_of`, judged by :func:`unshuffled_share`), or None."""
    short = unshuffled_share(shuffles, share)
    if not short:
        return None
    buffer, size = short
    if buffer == -1:
        its = f"its {size} elements" if size > 0 else "its elements"
        return (f"worker {worker}'s dataset has a branch whose shuffles of {its} never "
                "reshuffle or are stored (reshuffle_each_iteration=False, a cache() or "
                "snapshot above them, or a seed fixed inside a function, made anew with it at "
                "each call): that branch reads them in the same order in every pass, "
                "or replays its first passes' orders, or, a store of an endless stream, keeps "
                "every element it reads (memory without bound). What does your shuffle do at a "
                "new pass, and what does a store above it keep? (lesson 01, section 7)")
    if buffer == 0:
        return (f"worker {worker}'s dataset has a branch that reads the examples in stored order "
                f"(its source's {size} elements reach it through no shuffle): whatever the "
                "passes read first, that branch's are never shuffled. Which step of yours reads "
                "the data unshuffled? (lesson 01, section 7)")
    if size == _GROUPS:
        return (f"worker {worker}'s dataset shuffles batches (or other groups of examples), "
                "as its graph reads: a batch or window below the shuffle, or elements with a "
                "component of a higher rank than an example's (its batches' largest, less "
                "one); the examples in each element stay together. A pass shuffled over the "
                "whole share shuffles the examples themselves, all of them (lesson 01, "
                "section 7)")
    if size < 0:  # an unknown number: its buffer is below the share
        return (f"worker {worker}'s dataset shuffles a number of elements tf.data cannot tell "
                f"ahead (after a filter, say) with a buffer of {buffer}, fewer than its {share} "
                f"examples: an element {buffer} or more places into its input can never come "
                "first. A pass shuffled over the whole share needs a buffer that holds it all "
                "(lesson 01, section 7)")
    if buffer >= size or buffer == _UNBOUNDED:
        return (f"worker {worker}'s dataset shuffles {size} elements, fewer than its {share} "
                "examples: its elements are groups of examples, which stay together (a shuffle "
                "of a part of the share). A pass shuffled over the whole share shuffles the "
                "examples themselves, all of them (lesson 01, section 7)")
    return (f"worker {worker}'s dataset shuffles {size} elements with a buffer of {buffer} "
            "(buffer_size of its ShuffleDataset): the shuffle buffer is too small to shuffle "
            f"them all, the last {size - buffer} of them can never come first. A pass shuffled "
            "over the whole share needs a buffer that holds it all (lesson 01, section 7)")
