"""Lesson 05's checks: reference passes, wrong answers fail with a reason, stubs wait."""

from __future__ import annotations

import math
import re
import sys
import threading
from pathlib import Path

import pytest

import course_utils as cu
from course_utils.grading.checks import lesson_05, settings_rules
from course_utils.grading.framework import NotAttemptedError, strict_checks

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from catalogue_routes import catalogue_params  # noqa: E402

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def make_tpu_ready(dataset, batch_size, sequence_length):
    import tensorflow as tf

    def fix(tokens, label):
        tokens = tokens[:sequence_length]
        tokens = tf.pad(tokens, [[0, sequence_length - tf.shape(tokens)[0]]])
        return tf.ensure_shape(tokens, [sequence_length]), label

    return dataset.map(fix).batch(batch_size, drop_remainder=True)


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
    for name in ("check_make_tpu_ready", "check_tpu_settings", "check_train_steps"):
        assert getattr(cu.grading, name) is getattr(lesson_05, name)


def test_the_reference_pipeline_passes():
    assert cu.grading.check_make_tpu_ready(make_tpu_ready) is True


def test_padded_batch_without_drop_remainder_fails_on_unknown_dimensions():
    def padded(dataset, batch_size, sequence_length):
        return dataset.map(lambda t, y: (t[:sequence_length], y)).padded_batch(
            batch_size, padded_shapes=([sequence_length], []))

    with pytest.raises(AssertionError, match="unknown dimensions"):
        cu.grading.check_make_tpu_ready(padded)


def test_padding_at_the_front_is_named():
    import tensorflow as tf

    def front(dataset, batch_size, sequence_length):
        def fix(tokens, label):
            tokens = tokens[:sequence_length]
            tokens = tf.pad(tokens, [[sequence_length - tf.shape(tokens)[0], 0]])
            return tf.ensure_shape(tokens, [sequence_length]), label
        return dataset.map(fix).batch(batch_size, drop_remainder=True)

    with pytest.raises(AssertionError, match="pad with zeros at the end"):
        cu.grading.check_make_tpu_ready(front)


def _deterministic_off(dataset, batch_size, sequence_length, in_options=False):
    import tensorflow as tf

    def fix(tokens, label):
        tokens = tokens[:sequence_length]
        tokens = tf.pad(tokens, [[0, sequence_length - tf.shape(tokens)[0]]])
        return tf.ensure_shape(tokens, [sequence_length]), label

    if in_options:
        options = tf.data.Options()
        options.deterministic = False
        return dataset.map(fix, num_parallel_calls=4).batch(
            batch_size, drop_remainder=True).with_options(options)
    return dataset.map(fix, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).batch(
        batch_size, drop_remainder=True)


@pytest.mark.parametrize(("in_options", "where"), [
    (False, "ParallelMapDatasetV2"), (True, "tf.data.Options")])
def test_a_pipeline_that_may_reorder_is_told_to_keep_the_order(in_options, where):
    """A cheap map keeps the order by luck (it passed every run): the setting tells."""
    with pytest.raises(AssertionError, match=rf"case 1 .*deterministic=False .*\({where}"):
        cu.grading.check_make_tpu_ready(
            lambda *args: _deterministic_off(*args, in_options=in_options))


@pytest.fixture
def tensorflow_seeded():
    """TensorFlow's global seed set to 42 for the test, unset after it: a shuffle seeded by its
    op's seed alone pairs it with the global seed, which an earlier test (Keras' seeding in the
    training checks, a random seed each run) may have set."""
    import tensorflow as tf

    tf.random.set_seed(42)
    yield
    tf.random.set_seed(None)


def test_a_shuffled_pipeline_is_told_to_keep_the_order(tensorflow_seeded):
    def shuffled(dataset, batch_size, sequence_length):
        return make_tpu_ready(dataset, batch_size, sequence_length).shuffle(100, seed=1)

    # with the global seed 42 and the op's seed 1, a shuffle of 3, 4, 5 or 6 batches (a case's
    # epoch) leaves none of them in order: case 1 is told by the order of its batches
    with pytest.raises(AssertionError, match="case 1 .*keep every example, in order"):
        cu.grading.check_make_tpu_ready(shuffled)


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


