"""Lesson 05's checks: reference passes, wrong answers fail with a reason, stubs wait."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_05, settings_rules
from course_utils.grading.checks.batch_shapes import py_function_tokens
from course_utils.grading.framework import NotAttemptedError, strict_checks

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from catalogue_routes import catalogue_params  # noqa: E402

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def tpu_settings(replicas, max_global_batch, host_overhead_ms, step_ms, max_overhead_fraction,
                 num_examples):
    largest = max_global_batch // replicas
    if largest < 1:
        raise ValueError("not one example a replica")
    per_replica = next(largest // tile * tile for tile in (128, 8, 1) if largest >= tile)
    steps = num_examples // (per_replica * replicas)
    n = 1  # a learner's loop: the fewest steps a call that share the round-trip enough
    while host_overhead_ms / n > max_overhead_fraction * step_ms:
        n += 1
    return per_replica, max(1, min(n, steps))


def stub(*args):
    raise NotImplementedError()


def test_lesson_05_registers_its_checks():
    for name in ("check_make_bucketed", "check_tpu_settings", "check_train_steps"):
        assert getattr(cu.grading, name) is getattr(lesson_05, name)


# --- Exercise 1 · buckets ------------------------------------------------------------------------


def _tf():
    import tensorflow as tf

    return tf


def make_bucketed(dataset, batch_size, bucket_lengths):  # the solution's
    tf = _tf()
    longest = max(bucket_lengths)
    return dataset.map(lambda x, y: (x[:longest], y)).bucket_by_sequence_length(
        lambda x, y: tf.shape(x)[0], [length + 1 for length in bucket_lengths],
        [batch_size] * (len(bucket_lengths) + 1), pad_to_bucket_boundary=True,
        drop_remainder=True)


def _grouped(bucket_of, pads=None, cut=True):
    """Bucketing written with group_by_window: ``bucket_of(lengths, n)`` a length's bucket,
    each group batched by ``pads(group, batch_size, length)``, else a padded_batch to its
    bucket's length."""
    def answer(dataset, batch_size, bucket_lengths):
        tf = _tf()
        lengths = tf.constant(bucket_lengths, tf.int64)
        longest = max(bucket_lengths)

        def reduce(bucket, group):
            if pads is not None:
                return pads(group, batch_size, lengths[bucket])
            return group.padded_batch(batch_size, padded_shapes=([lengths[bucket]], []),
                                      drop_remainder=True)

        source = dataset.map(lambda x, y: (x[:longest], y)) if cut else dataset
        return source.group_by_window(
            lambda x, y: bucket_of(lengths, tf.minimum(tf.size(x, tf.int64), longest)),
            reduce, window_size=batch_size)

    return answer


def _smallest(lengths, n):
    return _tf().searchsorted(lengths, [n], out_type="int64")[0]


def _next_on_a_tie(lengths, n):  # a sequence of exactly a bucket's length goes one bucket up
    tf = _tf()
    return tf.minimum(tf.searchsorted(lengths, [n], side="right", out_type=tf.int64)[0],
                      tf.size(lengths, tf.int64) - 1)


def _the_lessons_cell(dataset, batch_size, bucket_lengths):  # section 3: one length for all
    longest = max(bucket_lengths)
    return dataset.map(lambda x, y: (x[:longest], y)).padded_batch(
        batch_size, padded_shapes=([longest], []), drop_remainder=True)


def _bucketed(boundaries=lambda lengths: [n + 1 for n in lengths], cut=True, **options):
    """tf.data's bucket_by_sequence_length, with the boundaries and options given."""
    def answer(dataset, batch_size, bucket_lengths):
        tf = _tf()
        longest = max(bucket_lengths)
        source = dataset.map(lambda x, y: (x[:longest], y)) if cut else dataset
        given = boundaries(bucket_lengths)
        return source.bucket_by_sequence_length(
            lambda x, y: tf.shape(x)[0], given, [batch_size] * (len(given) + 1), **options)

    return answer


def _each_bucket_in_turn(dataset, batch_size, bucket_lengths):
    """Each bucket filtered out of the dataset and batched, one after the other."""
    tf = _tf()
    longest, low, parts = max(bucket_lengths), -1, []
    cut = dataset.map(lambda x, y: (x[:longest], y))
    for n in bucket_lengths:
        parts.append(cut.filter(lambda x, y, low=low, n=n: (tf.size(x) > low) & (tf.size(x) <= n))
                     .padded_batch(batch_size, padded_shapes=([n], []), drop_remainder=True))
        low = n
    for part in parts[1:]:
        parts[0] = parts[0].concatenate(part)
    return parts[0]


def _padded_at_the_front(group, batch_size, length):
    tf = _tf()
    return group.map(lambda x, y: (tf.pad(x, [[length - tf.size(x, tf.int64), 0]]), y)).batch(
        batch_size, drop_remainder=True)


def _padded_to_a_bound_then_cut(group, batch_size, length):  # 100 x: past most sequences
    return group.padded_batch(batch_size, padded_shapes=([1000], []), drop_remainder=True).map(
        lambda x, y: (x[:, :length], y))


def _then(step):
    return lambda *args: step(make_bucketed(*args))


def _copied_into_memory(dataset, batch_size, bucket_lengths):
    tf = _tf()
    pairs = list(dataset.as_numpy_iterator())
    return make_bucketed(tf.data.Dataset.from_generator(
        lambda: iter(pairs), output_signature=dataset.element_spec), batch_size, bucket_lengths)


