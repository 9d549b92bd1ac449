"""Checks of lesson 04's exercises (registered by name with ``@register``).

Each check runs the learner's code on the notebook's own ``ParameterServerStrategy`` (a check
cannot start a second in-process cluster) and verifies what the parameter servers recorded:

* ``check_run_steps(run_steps, strategy)``: a coordinator loop that gives every worker its own
  dataset (``create_per_worker_dataset``), keeps ``max_in_flight`` steps scheduled and
  unfinished while steps remain and never more (watched through a stand-in from
  :func:`~course_utils.grading.checks.coordinator_watch.watch` passed in the coordinator's
  place, its record kept by the check), and returns the values the steps computed, in the
  order scheduled;
* ``check_make_dataset_fn(make_dataset_fn, strategy)``: a ``dataset_fn`` that never runs dry,
  each worker its own examples, each pass reshuffled over the whole share, every batch full
  (:mod:`course_utils.grading.checks.per_worker_datasets`, which says what it reads);
* ``check_count_examples(count_examples, strategy)``: examples per class added to a vector
  counter, nothing lost when the workers update at the same moment (made likely by a barrier);
  the check's own first call (eager, no other worker) must count its labels exactly, and each
  worker reads its own batches, so an update that counts twice (or lands once of two) cannot
  make up for the one a race lost; the step is traced once, and that concrete function is both
  searched and run, so an answer that calls Python (``tf.py_function``,
  ``tf.numpy_function``) in the graph the workers run is refused before any step, as exercise
  2's check refuses such a dataset (a step that took a Python lock hung), and so is one that
  updates under the variable's shared lock (:func:`shared_lock_updates`: ``scatter_add``).

:func:`barrier_fn` (a counter on a parameter server) puts the workers in step so that they update
at once: the races are likely, not certain (one may read after the other wrote), however busy.
"""

from __future__ import annotations

from typing import Any

from course_utils.grading.checks.coordinator_watch import taken_in_order, watch
from course_utils.grading.checks.per_worker_datasets import (
    BARRIER_TIMEOUT_S,
    PASSES_READ,
    _overloaded,
    barrier_fn,
    check_make_dataset_fn,
    num_workers_of,
)
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.worker_passes import graph_ops, runs_python
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["BARRIER_TIMEOUT_S", "PASSES_READ", "barrier_fn", "check_count_examples",
           "check_make_dataset_fn", "check_run_steps", "num_workers_of", "shared_lock_updates"]


def shared_lock_updates(graph: Any) -> list[str]:
    """The types of the ops in ``graph`` (or a function it calls) that update a resource
    variable under its shared lock: a ``ResourceScatter*`` op (``Variable.scatter_add`` and its
    kin) with no ``use_locking`` attribute, or with it false. TensorFlow's kernel
    (``ResourceScatterUpdateOp`` in ``tensorflow/core/kernels/resource_variable_ops.cc``) takes
    ``tf_shared_lock`` for a number type without ``use_locking``, so two such adds to one row at
    once can lose one; ``ResourceScatterNdAdd`` (``scatter_nd_add``) has ``use_locking``, true
    by default: exclusive, as ``AssignAddVariableOp`` is."""
    found = set()
    for op in graph_ops(graph):
        locking = op.node_def.attr.get("use_locking")
        if op.type.startswith("ResourceScatter") and not (locking and locking.b):
            found.add(op.type)
    return sorted(found)


