"""Lesson 04's exercise 2, ``check_make_file_dataset_fn(make_file_dataset_fn, strategy)``, with
what the checks of lesson 04 share: the workers' count and barrier (lesson 04's module
re-exports them).

The exercise: a job's data in TFRecord files of unequal sizes. ``make_file_dataset_fn(paths,
sizes, batch_size, num_workers)`` returns a ``dataset_fn`` for ``create_per_worker_dataset`` in
which each worker reads whole files of its own (``Dataset.shard``'s docstring: shard the files
before reading them, "This avoids reading every file on every worker"), the workers' shares of
examples within one file of each other (sharding the file list by index, as that docstring's
recipe does, gives one worker most of the examples: the coordinator hands steps to whichever
worker is free, so a worker with a small share reads each of its examples many times as often),
each worker's examples read in passes (every one once before any twice: files interleaved with
a ``repeat()`` each are read at one rate per file, not per example), and never running dry.

What the check does, each call on fresh files (a fresh directory, sizes drawn so that neither
the files dealt by index nor blocks of them even the shares, every record a random token the
check alone knows; the learner's function gets copies of its lists): it runs the learner's
``dataset_fn`` through the notebook's own coordinator (``create_per_worker_dataset``), in rounds
of one step per worker (a barrier on a parameter server), each step returning the worker's index
and the records of its batch, then counts what each worker read: which files (a file read by two
workers is named), each share's examples (from the sizes of the files read; a job sized for one
worker more, who joins later, has the unread files as that worker's share), every record of a
worker's files read (at least a pass), each record's reads against the others' of its worker
(within 2), every batch full, and the dataset's cardinality on the worker (infinite; one
``assert_cardinality`` says is endless over a finite input is refused; where tf.data cannot
tell, -2, its steps must hold a ``repeat()`` that no later ``take``, ``take_while``, ``filter``
or zip can end: :func:`~course_utils.grading.checks.dataset_graphs.endless_steps`). On the
worker, the dataset's graph must hold a ``TFRecordDataset`` (records read on the coordinator and
shipped in the graph are refused) and no Python (``from_generator``, ``tf.py_function``: a real
job's remote workers cannot run it). A dataset that reads every file on every worker and drops
the records of other workers' files is seen in the job sized for a later worker: the files of
that worker's share, their access times set back before the run, must stay unopened (where the
file system records reads, relatime; elsewhere not told apart).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from course_utils.grading.checks.dataset_graphs import (
    ASSERTED,
    RunsPython,
    _asserted_infinite,
    endless_steps,
    graph_ops,
    runs_python,
    unmade_dataset_message,
)
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["BARRIER_TIMEOUT_S", "barrier_fn", "check_make_file_dataset_fn", "num_workers_of"]

#: The longest a step waits at the barrier for the other workers (a safety net, never reached
#: when every worker is alive).
BARRIER_TIMEOUT_S = 60.0


def num_workers_of(strategy: Any) -> int:
    """The workers of the cluster ``strategy`` joined, from the remote devices it made visible."""
    tf = _tf()
    del strategy  # connected when it was made: its devices are this process's remote ones
    names = [device.name for device in tf.config.list_logical_devices()]
    return len({name.split("/device:")[0] for name in names if "/job:worker/" in name})


def barrier_fn(strategy: Any, timeout_s: float = BARRIER_TIMEOUT_S) -> Any:
    """A function for worker steps: wait until every worker has arrived in this round.

    ``barrier(present=True)`` is ready once the round is full (or ``timeout_s`` passed); the
    counter lives on a parameter server, so each round holds one step of every worker. A step
    whose data ran out calls ``barrier(present=False)``, which opens it for good.
    ``barrier.timeouts`` counts waits that ran out (a worker starved by a busy machine).
    """
    tf = _tf()
    workers = num_workers_of(strategy)
    with strategy.scope():
        arrived = tf.Variable(0, dtype=tf.int64, name="check_barrier")
        opened = tf.Variable(0, dtype=tf.int64, name="check_barrier_opened")
        timeouts = tf.Variable(0, dtype=tf.int64, name="check_barrier_timeouts")

    def barrier(present: Any = True) -> Any:
        if present is not True:
            opened.assign_add(1 - tf.cast(present, tf.int64))
        ticket = arrived.assign_add(1)
        round_end = ((ticket - 1) // workers + 1) * workers
        deadline = tf.timestamp() + timeout_s

        def waiting(seen: Any) -> Any:
            return ((seen < round_end) & (opened.read_value() == 0)
                    & (tf.timestamp() < deadline))

        seen = tf.while_loop(waiting, lambda seen: [arrived.read_value()], [ticket])[0]
        late = (seen < round_end) & (opened.read_value() == 0)
        with tf.control_dependencies([timeouts.assign_add(tf.cast(late, tf.int64))]):
            return tf.identity(seen)

    barrier.timeouts = timeouts  # type: ignore[attr-defined]
    return barrier


def _overloaded(barrier: Any) -> str:  # the workers never met: a worker starved
    return (f"the check's workers did not meet at its barrier within {BARRIER_TIMEOUT_S:g} s "
            f"({int(barrier.timeouts.numpy())} times, twice in a row): the machine is too busy "
            "to judge this answer; run the check again when it is quieter")


_FINITE = -5  # the cardinality read for a count tf.data cannot tell, below no endless repeat


class NotFromFiles(Exception):
    """A worker's dataset holds no ``TFRecordDataset``: its records were not read there."""