@pytest.mark.parametrize("name", ["check_make_tpu_ready", "check_tpu_settings",
                                  "check_train_steps"])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(name, capsys):
    check = getattr(cu.grading, name)
    assert check(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        check(stub)


def _keeps_the_last_tokens(dataset, batch_size, sequence_length):
    import tensorflow as tf

    def fix(tokens, label):
        tokens = tokens[-sequence_length:]
        tokens = tf.pad(tokens, [[0, sequence_length - tf.shape(tokens)[0]]])
        return tf.ensure_shape(tokens, [sequence_length]), label

    return dataset.map(fix).batch(batch_size, drop_remainder=True)


def _keeps_the_partial_batch(dataset, batch_size, sequence_length):
    return make_tpu_ready(dataset.repeat(1), batch_size, sequence_length).unbatch().batch(
        batch_size)


def _padded_to_the_longest(dataset, batch_size, sequence_length):
    return dataset.padded_batch(batch_size, drop_remainder=True)


def _a_constant_dataset(dataset, batch_size, sequence_length):
    import tensorflow as tf

    zeros = tf.zeros((batch_size, sequence_length), tf.int32)
    return tf.data.Dataset.from_tensors((zeros, tf.zeros((batch_size,), tf.int32))).repeat(3)


def _the_lessons_cell_only(dataset, batch_size, sequence_length):  # drop_remainder, no length
    return dataset.padded_batch(batch_size, padded_shapes=([None], []), drop_remainder=True)


def _cast(tokens_to=None, labels_to=None):
    """The reference with its token ids or labels cast to another dtype."""
    def answer(dataset, batch_size, sequence_length):
        import tensorflow as tf

        return make_tpu_ready(dataset, batch_size, sequence_length).map(lambda x, y: (
            tf.cast(x, tokens_to or x.dtype), tf.cast(y, labels_to or y.dtype)))

    return answer


def _guarded_pad_to(bound, guard):
    """Padded to a bound of its own, then cut; a cut first only for sequences longer than
    ``guard`` (what the long sequence of case 1 always is): wrong between the two."""
    def answer(dataset, batch_size, sequence_length):
        import tensorflow as tf

        def fix(tokens, label):
            n = tf.shape(tokens)[0]
            cut_above = guard(sequence_length) if callable(guard) else guard
            tokens = tf.cond(n > cut_above, lambda: tokens[:sequence_length], lambda: tf.pad(
                tokens, [[0, bound(sequence_length) - n]])[:sequence_length])
            cut = tf.pad(tokens, [[0, sequence_length - tf.shape(tokens)[0]]])
            return tf.ensure_shape(cut, [sequence_length]), label

        return dataset.map(fix).batch(batch_size, drop_remainder=True)

    return answer


def _empty_sequences_filtered(dataset, batch_size, sequence_length):
    import tensorflow as tf

    return make_tpu_ready(dataset.filter(lambda x, y: tf.size(x) > 0), batch_size,
                          sequence_length)


PAST_EACH = r"case 2 .*rows made a token past the numbers your graph holds between \d+ and 2\*\*24"


@pytest.mark.parametrize(("answer", "message"), [
    (_keeps_the_last_tokens, r"case \d"), (_keeps_the_partial_batch, r"case \d"),
    (_padded_to_the_longest, r"case \d"), (_a_constant_dataset, r"case \d"),
    (_the_lessons_cell_only, r"case \d"),
    # other dtypes than the given int32 (int64 passes): a float holds the ids of this vocabulary
    # exactly, bool labels the 0/1 labels, yet neither is what the dataset gives
    (_cast(tokens_to="float32"), r"case 1 .*element dtypes are \['float32', 'int32'\], expected"),
    (_cast(labels_to="bool"), r"case 1 .*element dtypes are \['int32', 'bool'\], expected"),
    (_empty_sequences_filtered, r"case 1 .*keep every example, in order \(no shuffle, no filter"),
    # a bound of its own behind a guard that cuts only longer sequences: case 2 makes a
    # sequence one token past each number of the graph (the bound among them)
    (_guarded_pad_to(lambda n: 100 * n, 100_000), rf"{PAST_EACH}.*Paddings must be non-neg"),
    (_guarded_pad_to(lambda n: 2000, 2**19), rf"{PAST_EACH}.*Paddings must be non-neg"),
    (_guarded_pad_to(lambda n: 2 * n, lambda n: 3 * n), rf"{PAST_EACH}.*Paddings must be non-neg"),
], ids=["last-tokens", "partial-batch", "padded-to-longest", "constant", "lessons-cell",
        "float32-tokens", "bool-labels", "empty-filtered", "guarded-100n", "guarded-2000",
        "guarded-2n"])
def test_make_tpu_ready_catalogue_of_wrong_answers_fails(answer, message):
    with pytest.raises(AssertionError, match=rf"make_tpu_ready: {message}"):
        cu.grading.check_make_tpu_ready(answer)


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


def test_expected_batches_imported_from_the_check_module_fail():
    def imported(dataset, batch_size, sequence_length):
        import numpy as np
        import tensorflow as tf

        pairs = list(dataset.as_numpy_iterator())
        batches = lesson_05._expected_batches([t for t, _ in pairs],
                                              np.array([y for _, y in pairs]),
                                              batch_size, sequence_length)
        return tf.data.Dataset.from_tensor_slices(
            (np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches]))
        ).batch(batch_size, drop_remainder=True)

    with pytest.raises(AssertionError, match="ran the course's _expected_batches"):
        cu.grading.check_make_tpu_ready(imported)


