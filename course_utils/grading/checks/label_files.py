"""Lesson 01's exercise 2: the check's files, each a run of data sorted by label, the reader it
hands over, and what it counts while ``mixed_batches`` reads them.

:func:`write_label_files` writes fresh TFRecord files: examples with fresh random ids, sorted by
label and cut in order into files, so that each file holds one label or two. ``read_file(path)``
reads one file's ``(id, label)`` pairs in stored order; every record it reads appends the
number of its file to a log (a Python list, by ``tf.numpy_function``). From the log, read
between two counts of records read, :func:`read_epoch` tells the order the files were opened in
and how many were being read at once (from a file's first record read to its last).
:func:`mix_problem` judges an epoch's batches against a uniform shuffle of the same labels
(numpy), the files each batch draws on, how many of a file's neighbours kept their order, and
how far from its stored order the list of files was read; :func:`buffer_problem` reads every
shuffle's buffer (and any cache) from the dataset's serialized graph, in the functions its
steps call too; :func:`held_problem` knows from the log the order the records were read in
(a file's records are read in stored order) and counts the examples held at once (one out k
places before its place in that order was held with k others) and whether epochs 1 and 2
moved the examples the same way (a fixed reordering; a shuffle drawing anew repeats few).
The thresholds come from 700 to 1,500 simulated draws of the check's cases
(numpy: interleave of the shuffled files, a shuffle buffer, three epochs averaged): a right
answer's label excess at most 0.146 against ``LABEL_EXCESS_MAX``, files per batch at least
0.84 of ``max_open`` against ``FILES_SHARE_MIN``; one file at a time, the excess at least 0.34;
half the files allowed, at most 0.65 of ``max_open``; the whole list of files shuffled, its mean
rank correlation with the stored order over three epochs at most 0.63 in 20,000, a list
shuffled with a buffer of 2 at least 0.82.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import _graph
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["FILES_SHARE_MIN", "FILE_ORDER_MAX", "IN_ORDER_MAX", "LABEL_EXCESS_MAX",
           "SAME_MOVES_MAX", "SAME_PAIRS_MAX", "Epoch", "LabelFiles", "buffer_problem",
           "held_problem", "mix_problem", "read_epoch", "write_label_files"]

#: How much more of a batch its most common label may take, on average over the batches of
#: three epochs, than in a uniform shuffle of the same labels into batches of the same size.
LABEL_EXCESS_MAX = 0.22
#: The fewest distinct files a batch must draw on, on average, as a share of ``max_open``.
FILES_SHARE_MIN = 0.75
#: The largest share of a file's stored neighbours (record i, record i + 1) that may come out
#: in stored order: no shuffle of examples keeps all of them, a shuffle of examples about half.
IN_ORDER_MAX = 0.8
#: The largest mean rank correlation (three epochs) between the order the files were opened in
#: and their stored order.
FILE_ORDER_MAX = 0.75
#: The largest share of places p at which epochs 1 and 2 put an example read the same number
#: of places after (or before) p: a shuffle that draws anew repeats about 2 to 4 %
#: (measured, buffers of 12 to 24), a fixed reordering (each batch reversed, a window
#: permuted by an op seeded inside a step's function) all of them.
SAME_MOVES_MAX = 0.5
#: The largest share of a file's neighbours (record i, record i + 1) whose order out was the
#: same in epochs 1 and 2: a shuffle that draws anew about 55 % (at most about 70 % where it
#: keeps 80 % in stored order), every file's records reversed in pairs all of them.
SAME_PAIRS_MAX = 0.9


@dataclass
class LabelFiles:
    """The check's files: paths, each file's ids in stored order, the label of every id, the
    reader and its counts."""

    paths: list[str]
    file_ids: list[np.ndarray]
    label_of: dict[int, int]
    log: list[int]  # the file of each record read, in the order read
    read_file: Callable[[Any], Any]

    @property
    def num_examples(self) -> int:
        return sum(len(ids) for ids in self.file_ids)

    def count(self) -> int:
        return len(self.log)


def write_label_files(rng: Any) -> LabelFiles:
    """Fresh files: 4 or 5 labels (each at least half its even share), 14 to 18 files of 48 to
    60 records, sorted by label."""
    tf = _tf()
    num_labels, num_files = rng.randint(4, 5), rng.randint(14, 18)
    n = num_files * rng.randint(48, 60)
    base = n // (2 * num_labels)  # every label at least half its even share
    cuts = sorted(rng.sample(range(1, n - num_labels * base), num_labels - 1))
    sizes = np.diff([0, *cuts, n - num_labels * base]) + base
    labels = np.repeat(np.arange(num_labels), sizes)
    ids = np.array(rng.sample(range(10**6, 10**9), n), dtype=np.int64)
    directory = tempfile.mkdtemp(prefix="lesson01_label_files_")
    paths, file_ids = [], []
    for number, part in enumerate(np.array_split(np.arange(n), num_files)):
        path = os.path.join(directory, f"part-{number:03d}-of-{num_files:03d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in part:
                feature = {key: tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
                           for key, value in (("id", ids[i]), ("label", labels[i]),
                                              ("file", number))}
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        paths.append(path)
        file_ids.append(ids[part])
    # a Python list, appended to under the GIL: places counted by a Variable's assign_add
    # left holes in the log when a parallel interleave's threads read at once (tried)
    log: list[int] = []

    def note(number: Any) -> Any:
        log.append(int(number))
        return number
    spec = {key: tf.io.FixedLenFeature([], tf.int64) for key in ("id", "label", "file")}

    def parse(record: Any) -> Any:
        example = tf.io.parse_single_example(record, spec)
        logged = tf.numpy_function(note, [example["file"]], tf.int64, stateful=True)
        with tf.control_dependencies([logged]):
            return tf.identity(example["id"]), tf.identity(example["label"])

    @tf.autograph.experimental.do_not_convert
    def read_file(path: Any) -> Any:
        """One file's ``(id, label)`` pairs, in the order they are stored."""
        return tf.data.TFRecordDataset(path).map(parse)

    return LabelFiles(paths, file_ids, dict(zip(ids.tolist(), labels.tolist(), strict=True)),
                      log, read_file)