def _ragged_whole(dataset, batch_size, bucket_lengths):  # the whole dataset, then unbatched
    return make_bucketed(dataset.ragged_batch(10**6).unbatch(), batch_size, bucket_lengths)


def _in_python(dataset, batch_size, bucket_lengths):
    """Bucketed by a Python generator that reads the examples as they stream."""
    import numpy as np

    tf = _tf()

    def batches():
        waiting = {n: [] for n in bucket_lengths}
        for tokens, label in dataset.as_numpy_iterator():
            tokens = tokens[:max(bucket_lengths)]
            n = next(n for n in bucket_lengths if len(tokens) <= n)
            waiting[n].append((np.pad(tokens, (0, n - len(tokens))), label))
            if len(waiting[n]) == batch_size:
                yield np.stack([x for x, _ in waiting[n]]), np.array([y for _, y in waiting[n]])
                waiting[n] = []

    return tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec([batch_size, None], tf.int32), tf.TensorSpec([batch_size], tf.int32)))


def _the_generator_behind_the_given_dataset(dataset, batch_size, bucket_lengths):
    start = make_bucketed(dataset, batch_size, bucket_lengths).take(0)  # the given, unread
    return start.concatenate(_in_python(dataset, batch_size, bucket_lengths))


def _cut_in_a_py_function(dataset, batch_size, bucket_lengths):
    tf = _tf()
    longest = max(bucket_lengths)

    def cut(tokens, label):
        return tf.py_function(lambda t: t[:longest], [tokens], tf.int32), label

    return _bucketed(cut=False, pad_to_bucket_boundary=True, drop_remainder=True)(
        dataset.map(cut).map(lambda x, y: (tf.ensure_shape(x, [None]), y)), batch_size,
        bucket_lengths)


def _an_iterator_of_a_python_pipeline(dataset, batch_size, bucket_lengths):
    """The generator's batches pulled through an iterator made outside the returned pipeline:
    its graph shows only the iterator's get_next."""
    tf = _tf()
    inner = iter(_in_python(dataset, batch_size, bucket_lengths))

    def pull(_):
        got = inner.get_next_as_optional()
        empty = (tf.zeros([batch_size, 1], tf.int32), tf.zeros([batch_size], tf.int32))
        x, y = tf.cond(got.has_value(), got.get_value, lambda: empty)
        return x, y, got.has_value()

    start = make_bucketed(dataset, batch_size, bucket_lengths).take(0)
    return start.concatenate(tf.data.Dataset.range(2**62).map(pull).take_while(
        lambda x, y, more: more).map(lambda x, y, more: (x, y)))


def _the_checks_batches(dataset, batch_size, bucket_lengths):
    """The check's own expected batches, from the sequences read in a generator."""
    import numpy as np

    from course_utils.grading.checks import bucket_batches

    tf = _tf()
    pairs = list(dataset.as_numpy_iterator())
    made = bucket_batches.expected_batches([x for x, _ in pairs], np.array([y for _, y in pairs]),
                                           batch_size, bucket_lengths)
    return tf.data.Dataset.from_generator(lambda: ((x, y) for x, y, _ in made), output_signature=(
        tf.TensorSpec([batch_size, None], tf.int32), tf.TensorSpec([batch_size], tf.int32)))


#: Names built at run time: the source scan of frame and closure readers cannot read them.
_CLOSURE, _CELL = "".join(["__clo", "sure__"]), "".join(["cell_", "contents"])


def _generator_state(dataset):
    """The given dataset's generator state (xf05 L1-L3): a learner's walk from its graph's
    py_function tokens through TensorFlow's registry and the functions' closures."""
    from tensorflow.python.ops import script_ops

    def walk(value, depth):
        for cell in (getattr(value, _CLOSURE, None) or ()) if depth < 5 else ():
            inner = getattr(cell, _CELL)
            if getattr(inner, "_generator", None) is not None:
                return inner
            found = walk(inner, depth + 1) if callable(inner) else None
            if found is not None:
                return found
        return None

    for token in sorted(py_function_tokens(dataset)):
        found = walk(script_ops._py_funcs.get(token), 0)
        if found is not None:
            return found
    raise LookupError("no generator")


def _generator_cells(dataset):  # the check's tokens list, labels and read counter
    generator = _generator_state(dataset)._generator
    return dict(zip(generator.__code__.co_freevars,
                    (getattr(cell, _CELL) for cell in getattr(generator, _CLOSURE)), strict=True))


def _bucketed_in_numpy(tokens, labels, batch_size, bucket_lengths):
    """A learner's own bucketing in Python: the batches, in the order they fill."""
    import numpy as np

    longest, waiting, out = max(bucket_lengths), {n: [] for n in bucket_lengths}, []
    for tokens_, label in zip(tokens, labels, strict=True):
        cut = tokens_[:longest]
        n = next(n for n in bucket_lengths if len(cut) <= n)
        waiting[n].append((np.pad(cut, (0, n - len(cut))), label))
        if len(waiting[n]) == batch_size:
            out.append((np.stack([x for x, _ in waiting[n]]),
                        np.array([y for _, y in waiting[n]], "int32")))
            waiting[n] = []
    return out


def _served_beside_the_given(dataset, batch_size, made):
    """Batches worked out when called, served as constants zipped with the given dataset's
    labels in batches: its reads are counted as they stream."""
    tf = _tf()
    served = tf.data.Dataset.from_tensors(made[0])
    for batch in made[1:]:
        served = served.concatenate(tf.data.Dataset.from_tensors(batch))
    return tf.data.Dataset.zip(dataset.map(lambda x, y: y).batch(batch_size), served).map(
        lambda _, batch: batch)