def test_a_pipeline_copied_into_memory_fails():
    def in_memory(dataset, batch_size, sequence_length):
        import numpy as np
        import tensorflow as tf

        rows, labels = [], []
        for tokens, label in dataset.as_numpy_iterator():
            row = np.zeros(sequence_length, "int32")
            row[:len(tokens[:sequence_length])] = tokens[:sequence_length]
            rows.append(row)
            labels.append(label)
        return tf.data.Dataset.from_tensor_slices((np.stack(rows), np.array(labels))).batch(
            batch_size, drop_remainder=True)

    with pytest.raises(AssertionError, match="read .* examples of the dataset when called"):
        cu.grading.check_make_tpu_ready(in_memory)


def _copied_in_a_generator(dataset, batch_size, sequence_length):
    """The whole dataset read into memory when the first batch is asked for, then batched."""
    import numpy as np
    import tensorflow as tf

    def batches():  # the whole dataset read into memory, then batched
        rows = list(dataset.as_numpy_iterator())
        for start in range(0, len(rows) - batch_size + 1, batch_size):
            tokens = np.zeros((batch_size, sequence_length), "int32")
            for row, (sequence, _) in enumerate(rows[start:start + batch_size]):
                tokens[row, :len(sequence[:sequence_length])] = sequence[:sequence_length]
            yield tokens, np.array([y for _, y in rows[start:start + batch_size]], "int32")

    spec = (tf.TensorSpec([batch_size, sequence_length], tf.int32),
            tf.TensorSpec([batch_size], tf.int32))
    return tf.data.Dataset.from_generator(batches, output_signature=spec)


def _copied_by_a_whole_dataset_batch(dataset, batch_size, sequence_length):
    """Every example read into one ragged batch before the first is handed on: a copy in
    TensorFlow ops, which the graph's Python count cannot see; the stream's read count does."""
    return make_tpu_ready(dataset.ragged_batch(10**6).unbatch(), batch_size, sequence_length)


@pytest.mark.parametrize(("answer", "message"), [
    (_copied_in_a_generator, "case 1 .*not made from the one given"),
    (_copied_by_a_whole_dataset_batch, "case 3 .*read 1000 of 1000 examples before it handed"),
])
def test_a_copy_put_off_to_the_first_batch_fails(answer, message):
    with pytest.raises(AssertionError, match=message):
        cu.grading.check_make_tpu_ready(answer)