@dataclass
class Epoch:
    """One epoch as the check saw it: batches of ids and labels, the records read before the
    first batch came out and in the whole epoch, and the file of every record read."""

    ids: list[np.ndarray]
    labels: list[np.ndarray]
    read_first: int
    read_all: int
    files_read: np.ndarray

    def read_places(self, files: LabelFiles) -> np.ndarray:
        """For every example out, in order, its place in the order its record was read (a
        file's records are read in stored order, so the log names each one)."""
        read = [0] * len(files.paths)
        place_of = {}
        for place, f in enumerate(self.files_read.tolist()):
            place_of[int(files.file_ids[f][read[f]])] = place
            read[f] += 1
        return np.array([place_of[i] for i in np.concatenate(self.ids).tolist()])

    def opened(self) -> list[int]:
        """The files in the order their first record was read."""
        return list(dict.fromkeys(self.files_read.tolist()))

    def most_open(self) -> int:
        """The most files being read at once: from a file's first record read to its last."""
        files = self.files_read
        if not len(files):
            return 0
        first = {f: i for i, f in reversed(list(enumerate(files.tolist())))}
        last = {f: i for i, f in enumerate(files.tolist())}
        change = np.zeros(len(files) + 1, dtype=int)
        for f in first:
            change[first[f]] += 1
            change[last[f] + 1] -= 1
        return int(np.max(np.cumsum(change)))


def read_epoch(dataset: Any, files: LabelFiles) -> Epoch | str:
    """One epoch of ``dataset`` (batches of ``(ids, labels)``), or what its elements lack."""
    start, first = files.count(), None
    ids, labels = [], []
    for element in dataset:
        if first is None:
            first = files.count() - start
        if not isinstance(element, tuple | list) or len(element) != 2:
            return ("expected batches of (ids, labels) pairs, as read_file gives them, "
                    f"batched; got an element {type(element).__name__}")
        ids.append(np.asarray(element[0]))
        labels.append(np.asarray(element[1]))
        if len(ids) > 10 * files.num_examples:
            return "your dataset does not end: one epoch must end after every example"
    end = files.count()
    log = files.log[start:end]
    return Epoch(ids, labels, first or 0, end - start, np.asarray(log, dtype=np.int64))


def _top_share(labels: list[np.ndarray]) -> float:
    return float(np.mean([np.bincount(b).max() / len(b) for b in labels if len(b)]))


def _rank_correlation(order: list[int]) -> float:
    return float(np.corrcoef(np.arange(len(order)), np.asarray(order))[0, 1])


def mix_problem(epochs: list[Epoch], files: LabelFiles, max_open: int, rng: Any) -> str | None:
    """What shows that ``epochs`` (three, each every example once) are not mixed batches."""
    file_of = {i: f for f, ids in enumerate(files.file_ids) for i in ids.tolist()}
    place_of = {i: p for ids in files.file_ids for p, i in enumerate(ids.tolist())}
    all_labels = np.array(list(files.label_of.values()))
    sizes = [len(b) for b in epochs[0].labels]
    cuts = np.cumsum(sizes)[:-1]
    uniform = float(np.mean([_top_share(np.split(all_labels[np.random.default_rng(
        rng.getrandbits(32)).permutation(len(all_labels))], cuts)) for _ in range(30)]))
    top = float(np.mean([_top_share(e.labels) for e in epochs]))
    if top - uniform > LABEL_EXCESS_MAX:
        return (f"the most common label took {top:.0%} of a batch on average over three "
                f"epochs; a uniform shuffle of the same examples gives {uniform:.0%} (at most "
                f"{LABEL_EXCESS_MAX:.0%} more passes): the files hold runs of one label, and "
                "a buffer far smaller than a file mixes only the files being read at once")
    per_batch = np.mean([len({file_of[i] for i in b.tolist()}) for e in epochs for b in e.ids])
    if per_batch < FILES_SHARE_MIN * max_open:
        return (f"a batch drew on {per_batch:.1f} files on average; with max_open={max_open} "
                f"files read at once each batch can hold examples of nearly all of them (at "
                f"least {FILES_SHARE_MIN * max_open:.1f} passes): how many files does your "
                "interleave read at once, and does it take one record of each in turn?")
    kept = []
    for e in epochs:
        order = np.concatenate(e.ids)
        seen = {}
        for i in order.tolist():
            seen.setdefault(file_of[i], []).append(place_of[i])
        kept += [bool(b > a) for places in seen.values()
                 for a, b in zip(places[:-1], places[1:], strict=True)]
    if np.mean(kept) > IN_ORDER_MAX:
        return (f"{np.mean(kept):.0%} of the records of a file came out after the record "
                "before them, in stored order; a shuffle of examples changes about half of "
                "them: are the examples shuffled, after the files are interleaved?")
    rho = float(np.mean([_rank_correlation(e.opened()) for e in epochs]))
    if rho > FILE_ORDER_MAX:
        return (f"the files were opened close to their stored order (rank correlation "
                f"{rho:.2f}, three epochs; a shuffle of the whole list gives about 0): is "
                "the list of files shuffled, with a buffer that holds all of it?")
    return _anew_problem(epochs[0], epochs[1], files)