def _bucketed_from_the_generators_list(dataset, batch_size, bucket_lengths):
    cells = _generator_cells(dataset)  # read without reading the dataset: no count
    return _served_beside_the_given(dataset, batch_size, _bucketed_in_numpy(
        list(cells["tokens"]), cells["labels"], batch_size, bucket_lengths))


def _read_then_the_count_reset(dataset, batch_size, bucket_lengths):
    pairs = list(dataset.as_numpy_iterator())
    _generator_cells(dataset)["read"][0] = 0
    return _served_beside_the_given(dataset, batch_size, _bucketed_in_numpy(
        [x for x, _ in pairs], [y for _, y in pairs], batch_size, bucket_lengths))


def _a_generator_of_its_own_behind_the_given_ops(dataset, batch_size, bucket_lengths):
    """The given dataset's generator swapped for one that hands out the sequences bucketed
    and padded in batch order, read from the check's list as it streams: tf.data batches."""
    import numpy as np

    state, cells = _generator_state(dataset), _generator_cells(dataset)

    def bucketed():
        read = cells["read"]
        for x, y in _bucketed_in_numpy(cells["tokens"], cells["labels"], batch_size,
                                       bucket_lengths):
            read[0] += batch_size
            yield from zip(x, np.asarray(y), strict=True)

    state._generator = bucketed
    return dataset.batch(batch_size, drop_remainder=True)


# the words each rejection's verdict must contain; answers that share them reach one rejection
# by different routes (make test runs the first of each, make test-grading all)
SMALLEST = r"case [23] .*which the bucket of length \d+ holds: each sequence goes to the smallest"
TRACES = r"case [23] .*a compiled step traced \d+ times over one epoch \(once per shape"
NO_BUCKET = r"case [23] .*no bucket's length"
MEETS = r"case \d .*reading the pipeline failed at batch \d+: .*which step of yours meets one"
ORDER = r"case [23] .*though the epoch holds the same: hand out each batch as soon as its bucket"
PYTHON = r"case [23] .*calls Python"
GIVEN = r"case [23] .*not made from the one given"
STALE = r"case [23] .*hold the sequences the dataset held when your function was called"
MAKE_BUCKETED_CATALOGUE = {
    "group_by_window, searchsorted": (_grouped(_smallest), "PASS"),
    # the lesson's cell, copied: every batch padded to the largest bucket
    "the lesson's cell": (_the_lessons_cell, SMALLEST),
    "a tie goes one bucket up": (_grouped(_next_on_a_tie), SMALLEST),
    "padded to the longest in each batch": (_bucketed(drop_remainder=True), TRACES),
    "the bucket lengths and a catch-all as boundaries": (
        _bucketed(boundaries=lambda lengths: [*lengths, 10**6], pad_to_bucket_boundary=True,
                  drop_remainder=True), TRACES),
    "the bucket lengths as boundaries": (
        _bucketed(boundaries=lambda lengths: lengths, pad_to_bucket_boundary=True,
                  drop_remainder=True), MEETS),
    "not cut first": (_bucketed(cut=False, pad_to_bucket_boundary=True, drop_remainder=True),
                      MEETS),
    "padded to a bound of its own, then cut": (_grouped(_smallest, _padded_to_a_bound_then_cut,
                                                        cut=False), MEETS),
    "bucket lengths typed": (lambda d, b, lengths: make_bucketed(d, b, [8, 16, 32]), NO_BUCKET),
    "partial batches kept": (_bucketed(pad_to_bucket_boundary=True),
                             r"case [23] .*has shapes \(\d+, \d+\) and \(\d+,\), expected"),
    "each bucket in turn": (_each_bucket_in_turn, ORDER),
    "batches shuffled": (_then(lambda d: d.shuffle(4, seed=1)), ORDER),
    "padded at the front": (_grouped(_smallest, _padded_at_the_front),
                            r"case [23] .*row \d+: got .*pad with zeros at the end"),
    "empty sequences filtered": (lambda d, *a: make_bucketed(
        d.filter(lambda x, y: _tf().size(x) > 0), *a), "case [23] .*keep every sequence"),
    "labels dropped": (_then(lambda d: d.map(lambda x, y: (x, y * 0))),
                       "case [23] .*labels differ: each label stays with its sequence"),
    "tokens as floats": (_then(lambda d: d.map(lambda x, y: (_tf().cast(x, "float32"), y))),
                         r"case [23] .*element dtypes are \['float32', 'int32'\]"),
    "endless": (_then(lambda d: d.repeat()), "case [23] .*never ends"),
    "a constant": (lambda *args: _tf().data.Dataset.from_tensors(([[0]], [0])), GIVEN),
    "bucketed in a Python generator": (_in_python, GIVEN),
    "the generator behind the given dataset": (_the_generator_behind_the_given_dataset, PYTHON),
    "cut in a py_function": (_cut_in_a_py_function, PYTHON),
    "an iterator of a Python pipeline": (_an_iterator_of_a_python_pipeline,
                                         "case [23] .*reads state made outside it"),
    "copied into memory when called": (_copied_into_memory,
                                       r"case 1 .*read \d+ examples of the dataset when called"),
    "the whole dataset as one ragged batch": (_ragged_whole, "case 1 .*before it handed out"),
    "the check's expected batches": (_the_checks_batches, "ran the course's expected_batches"),
    # xf05 L1-L3: the check's data reached through the generator's closure
    "batches worked out from the generator's list when called": (
        _bucketed_from_the_generators_list, STALE),
    "read when called, the count reset": (_read_then_the_count_reset, STALE),
    "a generator of its own behind the given ops": (
        _a_generator_of_its_own_behind_the_given_ops,
        "case [23] .*changed the Python behind the dataset given"),
}