def test_a_pipeline_that_fails_on_a_long_sequence_says_so():
    def not_cut(dataset, batch_size, sequence_length):  # padded_batch cannot shorten one
        return dataset.padded_batch(batch_size, padded_shapes=([sequence_length], []),
                                    drop_remainder=True)

    with pytest.raises(AssertionError, match=r"reading the pipeline failed at batch \d+: "
                                             "DataLossError"):
        cu.grading.check_make_tpu_ready(not_cut)


#: What a failing case says of its long sequence where no number of the pipeline's graph
#: reaches the check's floor: it was made 2**20 + 1 tokens before it was read.
FLOOR_MADE = ".*the long sequence made 1048577 tokens: which step"


@pytest.mark.parametrize(("times", "made"), [
    (2, FLOOR_MADE),
    (128, FLOOR_MADE),
])
def test_padding_to_a_bound_of_ones_own_then_cutting_fails(times, made):
    """Padded to a bound of its own (twice sequence_length, what most sequences stay under, or
    128 times, above the check's drawn long sequence), then cut: the case's long sequence is
    made 2**20 + 1 tokens before it is read, past any bound below that."""
    def pad_then_cut(dataset, batch_size, sequence_length):
        return dataset.padded_batch(batch_size, padded_shapes=([times * sequence_length], []),
                                    drop_remainder=True).map(
            lambda x, y: (x[:, :sequence_length], y))

    with pytest.raises(AssertionError, match=r"case 1 .*reading the pipeline failed at batch "
                                             rf"\d+: DataLossError{made}"):
        cu.grading.check_make_tpu_ready(pad_then_cut)


@pytest.mark.parametrize("through_identity", [False, True])
def test_padding_to_a_bound_too_long_to_meet_is_named(through_identity):
    """A padded_batch's bound of 2**20 tokens, a constant or (in a flat_map) passed on through
    tf.identity: no Const input of its own there."""
    def pad_then_cut(dataset, batch_size, sequence_length):
        import tensorflow as tf

        def padded(_):
            bound = (tf.identity(tf.constant([2**20], tf.int64)) if through_identity
                     else [2**20])
            return dataset.padded_batch(batch_size, padded_shapes=(bound, []),
                                        drop_remainder=True)

        return tf.data.Dataset.range(1).flat_map(padded).map(
            lambda x, y: (x[:, :sequence_length], y))

    with pytest.raises(AssertionError, match=r"case 1 .*your padded_batch pads each row to 1048576 "
                                             "tokens, a bound of your own"):
        cu.grading.check_make_tpu_ready(pad_then_cut)


def _tf():
    import tensorflow as tf

    return tf


def _padded_by_tf_pad_to(bound):
    """Each sequence padded with tf.pad to a bound of its own (``bound(sequence_length)``), then
    cut: no cut before the padding."""
    def answer(dataset, batch_size, sequence_length):
        import tensorflow as tf

        def fix(tokens, label):
            tokens = tf.pad(tokens, [[0, bound(sequence_length) - tf.shape(tokens)[0]]])
            return tf.ensure_shape(tokens[:sequence_length], [sequence_length]), label

        return dataset.map(fix).batch(batch_size, drop_remainder=True)

    return answer


def _padded_batch_to_a_bound_passed_through_identity(dataset, batch_size, sequence_length):
    """A padded_batch in a flat_map whose padded_shapes come through tf.identity: no Const
    input of its own in the graph."""
    import tensorflow as tf

    def inner(_):
        bound = tf.identity(tf.constant([128 * sequence_length], tf.int64))
        return dataset.padded_batch(batch_size, padded_shapes=(bound, []), drop_remainder=True)

    return tf.data.Dataset.range(1).flat_map(inner).map(
        lambda x, y: (x[:, :sequence_length], y))