@register
def check_run_steps(fn: Any, strategy: Any) -> bool:
    """Check ``run_steps(coordinator, dataset_fn, step_fn, num_steps, max_in_flight)``."""
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # the notebook's own
    rng = fresh_rng()
    workers = num_workers_of(strategy)
    # each worker's dataset: its own random numbers, so results carry no order of their own
    table = tf.constant([[rng.randint(1, 10**9) for _ in range(64)] for _ in range(workers)],
                        tf.int64)
    rows = table.numpy().tolist()
    with strategy.scope():
        applied = tf.Variable(0, dtype=tf.int64, name="check_applied_steps")

    def dataset_fn() -> Any:
        try:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        except RuntimeError as error:  # called here: TensorFlow's words, then the course's
            raise RuntimeError(
                "dataset_fn was called on the coordinator, where there is no worker index: "
                "each worker must make its own dataset from it (create_per_worker_dataset, "
                "lesson 04, section 3), not pull every batch from one iterator made here"
            ) from error
        return tf.data.Dataset.from_tensor_slices(tf.gather(table, worker)).repeat()

    @tf.function
    def step_fn(iterator: Any) -> Any:
        result = next(iterator)  # what only a step run on a worker can compute
        applied.assign_add(1)
        return result

    def case(num_steps: int, max_in_flight: int) -> Case:
        watched, record = watch(coordinator)

        def verify(got: Any) -> str | None:
            done = int(applied.numpy())  # read at once: a loop without join is still running
            applied.assign(0)
            tampered = record.tampered(watched) or record.changed()
            if tampered:
                return tampered
            if len(record.scheduled) != num_steps or done != len(record.scheduled):
                return (f"{len(record.scheduled)} steps were scheduled on the coordinator "
                        f"passed to run_steps and {done} applied when it returned, "
                        f"{num_steps} asked for: a step scheduled is not yet a step run "
                        "(section 2); did every step go through that coordinator and end?")
            window = [min(number, max_in_flight) for number in range(1, num_steps + 1)]
            if record.in_flight != window:
                steps = next(i for i, (a, b) in enumerate(
                    zip(record.in_flight, window, strict=True)) if a != b)
                said = ("more: which step's end does your loop wait for?"
                        if record.in_flight[steps] > window[steps] else
                        "fewer, while steps remained: the workers sat idle. What does your "
                        "loop wait for before scheduling more?")
                return (f"steps in flight (from the oldest not yet waited for) at each schedule: "
                        f"{record.in_flight}; with max_in_flight={max_in_flight} expected "
                        f"{window}. At schedule {steps + 1} there were {said}")
            if not isinstance(got, (list, tuple)) or len(got) != num_steps:
                return f"return a list of one result per step ({num_steps}), got {got!r:.80}"
            if any(hasattr(value, "fetch") for value in got):
                return "you returned RemoteValues, promises of results, not the values (section 2)"
            try:
                values = [int(value) for value in got]
            except (TypeError, ValueError):
                return f"return numbers (what each step returned), got {got!r:.80}"
            if not taken_in_order(values, rows):  # worker w's steps: the start of rows[w]
                return (f"you returned {values[:4]}..., not the numbers step_fn read on the "
                        "workers (each worker's dataset holds its own numbers; section 3)")
            in_order = [int(remote.fetch()) for remote in record.scheduled]
            if values != in_order:
                return ("the right values, in another order than the steps were scheduled "
                        f"(got {values[:4]}..., scheduled {in_order[:4]}...): sorted, or as "
                        "they finished?")
            return None

        return Case(args=(watched, dataset_fn, step_fn, num_steps, max_in_flight),
                    verify=verify, label=f"(coordinator, dataset_fn, step_fn, num_steps="
                                         f"{num_steps}, max_in_flight={max_in_flight})")

    # a window of 2 and one of 3, in a drawn order: a fixed window passes one of them only
    cases = [case(rng.randint(7, 12), window) for window in rng.sample((2, 3), 2)]
    return run_check("run_steps", fn, cases,
                     hint="lesson 04, section 2 (schedule returns at once; a RemoteValue is a "
                          "promise) and section 3 (each worker its own data). After each "
                          "schedule, how many of your steps are unfinished, and which one "
                          "does your loop wait for next?")