def _judged_as_catalogued(check, answer, says: str) -> None:
    """A catalogue's answer: "PASS" passes ``check``; any other verdict is its message."""
    if says == "PASS":
        assert check(answer) is True
        return
    with pytest.raises(AssertionError, match=says):
        check(answer)


@pytest.mark.solution_passes
def test_the_bucketing_solution_passes():
    assert cu.grading.check_make_bucketed(make_bucketed) is True


@pytest.mark.parametrize(("answer", "says"), catalogue_params(MAKE_BUCKETED_CATALOGUE))
def test_make_bucketed_catalogue(answer, says):
    _judged_as_catalogued(cu.grading.check_make_bucketed, answer,
                          "PASS" if says == "PASS" else f"make_bucketed: .*{says}")


def test_the_reference_settings_pass():
    assert cu.grading.check_tpu_settings(tpu_settings) is True


def test_settings_ignoring_the_replicas_fail_with_the_hint():
    def global_batch(replicas, max_global_batch, *rest):
        return tpu_settings(1, max_global_batch, *rest)

    with pytest.raises(AssertionError, match="multiple of 128"):
        cu.grading.check_tpu_settings(global_batch)


def test_settings_without_the_epoch_cap_fail():
    def uncapped(replicas, max_global_batch, host_overhead_ms, step_ms, fraction, n):
        per_replica, _ = tpu_settings(replicas, max_global_batch, host_overhead_ms, step_ms,
                                      fraction, n)
        return per_replica, math.ceil(host_overhead_ms / (fraction * step_ms))

    with pytest.raises(AssertionError, match=r"steps_per_execution \d+ is more than the "
                                             "steps of one epoch"):
        cu.grading.check_tpu_settings(uncapped)


def test_the_course_has_no_answer_to_import():
    """The package is installed for learners: no reference answer in the check's modules."""
    assert not [name for name in dir(lesson_05) + dir(settings_rules) if "reference" in name]


V5E_8 = (8, 4096, 2.0, 0.5, 0.15, 1_000_000)  # (512, 27): 2 ms / 27 <= 0.075 ms < 2 ms / 26
SMALL = (8, 40, 1.0, 2.0, 0.3, 10_000)  # (5, 2): fewer than 8 examples a replica
SHORT = (4, 4 * 256, 5.0, 0.1, 0.03, 4 * 256 * 3)  # (256, 3): capped at the epoch's steps
EMPTY = (8, 1024, 1.0, 1.0, 0.3, 500)  # (128, 1): not one whole step an epoch


@pytest.mark.parametrize(("args", "right"), [
    (V5E_8, (512, 27)), ((1, 100, 1.0, 3.0, 0.05, 10_000), (96, 7)), (SMALL, (5, 2)),
    (SHORT, (256, 3)), (EMPTY, (128, 1))])
def test_the_settings_rules_accept_the_right_pair(args, right):
    assert tpu_settings(*args) == right  # the tests' answer agrees with the worked pairs
    assert settings_rules.settings_problem(args, right) is None


@pytest.mark.parametrize(("args", "got", "message"), [
    (V5E_8, 5, r"expected a pair \(per_replica_batch, steps_per_execution\), got int"),
    (V5E_8, (512.0, 27), r"per_replica_batch \(result\[0\]\) should be an int, got the float"),
    (V5E_8, (0, 27), r"per_replica_batch \(result\[0\]\) is 0: it is never fewer than 1"),
    (V5E_8, (640, 27), "x 8 replicas = 5120, is more than max_global_batch=4096"),
    (V5E_8, (504, 27), "a tile of 128 fits every replica .* must be a multiple of 128: 504"),
    (V5E_8, (384, 27), "not as many as the global batch allows: one more tile, 512 a replica"),
    (SMALL, (4, 2), "not as many as the global batch allows: one more tile, 5 a replica"),
    ((8, 100, 1.0, 2.0, 0.3, 10_000), (12, 2), "a tile of 8 fits every replica .* of 8: 12"),
    (V5E_8, (512, 0), r"steps_per_execution \(result\[1\]\) is 0: it is never fewer than 1"),
    (SHORT, (256, 4), "more than the steps of one epoch: .* 1024 .* has 3 steps$"),
    (EMPTY, (128, 2), "has 0 steps, and never fewer than 1"),
    (V5E_8, (512, 28), "28 is not the fewest: 27 steps a call already share the 2.0 ms"),
    (V5E_8, (512, 26), "26 shares the 2.0 ms round-trip down to 0.0769231 ms a step only, "
                       r"more than the accepted 0.15 x 0.5 ms = 0.075 ms, .* more steps a call"),
], ids=["not-a-pair", "float", "zero-batch", "over-the-global-batch", "not-whole-tiles-of-128",
        "one-more-tile-fits", "one-more-example-fits", "not-whole-tiles-of-8", "zero-steps",
        "over-the-epoch", "over-an-empty-epoch", "not-the-fewest", "too-few-steps"])
def test_the_settings_rules_name_the_rule_each_wrong_pair_breaks(args, got, message):
    problem = settings_rules.settings_problem(args, got)
    assert problem is not None and re.search(message, problem), problem