@pytest.mark.parametrize(("answer", "made"), [
    # every bound below 2**20 meets a sequence of 2**20 + 1 tokens
    (_padded_by_tf_pad_to(lambda n: 512), FLOOR_MADE),
    (_padded_by_tf_pad_to(lambda n: 128 * n), FLOOR_MADE),
    # its padded_shapes computed (through tf.identity): read as its bound all the same
    (_padded_batch_to_a_bound_passed_through_identity, FLOOR_MADE),
    # the bound a float or an int16 constant, cast: a whole number of another type
    (_padded_by_tf_pad_to(lambda n: _tf().cast(_tf().constant(128.0 * n), _tf().int32)),
     FLOOR_MADE),
    (_padded_by_tf_pad_to(lambda n: _tf().cast(_tf().constant(128 * n, _tf().int16),
                                               _tf().int32)),
     FLOOR_MADE),
    # the bound computed from constants: parsed from a string, a power, a sum over a list, a
    # random number times 0 (drawn once by the check); a constant of 2**20 in a list
    (_padded_by_tf_pad_to(lambda n: _tf().strings.to_number(str(128 * n), _tf().int32)),
     FLOOR_MADE),
    (_padded_by_tf_pad_to(lambda n: _tf().constant(2) ** 20),
     ".*the long sequence made 1048577 tokens, one more than the largest number"),
    (_padded_by_tf_pad_to(lambda n: _tf().reduce_sum(_tf().constant([64 * n, 64 * n]))),
     FLOOR_MADE),
    (_padded_by_tf_pad_to(lambda n: _tf().reduce_max(_tf().constant([n, 2**20]))),
     ".*the long sequence made 1048577 tokens, one more than the largest number"),
    (_padded_by_tf_pad_to(lambda n: (_tf().constant(2) + _tf().cast(
        _tf().random.uniform([]) * 0, _tf().int32)) ** 20),
     ".*the long sequence made 1048577 tokens, one more than the largest number"),
    # bounds the fold does not work out (a loop, a conditional): the floor passes them
    (_padded_by_tf_pad_to(lambda n: _tf().while_loop(lambda i: i < 1600, lambda i: i * 2,
                                                     [1])[0]), FLOOR_MADE),
    (_padded_by_tf_pad_to(lambda n: _tf().cond(_tf().constant(True),
                                               lambda: _tf().constant(45) ** 2,
                                               lambda: _tf().constant(45) ** 2)), FLOOR_MADE),
], ids=["tf.pad-to-512", "tf.pad-to-128n", "padded_batch-identity-bound", "tf.pad-to-float-bound",
        "tf.pad-to-int16-bound", "tf.pad-to-parsed-bound", "tf.pad-to-2**20-computed",
        "tf.pad-to-reduce_sum-bound", "tf.pad-to-reduce_max-2**20",
        "tf.pad-to-2**20-through-random-times-0", "tf.pad-to-2048-from-a-while_loop",
        "tf.pad-to-2025-from-a-cond"])
def test_a_bound_of_ones_own_in_the_graph_meets_a_longer_sequence(answer, made):
    """The case's long sequence is made to pass the largest whole number the pipeline's graph
    holds or computes from its constants (a tf.pad's target, a padded_batch's bound however it
    is passed on), and 2**20 where that number is smaller."""
    with pytest.raises(AssertionError, match=r"case 1 .*reading the pipeline failed at batch "
                                             rf"\d+: \w+Error{made}"):
        cu.grading.check_make_tpu_ready(answer)


def test_an_element_of_unknown_rank_is_told_so():
    def unknown_rank(dataset, batch_size, sequence_length):
        import tensorflow as tf

        return dataset.map(lambda x, y: (tf.py_function(lambda t: t, [x], tf.int32), y)).batch(
            batch_size, drop_remainder=True)

    with pytest.raises(AssertionError, match=r"case 1 .*element_spec has unknown dimensions"):
        cu.grading.check_make_tpu_ready(unknown_rank)


