"""Lesson 01's checks: the reference solutions pass, wrong ones fail usefully, stubs are skipped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import course_utils as cu
from course_utils.grading import framework
from course_utils.grading.checks import lesson_01 as checks_01
from course_utils.grading.framework import NotAttemptedError

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from catalogue_routes import catalogue_params  # noqa: E402

pytestmark = pytest.mark.usefixtures("normal_check_mode")


@pytest.fixture(scope="module")
def tf():
    from course_utils.quiet import import_tensorflow

    return import_tensorflow()


def stub(*args):
    raise NotImplementedError()


# --- fast_pipeline ---------------------------------------------------------------------------


def _options(threads=16):  # a private pool of tf.data's for the waits
    tf = cu.quiet.import_tensorflow()
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    return options


def _ask(records, is_current, calls=16, **kwargs):  # the lookups in a parallel map, then a
    def asked(record):  # filter that only reads their answers (the fix's second half)
        return record, is_current(record)

    keep = records.map(asked, num_parallel_calls=calls, **kwargs)
    return keep.filter(lambda record, current: current).map(lambda record, _: record)


def fast_pipeline(source, read, is_current, decode, batch_size):  # the solution's
    tf = cu.quiet.import_tensorflow()

    def read_and_ask(index):
        record = read(index)
        return record, is_current(record)

    asked = source.map(read_and_ask, num_parallel_calls=16, deterministic=False)
    current = asked.filter(lambda record, keep: keep).map(lambda record, _: record)
    dataset = current.map(decode).batch(batch_size).prefetch(tf.data.AUTOTUNE)
    return dataset.with_options(_options())


def _filters_interleaved(source, read, is_current, decode, batch_size):  # right: each record
    tf = cu.quiet.import_tensorflow()  # its own dataset, read and filtered, 16 in parallel

    def one(index):
        return tf.data.Dataset.from_tensors(index).map(read).filter(is_current)

    records = source.interleave(one, cycle_length=16, num_parallel_calls=16,
                                deterministic=False)
    return records.map(decode).batch(batch_size).with_options(_options())


def _checked_cached_and_shuffled(source, read, is_current, decode, batch_size):  # right: an
    import tempfile  # assert and a random op keep no state but their own; a cache in a file

    tf = cu.quiet.import_tensorflow()  # (the same file every call) is written by the pipeline

    def checked(record):
        tf.debugging.assert_non_negative(record, message="a negative record")
        return record

    records = source.map(read, num_parallel_calls=16, deterministic=False).map(checked)
    dataset = _ask(records, is_current, deterministic=False)
    dataset = dataset.cache(os.path.join(tempfile.gettempdir(), "fast_pipeline_cache"))
    dataset = dataset.map(decode).batch(batch_size).map(tf.random.shuffle)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(_options())


@pytest.mark.parametrize("right", [fast_pipeline, _filters_interleaved,
                                   _checked_cached_and_shuffled])
def test_right_fast_pipelines_pass(right, capsys):
    assert cu.grading.check_fast_pipeline(right)
    out = capsys.readouterr().out
    assert "✅ fast_pipeline: 2 cases passed" in out
    assert "lookups waited at once; speed-up over the slow pipeline" in out


def test_filter_waits_one_call_at_a_time_whatever_the_options(tf):
    """The fact the exercise rests on: ``filter`` has no ``num_parallel_calls``, and
    ``filter_parallelization`` leaves a predicate that runs Python alone."""
    import inspect

    from course_utils.grading.checks.storage_reads import waiting_stage

    assert "num_parallel_calls" not in inspect.signature(tf.data.Dataset.filter).parameters
    calls = {}
    ask = waiting_stage(0.005, calls, 4, lambda value, _: np.bool_(value % 2), tf.bool)
    options = _options()
    options.experimental_optimization.filter_parallelization = True
    assert len(list(tf.data.Dataset.range(16).filter(ask).with_options(options))) == 8
    assert calls["count"] == 16 and calls["most_at_once"] == 1


def test_handed_on_counts_files_read_by_unlisted_steps_and_ops(tmp_path):
    tf = cu.quiet.import_tensorflow()  # a cache in a file, a vocabulary remapping: files read
    from google.protobuf import descriptor_pb2

    from course_utils.grading.checks.batch_shapes import handed_on

    (tmp_path / "vocab").write_text("a\nb\n")
    vocab = str(tmp_path / "vocab")

    def remapped(index):
        remapping = tf.raw_ops.GenerateVocabRemapping(
            new_vocab_file=vocab, old_vocab_file=vocab, new_vocab_offset=0, num_new_vocab=2)
        return index + remapping[0][0]

    records = tf.data.Dataset.range(4)
    assert handed_on(records.cache(), set()) == (0, 0)
    assert handed_on(records.cache(str(tmp_path / "cache")), set()) == (0, 1)
    assert handed_on(records.flat_map(
        lambda index: tf.data.Dataset.from_tensors(index).cache(str(tmp_path / "inner"))),
        set()) == (0, 1)
    assert handed_on(records.map(remapped), set()) == (0, 1)
    descriptors = descriptor_pb2.FileDescriptorSet()  # a default value, read from a file
    message = descriptors.file.add(name="h.proto", package="h").message_type.add(name="M")
    message.field.add(name="v", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                      default_value="42")
    (tmp_path / "h.desc").write_bytes(descriptors.SerializeToString())

    def decoded(index, source=str(tmp_path / "h.desc")):
        values = tf.io.decode_proto(tf.constant([b""]), "h.M", ["v"], [tf.int64],
                                    descriptor_source=source).values[0]
        return index + values[0][0]

    assert [int(value) for value in records.map(decoded)] == [42, 43, 44, 45]
    assert handed_on(records.map(decoded), set()) == (0, 1)
    from course_utils.grading.checks.batch_shapes import fresh_caches

    # the pipeline's own cache in a file (a constant filename) rebuilt to cache in memory
    rebuilt = fresh_caches(records.map(lambda x: x + 1).cache(str(tmp_path / "mine")))
    assert [int(value) for value in rebuilt] == [1, 2, 3, 4]
    assert handed_on(rebuilt, set()) == (0, 0) and not list(tmp_path.glob("mine*"))
    in_memory = records.cache()  # nothing to rebuild: the pipeline itself
    assert fresh_caches(in_memory) is in_memory
    inner = records.flat_map(  # a cache in a step's function: one file for every inner
        lambda index: tf.data.Dataset.from_tensors(index).cache(str(tmp_path / "inner")))
    assert fresh_caches(inner) is inner and handed_on(inner, set()) == (0, 1)  # dataset
    assert handed_on(records.map(lambda index: decoded(index, "local://")), set()) == (0, 0)

    generated = tf.data.Dataset.from_generator(  # a pipeline run from its serialized graph
        lambda: iter(range(4)), output_signature=tf.TensorSpec([], tf.int64))
    serialized = tf.raw_ops.DatasetToGraphV2(
        input_dataset=tf.data.experimental.to_variant(generated), external_state_policy=1)
    hidden = records.take(1).flat_map(lambda _: tf.data.experimental.from_variant(
        tf.raw_ops.DatasetFromGraph(graph_def=serialized), generated.element_spec))
    assert [int(value) for value in hidden] == [0, 1, 2, 3]
    assert handed_on(hidden, set()) == (0, 1)
    assert handed_on(records.map(lambda index: index + tf.random.uniform([], 0, 1, tf.int64)),
                     set()) == (0, 0)


def test_not_a_dataset_is_reported():
    with pytest.raises(AssertionError, match="expected a tf.data.Dataset, got list"):
        cu.grading.check_fast_pipeline(lambda source, read, is_current, decode, b: [])


def _usable_cpus():  # tf.data's default pool: the logical CPUs this process may use
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# -- the catalogue: wrong answers as a learner would write them


def _constant(source, read, is_current, decode, batch_size):  # the demo's numbers, typed in
    tf = cu.quiet.import_tensorflow()
    return tf.data.Dataset.from_tensor_slices(np.arange(40, dtype=np.float32)).batch(batch_size)


def _no_filter(source, read, is_current, decode, batch_size):  # skips the slow lookups
    tf = cu.quiet.import_tensorflow()
    dataset = source.map(read, num_parallel_calls=16).map(decode).batch(batch_size)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(_options())


def _broken_given(source, read, is_current, decode, batch_size):  # the lesson's cell 21 as
    tf = cu.quiet.import_tensorflow()  # the colleague applied it: every map parallel
    dataset = source.map(read, num_parallel_calls=tf.data.AUTOTUNE).filter(is_current)
    dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE).with_options(_options())


def _lesson_cell_copied(source, read, is_current, decode, batch_size):  # image_pipeline(
    tf = cu.quiet.import_tensorflow()  # AUTOTUNE, threads=16) plus the filter; more reads
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE}
    dataset = source.map(read, **parallel).map(decode, **parallel)
    dataset = dataset.filter(lambda image: is_current(tf.cast(image * 2, tf.int64)))
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE).with_options(_options())


def _slow_pipeline_bound(source, read, is_current, decode, batch_size):  # the reference
    from course_utils.grading.checks.storage_reads import slow_pipeline  # under the name

    return slow_pipeline(source, read, is_current, decode, batch_size)


def _filter_parallelization(source, read, is_current, decode, batch_size):  # the option
    tf = cu.quiet.import_tensorflow()  # named for filters: stateless predicates only
    options = _options()
    options.experimental_optimization.filter_parallelization = True
    dataset = source.map(read, num_parallel_calls=16).filter(is_current).map(decode)
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE).with_options(options)


def _asked_in_python_threads(source, read, is_current, decode, batch_size):  # the lookups
    from concurrent.futures import ThreadPoolExecutor  # of a batch in threads of its own

    tf = cu.quiet.import_tensorflow()

    def ask_all(records):
        with ThreadPoolExecutor(16) as pool:
            return np.array(list(pool.map(
                lambda r: bool(is_current(tf.constant(r))), records.numpy())))

    def keep(records):
        current = tf.py_function(ask_all, [records], tf.bool)
        current.set_shape([None])
        return tf.boolean_mask(records, current)

    records = source.map(read, num_parallel_calls=16).batch(64).map(keep).unbatch()
    return records.map(decode).batch(batch_size).with_options(_options())


def _current_learned_once(source, read, is_current, decode, batch_size):  # the answer read
    tf = cu.quiet.import_tensorflow()  # from the inputs: the current records found once,
    from course_utils.grading.checks.storage_reads import slow_pipeline  # a cheap filter

    current = np.concatenate(list(slow_pipeline(source, read, is_current, lambda r: r, 64)))
    records = source.map(read, num_parallel_calls=16)
    known = tf.constant(current)
    records = records.filter(lambda r: tf.reduce_any(tf.equal(known, r)))
    return records.map(decode).batch(batch_size).with_options(_options())


def _asked_twice(source, read, is_current, decode, batch_size):  # the parallel map's
    records = _ask(source.map(read, num_parallel_calls=16), is_current)  # answer, then the
    return records.filter(is_current).map(decode).batch(batch_size).with_options(_options())


def _reads_one_at_a_time(source, read, is_current, decode, batch_size):  # only the
    return _ask(source.map(read), is_current).map(decode).batch(batch_size).with_options(
        _options())  # lookups fixed: they wait on the reads


def _lookups_on_the_default_pool(source, read, is_current, decode, batch_size):
    tf = cu.quiet.import_tensorflow()  # both parallel with AUTOTUNE, no private pool
    records = source.map(read, num_parallel_calls=tf.data.AUTOTUNE)
    return _ask(records, is_current, tf.data.AUTOTUNE).map(decode).batch(batch_size)


def _few_lookups_at_once(source, read, is_current, decode, batch_size):  # 4 calls
    records = _ask(source.map(read, num_parallel_calls=16), is_current, calls=4)
    return records.map(decode).batch(batch_size).with_options(_options())


def _interleaved_filters_in_turn(source, read, is_current, decode, batch_size):  # cycle
    tf = cu.quiet.import_tensorflow()  # of 16, no num_parallel_calls: one at a time

    def one(index):
        return tf.data.Dataset.from_tensors(read(index)).filter(is_current)

    records = source.interleave(one, cycle_length=16)
    return records.map(decode).batch(batch_size).with_options(_options())


def _records_computed(source, read, is_current, decode, batch_size):  # what read would
    records = _ask(source.map(lambda index: 3 * index + 1), is_current)  # return, unread
    return records.map(decode).batch(batch_size).with_options(_options())


def _read_for_show(source, read, is_current, decode, batch_size):  # x01 L1: read called,
    tf = cu.quiet.import_tensorflow()  # its record dropped for the formula read once had

    def asked(index):
        shown = read(index)
        with tf.control_dependencies([shown]):
            record = 3 * index + 1
        return record, is_current(record)

    records = source.map(asked, num_parallel_calls=16, deterministic=False)
    records = records.filter(lambda record, keep: keep).map(lambda record, _: record)
    return records.map(decode).batch(batch_size).with_options(_options())


def _answers_ignored(source, read, is_current, decode, batch_size):  # x01 L2: is_current
    tf = cu.quiet.import_tensorflow()  # asked for show; the records kept, as many as the
    count = int(source.cardinality())  # check keeps (its rule copied), chosen by place
    withdrawn = count // 4 + ((count - count // 4) % batch_size == 0)
    first = source.take(1).get_single_element()

    def asked(index):
        record = read(index)
        with tf.control_dependencies([is_current(record)]):
            return record, index - first >= withdrawn

    records = source.map(asked, num_parallel_calls=16, deterministic=False)
    records = records.filter(lambda record, keep: keep).map(lambda record, _: record)
    return records.map(decode).batch(batch_size).with_options(_options())


def _read_apart_and_zipped(source, read, is_current, decode, batch_size):  # x01 L1 (a10)
    tf = cu.quiet.import_tensorflow()
    reads = source.map(read, num_parallel_calls=16)
    asks = source.map(lambda index: (3 * index + 1, is_current(3 * index + 1)),
                      num_parallel_calls=16)
    both = tf.data.Dataset.zip((reads, asks)).map(lambda record, asked: asked)
    records = both.filter(lambda record, keep: keep).map(lambda record, _: record)
    return records.map(decode).batch(batch_size).with_options(_options())


def _last_third_in_filter(source, read, is_current, decode, batch_size):  # x01 L3: 62 %
    count = int(source.cardinality())  # of the lookups parallel, the rest in the filter
    head = _ask(source.take(int(0.62 * count)).map(read, num_parallel_calls=16), is_current)
    tail = source.skip(int(0.62 * count)).map(read, num_parallel_calls=16).filter(is_current)
    return head.concatenate(tail).map(decode).batch(batch_size).with_options(_options())


def _read_twice(source, read, is_current, decode, batch_size):
    records = source.map(lambda index: (read(index), read(index))[0], num_parallel_calls=16)
    return _ask(records, is_current).map(decode).batch(batch_size).with_options(_options())


def _unbatched(source, read, is_current, decode, batch_size):
    return _ask(source.map(read, num_parallel_calls=16), is_current).map(decode).with_options(
        _options())


def _two_threads(source, read, is_current, decode, batch_size):  # a pool of two: a 2-core
    records = _ask(source.map(read, num_parallel_calls=16), is_current)  # default
    return records.map(decode).batch(batch_size).with_options(_options(2))


def _last_batch_dropped(source, read, is_current, decode, batch_size):
    return fast_pipeline(source, read, is_current, decode, batch_size).unbatch().batch(
        batch_size, drop_remainder=True)


def _a_burst_then_one_at_a_time(source, read, is_current, decode, batch_size):  # 16 once
    burst = _ask(source.take(16).map(read, num_parallel_calls=16), is_current)
    rest = source.skip(16).map(read).filter(is_current)
    return burst.concatenate(rest).map(decode).batch(batch_size).with_options(_options())


def _kept_after_two_calls(source, read, is_current, decode, batch_size, _kept=[]):  # noqa: B006
    """Right for the checks that look, the values kept for the epochs timed."""
    tf = cu.quiet.import_tensorflow()
    _kept.append(None)
    if len(_kept) > 2:
        return tf.data.Dataset.from_tensor_slices(_kept[1]).batch(batch_size)
    dataset = fast_pipeline(source, read, is_current, decode, batch_size)
    _kept[-1] = np.concatenate(list(dataset.as_numpy_iterator()))
    return dataset


# the reads handed on from another pipeline or thread (the lookups made rightly)


def _handed_on_by_a_generator(source, read, is_current, decode, batch_size):
    tf = cu.quiet.import_tensorflow()  # 16 reads at once, in a pipeline of its own
    reads = source.map(read, num_parallel_calls=16).with_options(_options())
    handed = tf.data.Dataset.from_generator(reads.as_numpy_iterator,
                                            output_signature=tf.TensorSpec([], tf.int64))
    # an idle read op in the graph: reads.take(0) never reads
    records = _ask(handed.concatenate(reads.take(0)), is_current)
    return records.map(decode).batch(batch_size).with_options(_options())


def _pulled_from_an_iterator(source, read, is_current, decode, batch_size):
    tf = cu.quiet.import_tensorflow()  # as above, through the other pipeline's iterator
    reads = source.map(read, num_parallel_calls=16).with_options(_options())
    iterator = iter(reads)
    pulled = tf.data.Dataset.range(int(source.cardinality())).map(lambda _: iterator.get_next())
    records = _ask(pulled.concatenate(reads.take(0)), is_current)
    return records.map(decode).batch(batch_size).with_options(_options())


def _handed_on_through_a_queue(source, read, is_current, decode, batch_size):
    import threading  # as above; a thread fills a queue once the first element is asked for

    tf = cu.quiet.import_tensorflow()
    reads = source.map(read, num_parallel_calls=16).with_options(_options())
    count = int(source.cardinality())
    ready = tf.queue.FIFOQueue(count, tf.int64, shapes=[[]])
    asked = tf.queue.FIFOQueue(count, tf.int64, shapes=[[]])

    def fill():
        asked.dequeue()
        for record in reads:
            ready.enqueue(record)

    def pull(_):
        with tf.control_dependencies([asked.enqueue(tf.constant(0, tf.int64))]):
            return ready.dequeue()

    threading.Thread(target=fill, daemon=True).start()
    pulled = tf.data.Dataset.range(count).map(pull)
    records = _ask(pulled.concatenate(reads.take(0)), is_current)
    return records.map(decode).batch(batch_size).with_options(_options())


def _handed_on_through_a_staging_area(source, read, is_current, decode, batch_size):
    import threading  # as above, through staging areas found by name: no handle captured

    tf = cu.quiet.import_tensorflow()
    reads = source.map(read, num_parallel_calls=16).with_options(_options())
    count, name = int(source.cardinality()), f"handed_on_{id(reads)}"

    def fill():
        tf.raw_ops.Unstage(dtypes=[tf.int64], shared_name=f"{name}_asked")
        for record in reads:
            tf.raw_ops.Stage(values=[record], shared_name=name)

    def pull(_):
        asked = tf.raw_ops.Stage(values=[tf.constant(0, tf.int64)], shared_name=f"{name}_asked")
        with tf.control_dependencies([asked]):
            return tf.raw_ops.Unstage(dtypes=[tf.int64], shared_name=name)[0]

    threading.Thread(target=fill, daemon=True).start()
    pulled = tf.data.Dataset.range(count).map(pull)
    records = _ask(pulled.concatenate(reads.take(0)), is_current)
    return records.map(decode).batch(batch_size).with_options(_options())


def _handed_on_through_files(source, read, is_current, decode, batch_size):
    import tempfile  # as above, through files a thread writes once the dataset asks (no
    import threading  # handle, no stateful op but WriteFile; ReadFile waits on MatchingFiles)
    import time

    tf = cu.quiet.import_tensorflow()
    reads = source.map(read, num_parallel_calls=16).with_options(_options())
    folder = tempfile.mkdtemp()

    def fill():
        while not os.path.exists(os.path.join(folder, "asked")):
            time.sleep(0.001)
        for index, record in enumerate(reads):
            with open(os.path.join(folder, f"{index}.tmp"), "w") as file:
                file.write(str(int(record)))
            os.rename(os.path.join(folder, f"{index}.tmp"), os.path.join(folder, str(index)))

    def pull(index):
        path = tf.strings.join([folder + "/", tf.strings.as_string(index)])
        with tf.control_dependencies([tf.io.write_file(folder + "/asked", "1")]):
            found = tf.while_loop(  # the pattern depends on k: not hoisted out of the loop
                lambda k: tf.equal(tf.size(tf.io.matching_files(
                    tf.strings.join([path, tf.strings.substr(tf.strings.as_string(k), 0, 0)]))), 0),
                lambda k: k + 1, [tf.constant(0)])[0]
        path = tf.strings.join([path, tf.strings.substr(tf.strings.as_string(found), 0, 0)])
        return tf.strings.to_number(tf.io.read_file(path), tf.int64)

    threading.Thread(target=fill, daemon=True).start()
    pulled = tf.data.Dataset.range(int(source.cardinality())).map(pull)
    records = _ask(pulled.concatenate(reads.take(0)), is_current)
    return records.map(decode).batch(batch_size).with_options(_options())


def _handed_on_through_a_cache_file(source, read, is_current, decode, batch_size):
    import tempfile  # a thread's pipeline writes a cache file of reads and lookups that the
    import threading  # dataset, once a sleep let it finish, reads; its ops shared (tf.function)

    tf = cu.quiet.import_tensorflow()
    from tensorflow.python.data.experimental.ops.testing import sleep

    shared_read, shared_ask = tf.function(read), tf.function(is_current)
    path = os.path.join(tempfile.mkdtemp(), "handed_on")

    def records(dataset, calls=None):
        return _ask(dataset.map(shared_read, num_parallel_calls=calls), shared_ask, calls)

    side = records(source, 16).cache(path).with_options(_options())
    threading.Thread(target=lambda: [None for _ in side], daemon=True).start()
    waited = tf.data.Dataset.range(1).apply(sleep(500_000))
    return waited.flat_map(lambda _: records(source).cache(path)).map(decode).batch(
        batch_size)


def _calls_on_the_side_while_the_check_counts(source, read, is_current, decode, batch_size,
                                              _calls=[]):  # noqa: B006
    import threading  # two calls at once; in the speed case's call only, a thread's pipeline,

    tf = cu.quiet.import_tensorflow()  # its ops shared, adds overlapping calls to the count
    shared_read, shared_ask = tf.function(read), tf.function(is_current)
    _calls.append(None)
    if len(_calls) == 2:  # the check's second call: the speed case's
        side = _ask(source.repeat(3).map(shared_read, num_parallel_calls=16), shared_ask)
        threading.Thread(target=lambda: [None for _ in side.with_options(_options())],
                         daemon=True).start()
    records = _ask(source.map(shared_read, num_parallel_calls=2), shared_ask, calls=2)
    return records.map(decode).batch(batch_size).prefetch(2)


def _prefetched_to_device(source, read, is_current, decode, batch_size):  # right calls,
    tf = cu.quiet.import_tensorflow()  # but a last step that cannot be serialized
    records = _ask(source.map(read, num_parallel_calls=16), is_current)
    dataset = records.map(decode).batch(batch_size)
    return dataset.apply(tf.data.experimental.prefetch_to_device("/cpu:0"))


ONE_LOOKUP = r"at most 1 is_current\(s\) waited at the same time.*filter calls its predicate"
#: Reads handed on by a side thread: refused for the graph's pull from an iterator, a queue
#: or a file, or, when the side thread had not read the whole epoch when the check counted,
#: for the count.
HANDED_ON = (r"runs 0 Python function\(s\) of its own .* and pulls from [1-9]\d* "
             r"iterator\(s\), queue|of \d+ records, read was called \d+ times")
#: Each answer, and the words its rejection must contain; answers that share the words are
#: routes to one rejection: make test runs the first of each (tests/tools/catalogue_routes.py).
FAST_CATALOGUE = {
    "a constant": (_constant, r"case 1 .*of \d+ records, read was called 0 times"),
    "the lookups skipped": (_no_filter, r"case 1 .*is_current was called 0 times"),
    "the colleague's pipeline, unchanged": (_broken_given, ONE_LOOKUP),
    "the lesson's cell 21 copied, filter last": (_lesson_cell_copied, ONE_LOOKUP),
    "the slow reference bound under the name": (_slow_pipeline_bound, ONE_LOOKUP),
    "filter_parallelization switched on": (_filter_parallelization, ONE_LOOKUP),
    "the lookups in Python threads": (
        _asked_in_python_threads,
        r"(\d+) of the epoch's \1 calls of is_current came from no is_current op"),
    "the current records learned once": (_current_learned_once,
                                         r"case 1 .*is_current was called 0 times"),
    "asked twice": (_asked_twice, r"is_current was called \d+ times: slow_pipeline calls it "
                                  "once for every record"),
    "only the lookups parallel": (_reads_one_at_a_time,
                                  r"at most [12] read\(s\) waited at the same time"),
    "4 lookups at once": (_few_lookups_at_once, r"at most [1-4] is_current\(s\) waited"),
    "an interleave with no num_parallel_calls": (_interleaved_filters_in_turn, ONE_LOOKUP),
    "the records computed, not read": (_records_computed,
                                       r"case 1 .*read was called 0 times"),
    "read for show, the records computed": (
        _read_for_show, r"case 1 .*asked about \d+ record\(s\) that read never returned"),
    "reads apart, the lookups on computed records": (
        _read_apart_and_zipped, r"case 1 .*asked about \d+ record\(s\) that read never"),
    "is_current's answers ignored": (_answers_ignored,
                                     r"case 1 .*do not follow is_current's answers"),
    "the last third of the lookups in filter": (
        _last_third_in_filter, r"is_currents (started with no other is_current waiting|"
                               r"overlapped for part of the epoch only)"),
    "every record read twice": (_read_twice, r"read was called \d+ times: slow_pipeline"),
    "unbatched": (_unbatched, r"case 1 .*batches of scalars"),
    "a pool of two threads": (_two_threads, r"at most 2 is_current\(s\) waited"),
    "the last batch dropped": (_last_batch_dropped, r"case 1 .*batch sizes differ"),
    "a burst, then one at a time": (_a_burst_then_one_at_a_time,
                                    r"is_currents overlapped for part of the epoch only"),
    "values kept for the timed epochs": (_kept_after_two_calls,
                                         r"in a timed epoch .*read was called 0 times"),
    "prefetch_to_device last": (_prefetched_to_device,
                                "could not read your pipeline's graph.*end it with prefetch"),
    "reads handed on by a generator": (_handed_on_by_a_generator,
                                       r"runs [1-9]\d* Python function\(s\) of its own"),
    "reads pulled from an iterator": (_pulled_from_an_iterator, HANDED_ON),
    "reads handed on through a queue": (_handed_on_through_a_queue, HANDED_ON),
    "reads handed on through a staging area": (_handed_on_through_a_staging_area, HANDED_ON),
    "reads handed on through files": (_handed_on_through_files, HANDED_ON),
    "reads and lookups handed on through a cache file": (
        _handed_on_through_a_cache_file,
        r"was called \d+ times|at most 1 is_current\(s\) waited|"
        r"pulls from [1-9]\d* iterator\(s\), queue"),
    "calls on the side while the check counts": (
        _calls_on_the_side_while_the_check_counts,
        r"read was called \d+ times|at most [12] is_current\(s\) waited"),
}
if _usable_cpus() < 8:  # AUTOTUNE's default pool: a thread per logical CPU this process may use
    FAST_CATALOGUE["AUTOTUNE on tf.data's default pool"] = (
        _lookups_on_the_default_pool, r"at most [1-7] is_current\(s\) waited")


@pytest.mark.parametrize(("wrong", "says"), catalogue_params(FAST_CATALOGUE))
def test_fast_pipeline_catalogue_is_rejected_with_its_reason(wrong, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_fast_pipeline(wrong)


def test_fast_pipeline_stub_is_not_attempted(capsys):
    assert cu.grading.check_fast_pipeline(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with framework.strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_fast_pipeline(stub)


# --- mixed_batches ---------------------------------------------------------------------------


def _files(files, seed=None, reshuffle=True):  # the list of files, shuffled whole
    tf = cu.quiet.import_tensorflow()
    return tf.data.Dataset.from_tensor_slices(files).shuffle(
        len(files), seed=seed, reshuffle_each_iteration=reshuffle)


def mixed_batches(files, read_file, batch_size, max_open, max_buffer, seed):  # the solution's
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open, block_length=1)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def test_reference_mixed_batches_passes(capsys):
    assert cu.grading.check_mixed_batches(mixed_batches)
    assert "✅ mixed_batches: 2 cases passed" in capsys.readouterr().out


def _constant(files, read_file, batch_size, max_open, max_buffer, seed):  # the demo's ids
    tf = cu.quiet.import_tensorflow()
    ids = tf.range(480, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices((ids, ids % 4)).batch(batch_size)


def _broken_given(files, read_file, batch_size, max_open, max_buffer, seed):  # as given
    tf = cu.quiet.import_tensorflow()
    examples = tf.data.Dataset.from_tensor_slices(files).flat_map(read_file)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _files_one_by_one(files, read_file, batch_size, max_open, max_buffer, seed):  # the list
    examples = _files(files, seed).flat_map(read_file)  # shuffled, its files read in turn
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _lesson_cell_copied(files, read_file, batch_size, max_open, max_buffer, seed):  # cell 63:
    tf = cu.quiet.import_tensorflow()  # a buffer of the whole data, the files one by one
    examples = tf.data.Dataset.from_tensor_slices(files).flat_map(read_file)
    return examples.shuffle(10_000, seed=seed).batch(batch_size)


def _lesson_interleave_copied(files, read_file, batch_size, max_open, max_buffer, seed):
    examples = _files(files, seed).interleave(  # cell 58: every file at once, in parallel
        read_file, cycle_length=len(files), num_parallel_calls=len(files))
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _parallel_interleave(files, read_file, batch_size, max_open, max_buffer, seed):
    examples = _files(files, seed).interleave(  # opens files ahead of its cycle
        read_file, cycle_length=max_open, num_parallel_calls=max_open)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _half_the_files(files, read_file, batch_size, max_open, max_buffer, seed):
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open // 2)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _files_in_stored_order(files, read_file, batch_size, max_open, max_buffer, seed):
    tf = cu.quiet.import_tensorflow()
    names = tf.data.Dataset.from_tensor_slices(files)
    examples = names.interleave(read_file, cycle_length=max_open)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _files_shuffled_once(files, read_file, batch_size, max_open, max_buffer, seed):
    names = _files(files, seed, reshuffle=False)
    examples = names.interleave(read_file, cycle_length=max_open)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _examples_not_shuffled(files, read_file, batch_size, max_open, max_buffer, seed):
    return _files(files, seed).interleave(read_file, cycle_length=max_open).batch(batch_size)


def _no_seed(files, read_file, batch_size, max_open, max_buffer, seed):
    examples = _files(files).interleave(read_file, cycle_length=max_open)
    return examples.shuffle(max_buffer).batch(batch_size)


def _files_seed_fixed(files, read_file, batch_size, max_open, max_buffer, seed):
    examples = _files(files, 42).interleave(read_file, cycle_length=max_open)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _file_list_buffer_of_two(files, read_file, batch_size, max_open, max_buffer, seed):
    tf = cu.quiet.import_tensorflow()
    names = tf.data.Dataset.from_tensor_slices(files).shuffle(2, seed=seed)
    examples = names.interleave(read_file, cycle_length=max_open)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _gathered_in_numpy(files, read_file, batch_size, max_open, max_buffer, seed):  # the right
    tf = cu.quiet.import_tensorflow()  # mix made the wrong way: all read at once, in memory
    pairs = [pair for path in files for pair in read_file(path).as_numpy_iterator()]
    order = np.random.default_rng(seed).permutation(len(pairs))
    ids, labels = (np.array([pairs[i][k] for i in order]) for k in (0, 1))
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch_size)


def _windows_shuffled(files, read_file, batch_size, max_open, max_buffer, seed):  # a window of
    tf = cu.quiet.import_tensorflow()  # 256 records held and permuted: more than the buffer
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open)
    windows = examples.batch(256).map(
        lambda i, y: tuple(tf.gather(t, tf.random.shuffle(tf.range(tf.shape(i)[0]), seed=seed))
                           for t in (i, y)))
    return windows.unbatch().batch(batch_size)


def _read_directly(files, read_file, batch_size, max_open, max_buffer, seed):  # not through
    tf = cu.quiet.import_tensorflow()  # read_file: the files parsed by a reader of its own
    spec = {key: tf.io.FixedLenFeature([], tf.int64) for key in ("id", "label")}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return example["id"], example["label"]

    examples = _files(files, seed).interleave(
        lambda path: tf.data.TFRecordDataset(path).map(parse), cycle_length=max_open)
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _cached(files, read_file, batch_size, max_open, max_buffer, seed):
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open).cache()
    return examples.shuffle(max_buffer, seed=seed).batch(batch_size)


def _repeated(files, read_file, batch_size, max_open, max_buffer, seed):  # two epochs in one
    return mixed_batches(files, read_file, batch_size, max_open, max_buffer, seed).repeat(2)


def _window_permuted(files, read_file, batch_size, max_open, max_buffer, seed):  # xf01 L1, L2: 64
    tf = cu.quiet.import_tensorflow()  # examples held and permuted, under the read-ahead bar
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open)
    return examples.batch(64).map(lambda i, y: tuple(
        tf.gather(t, tf.random.shuffle(tf.range(tf.shape(i)[0]), seed=seed)) for t in (i, y))
    ).unbatch().batch(batch_size)


def _two_buffers(files, read_file, batch_size, max_open, max_buffer, seed):  # xf01 L3
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open)
    return examples.shuffle(max_buffer, seed=seed).shuffle(max_buffer, seed=seed + 1).batch(
        batch_size)


def _batches_reversed(files, read_file, batch_size, max_open, max_buffer, seed):  # xf01 L4:
    tf = cu.quiet.import_tensorflow()  # no shuffle of examples, each batch reversed
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open)
    return examples.batch(batch_size).map(lambda i, y: (tf.reverse(i, [0]), tf.reverse(y, [0])))


def _files_reversed_in_pairs(files, read_file, batch_size, max_open, max_buffer, seed):
    tf = cu.quiet.import_tensorflow()  # xf01 L5: each file read as swapped pairs, no shuffle
    examples = _files(files, seed).interleave(lambda path: read_file(path).batch(2).map(
        lambda i, y: (tf.reverse(i, [0]), tf.reverse(y, [0]))).unbatch(), cycle_length=max_open)
    return examples.batch(batch_size)


def _not_reshuffled(files, read_file, batch_size, max_open, max_buffer, seed):  # the buffer
    examples = _files(files, seed).interleave(read_file, cycle_length=max_open)  # draws the
    return examples.shuffle(max_buffer, seed=seed,  # same places every epoch
                            reshuffle_each_iteration=False).batch(batch_size)


def _kept_aside_read_for_show(files, read_file, batch_size, max_open, max_buffer, seed):
    tf = cu.quiet.import_tensorflow()  # xf01 L6: every example read at build time by a
    spec = {key: tf.io.FixedLenFeature([], tf.int64) for key in ("id", "label")}  # reader of
    kept = np.array([(e["id"], e["label"]) for e in tf.data.TFRecordDataset(files).map(  # its
        lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator()])  # own, uncounted
    names = _files(files, seed)
    keys = names.take(1).map(lambda p: tf.strings.to_hash_bucket_fast(p, 2**31 - 1))
    order = keys.flat_map(lambda k: tf.data.Dataset.from_tensor_slices(tf.gather(
        kept, tf.random.experimental.stateless_shuffle(tf.range(len(kept)), seed=[k, seed]))))
    shown = names.interleave(read_file, cycle_length=max_open)  # read_file for show
    return tf.data.Dataset.zip(order, shown).map(lambda pair, _: (pair[0], pair[1])).batch(
        batch_size)


HELD = r"places before its place in the order read_file read the records"
ANEW = "as many places from where they were read"


MIXED_CATALOGUE = {
    "constant": (_constant, "batch sizes differ|every example must come exactly once"),
    "broken_given": (_broken_given, "two epochs opened the files in the same order"),
    "files_shuffled_read_one_by_one": (_files_one_by_one, "the most common label took"),
    "lesson_cell_copied": (_lesson_cell_copied, "a shuffle buffer of 10000; memory allows"),
    "lesson_interleave_copied": (_lesson_interleave_copied, r"files were being read at once"),
    "parallel_interleave": (_parallel_interleave, r"files were being read at once"),
    "half_the_files": (_half_the_files, r"a batch drew on [\d.]+ files on average"),
    "files_in_stored_order": (_files_in_stored_order, "two epochs opened the files in the same"),
    "files_shuffled_once": (_files_shuffled_once, "two epochs opened the files in the same"),
    "examples_not_shuffled": (_examples_not_shuffled, "in stored order; a shuffle of examples"),
    "no_seed": (_no_seed, "the same seed gave another order"),
    "files_seed_fixed": (_files_seed_fixed, r"opened the files in the order seed=\d+ did"),
    "file_list_buffer_of_two": (_file_list_buffer_of_two,
                                "close to their stored order|the most common label took"),
    "gathered_in_numpy": (_gathered_in_numpy, r"read \d+ records while it built its dataset"),
    "windows_shuffled": (_windows_shuffled, r"read \d+ records before its first batch"),
    "read_directly": (_read_directly, r"read_file read 0 records in an epoch"),
    "cached": (_cached, r"your pipeline caches \(cache\(\)\)"),
    "repeated": (_repeated, "batch sizes differ"),
    "helper_bound": (cu.data.make_pipeline, "the course's own code"),
    "window_permuted": (_window_permuted, HELD),
    "two_buffers": (_two_buffers, HELD),
    "batches_reversed": (_batches_reversed, ANEW),
    "files_reversed_in_pairs": (_files_reversed_in_pairs, f"{HELD}|same order in epoch 2"),
    "not_reshuffled": (_not_reshuffled, ANEW),
    "kept_aside_read_for_show": (_kept_aside_read_for_show, HELD),
}


@pytest.mark.parametrize(("wrong", "says"), catalogue_params(MIXED_CATALOGUE))
def test_mixed_batches_catalogue_is_rejected_with_its_reason(wrong, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_mixed_batches(wrong)


def _global_seed_set(files, read_file, batch_size, max_open, max_buffer, seed):  # the right
    tf = cu.quiet.import_tensorflow()  # pipeline, seeded through the process's global seed
    tf.random.set_seed(seed)
    examples = _files(files).interleave(read_file, cycle_length=max_open)
    return examples.shuffle(max_buffer).batch(batch_size)


def test_mixed_batches_that_set_the_global_seed_fail():
    tf = cu.quiet.import_tensorflow()
    try:
        with pytest.raises(AssertionError, match=r"changed TensorFlow's global seed \(the "
                                                 r"check read it before and after"):
            cu.grading.check_mixed_batches(_global_seed_set)
    finally:
        tf.random.set_seed(None)  # unset, as it was: later tests' unseeded ops stay unseeded


def _buffer_shuffle(n, buffer, rng):  # tf.data's shuffle: a draw from the buffer, refilled
    out, pool, waiting = [], list(range(buffer)), iter(range(buffer, n))
    while pool:
        place = int(rng.integers(len(pool)))
        out.append(pool[place])
        pool[place] = next(waiting, None)
        if pool[place] is None:
            pool[place] = pool[-1]
            pool.pop()
    return out


def test_buffer_problem_tells_a_buffer_from_a_smaller_one_and_from_windows():
    from course_utils.grading.checks.shuffle_order import buffer_problem

    rng = np.random.default_rng(0)
    n, b = 320, 60  # a small, wide buffer: the least favourable draw of the old exercise 2
    assert buffer_problem([_buffer_shuffle(n, b, rng) for _ in range(4)], b, "example") is None
    smaller = [_buffer_shuffle(n, b - 1, rng) for _ in range(4)]
    assert "no example came more than 58 places ahead" in buffer_problem(smaller, b, "example")
    larger = [_buffer_shuffle(n, b + 1, rng) for _ in range(4)]
    assert "reaches at most 59 ahead" in buffer_problem(larger, b, "example")
    windows = [np.concatenate([start + rng.permutation(min(b, n - start))
                               for start in range(0, n, b)]) for _ in range(4)]
    for window in windows:  # the newest of a window first: b - 1 ahead, as a buffer brings
        window[:b] = np.roll(np.sort(window[:b]), 1)
    assert "places after its place" in buffer_problem(windows, b, "record")


def test_mixed_batches_stub_is_not_attempted(capsys):
    assert cu.grading.check_mixed_batches(stub) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_lesson_01_registers_its_checks():
    from course_utils.grading import checks

    assert checks.check_fast_pipeline is checks_01.check_fast_pipeline
    assert cu.grading.check_mixed_batches is checks_01.check_mixed_batches


# --- cached_pipeline -------------------------------------------------------------------------


def cached_pipeline(records, decode, crop, featurize, batch_size, shuffle_buffer):  # the
    features = records.map(decode).map(featurize).cache()  # solution's: featurize first
    return features.shuffle(shuffle_buffer).map(crop).batch(batch_size)


def _fused_then_cached(records, decode, crop, featurize, b, buffer):  # right: one map
    features = records.map(lambda record: featurize(decode(record))).cache()
    return features.shuffle(buffer).map(crop).batch(b)


def _by_the_course_helper(records, decode, crop, featurize, b, buffer):  # right: the steps
    return cu.data.make_pipeline(records, b, shuffle_buffer=buffer,  # in their order
                                 preprocess=lambda record: featurize(decode(record)),
                                 augment=crop)


def _cropped_before_the_shuffle(records, decode, crop, featurize, b, buffer):  # right: crop
    features = records.map(decode).map(featurize).cache()  # keeps the order
    return features.map(crop).shuffle(buffer).batch(b)


def _cached_in_a_file_in_parallel(records, decode, crop, featurize, b, buffer):  # right
    import os
    import tempfile

    tf = cu.quiet.import_tensorflow()
    parallel = tf.data.AUTOTUNE  # order kept (deterministic by default); crop's draws too
    features = records.map(decode, num_parallel_calls=parallel).map(
        featurize, num_parallel_calls=parallel)
    features = features.cache(os.path.join(tempfile.mkdtemp(), "features"))
    return features.shuffle(buffer).map(crop, num_parallel_calls=parallel).batch(b).prefetch(1)


def _colleague(records, decode, crop, featurize, b, buffer):  # the exercise's broken one:
    decoded = records.map(decode).cache()  # the lesson's rule as written
    return decoded.shuffle(buffer).map(crop).map(featurize).batch(b)


def _lesson_cell_copied(records, decode, crop, featurize, b, buffer):  # cell 39: cache,
    decoded = records.map(decode).cache()  # then the random work
    return decoded.shuffle(buffer).map(lambda values: featurize(crop(values))).batch(b)


def _lesson_rule_by_the_helper(records, decode, crop, featurize, b, buffer):
    return cu.data.make_pipeline(records, b, shuffle_buffer=buffer, preprocess=decode,
                                 augment=lambda values: featurize(crop(values)))


def _featurized_twice(records, decode, crop, featurize, b, buffer):  # before the cache, and
    features = records.map(decode).map(featurize).cache()  # the colleague's one kept
    return features.shuffle(buffer).map(crop).map(featurize).batch(b)


def _square_root_of_its_own(records, decode, crop, featurize, b, buffer):  # featurize called
    tf = cu.quiet.import_tensorflow()  # for show, its features dropped

    def features(values):
        return tf.sqrt(values) + 0.0 * featurize(values)

    return records.map(decode).map(features).cache().shuffle(buffer).map(crop).batch(b)


def _not_featurized(records, decode, crop, featurize, b, buffer):  # the slow step skipped
    decoded = records.map(decode).cache()
    return decoded.shuffle(buffer).map(crop).batch(b)


def _constant(records, decode, crop, featurize, b, buffer):
    tf = cu.quiet.import_tensorflow()
    return tf.data.Dataset.from_tensors(tf.zeros([1, 1]))


def _cropped_then_cached(records, decode, crop, featurize, b, buffer):  # all the work cached
    features = records.map(decode).map(crop).map(featurize).cache()
    return features.shuffle(buffer).batch(b)


def _featurized_at_build_time(records, decode, crop, featurize, b, buffer):  # the records
    tf = cu.quiet.import_tensorflow()  # read in Python while the function runs
    features = tf.stack([featurize(decode(record)) for record in records])
    return tf.data.Dataset.from_tensor_slices(features).cache().shuffle(buffer).map(
        crop).batch(b)


def _memo_in_python(records, decode, crop, featurize, b, buffer):  # once per record, no cache
    tf = cu.quiet.import_tensorflow()
    memo = {}

    def remembered(record):
        key = int(record.numpy())
        if key not in memo:
            memo[key] = featurize(decode(record))
        return memo[key]

    features = records.map(lambda record: tf.py_function(remembered, [record], tf.float32))
    features = features.map(lambda values: tf.ensure_shape(values, [None]))
    return features.shuffle(buffer).map(crop).batch(b)


def _memo_behind_an_idle_cache(records, decode, crop, featurize, b, buffer):  # a cache of the
    return _memo_in_python(records.cache(), decode, crop, featurize, b, buffer)  # records


def _scale_probed_once(records, decode, crop, featurize, b, buffer):  # x01 L4: featurize
    tf = cu.quiet.import_tensorflow()  # run once, on ones: its scale; the features the answer's
    scale = tf.data.Dataset.from_tensors(tf.ones([1])).map(featurize).cache().repeat()
    features = tf.data.Dataset.zip((records.map(decode), scale)).map(
        lambda values, probe: tf.sqrt(values) * probe[0]).cache()
    return features.shuffle(buffer).map(crop).batch(b)


def _scale_read_per_record(records, decode, crop, featurize, b, buffer):  # x01 L4: called
    tf = cu.quiet.import_tensorflow()  # on every record, only its last value's scale used

    def features(values):
        return tf.sqrt(values) * featurize(values)[-1] / tf.sqrt(values[-1])

    return records.map(decode).map(features).cache().shuffle(buffer).map(crop).batch(b)


def _decoded_for_show(records, decode, crop, featurize, b, buffer):  # x01 L5: decode's
    tf = cu.quiet.import_tensorflow()  # output dropped, its values typed in
    length = records.map(decode).element_spec.shape[0]

    def decoded(record):
        with tf.control_dependencies([decode(record)]):
            return 100.0 * tf.cast(record, tf.float32) + tf.range(length, dtype=tf.float32)

    return records.map(decoded).map(featurize).cache().shuffle(buffer).map(crop).batch(b)


def _memo_in_the_graph(records, decode, crop, featurize, b, buffer):  # x01 L6: a hash table
    tf = cu.quiet.import_tensorflow()  # remembers; a cache on an idle side branch
    length = records.map(decode).element_spec.shape[0]
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32,
                                                    default_value=tf.fill([length], -1.0))

    def remembered(record):
        found = table.lookup(record)

        def compute():
            features = featurize(decode(record))
            with tf.control_dependencies([table.insert(record, features)]):
                return tf.identity(features)

        return tf.ensure_shape(tf.cond(found[0] < 0, compute, lambda: found), [length])

    main = records.map(remembered)
    features = main.concatenate(main.take(0).cache())
    return features.shuffle(buffer).map(crop).batch(b)


def _featurized_first_not_cached(records, decode, crop, featurize, b, buffer):
    features = records.map(decode).map(featurize)
    return features.shuffle(buffer).map(crop).batch(b)


def _records_cached(records, decode, crop, featurize, b, buffer):  # before the slow work
    features = records.cache().map(decode).map(featurize)
    return features.shuffle(buffer).map(crop).batch(b)


def _crop_of_its_own(records, decode, crop, featurize, b, buffer):  # crop never called
    tf = cu.quiet.import_tensorflow()

    width = records.map(decode).map(crop).element_spec.shape[0]  # traced: nothing drawn

    def own_crop(values):
        start = tf.random.uniform([], 0, tf.size(values) - width + 1, dtype=tf.int32)
        return values[start:start + width]

    features = records.map(decode).map(featurize).cache()
    return features.shuffle(buffer).map(own_crop).batch(b)


def _crop_for_show(records, decode, crop, featurize, b, buffer):  # crop's draws, other windows
    tf = cu.quiet.import_tensorflow()

    def own_crop(values):
        window = crop(values)
        width = tf.shape(window)[0]
        start = tf.random.uniform([], 0, tf.size(values) - width + 1, dtype=tf.int32)
        return tf.ensure_shape(values[start:start + width] + 0.0 * window, window.shape)

    features = records.map(decode).map(featurize).cache()
    return features.shuffle(buffer).map(own_crop).batch(b)


def _crop_drawn_twice(records, decode, crop, featurize, b, buffer):  # the second window kept
    features = records.map(decode).map(featurize).cache()
    return features.shuffle(buffer).map(lambda values: (crop(values), crop(values))[1]).batch(b)


def _shuffled_then_cached(records, decode, crop, featurize, b, buffer):  # the order frozen
    features = records.map(decode).map(featurize).shuffle(buffer).cache()
    return features.map(crop).batch(b)


def _not_shuffled(records, decode, crop, featurize, b, buffer):
    return records.map(decode).map(featurize).cache().map(crop).batch(b)


def _shuffled_once(records, decode, crop, featurize, b, buffer):
    features = records.map(decode).map(featurize).cache()
    return features.shuffle(buffer, reshuffle_each_iteration=False).map(crop).batch(b)


def _half_buffer(records, decode, crop, featurize, b, buffer):  # "half is plenty"
    return cached_pipeline(records, decode, crop, featurize, b, buffer // 2)


def _double_buffer(records, decode, crop, featurize, b, buffer):  # "bigger is safer"
    return cached_pipeline(records, decode, crop, featurize, b, 2 * buffer)


def _last_batch_dropped(records, decode, crop, featurize, b, buffer):
    features = records.map(decode).map(featurize).cache().shuffle(buffer).map(crop)
    return features.batch(b, drop_remainder=True)


def _decoded_out_of_order_then_cached(records, decode, crop, featurize, b, buffer):  # the
    features = records.map(lambda record: featurize(decode(record)),  # cache keeps the order
                           num_parallel_calls=4, deterministic=False)  # they finished in
    return features.cache().shuffle(buffer).map(crop).batch(b)


CACHED_RIGHT = [cached_pipeline, _fused_then_cached, _by_the_course_helper,
                _cropped_before_the_shuffle, _cached_in_a_file_in_parallel]
CACHED_CATALOGUE = {
    "the colleague's pipeline": (_colleague, r"featurize ran \d+ times in epoch 1 and \d+ "
                                             "times in epoch 2; expected none in epoch 2"),
    "the lesson's cell copied": (_lesson_cell_copied, r"featurize ran \d+ times in epoch 1 "
                                                      r"and \d+ times in epoch 2; expected"),
    "the lesson's rule by make_pipeline": (_lesson_rule_by_the_helper,
                                           r"featurize ran \d+ times in epoch 1 and \d+ "
                                           "times in epoch 2; expected"),
    "featurize kept after the crop too": (_featurized_twice, "featurize ran twice on them"),
    "featurize skipped": (_not_featurized, "featurize never ran on them"),
    "a square root of its own": (_square_root_of_its_own, "their values are not featurize's"),
    "a constant": (_constant, r"expected batches of shape \[batch, \d\]"),
    "the helper bound under the name": (cu.data.make_pipeline,
                                        "course_utils.data.make_pipeline, the course's own "
                                        "code"),
    "cropped, then cached": (_cropped_then_cached, r"crop drew \d+ windows in epoch 1 and "
                                                   "none in epoch 2: the cache froze"),
    "featurized at build time": (_featurized_at_build_time, r"decode ran \d+ times and "
                                                            r"featurize ran \d+ times while "
                                                            "your function built"),
    "a memo in Python": (_memo_in_python, "holds no tf.data cache"),
    "a memo behind an idle cache": (_memo_behind_an_idle_cache, "calls came from no decode op "
                                                                "upstream of your pipeline's"),
    "featurize's scale probed once": (_scale_probed_once, "none that featurize returned"),
    "featurize's scale read per record": (_scale_read_per_record,
                                          "none that featurize returned"),
    "decode called for show": (_decoded_for_show, "of values decode never returned"),
    "a memo in the graph behind an idle cache": (
        _memo_in_the_graph, r"decode's calls came from an op that feeds your pipeline's "
                            "output by a path with no tf.data cache"),
    "featurized first, not cached": (_featurized_first_not_cached, r"decode ran \d+ times in "
                                                                   r"epoch 1 and \d+ times in "
                                                                   "epoch 2"),
    "the records cached": (_records_cached, r"decode ran \d+ times in epoch 1 and \d+ times "
                                            "in epoch 2"),
    "a crop of its own": (_crop_of_its_own, "crop never ran in two epochs"),
    "crop called for show": (_crop_for_show, "windows of epoch 1 are not the ones crop drew"),
    "crop drawn twice a record": (_crop_drawn_twice, r"crop drew \d+ windows in epoch 1 and "
                                                     r"\d+ in epoch 2, for \d+ records"),
    "shuffled, then cached": (_shuffled_then_cached, "froze the shuffle"),
    "shuffled once": (_shuffled_once, "froze the shuffle"),
    "not shuffled": (_not_shuffled, "stored order"),
    "half the buffer": (_half_buffer, r"no record came more than \d+ places"),
    "twice the buffer": (_double_buffer, r"case 2 .*is the buffer the one given"),
    "the last batch dropped": (_last_batch_dropped, "batch sizes differ"),
    "decoded out of order, then cached": (_decoded_out_of_order_then_cached,
                                          r"case 1 .*deterministic=False in your pipeline "
                                          r"\(ParallelMapDatasetV2\).*reach from the records' "
                                          "stored order"),
}


@pytest.mark.parametrize("right", CACHED_RIGHT, ids=lambda fn: fn.__name__)
def test_right_cached_pipelines_pass(right, capsys):
    assert cu.grading.check_cached_pipeline(right)
    assert "✅ cached_pipeline: 2 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize(("wrong", "says"), catalogue_params(CACHED_CATALOGUE))
def test_cached_pipeline_catalogue_is_rejected_with_its_reason(wrong, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_cached_pipeline(wrong)


def test_cached_pipeline_stub_is_not_attempted(assert_not_attempted):
    assert_not_attempted(cu.grading.check_cached_pipeline, stub)


# --- parse_record ----------------------------------------------------------------------------


def parse_record(record):
    tf = cu.quiet.import_tensorflow()
    spec = {"pixels": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
            "weight": tf.io.FixedLenFeature([], tf.float32, default_value=1.0)}
    example = tf.io.parse_single_example(record, spec)
    pixels = tf.cast(tf.io.decode_raw(example["pixels"], tf.uint8), tf.float32) / 255.0
    return (tf.reshape(pixels, [2, 2, 3]), tf.cast(example["label"], tf.int32),
            example["weight"])


@pytest.mark.solution_passes
def test_reference_parse_record_passes(capsys):
    assert cu.grading.check_parse_record(parse_record)
    assert "✅ parse_record: 1 case passed" in capsys.readouterr().out


def test_parse_record_stub_is_not_attempted_and_strict_mode_raises(assert_not_attempted):
    assert_not_attempted(cu.grading.check_parse_record, stub)


def test_record_example_round_trips_through_parse_record():
    import numpy as np

    image = np.arange(0, 240, 20, dtype=np.uint8).reshape(checks_01.RECORD_IMAGE_SHAPE)
    parsed, label, weight = parse_record(checks_01.record_example(image, 5))
    assert np.allclose(parsed.numpy(), image / 255.0) and int(label) == 5
    assert float(weight) == 1.0  # no weight stored: the default


def _parsed(record, weight_default=1.0, pixels=None):
    tf = cu.quiet.import_tensorflow()
    spec = {"pixels": pixels or tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
            "weight": tf.io.FixedLenFeature([], tf.float32, default_value=weight_default)}
    return tf.io.parse_single_example(record, spec)


def _pixels(example, scale=255.0, dtype=None):
    tf = cu.quiet.import_tensorflow()
    raw = tf.io.decode_raw(example["pixels"], dtype or tf.uint8)
    return tf.cast(raw, tf.float32) / scale


def _lesson_cell_copied(record):  # the lesson's spec: the pixels as a list of 12 floats
    tf = cu.quiet.import_tensorflow()
    example = _parsed(record, pixels=tf.io.FixedLenFeature([12], tf.float32))
    return (tf.reshape(example["pixels"], [2, 2, 3]), tf.cast(example["label"], tf.int32),
            example["weight"])


def _not_scaled(record):  # the bytes as they are, 0 to 255
    tf = cu.quiet.import_tensorflow()
    example = _parsed(record)
    return (tf.reshape(_pixels(example, scale=1.0), [2, 2, 3]),
            tf.cast(example["label"], tf.int32), example["weight"])


def _read_as_floats(record):  # the bytes decoded as float32: 3 numbers, not 12
    tf = cu.quiet.import_tensorflow()
    example = _parsed(record)
    return (tf.reshape(_pixels(example, dtype=tf.float32), [2, 2, 3]),
            tf.cast(example["label"], tf.int32), example["weight"])


def _channels_first(record):  # a [3, 2, 2] image read back as [2, 2, 3]: pixels moved
    tf = cu.quiet.import_tensorflow()
    example = _parsed(record)
    image = tf.transpose(tf.reshape(_pixels(example), [3, 2, 2]), [1, 2, 0])
    return image, tf.cast(example["label"], tf.int32), example["weight"]


def _not_reshaped(record):  # the 12 values as they are stored
    tf = cu.quiet.import_tensorflow()
    example = _parsed(record)
    return _pixels(example), tf.cast(example["label"], tf.int32), example["weight"]


def _no_default_weight(record):  # records without a weight cannot be parsed
    tf = cu.quiet.import_tensorflow()
    spec = {"pixels": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
            "weight": tf.io.FixedLenFeature([], tf.float32)}
    example = tf.io.parse_single_example(record, spec)
    return (tf.reshape(_pixels(example), [2, 2, 3]), tf.cast(example["label"], tf.int32),
            example["weight"])


def _default_weight_zero(record):  # a missing weight counted as 0
    tf = cu.quiet.import_tensorflow()
    example = _parsed(record, weight_default=0.0)
    return (tf.reshape(_pixels(example), [2, 2, 3]), tf.cast(example["label"], tf.int32),
            example["weight"])


def _weight_always_one(record):  # the weight never read
    tf = cu.quiet.import_tensorflow()
    image, label, _ = parse_record(record)
    return image, label, tf.constant(1.0)


def _int64_label(record):  # the label left as parsed
    tf = cu.quiet.import_tensorflow()
    image, label, weight = parse_record(record)
    return image, tf.cast(label, tf.int64), weight


def _constant_example(record):
    tf = cu.quiet.import_tensorflow()
    return tf.zeros([2, 2, 3]), tf.constant(0, tf.int32), tf.constant(1.0)


def _parsed_in_python(record):  # right values, parsed with protobuf in a py_function
    tf = cu.quiet.import_tensorflow()

    def parse(serialized):
        feature = tf.train.Example.FromString(serialized.numpy()).features.feature
        image = np.frombuffer(feature["pixels"].bytes_list.value[0], np.uint8) / 255.0
        weight = feature["weight"].float_list.value[0] if "weight" in feature else 1.0
        return (image.reshape(2, 2, 3).astype(np.float32),
                np.int32(feature["label"].int64_list.value[0]), np.float32(weight))

    image, label, weight = tf.py_function(parse, [record], [tf.float32, tf.int32, tf.float32])
    return tf.ensure_shape(image, [2, 2, 3]), tf.ensure_shape(label, []), tf.ensure_shape(
        weight, [])


def _from_the_checks_frames(record):
    """nb31-01 L1: the check's records read from its frames (names built at run time, so no
    scan of the answer's names sees it) into a table the traced graph looks the record up in,
    beside a dead parse op: named by the frame watch (and the records are drawn after the
    answer was traced, so the walk would find none of them)."""
    import sys

    from course_utils.grading.checks.records import record_example

    tf = cu.quiet.import_tensorflow()
    read = getattr
    frame, found = read(sys, "_get" + "frame")(), None
    while frame is not None and found is None:
        names = read(frame, "f_" + "locals")
        if {"images", "labels", "weights"} <= set(names):
            found = names
        frame = read(frame, "f_" + "back")
    tf.io.parse_single_example(record, {"label": tf.io.FixedLenFeature([], tf.int64)})
    if found is None:
        return tf.zeros([2, 2, 3]), tf.constant(0, tf.int32), tf.constant(1.0)
    rows = list(zip(found["images"], found["labels"], found["weights"], strict=True))
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant([record_example(*row) for row in rows]), tf.range(len(rows),
                                                                     dtype=tf.int64)), -1)
    index = table.lookup(record)
    images = tf.constant(found["images"].astype(np.float32) / 255.0)
    labels = tf.constant(np.asarray(found["labels"], np.int32))
    weights = tf.constant([1.0 if w is None else w for w in found["weights"]], tf.float32)
    return tf.gather(images, index), tf.gather(labels, index), tf.gather(weights, index)


@pytest.mark.parametrize(("wrong", "says"), [
    (_from_the_checks_frames, "read the interpreter's frames while the check ran"),
    (_lesson_cell_copied, "raised .*(pixels|Data types|dtype)"),
    (_not_scaled, r"the stored bytes as they are \(values up to \d+\); expected each byte / 255"),
    (_read_as_floats, "raised .*(reshape|Input to reshape|elements)"),
    (_channels_first, r"differ from the stored bytes / 255: at \[\d+, \d+, \d+\] expected"),
    (_not_reshaped, r"expected a float32 image of shape \(2, 2, 3\), got float32 \(12,\)"),
    (_no_default_weight, "raised .*weight"),
    (_default_weight_zero, r"\(no weight stored\): expected the weight 1.0, got"),
    (_weight_always_one, r"record \d+: expected the weight \d\.\d+, got array\(1\."),
    (_int64_label, "expected the label \\d+ as int32"),
    (_constant_example, "differ from the stored bytes / 255"),
    (_parsed_in_python, r"parse_record's graph \(traced on one tf.string record\) has "
                        "EagerPyFunc op\\(s\\): it parses in Python"),
    # the course's helper bound under the answer's name: it reads the lesson's keys
    (cu.data.parse_tfrecord_fn((2, 2, 3)), "raised .*(Feature: x|x)"),
])
def test_parse_record_catalogue_is_rejected_with_its_reason(wrong, says):
    with pytest.raises(AssertionError, match=says):
        cu.grading.check_parse_record(wrong)


def test_parse_ops_problem_wants_a_parse_op_and_no_python():
    from course_utils.grading.checks.records import parse_ops_problem

    tf = cu.quiet.import_tensorflow()
    assert parse_ops_problem(parse_record) is None
    assert "has no ParseExample op" in parse_ops_problem(
        lambda record: (tf.zeros([2, 2, 3]), tf.strings.length(record), tf.constant(1.0)))
    numpy_parse = lambda record: tf.numpy_function(lambda r: r, [record], tf.string)  # noqa: E731
    assert "has PyFunc op(s)" in parse_ops_problem(numpy_parse)
