"""Lesson 05, exercise 1 (buckets: a few static shapes for sequences of any length): the check's
data, its expected batches and what is wrong with one epoch of a learner's pipeline.

Expected: each sequence cut to its first ``max(buckets)`` tokens, put in the smallest bucket
whose length holds it (an empty one in the first), a batch of ``batch`` sequences handed out,
padded with zeros at the end to its bucket's length, as soon as its bucket holds that many (in
the order they came), the rest of each bucket dropped at the end of the epoch
(``expected_batches``: what ``Dataset.group_by_window`` with a ``padded_batch`` of
``drop_remainder=True`` per bucket hands out). The data hold sequences of exactly each bucket's
length and one token longer, an empty one, and one far longer than the largest bucket, each in a
batch kept (``cases``); the dataset holds other sequences of the same kind when it is read
than when the function is called (batches worked out then, from the data reached through the
generator, are named stale), and the Python behind its ops must be the same objects after the
call (``static_batches.python_behind``: a generator swapped in fails). Judged in turn
(``verify``): read when called, the element's structure
and integer dtypes, the Python or outside state its graph runs (``static_batches``), an
epoch that never ends, the traces of a ``jit_compile=True`` step over one epoch (at most one per
bucket: counted, ``experimental_get_tracing_count``), each batch's shape (``batch`` rows, padded
to a bucket's length), each row in the smallest bucket that holds it (the padding share of the
epoch against the expected one named), then the batches one by one: order, labels, rows. In case
2 the long sequence is made, before it is read, one token longer than ``2**20`` and than every
whole number below ``2**24`` the pipeline's graph holds (``static_batches.graph_numbers``): a
bound of the pipeline's own (padding to it, then cutting) meets it. The stream case (case 1) reads
only the first batch of a long stream: a pipeline that copies the data reads most of it first."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import py_function_tokens
from course_utils.grading.checks.static_batches import (
    graph_numbers,
    order_problem,
    python_behind,
    python_problem,
)
from course_utils.grading.framework import Case
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["cases", "expected_batches", "raw_dataset"]

#: A stream longer than any read-ahead: the reference hands out its first batch after a few
#: buckets' worth of examples; a copy of the data, even one put off to the first batch, reads all.
_STREAM = 1_000
#: The long sequence of case 1 is made one token past the largest of this and the whole numbers
#: below ``_LONGEST`` its graph holds (a bound of the pipeline's own).
_FLOOR, _LONGEST = 2**20, 2**24

#: What to do where the batches hold other sequences than expected.
_KEEP = ("keep every sequence, in the order it came, in the smallest bucket that holds it (an "
         "empty one: a row of zeros in the first)")


def raw_dataset(tokens: list[np.ndarray], labels: np.ndarray, read: list[int]) -> Any:
    """The sequences as a dataset; ``read[0]`` counts the examples it has handed out (the list
    ``tokens`` is read when iterated: a sequence changed before then is the one handed out)."""
    tf = _tf()

    def examples() -> Any:
        for pair in zip(tokens, labels, strict=True):
            read[0] += 1
            yield pair

    return tf.data.Dataset.from_generator(
        examples,
        output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))


def _bucket_of(length: int, buckets: list[int]) -> int:
    return next(bucket for bucket in buckets if length <= bucket)


def expected_batches(tokens: list[np.ndarray], labels: np.ndarray, batch: int,
                     buckets: list[int]) -> list[tuple[np.ndarray, np.ndarray, list[int]]]:
    """The batches in the order a bucketing pipeline hands them out: (tokens, labels, the
    indices of their sequences)."""
    longest, waiting, out = max(buckets), {bucket: [] for bucket in buckets}, []
    for index, sequence in enumerate(tokens):
        bucket = _bucket_of(min(len(sequence), longest), buckets)
        waiting[bucket].append(index)
        if len(waiting[bucket]) == batch:
            x = np.zeros((batch, bucket), "int32")
            for row, i in enumerate(waiting[bucket]):
                cut = tokens[i][:longest]
                x[row, :len(cut)] = cut
            out.append((x, labels[waiting[bucket]], waiting[bucket]))
            waiting[bucket] = []
    return out


def _draw(rng: Any, n: int, batch: int, buckets: list[int]
          ) -> tuple[list[np.ndarray], np.ndarray, int]:
    """Fresh sequences of 0 to 1.5 x the largest bucket's tokens (ids up to 2**31 - 1); among
    the first third, two of each bucket's length and one a token longer, an empty one and one of
    2 to 100 times the largest bucket, each in a batch kept, and some left over at the end
    (drawn again until so). Returns the tokens, the labels and the long one's index."""
    longest = max(buckets)
    while True:
        data = np.random.default_rng(rng.randint(0, 2**31 - 1))
        lengths = data.integers(0, longest + longest // 2 + 1, size=n)
        special = [0, *buckets, *buckets, *(bucket + 1 for bucket in buckets),
                   int(data.integers(2 * longest, 100 * longest + 1))]
        at = data.choice(n // 3, size=len(special), replace=False)
        lengths[at] = special
        tokens = [data.integers(1, 2**31, size=length).astype("int32") for length in lengths]
        labels = data.integers(0, 2, size=n).astype("int32")
        kept = {i for _, _, rows in expected_batches(tokens, labels, batch, buckets)
                for i in rows}
        if kept >= set(at.tolist()) and len(kept) < n:  # and a partial batch left
            return tokens, labels, int(at[-1])


def _padding(batches: list[np.ndarray]) -> float:
    return sum(int((x == 0).sum()) for x in batches) / max(sum(x.size for x in batches), 1)


def _shape_problem(got: list[tuple[np.ndarray, np.ndarray]], batch: int,
                   buckets: list[int], traces: int) -> str | None:
    for number, (x, y) in enumerate(got, start=1):
        if x.ndim != 2 or x.shape[0] != batch or y.shape != (batch,):
            return (f"batch {number} has shapes {x.shape} and {y.shape}, expected ({batch}, "
                    f"a bucket's length) and ({batch},): every batch holds batch_size "
                    "sequences (the rest of each bucket is dropped at the end of the epoch)")
    shapes = sorted({x.shape for x, _ in got})
    if traces > len(buckets):
        longest = all(x.shape[1] == (x != 0).sum(axis=1).max() for x, _ in got)
        return (f"a compiled step traced {traces} times over one epoch (once per shape: "
                f"{', '.join(map(str, shapes[:6]))}{' ...' if len(shapes) > 6 else ''}); "
                f"{len(buckets)} buckets allow at most {len(buckets)} shapes: pad each batch "
                f"to exactly its bucket's length ({buckets})"
                + (", not to its longest sequence" if longest else ""))
    for number, (x, _) in enumerate(got, start=1):
        if x.shape[1] not in buckets:
            return (f"batch {number} is padded to {x.shape[1]} tokens, no bucket's length "
                    f"({buckets}): each batch is padded to exactly its bucket's length")
    return None


def _smallest_problem(got: list[tuple[np.ndarray, np.ndarray]], buckets: list[int],
                      expected: list[tuple[np.ndarray, np.ndarray, list[int]]]) -> str | None:
    for number, (x, _) in enumerate(got, start=1):
        smaller = [bucket for bucket in buckets if bucket < x.shape[1]]
        held = (x != 0).sum(axis=1)  # the ids are never 0: a row's real tokens
        if smaller and (held <= smaller[-1]).any():
            row = int(np.argmax(held <= smaller[-1]))
            return (f"batch {number} is padded to {x.shape[1]} tokens, but row {row} holds "
                    f"{held[row]}, which the bucket of length "
                    f"{_bucket_of(int(held[row]), buckets)} holds: each sequence goes to the "
                    "smallest bucket that holds it (your epoch is "
                    f"{_padding([x for x, _ in got]):.0%} padding, the smallest buckets' "
                    f"{_padding([x for x, _, _ in expected]):.0%})")
    return None


def _row(row: np.ndarray) -> str:
    shown = ", ".join(map(str, row[:4].tolist()))
    return f"[{shown}, ... {int(row[-1])}] ({int((row != 0).sum())} tokens)"


def _content_problem(got: list[tuple[np.ndarray, np.ndarray]],
                     expected: list[tuple[np.ndarray, np.ndarray, list[int]]]) -> str | None:
    def rows(batches: Any) -> list[bytes]:
        return sorted(row.tobytes() for x in batches for row in x)

    for number, ((x, y), (ex, ey, _)) in enumerate(zip(got, expected, strict=True), start=1):
        if np.array_equal(x, ex) and np.array_equal(y, ey):
            continue
        if np.array_equal(x, ex):
            return f"batch {number}'s labels differ: each label stays with its sequence"
        if rows(x for x, _ in got) == rows(x for x, _, _ in expected):
            return (f"batch {number} holds other sequences than the batch expected there, "
                    "though the epoch holds the same: hand out each batch as soon as its "
                    "bucket holds batch_size sequences, in the order they came")
        known = {row.tobytes() for other, _, _ in expected for row in other}
        for row, (mine, right) in enumerate(zip(x, ex, strict=True)):
            if mine.tobytes() not in known and right.any():
                return (f"batch {number}, row {row}: got {_row(mine)}, expected "
                        f"{_row(right)} (keep the first max(bucket_lengths) tokens, pad "
                        "with zeros at the end)")
        return f"batch {number} holds other sequences than expected: {_KEEP}"
    return None


def _read_failure(error: BaseException, number: int, note: str = "") -> str:
    said = str(error).strip().splitlines()[0].split("}}")[-1].strip()[:160]
    detail = re.search(r"\[(When pad_to_bucket_boundary[^\]]*)\]", str(error))
    return (f"reading the pipeline failed at batch {number}: {type(error).__name__}: "
            f"{detail.group(1) if detail else said} (some sequences are empty, some of exactly "
            f"a bucket's length or one longer, some longer than the largest bucket{note}: "
            "which step of yours meets one?)")


def verify(got: Any, tokens: list[np.ndarray], labels: np.ndarray, batch: int,
           buckets: list[int], read: list[int], given: set[str], long_at: int | None,
           stale: list[Any] | None = None) -> str | None:
    """What is wrong with the learner's dataset ``got``, or None; ``read[0]`` counts what the
    dataset given handed out, ``given`` holds its ``py_function`` tokens; ``long_at``: the
    sequence to make longer than the pipeline's own bounds before it is read; ``stale``: the
    batches of the sequences the dataset held when the function was called (others since)."""
    tf = _tf()
    if read[0]:
        return (f"your function read {read[0]} examples of the dataset when called: a copy of "
                "the data made in memory, not a pipeline that transforms them as they stream")
    if not isinstance(got, tf.data.Dataset):
        return f"expected a tf.data.Dataset, got {type(got).__name__}"
    specs = tf.nest.flatten(got.element_spec)
    ranks = [spec.shape.rank for spec in specs]
    if ranks != [2, 1]:
        return (f"elements of {len(specs)} tensor(s) of ranks {ranks}, expected (tokens, labels) "
                "of ranks [2, 1]: a batch of rows and their labels")
    if any(spec.dtype not in (tf.int32, tf.int64) for spec in specs):
        return (f"element dtypes are {[spec.dtype.name for spec in specs]}, expected int32 "
                "(int64 passes too): keep the token ids and labels integers")
    problem = python_problem(got, given) or order_problem(got)
    if problem:
        return problem
    note = ""
    if long_at is not None:
        own = max({n for n in graph_numbers(got)[0] if n < _LONGEST} | {_FLOOR})
        tokens[long_at] = np.resize(tokens[long_at], own + 1)  # read when iterated
        note = f"; one made {own + 1} tokens"
    expected = expected_batches(tokens, labels, batch, buckets)
    if got.cardinality() == tf.data.INFINITE_CARDINALITY:
        return (f"your pipeline never ends (it repeats): the check reads one epoch of "
                f"{len(expected)} batches; leave repeat() to the training (section 9)")

    @tf.function(jit_compile=True)  # XLA, as on a TPU: one trace (a program) per shape
    def step(x: Any, y: Any) -> Any:
        return tf.reduce_sum(tf.cast(x, tf.float32)) + tf.cast(tf.reduce_sum(y), tf.float32)

    batches = []
    try:  # one batch more than an epoch: a pipeline that never ends is still answered
        for x, y in got.take(len(expected) + 1):
            step(x, y)
            batches.append((x.numpy(), y.numpy()))
    except (tf.errors.OpError, ValueError, TypeError, AssertionError) as error:
        return _read_failure(error, len(batches) + 1, note)
    if stale and len(batches) == len(stale) and all(
            np.array_equal(x, sx) and np.array_equal(y, sy)
            for (x, y), (sx, sy, _) in zip(batches, stale, strict=True)):
        return ("your batches hold the sequences the dataset held when your function was "
                "called, not those it hands out when the pipeline reads it (the check changed "
                "them in between): batches worked out when called, from a copy of the data, "
                "are not a pipeline that transforms the sequences as they stream (section 3)")
    problem = (_shape_problem(batches, batch, buckets, step.experimental_get_tracing_count())
               or _smallest_problem(batches, buckets, expected))
    if problem:
        return problem
    if len(batches) != len(expected):
        count = f"more than {len(expected)}" if len(batches) > len(expected) else len(batches)
        return (f"the epoch has {count} batches, expected {len(expected)} (each bucket's "
                f"full batches): {_KEEP}")
    if read[0] < len(batches) * batch:
        return (f"your {len(batches)} batches hold {len(batches) * batch} sequences, but only "
                f"{read[0]} were read from the dataset given: where do the others come from?")
    return _content_problem(batches, expected)


def _stream_case(rng: Any, buckets: list[int]) -> Case:
    """A long dataset of which only the first batch is read: what had been read by then? (What
    the batch holds is the next cases' to judge.)"""
    tf = _tf()
    batch = rng.choice([4, 8])
    tokens, labels, _ = _draw(rng, _STREAM, batch, buckets)
    read = [0]

    def check(got: Any) -> str | None:
        if read[0]:
            return (f"your function read {read[0]} examples of the dataset when called: a copy "
                    "of the data made in memory, not a pipeline")
        if not isinstance(got, tf.data.Dataset):
            return f"expected a tf.data.Dataset, got {type(got).__name__}"
        try:
            x, y = next(iter(got))
        except Exception as error:  # noqa: BLE001 - the learner's to see
            return _read_failure(error, 1)
        ahead = read[0]  # what the batch holds: judged by the next cases
        if ahead >= _STREAM // 2:
            return (f"your pipeline read {ahead} of {_STREAM} examples before it handed out "
                    f"its first batch of {batch}: it copies the data, not transforms the "
                    "sequences as they stream (section 3)")
        return None

    return Case(args=(raw_dataset(tokens, labels, read), batch, list(buckets)), verify=check,
                label=f"(a stream of {_STREAM} sequences, batch_size={batch}, "
                      f"bucket_lengths={buckets}: its first batch)")


def cases(rng: Any) -> list[Case]:
    """The stream case, then two epochs judged whole (3, then 2 or 4 buckets of fresh
    lengths)."""
    made = [_stream_case(rng, sorted(rng.sample(range(4, 30, 4), 3)))]
    for index, count in enumerate((3, rng.choice([2, 4]))):
        batch = rng.choice([4, 8])
        buckets = sorted(rng.sample(range(3, 40, 3), count))  # at least 3 apart
        buckets = [bucket + rng.randint(0, 1) for bucket in buckets]
        n = batch * count * rng.randint(6, 8)
        # the dataset holds these when the function is called, the later ones when it is
        # read: batches worked out when called (from the data reached some other way) are stale
        tokens, labels, _ = _draw(rng, n, batch, buckets)
        later, later_labels, long_at = _draw(rng, n, batch, buckets)
        read = [0]
        given = raw_dataset(tokens, labels, read)
        reads = py_function_tokens(given)  # the ops of its generator: what reads it
        behind = python_behind(given)

        def check(got: Any, tokens: Any = tokens, labels: Any = labels, batch: int = batch,
                  buckets: list[int] = buckets, read: list[int] = read, reads: set[str] = reads,
                  long_at: int | None = long_at if index == 0 else None, given: Any = given,
                  behind: list[Any] = behind, later: Any = later,
                  later_labels: Any = later_labels) -> str | None:
            now = python_behind(given)
            if len(now) != len(behind) or any(
                    a is not b for a, b in zip(now, behind, strict=True)):
                return ("your function changed the Python behind the dataset given (its "
                        "generator, or what it reads): transform `dataset` with tf.data steps, "
                        "leave it as it is (section 3)")
            stale = expected_batches(tokens, labels, batch, buckets)
            tokens[:], labels[:] = later, later_labels  # read when iterated
            return verify(got, tokens, labels, batch, buckets, read, reads, long_at, stale)

        made.append(Case(args=(given, batch, list(buckets)), verify=check, label=(
            f"({n} sequences of 0 to {max(buckets) * 3 // 2} tokens, among them each bucket's "
            f"length and one more, an empty one and one of "
            + ("at least 1048577 tokens (past 2**20 and every number below 2**24 your graph "
               "holds)" if index == 0 else f"{len(later[long_at])} tokens")
            + f", batch_size={batch}, bucket_lengths={buckets})")))
    return made
