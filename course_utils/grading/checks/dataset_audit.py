"""Lesson 03's audit of the tf.data datasets a learner's pipeline makes: one function, used by
the in-process check of ``make_dataset_fn`` and bound by every exercise worker's set-up before
the learner's code runs (:mod:`course_utils.grading.checks.worker_scripts`).

Every dataset made while the audit is in place (in process: ``make_dataset_fn``'s body and
each ``dataset_fn`` call) reports the batch or window size of a batching op (-1: not known
when it was made; made by any ``tf.data.Dataset`` method or class: ``batch``, ``padded_batch``,
``map_and_batch``, ``window``, ``group_by_window``, ``rebatch``, a private function; not by
``tf.raw_ops``, which makes no Dataset: the in-process check also reads the batching ops of the
returned dataset's serialized graph, :mod:`course_utils.grading.checks.resume_inputs`) times
the examples each element it takes holds (a batch of per-replica batches is a global batch),
and the examples its own element holds; or the examples an element already holds when they
are more than the per-replica batch (``share``: whole global batches made in NumPy). The parts
of an element whose rows have the row shape of one of the data's arrays count together,
whatever their dtypes (a global batch as one ``[per-replica batch, features]`` part per
replica is a global batch), and so do all its parts of row shapes none of the data's arrays
has, each by its dimensions before its last (``[per-replica batch, 1]`` columns, a row with
its label); a part of one dimension counts for nothing, except several that hold rows of the
data (every whole chunk of a row's length, else one run of a row's length: a row among an
index and a label), stacked as one part (a global batch as one part per example, read as it
runs). The data's values (of its arrays of rows of one dimension; the real part of complex
numbers) in parts of one dimension or none and of row shapes none of the data has count too,
as that many rows: an element whose such parts hold more values than the per-replica batch of
rows (or a number not known) is read as it runs (rows packed, padded, interleaved with labels,
split in halves, reversed, as complex numbers, a value to a part). One element of
``from_tensors`` (or several zipped) is all the data, no batch, when each of its parts is a
stack of rows of the arrays the check handed over (same rank and row shape, every row one of
theirs, in any order: ``from_tensors(x[start:])`` or the rows gathered in the resumed order) or
has one dimension at most (an index array, the labels); any other, e.g. ``[steps, global batch,
features]`` stacks, holds batches. What is made of that element (``map`` casting it or
gathering a pipeline's rows in TensorFlow, ``repeat``; not ``unbatch``), and every dataset
whose elements hold a number of examples not known when it is made (``from_generator`` with an
``output_signature`` of ``[None, features]``, a ``map`` slicing rows with bounds computed at
run time, ``scan``, unknown ranks), is probed at run time: its elements pass through an
identity ``map`` calling back into the audit, and an element holding more than the per-replica
batch (its parts counted as above) whose set of rows differs from the first such element's
(rows and how often each comes), and is not every row of the data, each as often, is a batch of
that many (all the data, or a pipeline's fixed part of it, is the same set every time;
``x[start:]`` then ``x``, concatenated, is the first set, then every row; chunks larger than
the per-replica batch count as batches, as their known-size stacks do). A ``from_tensors``
element of some of the data's rows is a stack of them: its parts of two dimensions or more of
one row shape together, and the data's values its parts of one dimension or none hold,
counted as rows (raveled, a value to a part); several zipped are one stack, and a stack taken,
mapped or cached stays one; once such stacks hold more rows than the data, each larger than
the per-replica batch counts as a batch (one dataset a global batch). Refused though right: a
per-replica batch carried with a second part of the features' row shape (``(f, f + 1.0,
labels)``, the copy dropped later), counted as twice the per-replica batch: a copy cannot be
told from the next replica's rows stored another way; likewise two parts of row shapes none of
the data has (labels and weights as ``[per-replica batch, 1]`` columns, the features split
into a column and two); pipelines for every layout built in ``make_dataset_fn``'s body
before a context says which (their other layouts' batches count);
``bucket_by_sequence_length`` (its window's size comes from a function: not known); the data
as ``from_tensors`` stacks of some of its rows holding more rows than it (a pipeline's own rows
for many steps in two stacks; ``x[s:]``, ``x[:s]``, ``x[s:]``...), or two, ``x[s:]`` then
``x[:s]``, concatenated before they are unbatched (the second another set of rows: unbatch
each, or use ``from_tensor_slices`` or ``np.roll``). Still passes: a global batch made in
NumPy in a generator's Python and cut there (a ``tf.data`` audit sees no Python); a global
batch made as a tensor inside a traced function (``flat_map``'s, gathering or reshaping the
data's rows) and cut there: no element or batching op holds it; each element all the data,
rolled so that the next global batch comes first, or after the global batch; the data's rows
stored in values not the data's (negated, scaled, serialized into strings: any lossless
encoding); ragged or sparse elements (not probed); an element of labels alone, of any shape (a
global batch of ids).
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["COUNTED", "dataset_auditor"]

#: What the sizes the audit reports count, for the checks' messages.
COUNTED = ("the sizes of its batching ops, -1 when not known as they were made, and the "
           "examples an element held, its parts of one row shape counted together")


def dataset_auditor(tf: Any, np: Any, share: int, arrays: Any,
                    original: Any) -> tuple[Any, list[int]]:
    """``(init, sizes)``: a replacement for ``tf.data.Dataset.__init__`` that calls
    ``original`` and appends to ``sizes`` what each dataset made batches (see the module
    docstring), and ``sizes``. ``arrays``: the data handed to the learner (features, labels).
    Every function and module it uses is bound here, when it is made: a learner's code that
    replaces one later (``tf.nest.flatten``, this module's globals) does not change it."""
    flatten, static_value, tensor_spec = tf.nest.flatten, tf.get_static_value, tf.TensorSpec
    pack = tf.nest.pack_sequence_as
    py_function, dependencies, identity, int32 = (tf.py_function, tf.control_dependencies,
                                                  tf.identity, tf.int32)
    asarray, unique, prod, float64 = np.asarray, np.unique, np.prod, np.float64
    concatenate, isin, sort = np.concatenate, np.isin, np.sort
    weak_keys, weak_set = weakref.WeakKeyDictionary, weakref.WeakSet
    rows_of = []                      # (rank, row shape, the rows as bytes) of each array
    for array in arrays:
        array = asarray(array).astype(float64)
        flat = array.reshape(len(array), -1)
        rows_of.append((array.ndim, array.shape[1:], {row.tobytes() for row in flat}))
    row_shapes = {tuple(shape) for _, shape, _ in rows_of if len(shape) == 1}
    value_sets = [(shape[0], unique(asarray(array).astype(float64)))   # its values
                  for array, (_, shape, _) in zip(arrays, rows_of, strict=True)
                  if len(shape) == 1]

    def single_rows(shapes: list[Any]) -> list[int]:
        """Indices of the parts of one dimension at least as long as a row of the data, when an
        element has several (a global batch as one part per example, or columns as long)."""
        found = [i for i, shape in enumerate(shapes)
                 if shape is not None and len(shape) == 1 and shape[0] is not None
                 and any(shape[0] >= width for width, in row_shapes)]
        return found if len(found) > 1 else []

    def as_row(value: Any) -> Any:
        """The rows of the data a part of one dimension holds (every whole chunk of a row's
        length, or any run of a row's length: a row with an index and a label), or None."""
        if value.dtype.kind not in "biuf":
            return None
        value = value.astype(float64)
        for _, shape, rows in rows_of:
            if len(shape) == 1 and len(value) >= shape[0]:
                width = shape[0]
                if len(value) % width == 0:
                    chunks = value.reshape(-1, width)
                    if all(chunk.tobytes() in rows for chunk in chunks):
                        return list(chunks)
                for start in range(len(value) - width + 1):
                    if value[start:start + width].tobytes() in rows:
                        return [value[start:start + width]]
        return None

    def multiset(flat: Any) -> bytes:
        rows, counts = unique(flat, axis=0, return_counts=True)
        return rows.tobytes() + counts.tobytes()

    every = {unique(asarray(array).astype(float64).reshape(len(array), -1), axis=0).tobytes()
             for array in arrays if asarray(array).ndim >= 2}   # all the rows of each array
    sizes: list[int] = []
    stacks: list[int] = []            # rows of each from_tensors stack of some of the data's
    counted = [0]                     # (of them, those already in sizes)
    stack_of: Any = weak_keys()       # from_tensors dataset (or zip of them): its entry in stacks
    examples: Any = weak_keys()       # dataset: the examples each of its elements holds
    whole: Any = weak_set()           # datasets still holding from_tensors' one element
    probes: list[Any] = []            # the audit's own probes (kept alive), made unaudited
    probing: list[bool] = []          # set while the audit makes one
    firsts: dict[tuple[int, int], bytes] = {}   # (probe, part): the rows its first big element held

    def rows_of_the_data(part: Any) -> bool:
        """Whether ``part`` is a stack of the data's rows, or of one dimension at most."""
        if (part.shape.rank or 0) <= 1:
            return True               # an index array, the labels, a number: no batch of rows
        value = static_value(part)
        if value is None:
            return False
        value = asarray(value)
        if value.dtype.kind not in "biuf":
            return False
        value = value.astype(float64)
        for rank, shape, rows in rows_of:
            if value.ndim == rank and value.shape[1:] == shape and all(
                    row.tobytes() in rows for row in unique(value.reshape(len(value), -1),
                                                            axis=0)):
                return True
        return False

    def held(spec: Any) -> int:
        """The examples an element of ``spec`` holds: the product of its dimensions before
        the row shape of the data's arrays (before its last, when none fits: a row with its
        label), those not known counted as 1 (at least that many: ``[None, global batch,
        features]`` holds global batches); 0 for one example or a part of one dimension."""
        if not isinstance(spec, tensor_spec) or (spec.shape.rank or 0) < 2:
            return 0
        dims = spec.shape.as_list()
        lead = leading(dims)
        return int(prod([d for d in (dims[:-1] if len(lead) == len(dims) else lead)
                         if d is not None]))

    def loose(dims: Any) -> bool:
        """Whether the data's values a part holds are counted as rows (:func:`note`): a part
        of one dimension or none, or one whose rows have no row shape of the data's."""
        return dims is not None and (len(dims) <= 1 or kin(list(dims)) is None)

    def leading(dims: list[Any]) -> list[Any]:
        """The dimensions before the row shape of the data's arrays (all, when none fits)."""
        tails = [len(shape) for _, shape, _ in rows_of
                 if 0 < len(shape) < len(dims) and tuple(dims[-len(shape):]) == shape]
        return dims[:len(dims) - max(tails, default=0)]

    def kin(dims: list[Any]) -> Any:
        """The row shape of a data array that ``dims`` end with (None when none fits): the
        parts of an element with one such row shape are counted together."""
        lead = len(leading(dims))
        return tuple(dims[lead:]) if lead < len(dims) else None

    def together(specs: Any) -> list[int]:
        """The examples an element holds: those of its parts whose rows have the row shape of
        one of the data's arrays added up per row shape, whatever their dtypes (a global batch
        split into per-replica parts is one global batch), those of row shapes none of the
        data's arrays has added up too."""
        groups: dict[Any, int] = {}
        for spec in specs:
            if count := held(spec):   # None: the parts of row shapes none of the data has
                key = kin(spec.shape.as_list())
                groups[key] = groups.get(key, 0) + count
        return list(groups.values())

    def unknown(spec: Any) -> bool:
        """Whether the examples an element of ``spec`` holds are known only when it is made."""
        if not isinstance(spec, tensor_spec):
            return False
        if spec.shape.rank is None:
            return True
        dims = spec.shape.as_list()
        return len(dims) >= 2 and None in leading(dims)

    def several(specs: Any) -> bool:
        """Whether an element has several parts of one dimension as long as a row or longer,
        or parts holding more values (or a number not known) than ``share`` rows of the data
        (:func:`loose`: packed rows, a row with its label, scalars)."""
        low = [spec for spec in specs if isinstance(spec, tensor_spec)
               and spec.shape.rank is not None and loose(spec.shape.as_list())]
        return bool(single_rows([spec.shape.as_list() if isinstance(spec, tensor_spec)
                                 and spec.shape.rank is not None else None for spec in specs])
                    ) or (bool(value_sets) and (
                        None in [d for spec in low for d in spec.shape] or sum(
                            spec.shape.num_elements() for spec in low) > share * min(
                                w for w, _ in value_sets)))   # more values than share rows

    def row_set(value: Any) -> bytes:
        """The set of rows a part holds (the examples :func:`held` counts), as bytes."""
        count = held(tensor_spec(value.shape))
        if count == 0:
            return b""
        if value.dtype.kind not in "biuf":   # complex, strings: their rows as text
            return "\n".join(sorted(repr(row.tolist()) for row in value.reshape(count, -1))
                             ).encode()
        return multiset(value.astype(float64).reshape(count, -1))

    def whole_times(value: Any, count: int) -> bool:
        """Whether ``value`` holds every row of one of the data's arrays, each as often."""
        rows, counts = unique(value.astype(float64).reshape(count, -1), axis=0,
                              return_counts=True)
        return rows.tobytes() in every and counts.min() == counts.max()

    def note(number: int, values: Any) -> Any:
        """At run time, one element of probe ``number``: its parts of one of the data's row
        shapes taken together (:func:`together`), those of other row shapes too; those holding
        more than the share whose rows are neither the rows the first such element held nor
        every row of one of the data's arrays (``x[start:]`` then ``x``, concatenated) are a
        batch of that many."""
        groups: dict[Any, list[Any]] = {}
        values = [asarray(value) for value in values]
        low = [v.real if v.dtype.kind == "c" else v for v in values if loose(v.shape)
               and v.dtype.kind in "biufc"]
        if low:                       # the data's values in loose parts, as rows
            flat = concatenate([v.astype(float64).ravel() for v in low])
            for width, known in value_sets:
                hits = flat[isin(flat, known)]
                count = len(hits) // width
                if count > share and firsts.setdefault(
                        (number, ("values", width)), sort(hits).tobytes()
                ) != sort(hits).tobytes():
                    sizes.append(count)
        found = {i: as_row(values[i]) for i in single_rows([list(v.shape) for v in values])}
        rows = {i: row for i, row in found.items() if row is not None}
        if len(rows) > 1:             # rows of the data as parts: a stack of them
            values = [v for i, v in enumerate(values) if i not in rows] + [
                asarray([r for found_rows in rows.values() for r in found_rows])]
        for value in values:
            value = asarray(value)
            if held(tensor_spec(value.shape)):
                groups.setdefault(kin(list(value.shape)), []).append(value)
        for key, parts in groups.items():
            count = sum(held(tensor_spec(part.shape)) for part in parts)
            if count <= share:
                continue
            numbers = [part for part in parts if part.dtype.kind in "biuf"]
            others = [row_set(part) for part in parts if part.dtype.kind not in "biuf"]
            if key is None and len(parts) > 1:   # parts of row shapes the data lacks
                rows, whole = b"\0".join(sorted(row_set(part) for part in parts)), False
            elif len(parts) == 1:
                value = parts[0]
                rows, whole = row_set(value), bool(numbers) and whole_times(value, count)
            else:             # numbers of any dtype as one stack of rows, the others as text
                value = concatenate([part.astype(float64).reshape(-1, *key) for part in numbers]
                                    ) if numbers else None
                rows = b"\0".join([row_set(value) if numbers else b"", *sorted(others)])
                whole = not others and whole_times(value, len(value))
            if not whole and firsts.setdefault((number, key), rows) != rows:
                sizes.append(count)
        return 0

    def probe(dataset: Any) -> None:
        """Route ``dataset``'s elements through :func:`note` (its variant tensor replaced by
        that of an identity ``map`` that calls it with its dense parts; the others pass by)."""
        dense = [isinstance(spec, tensor_spec) for spec in flatten(dataset.element_spec)]
        if not any(dense):
            return
        number = len(probes)

        def through(*element: Any) -> Any:
            parts = flatten(element, expand_composites=False)
            done = py_function(lambda *values: note(number, values),
                               [part for part, d in zip(parts, dense, strict=True) if d],
                               Tout=int32)
            with dependencies([done]):
                passed = [identity(part) if d else part
                          for part, d in zip(parts, dense, strict=True)]
            packed = pack(element, passed)
            return packed[0] if len(element) == 1 else packed

        probing.append(True)
        try:
            mapped = dataset.map(through)
        finally:
            probing.pop()
        probes.append(mapped)
        dataset._variant_tensor_attr = mapped._variant_tensor

    def each(dataset: Any) -> int:
        """The examples each element of ``dataset`` (a batching op's input) holds: as recorded
        for a batching op (or a dataset passing its elements on unchanged), else as its element
        spec says (:func:`together`), at least 1."""
        if dataset in examples:
            return examples[dataset]
        return max(together(specs_of(dataset)), default=1)

    def specs_of(dataset: Any) -> list[Any]:
        """The flattened element spec of ``dataset`` ([] when not known)."""
        try:
            return flatten(dataset.element_spec)
        except Exception:  # noqa: BLE001 - no dataset, or its elements are not known yet
            return []

    def window_size(dataset: Any) -> Any:
        """``group_by_window``'s window size: its function's constant result, else None."""
        try:
            outputs = dataset._window_size_func.function.graph.outputs
            return static_value(outputs[0]) if len(outputs) == 1 else None
        except Exception:  # noqa: BLE001 - made another way
            return None

    def stacked(dataset: Any, rows: int) -> None:
        """Record ``dataset``'s one element as a stack of ``rows`` of the data's rows: once
        such stacks hold more rows than the data, each larger than ``share`` is a batch."""
        stack_of[dataset] = len(stacks)
        stacks.append(rows)
        if len(stacks) > 1 and sum(stacks) > len(asarray(arrays[0])):
            sizes.extend(n for n in stacks[counted[0]:] if n > share)
            counted[0] = len(stacks)

    def values_held(parts: Any) -> int:
        """The rows of the data a from_tensors element of parts of one dimension or none holds
        as values (raveled, a value to a part), 0 when it holds every row's values."""
        flat = [asarray(static_value(part)) for part in parts]
        flat = [v.real if v.dtype.kind == "c" else v for v in flat if v.dtype.kind in "biufc"]
        flat = concatenate([v.astype(float64).ravel() for v in flat]) if flat else asarray([])
        for width, known in value_sets:
            hits = flat[isin(flat, known)]
            if len(hits) >= width and len(unique(hits)) < len(known):
                return len(hits) // width
        return 0

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if probing:                   # the audit's own probe
            return
        kind, source = type(self).__name__, getattr(self, "_input_dataset", None)
        size = next((getattr(self, name) for name in ("_batch_size", "_batch_size_t", "_size",
                                                      "_batch_sizes")
                     if getattr(self, name, None) is not None), None)
        if kind == "_GroupByWindowDataset":
            size = window_size(self)  # a window whose size a function gives (-1: not constant)
        if size is not None or kind == "_GroupByWindowDataset":   # a batching op: its size
            value = static_value(size) if size is not None else None   # (rebatch: largest)
            rebatch = getattr(self, "_batch_sizes", None) is not None   # splits, stacks none
            count = (int(asarray(value).max(initial=0)) * (1 if rebatch else each(source))
                     if value is not None else -1)   # times the examples each input holds
            examples[self] = count
            sizes.append(count)
            specs, inputs = specs_of(self), [] if source in examples else specs_of(source)
            sizes.extend(n for n in together(specs) if n > share)   # a batch of batches: its
            # own element too, probed when the examples its input's elements hold are not known
            if any(map(unknown, specs)) and any(map(unknown, inputs)) or several(specs):
                probe(self)
            return
        try:
            if source is not None and source in examples and (
                    self.element_spec == source.element_spec):
                examples[self] = examples[source]   # prefetch, take, a map of the same shapes
        except Exception:  # noqa: BLE001 - elements not known
            pass
        zipped = flatten(getattr(self, "_datasets", None) or []) if kind == "_ZipDataset" else []
        parts = (getattr(self, "_tensors", None) or []) if kind == "_TensorDataset" else []
        if parts and all(rows_of_the_data(part) for part in parts):
            whole.add(self)           # from_tensors' one element: all the data, no batch,
            some = [asarray(static_value(part)).astype(float64) for part in parts
                    if (part.shape.rank or 0) >= 2]   # or some of its rows: a global
            kinds: dict[Any, list[Any]] = {}  # its parts of one row shape together
            for value in some:
                kinds.setdefault(value.shape[1:], []).append(value)
            held_rows = [len(rows) for rows in map(concatenate, kinds.values()) if unique(
                rows.reshape(len(rows), -1), axis=0).tobytes() not in every]
            low = [part for part in parts if (part.shape.rank or 0) <= 1]
            if rows := max(held_rows, default=0) + (values_held(low) if low else 0):
                stacked(self, rows)   # a batch, once such stacks hold more than the data
            return
        if zipped and all(part in whole for part in zipped):
            whole.add(self)           # several zipped: their stacks one stack
            merged = list(dict.fromkeys(stack_of[part] for part in zipped if part in stack_of))
            if len(merged) > 1:
                rows = sum(stacks[i] for i in merged)
                for i in merged:
                    stacks[i] = 0
                stacked(self, rows)
            return
        if source in whole and kind != "_UnbatchDataset":
            if source in stack_of:    # a stack taken, mapped, cached...: the same stack
                stack_of[self] = stack_of[source]
            whole.add(self)           # made of all the data (a cast, a repeat, a pipeline's
            probe(self)               # rows gathered): the same rows in every element, or
            return                    # it is cut into batches
        specs = specs_of(self)        # any other: the examples its elements already hold
        sizes.extend(count for count in together(specs) if count > share)
        if any(map(unknown, specs)) or several(specs):
            probe(self)               # the examples its elements hold, seen at run time

    return init, sizes
