"""Lesson 02's exercise 4: ``make_files_dataset_fn(files, global_batch_size, shuffle_buffer)``
over TFRecord files, its ``dataset_fn`` read pipeline by pipeline as separate workers build it.

Each worker is its own process, seeded its own way: so for every pipeline the check seeds
TensorFlow with that worker's seed, then calls the learner's ``make_files_dataset_fn`` and the
``dataset_fn`` it returns (a random op made once and shared by every "worker" would hide a
shuffle before the split). Each pipeline is built three times: with the case's
``shuffle_buffer`` (at least a share: two epochs read), with ``shuffle_buffer=1`` (the order it
reads its records in) and with a buffer of 2 or 3 (none may come more than ``b - 1`` places early
against that order, ``shuffle_order``'s docstring; some must come exactly ``b - 1`` early, so a
buffer of 1 or 2 in its place fails). With at least as many files as pipelines, the last two
builds run with the other pipelines' files replaced by files that are not TFRecords, of their
sizes and times, their access times set back: one that opens another's file fails reading
it, or (read with ``ignore_errors``) is seen by its access time where the file system keeps
one (a decoy of its own size and time: every file read, those smaller than the rest skipped,
passed 2 of 2 in a fresh read). With fewer files, the order read with ``shuffle_buffer=1``
must be the files' order given; and the shuffles in a pipeline's graph must include one of
``shuffle_buffer`` (``shuffle_buffers``). Every read of a
pipeline has a time limit of its own (``READ_SECONDS``): an answer that never ends fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from course_utils.grading.checks.shuffle_order import global_seed
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["SHARE_MIN", "FileSet", "PipelineRead", "dataset_fn_of", "draw_file_sizes",
           "read_pipelines", "steps_on", "strategy_verifier", "workers_verifier"]

#: The fewest records a pipeline's share holds: a whole shuffle of 150 records brought one of
#: the last 40 % into the first places in 20,000 of 20,000 permutations drawn (numpy).
SHARE_MIN = 200
#: The longest one read of a pipeline may take (a right one takes well under a second).
READ_SECONDS = 60
MOST_BATCHES = 100_000  # the check's files hold a few thousand records in all
NOT_TFRECORD = b"not a TFRecord: another pipeline's file, which this one must not open\n" * 4
SPLIT_FIRST = ("Each worker's process seeds its shuffles its own way: split first (the list of "
               "files, or the records read in a fixed order), then shuffle")


@dataclass
class FileSet:
    """The check's TFRecord files: file ``f`` holds records ``str(k)`` for a block of ``k``."""

    directory: str
    paths: list[str]
    file_of: dict[int, int]

    @classmethod
    def write(cls, sizes: list[int]) -> FileSet:
        tf = _tf()
        directory = tempfile.mkdtemp(prefix="lesson02_files_")
        paths, file_of, start = [], {}, 0
        for number, size in enumerate(sizes):
            path = os.path.join(directory, f"part-{number:03d}-of-{len(sizes):03d}.tfrecord")
            with tf.io.TFRecordWriter(path) as writer:
                for record in range(start, start + size):
                    writer.write(b"%d" % record)
                    file_of[record] = number
            paths.append(path)
            start += size
        return cls(directory, paths, file_of)

    @contextlib.contextmanager
    def only(self, keep: set[int], opened: list[int]) -> Iterator[None]:
        """The files not in ``keep`` replaced, while it runs, by files that are not TFRecords
        (their access times set back an hour): the numbers of those read go to ``opened``."""
        away = self.directory + "_away"
        os.makedirs(away, exist_ok=True)
        swapped = [(number, path, os.path.join(away, os.path.basename(path)))
                   for number, path in enumerate(self.paths) if number not in keep]
        for _, path, hidden in swapped:
            size, mtime = os.stat(path).st_size, os.stat(path).st_mtime_ns
            os.rename(path, hidden)
            with open(path, "wb") as decoy:  # its size and time: a stat cannot tell it
                decoy.write((NOT_TFRECORD * (size // len(NOT_TFRECORD) + 1))[:size])
            os.utime(path, ns=(mtime - 3600 * 10**9, mtime))
        try:
            yield
        finally:
            for number, path, hidden in swapped:
                status = os.stat(path)
                if status.st_atime_ns >= status.st_mtime_ns:  # relatime: read since set back
                    opened.append(number)
                os.replace(hidden, path)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self.directory + "_away", ignore_errors=True)


def _listed(make: Any, what: str) -> list[Any]:
    """``list(make())``, read in a thread of its own and given ``READ_SECONDS``: an answer's
    pipeline that never ends (an endless ``repeat``, ``ignore_errors`` on a file that cannot
    be opened) fails with a message instead of hanging the check."""
    items: list[Any] = []
    outcome: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            for item in make():
                if stop.is_set() or len(items) >= MOST_BATCHES:
                    return
                items.append(item)
        except BaseException as error:  # noqa: BLE001 - handed to the check's thread
            outcome.append(error)

    thread = threading.Thread(target=read, daemon=True, name="lesson02-read")
    thread.start()
    thread.join(READ_SECONDS)
    if thread.is_alive() or len(items) >= MOST_BATCHES:
        stop.set()
        raise TimeoutError(
            f"reading {what} took more than {READ_SECONDS} s or {MOST_BATCHES} batches "
            f"({len(items)} read by then), and it was given up: a dataset_fn's pipeline "
            "ends after one pass over its records (no endless repeat; no ignore_errors on a "
            "file that cannot be opened: it retries the open for ever)")
    if outcome:
        raise outcome[0]
    return items


def draw_file_sizes(rng: Any, files: int, pipelines: int, whole_files: bool) -> list[int]:
    """Record counts of ``files`` files: every pipeline's share holds ``SHARE_MIN`` or more."""
    if whole_files:  # a pipeline may get a single file
        return [rng.randint(SHARE_MIN, SHARE_MIN + 60) for _ in range(files)]
    total = pipelines * rng.randint(SHARE_MIN + 20, SHARE_MIN + 100)
    cuts = sorted(rng.sample(range(20, total - 20), files - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def _records(batch: Any) -> list[int]:
    return [int(value) for value in batch.numpy().ravel()]


def steps_on(strategy: Any, distributed: Any) -> list[list[list[int]]]:
    """Each step's per-replica batches, as lists of record numbers (time-limited)."""
    return _listed(lambda: ([_records(part) for part in strategy.experimental_local_results(
        step)] for step in distributed), "the distributed dataset")


@dataclass
class PipelineRead:
    """What one pipeline gave: two epochs with the case's buffer, its read order and one epoch
    with a small buffer (or why those could not be read), and whether a seed was changed."""

    epochs: list[list[list[int]]] = field(default_factory=list)
    read_order: list[int] = field(default_factory=list)
    small: list[int] = field(default_factory=list)
    reseeded: list[int] = field(default_factory=list)  # an epoch made under another seed
    buffers: list[int] | None = None  # its shuffles' buffer sizes, where its graph says them
    failed: str = ""
    seed_changed: bool = False


def dataset_fn_of(fn: Any, files: FileSet, global_batch: int, buffer: int) -> Any:
    """The ``dataset_fn`` the learner's function returns for ``files`` (checked callable)."""
    dataset_fn = fn(list(files.paths), global_batch, buffer)
    if not callable(dataset_fn):
        raise TypeError(f"make_files_dataset_fn must return a function of input_context (the "
                        f"dataset_fn), got {type(dataset_fn).__name__}")
    return dataset_fn


def _build(fn: Any, files: FileSet, global_batch: int, buffer: int, context: Any, seed: int,
           read: PipelineRead) -> Any:
    """``fn``'s pipeline for ``context``, made as a worker process seeded ``seed`` makes it."""
    tf = _tf()
    tf.random.set_seed(seed)
    dataset = dataset_fn_of(fn, files, global_batch, buffer)(context)
    if global_seed() != seed:
        read.seed_changed = True
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset_fn(input_context) must return a tf.data.Dataset, got "
                        f"{type(dataset).__name__}")
    return dataset


def _built(*args: Any) -> Iterator[list[int]]:
    """The batches, as lists of record numbers, of ``_build(*args)``'s pipeline."""
    return map(_records, _build(*args))


def read_pipelines(fn: Any, files: FileSet, global_batch: int, buffers: tuple[int, int],
                   pipelines: int, replicas: int, seeds: list[tuple[int, int]],
                   whole_files: bool) -> list[PipelineRead]:
    """Every pipeline of a cluster of ``pipelines`` workers with ``replicas`` each, read:
    each made by a worker seeded ``seeds[i][0]``, and once more by one seeded ``seeds[i][1]``."""
    tf = _tf()
    big, small = buffers
    reads = []
    for number, (seed, other) in enumerate(seeds):
        context = tf.distribute.InputContext(pipelines, number, pipelines * replicas)
        read = PipelineRead()
        dataset = _build(fn, files, global_batch, big, context, seed, read)
        read.buffers = shuffle_buffers(dataset)
        what = f"pipeline {number} of {pipelines}"
        read.epochs = [_listed(partial(map, _records, dataset), what) for _ in range(2)]
        read.reseeded = [r for batch in _listed(partial(
            _built, fn, files, global_batch, big, context, other, read), what) for r in batch]
        own = {files.file_of.get(r, -1) for batch in read.epochs[0] for r in batch}
        present = own if whole_files else set(range(len(files.paths)))
        opened: list[int] = []
        try:
            with files.only(present, opened):
                for buffer in (1, small):
                    order = [r for batch in _listed(partial(
                        _built, fn, files, global_batch, buffer, context, seed, read), what)
                        for r in batch]
                    read.read_order, read.small = (order, []) if buffer == 1 else (
                        read.read_order, order)
        except tf.errors.OpError as error:
            read.failed = str(error).strip().splitlines()[0][:160]
        if opened and not read.failed:
            read.failed = (f"it read file{'s' * (len(opened) > 1)} {sorted(opened)}, another "
                           "pipeline's (its access time moved)")
        reads.append(read)
    return reads


def shuffle_buffers(dataset: Any) -> list[int] | None:
    """The buffer sizes of the shuffles ``dataset``'s own graph holds (not those inside the
    functions of its steps), or None where one is not a constant or the graph cannot be read.
    A buffer of one's own at least as large as every share shuffles as ``shuffle_buffer`` does
    (``min(shuffle_buffer, 1000)`` passed 2 of 2 in a fresh read): only the graph tells."""
    tf = _tf()
    from tensorflow.core.framework import graph_pb2

    try:
        graph = graph_pb2.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
            input_dataset=dataset._variant_tensor, external_state_policy=1,  # ignore
            strip_device_assignment=True).numpy())
    except Exception:  # noqa: BLE001 - a graph that cannot be read is not judged
        return None
    nodes = {node.name: node for node in graph.node}
    sizes = []
    for node in graph.node:
        if node.op.startswith(("ShuffleDataset", "ShuffleAndRepeatDataset")):
            source = nodes.get(node.input[1].split(":")[0].lstrip("^"))
            if source is None or source.op != "Const":
                return None
            sizes.append(int(tf.make_ndarray(source.attr["value"].tensor)))
    return sizes


def _coverage(given: list[int], total: int, what: str) -> str | None:
    if sorted(given) == list(range(total)):
        return None
    repeated = len(given) - len(set(given))
    missing = total - len(set(given) & set(range(total)))
    return (f"{what} gave {len(given)} records of the files' {total}: {repeated} repeated, "
            f"{missing} missing (together, every record once per epoch; keep the short last "
            "batch)")


def strategy_verifier(total: int, per_replica: int, replicas: int) -> Any:
    """A verify function for an epoch's steps under ``cu.make_strategy("mirrored")``."""

    def verify(steps: list[list[list[int]]]) -> str | None:
        problem = _coverage([r for step in steps for part in step for r in part], total,
                            "over an epoch, the replicas")
        if problem:
            return problem
        for number, step in enumerate(steps[:-1], start=1):
            if [len(part) for part in step] != [per_replica] * replicas:
                return (f"step {number} gave the replicas {[len(part) for part in step]} "
                        f"records, expected {per_replica} each: the per-replica batch, "
                        "input_context.get_per_replica_batch_size(global_batch_size)")
        return None

    return verify


def _share_problem(reads: list[PipelineRead], files: FileSet, whole_files: bool) -> str | None:
    """What is wrong with the shares the pipelines read (epoch by epoch), or None."""
    count, total = len(reads), len(files.file_of)
    for epoch in (0, 1):
        shares = [[r for batch in read.epochs[epoch] for r in batch] for read in reads]
        for a in range(count):
            for b in range(a + 1, count):
                shared = set(shares[a]) & set(shares[b])
                if shared:
                    return (f"epoch {epoch + 1}: pipelines {a} and {b} of {count} both gave "
                            f"{len(shared)} of the same records: each pipeline reads its own "
                            f"share. {SPLIT_FIRST}")
        problem = _coverage([r for share in shares for r in share], total,
                            f"epoch {epoch + 1}: the {count} pipelines")
        if problem:
            return problem
    for number, read in enumerate(reads):
        shares = [{r for batch in epoch for r in batch} for epoch in read.epochs]
        if len({frozenset(share) for share in [*shares, set(read.reseeded)]}) > 1:
            return (f"pipeline {number}'s share of the records changed (between its epochs, "
                    "or with its worker's process seeded another way): a shuffle before the "
                    f"split cuts differently in each worker. {SPLIT_FIRST}")
    for epoch in (0, 1):
        for number, share in enumerate(read.epochs[epoch] for read in reads):
            if not share and whole_files:
                return (f"pipeline {number} of {count} got no records ({len(files.paths)} "
                        "files): with at least as many files as pipelines, deal the files "
                        "evenly (their numbers differ by one at most): none left without")
            if not share:
                return (f"pipeline {number} of {count} got no records ({len(files.paths)} "
                        "files): with fewer files than pipelines, every pipeline reads every "
                        "file and keeps its share of the records")
    if not whole_files:
        return None
    counts = []
    for number, read in enumerate(reads):
        kept: dict[int, int] = {}
        for record in (r for batch in read.epochs[0] for r in batch):
            kept[files.file_of[record]] = kept.get(files.file_of[record], 0) + 1
        for file, got in sorted(kept.items()):
            size = sum(1 for f in files.file_of.values() if f == file)
            if got != size:
                return (f"pipeline {number} kept {got} of file {file}'s {size} records: with "
                        f"at least as many files as pipelines ({len(files.paths)} for "
                        f"{count}), each pipeline reads whole files of its own – split the "
                        "list of files, not the records")
        counts.append(len(kept))
    if max(counts) - min(counts) > 1:
        return (f"the pipelines read {counts} files: deal the files evenly (the numbers of "
                "files differ by one at most)")
    for number, read in enumerate(reads):
        if read.failed:
            return (f"pipeline {number} opens files that are not its own: built again with "
                    f"the other files made unreadable ({counts[number]} of its own left), "
                    f"reading it failed ({read.failed})"
                    ". Each pipeline opens only its own files; one that reads every file and "
                    f"keeps its share reads {count}× the data")
    return None


def _order_problem(number: int, read: PipelineRead, buffers: tuple[int, int]) -> str | None:
    """What is wrong with one pipeline's shuffle, against the order it reads (buffer 1)."""
    import numpy as np

    big, small = buffers
    if read.buffers is not None and read.buffers and big not in read.buffers:
        return (f"pipeline {number}'s dataset shuffles with a buffer of "
                f"{' and '.join(map(str, read.buffers))}, not shuffle_buffer={big}: shuffle "
                "with shuffle_buffer, not a buffer of your own (one at least as large as the "
                "share shuffles alike, but shuffle_buffer is the caller's choice)")
    first, second = ([r for batch in epoch for r in batch] for epoch in read.epochs)
    if first == second:
        return (f"pipeline {number} gave its records in the same order in both epochs: "
                "reshuffle every epoch")
    place = {record: index for index, record in enumerate(read.read_order)}
    if set(place) != set(first) or set(read.small) != set(first):
        return (f"pipeline {number} gave other records when built with another "
                "shuffle_buffer: the buffer must change the order, not the share")
    if first == read.read_order:
        return (f"pipeline {number} gave its records in the same order with shuffle_buffer=1 "
                f"as with shuffle_buffer={big}: shuffle with shuffle_buffer, not a buffer of "
                "your own")
    early = max(place[r] - index for index, r in enumerate(first))
    if early < 0.6 * len(first):
        return (f"with shuffle_buffer={big} (at least the share), no record of pipeline "
                f"{number}'s {len(first)} came out more than {early} places before its place "
                "in the order the pipeline reads them (its order with shuffle_buffer=1); a "
                "shuffle of the whole share brings some of its last 40 % to the front: "
                "shuffle the records with shuffle_buffer")
    after = float(np.mean([place[b] == place[a] + 1 for a, b in zip(first[:-1], first[1:],
                                                                  strict=True)]))
    if after > 0.25:
        return (f"{after:.0%} of pipeline {number}'s records came out right after the record "
                "read before them: you shuffled blocks of neighbouring records (batches, "
                "lesson 01); shuffle the records themselves, then batch")
    ahead = max(place[r] - index for index, r in enumerate(read.small))
    if ahead < small - 1:
        return (f"with shuffle_buffer={small}, no record of pipeline {number}'s {len(first)} "
                f"came out {small - 1} place{'s' * (small > 2)} early against the order it "
                f"reads them (a buffer of {small} moves some that far; its most was "
                f"{max(ahead, 0)}): shuffle with "
                "shuffle_buffer, small or large, not a buffer of your own")
    if ahead > small - 1:
        return (f"with shuffle_buffer={small}, a record of pipeline {number} came out {ahead} "
                f"places before its place in the order it reads them (a buffer of {small} "
                f"brings one {small - 1} places early at most): shuffle with shuffle_buffer, "
                "not a buffer of your own")
    return None


def workers_verifier(files: FileSet, per_replica: int, buffers: tuple[int, int],
                     whole_files: bool) -> Any:
    """A verify function for the pipelines ``read_pipelines`` read."""

    def verify(reads: list[PipelineRead]) -> str | None:
        if any(read.seed_changed for read in reads):
            return ("your make_files_dataset_fn (or its dataset_fn) set TensorFlow's global "
                    "seed (the check read it back after each call): it is the worker "
                    "process's, leave it alone")
        problem = _share_problem(reads, files, whole_files)
        if problem:
            return problem
        for number, read in enumerate(reads):
            sizes = sorted({len(batch) for epoch in read.epochs for batch in epoch[:-1]})
            if sizes and sizes != [per_replica]:
                return (f"pipeline {number}'s batches held {sizes} records, expected "
                        f"{per_replica}: the per-replica batch, "
                        "input_context.get_per_replica_batch_size(global_batch_size)")
            if read.failed:
                return (f"pipeline {number}, made again with shuffle_buffer=1, then "
                        f"{buffers[1]}, could not be read: {read.failed}")
            problem = _order_problem(number, read, buffers)
            if problem:
                return problem
            order = read.read_order  # its shuffles judged above: the order it reads
            late = next((k for k in range(1, len(order)) if order[k] < order[k - 1]), 0)
            if not whole_files and late:
                return (f"pipeline {number}, made with shuffle_buffer=1, read record "
                        f"{order[late]} after record {order[late - 1]}: with fewer files "
                        "than pipelines, read every file in the order given, each from its "
                        "start (the shares hold only where every worker reads one order: "
                        "options.py, lines 102-104), then keep your share")
        return None

    return verify
