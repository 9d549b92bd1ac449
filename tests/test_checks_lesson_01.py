"""Lesson 01's checks: the reference solutions pass, wrong ones fail usefully, stubs are skipped."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading import framework
from course_utils.grading.checks import lesson_01 as checks_01
from course_utils.grading.framework import NotAttemptedError

pytestmark = pytest.mark.usefixtures("normal_check_mode")


@pytest.fixture(scope="module")
def tf():
    from course_utils.environment import import_tensorflow

    return import_tensorflow()


def stub(*args):
    raise NotImplementedError()


# --- fast_pipeline ---------------------------------------------------------------------------


def fast_pipeline(source, read, decode, batch_size):
    tf = cu.environment.import_tensorflow()
    dataset = source.map(read, num_parallel_calls=16, deterministic=False)
    dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 16
    return dataset.with_options(options)


def test_reference_fast_pipeline_passes(capsys):
    assert cu.grading.check_fast_pipeline(fast_pipeline)
    out = capsys.readouterr().out
    assert "✅ fast_pipeline: 2 cases passed" in out
    assert "speed-up over the slow pipeline" in out


def test_unchanged_slow_pipeline_is_too_slow():
    def slow(source, read, decode, batch_size):
        return source.map(read).map(decode).batch(batch_size)

    with pytest.raises(AssertionError) as info:
        cu.grading.check_fast_pipeline(slow)
    message = str(info.value)
    assert "case 2" in message and "speed" in message
    assert f"at least ×{checks_01.FAST_PIPELINE_MIN_SPEEDUP:g}" in message
    assert "Hint:" in message and "private_threadpool_size" in message


def test_skipping_the_read_changes_the_elements():
    def no_read(source, read, decode, batch_size):
        tf = cu.environment.import_tensorflow()
        return source.map(lambda x: decode(x)).batch(batch_size).prefetch(tf.data.AUTOTUNE)

    with pytest.raises(AssertionError, match=r"case 1 .*elements differ"):
        cu.grading.check_fast_pipeline(no_read)


def test_wrong_batching_is_reported():
    def unbatched(source, read, decode, batch_size):
        return source.map(read, num_parallel_calls=8).map(decode)

    with pytest.raises(AssertionError, match="batches of scalars"):
        cu.grading.check_fast_pipeline(unbatched)

    def dropped(source, read, decode, batch_size):
        return fast_pipeline(source, read, decode, batch_size).unbatch().batch(
            batch_size, drop_remainder=True)

    with pytest.raises(AssertionError, match="case 1"):
        cu.grading.check_fast_pipeline(dropped)


def test_not_a_dataset_is_reported():
    with pytest.raises(AssertionError, match="expected a tf.data.Dataset, got list"):
        cu.grading.check_fast_pipeline(lambda source, read, decode, batch_size: [])


def test_fast_pipeline_stub_is_not_attempted(capsys):
    assert cu.grading.check_fast_pipeline(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with framework.strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_fast_pipeline(stub)


# --- shuffled_batches ------------------------------------------------------------------------


def shuffled_batches(dataset, batch_size, buffer, seed):
    return dataset.shuffle(buffer, seed=seed).batch(batch_size)


def test_reference_shuffled_batches_passes(capsys):
    assert cu.grading.check_shuffled_batches(shuffled_batches)
    assert "✅ shuffled_batches: 2 cases passed" in capsys.readouterr().out


def test_shuffling_batches_is_caught_with_its_reason():
    def batch_then_shuffle(dataset, batch_size, buffer, seed):
        return dataset.batch(batch_size).shuffle(buffer, seed=seed)

    with pytest.raises(AssertionError) as info:
        cu.grading.check_shuffled_batches(batch_then_shuffle)
    message = str(info.value)
    assert "case 1" in message and "runs of consecutive examples" in message
    assert "batches were shuffled, not the examples" in message and "Hint:" in message


def test_a_small_buffer_is_caught():
    def tiny_buffer(dataset, batch_size, buffer, seed):
        return dataset.shuffle(4, seed=seed).batch(batch_size)

    with pytest.raises(AssertionError, match="consecutive|near neighbours"):
        cu.grading.check_shuffled_batches(tiny_buffer)


def test_seed_and_reshuffling_are_checked():
    def no_seed(dataset, batch_size, buffer, seed):
        return dataset.shuffle(buffer).batch(batch_size)

    with pytest.raises(AssertionError, match="same seed gave another order"):
        cu.grading.check_shuffled_batches(no_seed)

    def frozen(dataset, batch_size, buffer, seed):
        return dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=False).batch(
            batch_size)

    with pytest.raises(AssertionError, match="two epochs came in the same order"):
        cu.grading.check_shuffled_batches(frozen)


def test_lost_or_repeated_examples_are_caught(tf):
    def repeated(dataset, batch_size, buffer, seed):
        return dataset.map(lambda x: x // 2 * 2).shuffle(buffer, seed=seed).batch(batch_size)

    with pytest.raises(AssertionError, match="exactly once per epoch"):
        cu.grading.check_shuffled_batches(repeated)


def test_shuffled_batches_stub_is_not_attempted(capsys):
    assert cu.grading.check_shuffled_batches(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_lesson_01_registers_its_checks():
    from course_utils.grading import checks

    assert checks.check_fast_pipeline is checks_01.check_fast_pipeline
    assert cu.grading.check_shuffled_batches is checks_01.check_shuffled_batches