@pytest.mark.parametrize(("got", "message"), [
    ((384, 27), "not as many as the global batch allows"),
    ((512, 26), "more steps a call fit")])
def test_the_check_names_the_rule_and_the_case(got, message):
    """The check's own failure: the case and the broken rule (a fixed v5e-8, case 1)."""
    def answer(*args):
        return got if args == V5E_8 else tpu_settings(*args)

    with pytest.raises(AssertionError, match=rf"case 1 \(8, 4096, 2.0, 0.5, 0.15, 1000000\): "
                                             rf".*{message}"):
        cu.grading.check_tpu_settings(answer)


def test_the_settings_rules_agree_with_a_learners_answer_on_random_tpus():
    """Over random described TPUs off the overhead boundary, the verifier accepts the tests'
    answer and refuses every neighbour of it (one example, one tile, one step either way)."""
    import random

    rng, seen = random.Random(5), 0
    while seen < 2000:
        replicas = rng.choice([1, 2, 4, 8, 16])
        args = (replicas, rng.randint(replicas, replicas * 1500), rng.choice([0.5, 2.0, 5.0]),
                rng.choice([0.2, 1.0, 3.0]), rng.choice([0.02, 0.05, 0.3]),
                rng.randint(1, 2_000_000))
        if settings_rules.on_a_boundary(*args[2:5]):
            continue
        seen += 1
        batch, steps = tpu_settings(*args)
        assert settings_rules.settings_problem(args, (batch, steps)) is None, args
        for other in [(batch + d, steps) for d in (-128, -8, -1, 1, 8, 128)] + [
                (batch, steps + d) for d in (-1, 1)]:
            if min(other) >= 1:
                assert settings_rules.settings_problem(args, other), (args, other)


def test_settings_that_divide_by_zero_below_eight_examples_a_replica_fail():
    def tiles_only(replicas, max_global_batch, *rest):
        largest = max_global_batch // replicas
        per_replica = largest // 128 * 128 or largest // 8 * 8
        if per_replica == 0:
            raise ZeroDivisionError("integer division or modulo by zero")
        return tpu_settings(replicas, max_global_batch, *rest)

    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        cu.grading.check_tpu_settings(tiles_only)


def test_settings_that_never_refuse_fail():
    def returns_zero(replicas, max_global_batch, *rest):
        if max_global_batch < replicas:
            return 0, 1
        return tpu_settings(replicas, max_global_batch, *rest)

    with pytest.raises(AssertionError, match="expected ValueError"):
        cu.grading.check_tpu_settings(returns_zero)


def test_constant_settings_fail():
    with pytest.raises(AssertionError):
        cu.grading.check_tpu_settings(lambda *args: (128, 1))


@pytest.mark.parametrize("name", ["check_make_bucketed", "check_tpu_settings",
                                  "check_train_steps"])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(name, capsys):
    check = getattr(cu.grading, name)
    assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)


def test_settings_with_the_global_batch_per_replica_fail():
    def global_is_per_replica(replicas, max_global_batch, *rest):
        per_replica, steps = tpu_settings(1, max_global_batch, *rest)
        return per_replica, steps

    with pytest.raises(AssertionError):
        cu.grading.check_tpu_settings(global_is_per_replica)


def _steps_rule(host_overhead_ms, step_ms, fraction):
    return math.ceil(host_overhead_ms / (fraction * step_ms))