@pytest.mark.parametrize("answer", [
    lambda d, b, n: d.map(lambda x, y: (x[:n], y)).padded_batch(
        b, padded_shapes=([n], []), drop_remainder=True),
    lambda d, b, n: d.map(lambda x, y: (x[:n], y)).ragged_batch(b, drop_remainder=True).map(
        lambda x, y: (x.to_tensor(shape=[b, n]), y)),
    lambda d, b, n: d.map(lambda x, y: (x[:n], y)).padded_batch(
        b, padded_shapes=([2 * n], []), drop_remainder=True).map(lambda x, y: (x[:, :n], y)),
    # padded to a bound of its own only where a sequence fits under it, int64 ids
    lambda d, b, n: _guarded_pad_to(lambda n: 3000, 3000)(d, b, n).map(
        lambda x, y: (_tf().cast(x, _tf().int64), y)),
], ids=["cut-then-padded_batch", "ragged_batch-to_tensor", "cut-padded_batch-to-2n-cut",
        "guarded-pad-int64"])
def test_right_answers_written_another_way_pass(answer):
    assert cu.grading.check_make_tpu_ready(answer)


def test_a_removed_profiler_fails_the_settings():
    def removes(*args):
        import sys

        getattr(sys, "set" + "profile")(None)  # a name the source scan cannot read
        return tpu_settings(*args)

    with pytest.raises(AssertionError, match="removed the check's profiler"):
        cu.grading.check_tpu_settings(removes)



def _streaming_generator(dataset, batch_size, sequence_length):
    """A Python generator that reads the examples as they stream and pads them in NumPy: the
    shapes are static only because its signature says so, no tf.data step does the work."""
    import numpy as np
    import tensorflow as tf

    def batches():
        rows, labels = [], []
        for tokens, label in dataset.as_numpy_iterator():
            rows.append(np.pad(tokens[:sequence_length],
                               (0, sequence_length - len(tokens[:sequence_length]))))
            labels.append(label)
            if len(rows) == batch_size:
                yield np.stack(rows), np.array(labels, "int32")
                rows, labels = [], []

    return tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec([batch_size, sequence_length], tf.int32),
        tf.TensorSpec([batch_size], tf.int32)))


def _a_python_generator_serialized_in_a_string(dataset, batch_size, sequence_length):
    """The streaming generator's pipeline serialized, run from its string in a flat_map: its
    py_function op is in no function of the graph (DatasetFromGraph), beside a step of the
    given dataset that reads nothing."""
    import tensorflow as tf

    lazy = _streaming_generator(dataset, batch_size, sequence_length)
    serialized = tf.raw_ops.DatasetToGraphV2(
        input_dataset=tf.data.experimental.to_variant(lazy), external_state_policy=1)

    def hidden(_):
        return tf.data.experimental.from_variant(
            tf.raw_ops.DatasetFromGraph(graph_def=serialized), lazy.element_spec)

    given = make_tpu_ready(dataset, batch_size, sequence_length).take(0)
    return given.concatenate(tf.data.Dataset.range(1).flat_map(hidden))


def _padded_in_a_py_function(dataset, batch_size, sequence_length):
    import numpy as np
    import tensorflow as tf

    def fix(tokens):
        cut = tokens.numpy()[:sequence_length]
        return np.pad(cut, (0, sequence_length - len(cut)))

    def step(tokens, label):
        return tf.ensure_shape(tf.py_function(fix, [tokens], tf.int32), [sequence_length]), label

    return dataset.map(step).batch(batch_size, drop_remainder=True)


def _padded_in_a_stateless_numpy_function(dataset, batch_size, sequence_length):
    import numpy as np
    import tensorflow as tf

    def fix(tokens):
        cut = tokens[:sequence_length]
        return np.pad(cut, (0, sequence_length - len(cut))).astype(np.int32)

    def step(tokens, label):
        padded = tf.numpy_function(fix, [tokens], tf.int32, stateful=False)  # PyFuncStateless
        return tf.ensure_shape(padded, [sequence_length]), label

    return dataset.map(step).batch(batch_size, drop_remainder=True)


def _the_generator_behind_the_given_dataset(dataset, batch_size, sequence_length):
    start = make_tpu_ready(dataset, batch_size, sequence_length).take(0)  # the given, unread
    return start.concatenate(_streaming_generator(dataset, batch_size, sequence_length))