@register
def check_count_examples(fn: Any, strategy: Any) -> bool:
    """Check ``count_examples(counter, labels)``: examples per class, none lost when workers
    add at once."""
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    rng = fresh_rng()
    workers = num_workers_of(strategy)
    barrier = barrier_fn(strategy)
    num_classes = rng.randint(5, 8)
    with strategy.scope():
        counter = tf.Variable(tf.zeros([num_classes], tf.int64), name="check_class_counter")
    # each step's labels: 2-9 of them; every other batch of each worker lacks the last class,
    # so a count of the classes present in one batch is not the counter's length
    steps = workers * rng.randint(4, 6)
    batches = []
    for number in range(steps):
        top = num_classes - 1
        batch = [rng.randrange(top) for _ in range(rng.randint(2, 8))]
        batches.append(batch + [top] if (number // workers) % 2 else batch)
    padded = [batch + [-1] * (9 - len(batch)) for batch in batches]

    def all_batches() -> Any:
        return tf.data.Dataset.from_tensor_slices(
            (tf.constant(padded, tf.int32), [len(b) for b in batches]))

    def labels_fn() -> Any:  # each worker its own batches: two updates in a round differ
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return all_batches().shard(workers, worker).repeat()

    traced: list[Any] = []  # the step's one concrete function (verify traces it)

    @tf.function
    def step(iterator: Any) -> Any:
        row, size = next(iterator)
        labels = row[:size] + tf.cast(barrier() * 0, tf.int32)  # the workers in step
        fn(counter, labels)
        return labels

    def verify(_: Any) -> str | None:
        alone = counted(f"one call on labels {first.numpy().tolist()} (the check's first, "
                        "eager, no other worker running)", [first.numpy().tolist()])
        if alone:
            return alone + " Does your update count each example once?"
        try:  # the step traced once: the graph read here is the one every worker runs
            traced.append(step.get_concrete_function(
                tf.data.IteratorSpec(all_batches().element_spec)))
        except Exception as error:  # noqa: BLE001 - the answer's own error, said
            return (f"count_examples could not be traced into the step: "
                    f"{type(error).__name__}: {str(error)[:300]}")
        if runs_python(traced[-1].graph):  # before any step: none can hang on it
            return ("count_examples calls Python (tf.py_function or tf.numpy_function) inside "
                    "the step: a real job's workers cannot run it (it runs only in the process "
                    "of the Python program that made it: TensorFlow's py_function docs). Make "
                    "it of TensorFlow ops on the counter")
        shared = shared_lock_updates(traced[-1].graph)
        if shared:
            return (f"count_examples updates the counter with {', '.join(shared)} (scatter_add "
                    "and its kin), which runs under the variable's shared lock: two workers' "
                    "adds to one class at once can be lost, however rarely (lesson 04, section "
                    "6, sparse updates). Use an update that takes the exclusive lock")
        for _ in range(2):  # again if a busy machine starved a worker past the barrier
            timeouts_before = int(barrier.timeouts.numpy())
            message = count_once()
            if message or int(barrier.timeouts.numpy()) == timeouts_before:
                return message  # a loss is real even out of step; a pass only in step
        return _overloaded(barrier)

    def count_once() -> str | None:
        counter.assign(tf.zeros([num_classes], tf.int64))
        iterator = iter(coordinator.create_per_worker_dataset(labels_fn))
        remotes = [coordinator.schedule(traced[-1], args=(iterator,)) for _ in range(steps)]
        try:
            coordinator.join()
        except tf.errors.OpError as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            said = next((line for line in lines if "shape" in line.lower()), lines[-1])
            return (f"count_examples failed in a step on a worker: {type(error).__name__}: "
                    f"{said[:200]} (a batch may lack some classes; the counter has them all)")
        said = counted(f"{steps} steps, {workers} workers adding at the same moment",
                       [remote.fetch().tolist() for remote in remotes])
        return said and said + " Is your update one operation, or a read then a write?"

    def counted(what: str, labels: list[list[int]]) -> str | None:  # the counter against them
        expected = [0] * num_classes
        for label in (label for batch in labels for label in batch):
            expected[label] += 1
        got = counter.numpy().tolist()
        if got == expected:
            return None
        lost = sum(expected) - sum(got)
        more = "" if not lost else f" ({lost} lost)" if lost > 0 else f" ({-lost} too many)"
        return (f"{what}: the counter reads {got}, the examples per class were "
                f"{expected}{more}.")

    first = tf.constant([rng.randrange(num_classes) for _ in range(rng.randint(2, 9))])
    label = f"({num_classes} classes, {steps} steps of 2-9 labels, workers in step)"
    return run_check("count_examples", fn, [Case(args=(counter, first), verify=verify,
                                                 label=label)],
                     hint="lesson 04, section 6 (Keras 3's counters lose updates): what can "
                          "happen between a read and a write when two workers update at once?")