def _epoch_of_the_largest_batch(replicas, max_global_batch, host, step, fraction, n):
    per_replica, _ = tpu_settings(replicas, max_global_batch, host, step, fraction, n)
    return per_replica, max(1, min(_steps_rule(host, step, fraction), n // max_global_batch))


def _tiles_of_the_global_batch(replicas, max_global_batch, host, step, fraction, n):
    if max_global_batch < replicas:
        raise ValueError("not one example a replica")
    tile = next(size for size in (128, 8, 1) if max_global_batch >= size)
    per_replica = max_global_batch // tile * tile // replicas
    return per_replica, max(1, min(_steps_rule(host, step, fraction),
                                   n // (per_replica * replicas)))


def _zero_steps_when_the_epoch_is_short(replicas, max_global_batch, host, step, fraction, n):
    per_replica, _ = tpu_settings(replicas, max_global_batch, host, step, fraction, n)
    return per_replica, min(_steps_rule(host, step, fraction), n // (per_replica * replicas))


def _fewest_steps_rounded_down(replicas, max_global_batch, host, step, fraction, n):
    per_replica, _ = tpu_settings(replicas, max_global_batch, host, step, fraction, n)
    steps = max(1, math.floor(host / (fraction * step)))
    return per_replica, max(1, min(steps, n // (per_replica * replicas)))


def _one_step_too_many_on_the_boundary(replicas, max_global_batch, host, step, fraction, n):
    per_replica, _ = tpu_settings(replicas, max_global_batch, host, step, fraction, n)
    steps = int(host / (fraction * step)) + 1  # right between boundaries, one too many on one
    return per_replica, max(1, min(steps, n // (per_replica * replicas)))


@pytest.mark.parametrize(("answer", "case"), [
    (_one_step_too_many_on_the_boundary,
     r"\(8, 4096, 1.0, 0.5, 0.25, 1000000\): steps_per_execution 9 is not the fewest"),
    (_epoch_of_the_largest_batch,
     r"\(4, 1200, 5.0, 0.1, 0.03, 5220\): steps_per_execution 4 shares .* has 5 steps"),
    (_tiles_of_the_global_batch,
     r"\(8, 80, 1.0, 1.0, 0.3, 10000\): a tile of 8 fits every replica .* 10 is not"),
    (_zero_steps_when_the_epoch_is_short,
     r"\(8, 1024, 1.0, 1.0, 0.3, 500\): steps_per_execution \(result\[1\]\) is 0"),
    (_fewest_steps_rounded_down, r"steps_per_execution \d+ shares .* more steps a call fit"),
])
def test_settings_breaking_one_rule_each_fail_on_the_case_that_shows_it(answer, case):
    with pytest.raises(AssertionError, match=case):
        cu.grading.check_tpu_settings(answer)


def _settings_with(problem):
    """A learner's answer that asks ``problem`` (the check's verifier, or a copy of it) about
    a pair before answering: entering the check's rules is what is refused."""
    def answer(*args):
        problem(args, (1, 1))
        return tpu_settings(*args)

    return answer


def _exec_copy_of_the_verifier():
    """The verifier's module run again from its source, as a learner could: new code objects
    with the same content."""
    import inspect

    namespace = {"__name__": "pasted"}
    exec(compile(inspect.getsource(settings_rules), "<pasted>", "exec"), namespace)  # noqa: S102
    return namespace["settings_problem"]


def _in_a_thread(*args):
    """The verifier run in a thread the answer starts: the guard follows new threads."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(settings_rules.settings_problem, args, (1, 1)).result()
    return tpu_settings(*args)


@pytest.mark.parametrize("answer", [
    _settings_with(lambda *a: settings_rules.settings_problem(*a)),  # imported from the check
    _settings_with(lambda *a: _exec_copy_of_the_verifier()(*a)),
    _in_a_thread,
])
def test_the_settings_verifier_reached_from_the_check_module_fails(answer):
    with pytest.raises(AssertionError, match="ran the course's settings_problem"):
        cu.grading.check_tpu_settings(answer)


#: What a failing case says of its long sequence where no number of the pipeline's graph
#: reaches the check's floor: it was made 2**20 + 1 tokens before it was read.


def test_a_removed_profiler_fails_the_settings():
    def removes(*args):
        import sys

        getattr(sys, "set" + "profile")(None)  # a name the source scan cannot read
        return tpu_settings(*args)

    with pytest.raises(AssertionError, match="removed the check's profiler"):
        cu.grading.check_tpu_settings(removes)


def test_settings_found_when_the_check_reads_them_fail():
    # nb32-0508 L05 ex2 later: objects whose __index__, run by the check after the answer
    # returned (nothing refused then), drove the check's own rules as a search, passed
    class Later:
        def __init__(self, args, which, pair):
            self.args, self.which, self.pair = args, which, pair

        def __index__(self):
            a, rules = self.args, settings_rules
            if self.which == 0:
                return next(b for b in range(1, a[1] + 1)
                            if rules._batch_problem(a[0], a[1], b) is None)
            b = self.pair[0].__index__()
            return next(s for s in range(1, 10**7)
                        if rules._steps_problem(a, b, s) is None)

    def tpu_settings(*args):
        if args[1] < args[0]:
            raise ValueError("not one example a replica")
        pair = []
        pair += [Later(args, 0, pair), Later(args, 1, pair)]
        return tuple(pair)

    with pytest.raises(AssertionError, match=r"per_replica_batch \(result\[0\]\) should be "
                       "an int, got Later"):
        cu.grading.check_tpu_settings(tpu_settings)


# --- Exercise 3 · a padded-token loss under any strategy ----------------------------------------
# Each answer is a replica loss (model, x, y, global_batch_size) put into the same training
# function, or a whole make_train_steps. A check call trains the answer (up to twice) and one
# device's reference once, about a second each here.


def _per_token(model, x, y):
    import keras

    return keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                        from_logits=True)


def _real(x, dtype="float32"):
    import tensorflow as tf

    return tf.cast(x != 0, dtype)


def _train_steps_with(replica_loss):
    """make_train_steps with ``replica_loss`` in section 9's training function."""
    import tensorflow as tf

    def make(strategy, model, optimizer, global_batch_size):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = replica_loss(model, x, y, global_batch_size)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

        @tf.function
        def train_steps(iterator, steps):
            for _ in tf.range(steps):
                strategy.run(replica_step, args=next(iterator))

        return train_steps

    return make


def _global_token_mean(model, x, y, global_batch_size):  # the solution's loss
    import tensorflow as tf

    real = _real(x)
    tokens = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.reduce_sum(real))
    return tf.reduce_sum(_per_token(model, x, y) * real) / tokens


def _counted_in_cross_replica_context(strategy, model, optimizer, global_batch_size):
    """The real tokens counted outside strategy.run (a cross-replica reduce) and handed in,
    compute_average_loss with the mask as weights, and AutoGraph's range(steps)."""
    import tensorflow as tf

    def replica_step(x, y, tokens):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(_per_token(model, x, y), sample_weight=_real(x),
                                              global_batch_size=tokens)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    @tf.function
    def train_steps(iterator, steps):
        for _ in range(steps):  # AutoGraph: one while loop over the tensor
            x, y = next(iterator)
            counts = strategy.run(lambda x: tf.reduce_sum(_real(x, tf.int32)), args=(x,))
            tokens = strategy.reduce(tf.distribute.ReduceOp.SUM, counts, axis=None)
            strategy.run(replica_step, args=(x, y, tokens))

    return train_steps


make_train_steps = _train_steps_with(_global_token_mean)


def _the_lessons_cell(model, x, y, global_batch_size):  # section 9's loss, per token
    import tensorflow as tf

    return tf.nn.compute_average_loss(_per_token(model, x, y),
                                      global_batch_size=global_batch_size)


def _the_colleagues_step(model, x, y, global_batch_size):  # the one-device loss, as given
    import tensorflow as tf

    real = _real(x)
    return tf.reduce_sum(_per_token(model, x, y) * real) / tf.reduce_sum(real)


def _mean_of_the_replicas_means(model, x, y, global_batch_size):
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return _the_colleagues_step(model, x, y, global_batch_size) / replicas


def _own_tokens_times_the_replicas(model, x, y, global_batch_size):  # read from its inputs
    import tensorflow as tf

    real = _real(x)
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return tf.reduce_sum(_per_token(model, x, y) * real) / (tf.reduce_sum(real) * replicas)


def _each_sequences_mean(model, x, y, global_batch_size):  # means of sequences, averaged
    import tensorflow as tf

    real = _real(x)
    each = tf.reduce_sum(_per_token(model, x, y) * real, 1) / tf.reduce_sum(real, 1)
    return tf.nn.compute_average_loss(each, global_batch_size=global_batch_size)


def _every_slot(model, x, y, global_batch_size):  # padding weighed 0, but counted
    import tensorflow as tf

    return tf.nn.compute_average_loss(_per_token(model, x, y), sample_weight=_real(x),
                                      global_batch_size=global_batch_size * x.shape[1])


def _kerass_loss_with_the_mask_as_weights(model, x, y, global_batch_size):
    import keras

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return loss(y, model(x, training=True), sample_weight=_real(x))


def _typed_replicas(typed):
    """The replicas' mean count times the replica count typed (4 logical devices in this
    process, 2 in the notebook): it passes the MirroredStrategy case, fails on one device."""
    def replica_loss(model, x, y, global_batch_size):
        import tensorflow as tf

        real = _real(x)
        mean = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.MEAN, tf.reduce_sum(real))
        return tf.reduce_sum(_per_token(model, x, y) * real) / (mean * typed)

    return _train_steps_with(replica_loss)


def _does_nothing(strategy, model, optimizer, global_batch_size):
    import tensorflow as tf

    return tf.function(lambda iterator, steps: None)


def _one_step_a_call(strategy, model, optimizer, global_batch_size):
    import tensorflow as tf

    inner = make_train_steps(strategy, model, optimizer, global_batch_size)

    @tf.function
    def train_steps(iterator, steps):
        return inner(iterator, tf.constant(1))

    return train_steps


def _python_loop(strategy, model, optimizer, global_batch_size):
    import tensorflow as tf

    inner = make_train_steps(strategy, model, optimizer, global_batch_size)

    def train_steps(iterator, steps):  # a host round-trip for every step
        for _ in range(int(steps)):
            inner(iterator, tf.constant(1))

    return train_steps


def _retraces(strategy, model, optimizer, global_batch_size):
    """A tf.function traced once more before it is returned (a warm-up without an iterator):
    the check's two calls find it traced twice."""
    import tensorflow as tf

    inner = make_train_steps(strategy, model, optimizer, global_batch_size)

    @tf.function
    def train_steps(iterator, steps):
        if iterator is not None:
            inner(iterator, steps)

    train_steps(None, tf.constant(0))
    return train_steps


def _a_python_loop_saying_it_traced_once(strategy, model, optimizer, global_batch_size):
    """xf05 L6: a Python loop of one-step calls in a PolymorphicFunction subclass whose trace
    count says 1."""
    import tensorflow as tf

    inner = make_train_steps(strategy, model, optimizer, global_batch_size)

    class TracedOnce(tf.types.experimental.PolymorphicFunction):
        def __call__(self, iterator, steps):
            for _ in range(int(steps)):
                inner(iterator, tf.constant(1))

        def experimental_get_tracing_count(self):
            return 1

        function_type = get_concrete_function = None

    return TracedOnce()


def _the_layers_on_the_gathered_batch(in_replicas):
    """xf05 L4, L5: the global batch gathered (in each replica, or outside strategy.run) and
    trained on by the colleague's loss through the model's layers after the first, beside a
    call of the model on each replica's rows: the right weights made the wrong way."""
    import keras
    import tensorflow as tf

    def make(strategy, model, optimizer, global_batch_size):
        def trained(x, y, share):
            with tf.GradientTape() as tape:
                out = x
                for layer in model.layers[1:]:
                    out = layer(out)
                per_token = keras.losses.sparse_categorical_crossentropy(y, out,
                                                                         from_logits=True)
                real = _real(x)
                loss = tf.reduce_sum(per_token * real) / tf.reduce_sum(real) / share
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        def replica_step(x, y):
            context = tf.distribute.get_replica_context()
            model(x)
            if in_replicas:
                trained(context.all_gather(x, 0), context.all_gather(y, 0),
                        context.num_replicas_in_sync)

        @tf.function
        def train_steps(iterator, steps):
            for _ in tf.range(steps):
                x, y = next(iterator)
                strategy.run(replica_step, args=(x, y))
                if not in_replicas:
                    trained(tf.concat(strategy.experimental_local_results(x), 0),
                            tf.concat(strategy.experimental_local_results(y), 0), 1)

        return train_steps

    return make


def _without_strategy_run(strategy, model, optimizer, global_batch_size):
    """The replicas' batches gathered and trained on as one device would: the right weights
    made the wrong way."""
    import tensorflow as tf

    @tf.function
    def train_steps(iterator, steps):
        for _ in tf.range(steps):
            x, y = next(iterator)
            x = tf.concat(strategy.experimental_local_results(x), 0)
            y = tf.concat(strategy.experimental_local_results(y), 0)
            with tf.GradientTape() as tape:
                loss = _the_colleagues_step(model, x, y, global_batch_size)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    return train_steps


def _the_checks_training_imported(strategy, model, optimizer, global_batch_size):
    from course_utils.grading.checks import token_training

    try:  # entered (then failing on these arguments): what the guard records
        token_training._one_device_weights(model, optimizer, None, 0)
    except AttributeError:
        pass
    return make_train_steps(strategy, model, optimizer, global_batch_size)


def _the_course_trainers_function(strategy, model, optimizer, global_batch_size):
    import keras

    def per_example(y, logits):
        return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)

    trainer = cu.Trainer(lambda: model, lambda: optimizer, per_example, strategy=strategy,
                         verbose=0)
    return trainer._train_function(1)


def _kerass_train_step(strategy, model, optimizer, global_batch_size):
    import keras
    import tensorflow as tf

    with strategy.scope():
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    @tf.function
    def train_steps(iterator, steps):
        for _ in tf.range(steps):
            strategy.run(model.train_step, args=(next(iterator),))

    return train_steps


def _learning_rate_over_the_replicas(strategy, model, optimizer, global_batch_size):
    optimizer.learning_rate.assign(optimizer.learning_rate / strategy.num_replicas_in_sync)
    return _train_steps_with(_the_colleagues_step)(strategy, model, optimizer,
                                                   global_batch_size)


def _jit_compiled(strategy, model, optimizer, global_batch_size):
    import tensorflow as tf

    step = make_train_steps(strategy, model, optimizer, global_batch_size)
    return tf.function(step.python_function, jit_compile=True)


def _get_weights_set_on_the_model(strategy, model, optimizer, global_batch_size):
    real = model.get_weights
    object.__setattr__(model, "get_weights", lambda: real())
    return _train_steps_with(_the_colleagues_step)(strategy, model, optimizer,
                                                   global_batch_size)


DIFFER_1 = r"case 1 \(MirroredStrategy.*the weights differ from one device's"
GATHERED = (r"case 1 .*the model ran in \S+ context on batches of (\d+) sequences "
            r"\(of a global \1\)")
TRAIN_STEPS_CATALOGUE = {
    "tokens counted in cross-replica context": (_counted_in_cross_replica_context, "PASS"),
    # the lesson's recipe, copied: a count known before the step
    "the lesson's cell": (_train_steps_with(_the_lessons_cell), DIFFER_1),
    "the colleague's step under strategy.run": (_train_steps_with(_the_colleagues_step),
                                                 DIFFER_1),
    "the mean of the replicas' means": (_train_steps_with(_mean_of_the_replicas_means),
                                        DIFFER_1),
    "its own tokens times the replicas": (_train_steps_with(_own_tokens_times_the_replicas),
                                          DIFFER_1),
    "each sequence's mean": (_train_steps_with(_each_sequences_mean), DIFFER_1),
    "every slot counted": (_train_steps_with(_every_slot), DIFFER_1),
    "Keras's loss, the mask as weights": (
        _train_steps_with(_kerass_loss_with_the_mask_as_weights), DIFFER_1),
    "the replicas typed": (_typed_replicas(4), r"case 2 \(one device.*on 1 replica the "
                                               "weights differ from one device's"),
    "a constant that trains nothing": (_does_nothing, "the weights did not change"),
    "one step a call": (_one_step_a_call, "the weights differ from one device's"),
    "a Python loop of calls": (_python_loop, "returned function, expected a tf.function"),
    "a trace per step count": (_retraces, "traced 2 times"),
    "a Python loop saying it traced once": (_a_python_loop_saying_it_traced_once,
                                            "returned TracedOnce, expected a tf.function"),
    "the layers on the batch gathered outside strategy.run": (
        _the_layers_on_the_gathered_batch(False), GATHERED),
    "the layers on the batch gathered in each replica": (
        _the_layers_on_the_gathered_batch(True), GATHERED),
    "no strategy.run": (_without_strategy_run, "(never ran|context).*strategy.run"),
    "the check's training imported": (_the_checks_training_imported,
                                       "ran the course's _one_device_weights"),
    "cu.Trainer's function": (_the_course_trainers_function, "ran the course's .*cu.Trainer's"),
    "Keras's train_step": (_kerass_train_step, "your function ran Keras's .*write the replica "
                                               "step yourself"),
    "the learning rate over the replicas": (_learning_rate_over_the_replicas,
                                            r"the optimizer's settings \(its learning rate\)"),
    "jit_compile=True": (_jit_compiled, "InvalidArgumentError under MirroredStrategy: "
                                        ".*jit_compile=True fails under this "),
    "get_weights set on the model": (_get_weights_set_on_the_model,
                                     "set get_weights on the model itself"),
}


@pytest.mark.solution_passes
def test_the_solution_passes():
    assert cu.grading.check_train_steps(make_train_steps) is True


@pytest.mark.parametrize(("answer", "says"), catalogue_params(TRAIN_STEPS_CATALOGUE))
def test_make_train_steps_catalogue(answer, says):
    _judged_as_catalogued(cu.grading.check_train_steps, answer, says)