class NotRecords(Exception):
    """A worker's dataset does not yield batches of records (1-D ``tf.string`` tensors)."""


def _reads(strategy: Any, dataset_fn: Any, rounds: int, barrier: Any) -> Any:
    """Run ``rounds`` rounds of one step per worker on ``dataset_fn``'s per-worker datasets.

    Returns ``(batches, cardinalities, error)``: ``batches[w]`` worker ``w``'s batches (lists of
    records, bytes) in order, ``cardinalities`` the set of its datasets' cardinalities as made
    on the workers, ``error`` what ended the job early (None; a ``TimeoutError`` where a worker
    waited out the barrier or gRPC failed between the in-process tasks: run it again).
    """
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers = num_workers_of(strategy)
    timeouts_before = int(barrier.timeouts.numpy())
    made: dict[str, str] = {}  # the elements of a dataset that yields no records

    def probed_fn() -> Any:
        dataset = getattr(dataset_fn, "python_function", dataset_fn)()
        graph = dataset._variant_tensor.graph
        if runs_python(graph):
            raise RunsPython("Python")
        spec = dataset.element_spec
        if not (isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string
                and spec.shape.rank == 1):
            made["spec"] = str(spec)
            raise NotRecords(made["spec"])
        if not any(op.type.startswith("TFRecordDataset") for op in graph_ops(graph)):
            raise NotFromFiles("no TFRecordDataset")
        cardinality = dataset.cardinality()  # on the worker, as made there
        if not endless_steps(dataset):  # a count tf.data cannot tell (-2) is then finite
            cardinality = tf.where(cardinality == tf.data.UNKNOWN_CARDINALITY,
                                   tf.constant(_FINITE, tf.int64), cardinality)
        for asserted in _asserted_infinite(dataset):  # said endless, of a finite input (or
            inner = tf.raw_ops.DatasetCardinality(input_dataset=asserted.inputs[0])  # one of
            said = (inner >= 0 if endless_steps(asserted.inputs[0])  # a count tf.data cannot
                    else inner != tf.data.INFINITE_CARDINALITY)  # tell, not endless by steps)
            cardinality = tf.where(said, tf.constant(ASSERTED, tf.int64), cardinality)
        return dataset.map(lambda records: (records, cardinality))

    try:  # traced here, on the coordinator: what it raises says why (autograph's words aside)
        iterator = iter(coordinator.create_per_worker_dataset(probed_fn))
    except NotRecords as failure:
        raise NotRecords(made.get("spec", "")) from failure

    @tf.function
    def step(iterator: Any) -> Any:
        batch = iterator.get_next_as_optional()  # a worker whose data ran out opens the barrier
        with tf.control_dependencies([barrier(batch.has_value())]):
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            records, cardinality = tf.cond(
                batch.has_value(), lambda: batch.get_value(),
                lambda: (tf.zeros([0], tf.string), tf.constant(-1, tf.int64)))
            return worker, records, cardinality, batch.has_value()

    remotes = [coordinator.schedule(step, args=(iterator,)) for _ in range(rounds * workers)]
    try:
        coordinator.join()
    except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as error:
        return None, None, error
    except tf.errors.OpError as error:
        if "GRPC error" in str(error) and isinstance(
                error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
            return None, None, TimeoutError(f"gRPC failed between the check's tasks: {error}")
        return None, None, error  # the answer's own dataset failed on a worker
    fetched = [remote.fetch() for remote in remotes]
    if not all(bool(has_value) for *_, has_value in fetched):
        return None, None, tf.errors.OutOfRangeError(None, None, "End of sequence")
    if int(barrier.timeouts.numpy()) > timeouts_before:
        return None, None, TimeoutError("a worker waited out the barrier")
    batches: dict[int, list[list[bytes]]] = {}
    for worker, records, _, _ in fetched:  # in the order scheduled: each worker's in order
        batches.setdefault(int(worker), []).append(list(records.tolist()))
    return batches, {int(cardinality) for _, _, cardinality, _ in fetched}, None


def _write_files(root: Path, sizes: list[int], rng: Any) -> tuple[list[str], dict]:
    """TFRecord files of ``sizes`` records, each a fresh random token; the token -> (file,
    place) table."""
    tf = _tf()
    paths, where = [], {}
    for number, size in enumerate(sizes):
        path = str(root / f"part-{number:02d}-{rng.getrandbits(24):06x}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for place in range(size):
                token = f"{rng.getrandbits(48):012x}".encode()
                where[token] = (number, place)
                writer.write(token)
        paths.append(path)
    return paths, where


def _draw_sizes(workers: int, rng: Any) -> list[int]:
    """Sizes of ``3 * workers`` files, ``workers`` of them large, placed so that the files dealt
    by index (``i % workers``) and in blocks of three (``i // 3``) both give some worker two
    large files and another none: only a split by the sizes evens the shares."""
    while True:
        large = set(rng.sample(range(3 * workers), workers))
        if (len({i % workers for i in large}) < workers
                and len({i // 3 for i in large}) < workers):
            return [rng.randint(38, 45) if i in large else rng.randint(3, 6)
                    for i in range(3 * workers)]


def _set_back(path: str) -> None:  # its access time an hour before its change: relatime
    changed = os.stat(path).st_mtime_ns  # then records the next read
    os.utime(path, ns=(changed - 3600 * 10**9, changed))


def _opened_message(batches: dict, paths: list[str], where: dict, sized_for: int) -> str | None:
    """What to say where a running worker opened a file of the worker that joins later."""
    if len(batches) >= sized_for:
        return None
    yielded = {where[r][0] for per in batches.values() for batch in per for r in batch}
    opened = [f for f, path in enumerate(paths) if f not in yielded and (
        lambda status: status.st_atime_ns >= status.st_mtime_ns)(os.stat(path))]
    if not opened:
        return None
    return (f"files {opened}, the share of the worker that joins later, were opened on the "
            "running workers (their access times moved), though none of their records came "
            "out: does each worker read every file and drop the records of the others' "
            "files? Pick each worker's files before reading them (Dataset.shard's docstring: "
            "this avoids reading every file on every worker)")


def _failed_message(error: Any) -> str | None:
    """What to say of a job that ended early, or None where it did not."""
    tf = _tf()
    if error is None:
        return None
    if isinstance(error, (tf.errors.OutOfRangeError, tf.errors.CancelledError)) or (
            "expected to contain an infinite" in str(error)):
        return (f"the job ended early with {type(error).__name__}: a worker's dataset ran out "
                "before the check's steps; a parameter-server dataset must never run dry "
                "(section 2)")
    said = [line.strip() for line in str(error).splitlines() if line.strip()
            and not line.strip().startswith(("Graph execution", "Detected at", "File ", "[["))]
    return f"a worker's dataset failed: {type(error).__name__}: {(said or [''])[0][:200]}"


def _made_message(failure: Exception) -> str | None:
    """What to say of a ``dataset_fn`` the check could not run on the workers."""
    if isinstance(failure, NotRecords):
        return ("the dataset must yield batches of records as stored in the files (1-D "
                f"tf.string tensors; the step parses them), got elements {failure}")
    if isinstance(failure, NotFromFiles):
        return ("a worker's dataset reads no file (no TFRecordDataset in it): its records were "
                "read elsewhere, here on the coordinator, say, and shipped in its graph. Each "
                "worker must read its own files")
    return unmade_dataset_message(failure)


@register
def check_make_file_dataset_fn(fn: Any, strategy: Any) -> bool:
    """Check ``make_file_dataset_fn(paths, sizes, batch_size, num_workers)``: whole files of its
    own on each worker, shares within one file of each other, read in passes, never dry."""
    rng = fresh_rng()
    workers = num_workers_of(strategy)
    barrier = barrier_fn(strategy)
    root = Path(tempfile.mkdtemp(prefix="lesson04_files_"))

    def case(sized_for: int) -> Case:
        """A job sized for ``sized_for`` workers: the running ones, or one more that joins
        later (its share stays unread), so that only ``num_workers`` tells the shares."""
        sizes = _draw_sizes(sized_for, rng)
        folder = root / f"job{sized_for}"
        folder.mkdir()
        paths, where = _write_files(folder, sizes, rng)
        batch_size = rng.choice([6, 8])
        largest = max(sizes)
        # a passing share holds at most the mean share and one file: 1.5 passes of it or more
        rounds = -(-3 * (sum(sizes) // sized_for + largest) // (2 * batch_size))

        def verify(dataset_fn: Any) -> str | None:
            if not callable(dataset_fn):
                return f"return a dataset_fn (a function), got {dataset_fn!r:.80}"
            for path in paths:  # read since (relatime) where a worker opens it: unread kept
                _set_back(path)
            for _ in range(2):  # again if a busy machine starved a worker past the barrier
                try:
                    batches, cardinalities, error = _reads(strategy, dataset_fn, rounds,
                                                           barrier)
                except Exception as failure:  # Python in it, or a worker could not make it
                    if _made_message(failure) is None:
                        raise
                    return _made_message(failure)
                if not isinstance(error, TimeoutError):
                    break
            else:
                if "gRPC" in str(error):
                    return (f"{str(error)[:300]} (twice: a failure of the check's cluster, "
                            "not of your answer; run the check again)")
                return _overloaded(barrier)
            failed = _failed_message(error)
            if failed:
                return failed
            return _read_message(batches, cardinalities, sizes, where, batch_size, sized_for
                                 ) or _opened_message(batches, paths, where, sized_for)

        late = ("" if sized_for == workers else
                f": {workers} workers running, one more to join later")
        # copies: an answer that rewrites its lists changes no list the check judges with
        return Case(args=(list(paths), list(sizes), batch_size, sized_for), verify=verify,
                    label=f"(files of {sizes} records, batch_size={batch_size}, "
                          f"num_workers={sized_for}{late})")

    try:
        return run_check("make_file_dataset_fn", fn, [case(workers), case(workers + 1)],
                         hint="lesson 04, sections 2 and 3 (a dataset_fn per worker, made "
                              "with experimental_get_current_worker_index(), a tensor; data "
                              "for as many steps as the coordinator runs): which files does "
                              "each worker read, and how many examples do they hold?")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _read_message(batches: dict, cardinalities: set, sizes: list[int], where: dict,
                  batch_size: int, sized_for: int) -> str | None:
    """What differs in what the workers read (None: nothing)."""
    tf = _tf()
    if ASSERTED in cardinalities:
        return ("a worker's dataset is said to be endless (assert_cardinality("
                "INFINITE_CARDINALITY)) over an input that is finite (tf.data counts it) or "
                "that no repeat() without a count makes endless: it runs dry after its "
                "elements. What makes a dataset endless? (section 2)")
    if _FINITE in cardinalities:
        return ("a worker's dataset has a number of batches tf.data cannot tell (-2, after an "
                "interleave or filter, say) and no repeat() without a count that no later step "
                "can end (a take, take_while or filter after it, a zip with a finite dataset): "
                "it runs dry (or waits for ever) after its last repeat, however many steps "
                "remain (section 2)")
    endless = {int(tf.data.INFINITE_CARDINALITY), int(tf.data.UNKNOWN_CARDINALITY)}
    if not cardinalities <= endless:
        return (f"each worker's dataset has {sorted(cardinalities)} batches: it must never run "
                "dry, whatever the number of steps the coordinator runs (section 2)")
    records = [r for per in batches.values() for batch in per for r in batch]
    strange = [r for r in records if r not in where]
    if strange:
        return (f"{len(strange)} of the {len(records)} records read are in none of the files "
                f"(e.g. {strange[0]!r:.40}): yield the records as read, unparsed")
    sizes_read = Counter(len(batch) for per in batches.values() for batch in per)
    if set(sizes_read) != {batch_size}:  # an endless dataset's batches: every one full
        return (f"batches of {dict(sorted(sizes_read.items()))} records (size: count): "
                f"batch_size={batch_size} asked for, every batch (a batch before the repeat() "
                "ends each pass with a short one: lesson 01)")
    read = {w: Counter(where[r] for batch in per for r in batch) for w, per in batches.items()}
    files = {w: sorted({f for f, _ in counts}) for w, counts in read.items()}
    for number, size in enumerate(sizes):
        readers = [w for w in sorted(files) if number in files[w]]
        if len(readers) > 1:
            return (f"file {number} ({size} records) was read by workers {readers}: each file "
                    "must be read by one worker only (Dataset.shard's docstring: shard the "
                    "files before reading them, to avoid reading every file on every worker)")
    shares = {w: sum(sizes[f] for f in files[w]) for w in sorted(files)}
    unread = [f for f in range(len(sizes)) if not any(f in own for own in files.values())]
    if len(shares) == sized_for and unread:
        return (f"files {unread} were never read in the check's steps, at least 1.5 passes of "
                f"each share (the workers read files {files}): every file must be some "
                "worker's, and each worker reads all of its files in every pass")
    if len(shares) < sized_for:  # the worker to join later: the files no one read
        shares[len(shares)] = sum(sizes[f] for f in unread)
    largest, low, high = max(sizes), min(shares.values()), max(shares.values())
    if high - low > largest:
        late = (f" (worker {sized_for - 1}, which joins later: the files no running worker "
                "read)" if len(batches) < sized_for else "")
        return (f"the workers' shares are {shares} examples{late}: {high - low} apart, more than "
                f"the largest file ({largest}). Each worker runs about as many steps (the "
                "coordinator gives a step to whichever worker is free), so the smallest "
                f"share's examples are read about {high / max(low, 1):.1f} times as often as the "
                "largest's. Share the files by their sizes (sizes), not by their number")
    for w in sorted(read):  # every record of its files, read or not
        counts = {(f, place): read[w][(f, place)] for f in files[w] for place in range(sizes[f])}
        few, many = min(counts, key=counts.get), max(counts, key=counts.get)
        if counts[many] - counts[few] > 2:
            return (f"worker {w} read record {many[1]} of file {many[0]} ({sizes[many[0]]} "
                    f"records) {counts[many]} times, record {few[1]} of file {few[0]} "
                    f"({sizes[few[0]]} records) {counts[few]} times: a worker reads its "
                    "examples in passes, each once before any twice. Are its files read at one "
                    "rate each, whatever their sizes, or a pass begun before the last one ended "
                    "(a shuffle of files after the repeat)?")
        if counts[few] == 0:
            return (f"worker {w} read {len(read[w])} distinct records of its files {files[w]} "
                    f"({shares[w]} records) in more than a pass: each file read whole")
    return None