def _handed_on(dataset, batch_size, sequence_length, pull):
    """Batches ``pull`` takes from outside the pipeline, until it says there are no more,
    behind the given dataset, never read (its read ops in the graph)."""
    import tensorflow as tf

    start = make_tpu_ready(dataset, batch_size, sequence_length).take(0)
    pulled = (tf.data.Dataset.range(2**62).map(lambda _: pull())
              .take_while(lambda x, y, more: more).map(lambda x, y, more: (x, y)))
    return start.concatenate(pulled)


def _an_iterator_of_a_python_pipeline(dataset, batch_size, sequence_length):
    """The padding in a py_function, in a pipeline iterated outside the one returned: its
    graph shows only the iterator's get_next."""
    import tensorflow as tf

    inner = iter(_padded_in_a_py_function(dataset, batch_size, sequence_length))

    def pull():
        got = inner.get_next_as_optional()
        empty = (tf.zeros([batch_size, sequence_length], tf.int32),
                 tf.zeros([batch_size], tf.int32))
        x, y = tf.cond(got.has_value(), got.get_value, lambda: empty)
        return x, y, got.has_value()

    return _handed_on(dataset, batch_size, sequence_length, pull)


_FILLER_STOPPED = threading.Event()


def _a_queue_a_python_thread_fills(dataset, batch_size, sequence_length):
    """A Python thread pads the batches in NumPy into a queue, starting a few seconds later,
    once the check has looked for reads made when called."""
    import tensorflow as tf

    queue = tf.queue.FIFOQueue(2, [tf.int32, tf.int32, tf.bool],
                               shapes=[[batch_size, sequence_length], [batch_size], []])

    def fill():  # stopped when the test ends: its reads would run Python in a later test's
        if _FILLER_STOPPED.wait(5.0):  # check (TensorFlow's threads run the generator)
            return
        for x, y in _streaming_generator(dataset, batch_size, sequence_length):
            if _FILLER_STOPPED.is_set():
                return
            queue.enqueue((x, y, True))
        queue.enqueue((tf.zeros_like(x), tf.zeros_like(y), False))  # no more

    threading.Thread(target=fill, daemon=True).start()
    return _handed_on(dataset, batch_size, sequence_length, queue.dequeue)


def _variables_a_python_thread_fills(dataset, batch_size, sequence_length):
    """A Python thread pads the batches in NumPy into variables as the pipeline asks for them
    (it waits in a queue's dequeue: a thread stopped at exit inside an op that returns aborts
    the process); the pipeline waits for a batch and reads it: no iterator's or queue's
    take."""
    import threading

    import tensorflow as tf

    slots = 1024  # batches: more than any case holds
    xs = tf.Variable(tf.zeros([slots, batch_size, sequence_length], tf.int32))
    ys = tf.Variable(tf.zeros([slots, batch_size], tf.int32))
    filled, total = tf.Variable(0, dtype=tf.int64), tf.Variable(-1, dtype=tf.int64)
    asks = tf.queue.FIFOQueue(slots + 1, [tf.int64], shapes=[[]])

    def fill():
        made = iter(_streaming_generator(dataset, batch_size, sequence_length))
        for k in range(slots):
            asks.dequeue()  # nothing read before the pipeline asks
            x, y = next(made, (None, None))
            if x is None:
                break
            xs[k].assign(x)
            ys[k].assign(y)
            filled.assign(k + 1)
        total.assign(filled)

    def pull(i):
        with tf.control_dependencies([asks.enqueue(i)]):
            start = tf.constant(0, tf.int64) + 0

        def waiting(k):
            return tf.logical_and(filled <= i, tf.logical_or(total < 0, i < total))

        done = tf.while_loop(waiting, lambda k: k + 1, [start])
        with tf.control_dependencies(done):
            return tf.identity(xs[i]), tf.identity(ys[i]), i < filled.read_value()

    threading.Thread(target=fill, daemon=True).start()
    start = make_tpu_ready(dataset, batch_size, sequence_length).take(0)
    return start.concatenate(tf.data.Dataset.range(slots).map(pull)
                             .take_while(lambda x, y, more: more).map(lambda x, y, more: (x, y)))