def _anew_problem(first: Epoch, second: Epoch, files: LabelFiles) -> str | None:
    """What shows that epochs 1 and 2 (one dataset) did not shuffle the examples anew."""
    one, two = (e.read_places(files) - np.arange(files.num_examples) for e in (first, second))
    same = float(np.mean(one == two))
    if same > SAME_MOVES_MAX:
        return (f"{same:.0%} of the examples came out as many places from where they were read "
                "in epoch 2 as in epoch 1 (a shuffle that draws anew repeats a few in "
                "a hundred): are the examples shuffled anew every epoch – not a fixed "
                "reordering, nor a random op seeded inside a step's function, which draws "
                "the same every epoch, nor reshuffle_each_iteration=False?")
    order = [{i: p for p, i in enumerate(np.concatenate(e.ids).tolist())}
             for e in (first, second)]
    pairs = [[o[a] < o[b] for ids in files.file_ids
              for a, b in zip(ids[:-1].tolist(), ids[1:].tolist(), strict=True)]
             for o in order]
    same = float(np.mean(np.equal(*pairs)))
    if same > SAME_PAIRS_MAX:
        return (f"{same:.0%} of a file's neighbouring records came out in the same order in "
                "epoch 2 as in epoch 1 (a shuffle that draws anew: about half): is "
                "each file reordered the same way every epoch instead of the examples "
                "shuffled anew?")
    return None


def held_problem(epochs: dict[str, Epoch], files: LabelFiles, max_buffer: int) -> str | None:
    """What shows that more than ``max_buffer`` examples were held at once: an example out at
    place p that was read at place r > p waited with r - p others read before it and not yet
    out, itself included r - p + 1; a shuffle buffer of b brings at most b - 1 ahead."""
    moves = {name: e.read_places(files) - np.arange(files.num_examples)
             for name, e in epochs.items()}
    for name, moved in moves.items():
        held = int(np.max(moved)) + 1
        if held > max_buffer:
            return (f"an example came out {held - 1} places before its place in the order "
                    f"read_file read the records ({name}): {held} examples were held at once "
                    f"(the check knows that order); memory allows max_buffer={max_buffer}: "
                    "what holds more than the shuffle buffer (a window or batches shuffled, "
                    "two buffers, examples read and kept aside)?")
    return None


def _const(node_name: str, nodes: dict[str, Any]) -> int | None:
    tf = _tf()
    node = nodes.get(node_name.split(":")[0].lstrip("^"))
    while node is not None and node.op == "Identity":
        node = nodes.get(node.input[0].split(":")[0])
    if node is None or node.op != "Const":
        return None
    return int(tf.make_ndarray(node.attr["value"].tensor))


def buffer_problem(dataset: Any, max_buffer: int) -> str | None:
    """A shuffle of examples whose buffer exceeds ``max_buffer`` (or is not a constant), or a
    cache; a shuffle of strings alone (the files' names) holds no example."""
    graph = _graph(dataset)
    scopes = [list(graph.node)] + [list(f.node_def) for f in graph.library.function]
    buffers = []
    for scope in scopes:
        nodes = {node.name: node for node in scope}
        for node in scope:
            if node.op.startswith("CacheDataset"):
                return ("your pipeline caches (cache()): a cache keeps every example read, far "
                        f"more than a shuffle buffer of {max_buffer}")
            types = list(node.attr["output_types"].list.type)
            if node.op.startswith("Shuffle") and types != [_tf().string.as_datatype_enum]:
                buffers.append(_const(node.input[1], nodes))  # of examples, not of names
    too_big = [b for b in buffers if b is None or b < 0 or b > max_buffer]
    if too_big:
        said = ", ".join("not a number known when it is built" if b is None else str(b)
                         for b in too_big)
        return (f"your pipeline has a shuffle buffer of {said}; memory allows "
                f"max_buffer={max_buffer} examples in a buffer: shuffle the list of files "
                "and read several at once instead of holding more examples")
    return None