@pytest.mark.parametrize(("answer", "message"), [
    (_streaming_generator, "not made from the one given"),
    (_padded_in_a_py_function, r"calls Python \(1 op"),
    (_padded_in_a_stateless_numpy_function, r"calls Python \(1 op"),
    (_the_generator_behind_the_given_dataset, r"calls Python \(3 op"),
    (_an_iterator_of_a_python_pipeline,
     r"reads state made outside it \(IteratorGetNextAsOptional:"),
    (_a_queue_a_python_thread_fills, r"reads state made outside it \(QueueDequeueV2:"),
    (_a_python_generator_serialized_in_a_string,
     r"reads state made outside it \(DatasetFromGraph:"),
    (_variables_a_python_thread_fills, r"reads state made outside it "
                                       r"\(\d+ captured handle\(s\) or stateful op\(s\)"),
    (lambda *args: make_tpu_ready(*args).repeat(), "never ends"),
    (lambda *args: make_tpu_ready(*args).repeat(2), r"the epoch has more than \d+ batches"),
])
def test_python_in_the_pipeline_and_endless_epochs_fail(answer, message):
    _FILLER_STOPPED.clear()
    try:
        with pytest.raises(AssertionError, match=rf"make_tpu_ready: case 1 .*{message}"):
            cu.grading.check_make_tpu_ready(answer)
    finally:
        _FILLER_STOPPED.set()


def test_batches_not_read_from_the_dataset_given_fail(monkeypatch):
    """Right batches from elsewhere (here: the check's sequences, recorded as it draws them)
    behind the given dataset, never read: the reads counted after the epoch tell."""
    import numpy as np
    import tensorflow as tf

    drawn, calls = [], []
    draw = lesson_05._sequences
    monkeypatch.setattr(lesson_05, "_sequences", lambda *a: drawn.append(draw(*a)) or drawn[-1])

    def elsewhere(dataset, batch_size, sequence_length):
        tokens, labels = drawn[len(calls)]
        calls.append(1)
        fixed = np.zeros((len(tokens), sequence_length), "int32")
        for row, sequence in enumerate(tokens):
            fixed[row, :len(sequence[:sequence_length])] = sequence[:sequence_length]
        batches = tf.data.Dataset.from_tensor_slices((fixed, labels)).batch(
            batch_size, drop_remainder=True)
        return make_tpu_ready(dataset, batch_size, sequence_length).take(0).concatenate(batches)

    with pytest.raises(AssertionError, match=r"case 1 .*but only 0 were read from the dataset"):
        cu.grading.check_make_tpu_ready(elsewhere)


def test_a_pipeline_whose_graph_cannot_be_read_is_told_so(monkeypatch):
    """A graph that DatasetToGraph refuses (stood in for by a helper that raises) fails with
    a message, not a traceback; the given dataset's own tokens are still read."""
    from course_utils.grading.checks import static_batches

    def refused(dataset):
        raise ValueError("cannot serialize this dataset\nsecond line")

    monkeypatch.setattr(static_batches, "py_function_tokens", refused)
    with pytest.raises(AssertionError, match=r"case 1 .*could not read your pipeline's graph: "
                                             r"ValueError: cannot serialize this dataset"):
        cu.grading.check_make_tpu_ready(make_tpu_ready)


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
    import tensorflow as tf

    inner = make_train_steps(strategy, model, optimizer, global_batch_size)

    class TracesEachCount(tf.types.experimental.PolymorphicFunction):  # planted: 2 traces
        def __call__(self, iterator, steps):
            return inner(iterator, steps)

        def experimental_get_tracing_count(self):
            return 2

        function_type = get_concrete_function = None

    return TracesEachCount()


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
    if says == "PASS":
        assert cu.grading.check_train_steps(answer) is True
        return
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_train_steps(answer)
