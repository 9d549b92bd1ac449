"""Checks of lesson 04's exercises (registered by name with ``@register``).

Each check runs the learner's code on the notebook's own ``ParameterServerStrategy`` (a check
cannot start a second in-process cluster) and verifies what the parameter servers recorded:

* ``check_run_steps(run_steps, strategy)``: a coordinator loop that gives every worker its own
  dataset (``create_per_worker_dataset``), schedules every step, joins, and returns the values
  the steps computed (checked against a record the steps keep on a parameter server);
* ``check_make_dataset_fn(make_dataset_fn, strategy)``: a ``dataset_fn`` that lasts as long as
  the job (``repeat``), gives each worker its own examples, shuffled, in batches of the size asked;
* ``check_count_examples(count_examples, strategy)``: a counter update that loses nothing when
  the workers update at the same moment (they are made to, with a barrier).

The workers are put in step by :func:`barrier_fn`, a counter on a parameter server: that makes
the races of the exercises certain instead of likely, on a quiet or a busy machine.
"""

from __future__ import annotations

from typing import Any

from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = [
    "BARRIER_TIMEOUT_S",
    "barrier_fn",
    "check_count_examples",
    "check_make_dataset_fn",
    "check_run_steps",
    "num_workers_of",
]

#: The longest a step waits at the barrier for the other workers (a safety net, never reached
#: when every worker is alive).
BARRIER_TIMEOUT_S = 60.0
_WORKER_OFFSET = 1_000_000  # the check's dataset: worker w yields w * offset + position


def num_workers_of(strategy: Any) -> int:
    """The number of workers of the cluster ``strategy`` (a ``ParameterServerStrategy``) joined.

    Connecting to a cluster makes its remote devices visible to this process; the strategy
    keeps its resolver private.
    """
    tf = _tf()
    del strategy  # connected when it was made: its devices are this process's remote devices
    names = [device.name for device in tf.config.list_logical_devices()]
    return len({name.split("/device:")[0] for name in names if "/job:worker/" in name})


def barrier_fn(strategy: Any, timeout_s: float = BARRIER_TIMEOUT_S) -> Any:
    """A function for worker steps: wait until every worker has arrived in this round.

    Returns a tensor that is ready once the round is full (or ``timeout_s`` passed). The
    counter lives on a parameter server; a worker blocked here takes no other step, so each
    round holds one step of every worker.
    """
    tf = _tf()
    workers = num_workers_of(strategy)
    with strategy.scope():
        arrived = tf.Variable(0, dtype=tf.int64, name="check_barrier")

    def barrier() -> Any:
        ticket = arrived.assign_add(1)
        round_end = ((ticket - 1) // workers + 1) * workers
        deadline = tf.timestamp() + timeout_s
        return tf.while_loop(lambda seen: (seen < round_end) & (tf.timestamp() < deadline),
                             lambda seen: [arrived.read_value()], [ticket])[0]

    return barrier


@register
def check_run_steps(fn: Any, strategy: Any) -> bool:
    """Check ``run_steps(coordinator, dataset_fn, step_fn, num_steps)`` on the notebook cluster."""
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # the notebook's own
    rng = fresh_rng()
    secret = rng.randint(3, 97)
    with strategy.scope():
        applied = tf.Variable(0, dtype=tf.int64, name="check_applied_steps")
        record = tf.Variable(tf.zeros([64], tf.int64), name="check_step_results")

    def dataset_fn() -> Any:
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        return tf.data.Dataset.range(1_000_000).map(lambda i: worker * _WORKER_OFFSET + i)

    @tf.function
    def step_fn(iterator: Any) -> Any:
        result = next(iterator) * secret  # what only a step run on a worker can compute
        slot = applied.assign_add(1) - 1
        record.scatter_nd_update(tf.reshape(slot, [1, 1]), tf.reshape(result, [1]))
        return result

    def case(num_steps: int) -> Case:
        def verify(got: Any) -> str | None:
            done = int(applied.numpy())  # read at once: a loop without join is still running
            recorded = sorted(int(v) for v in record.numpy()[:min(done, 64)])
            applied.assign(0)
            record.assign(tf.zeros([64], tf.int64))
            if done != num_steps:
                return (f"{done} steps were applied when run_steps returned, {num_steps} "
                        "asked for: schedule every step, then coordinator.join() before "
                        "returning")
            if not isinstance(got, (list, tuple)) or len(got) != num_steps:
                return f"return a list of one result per step ({num_steps}), got {got!r:.80}"
            if any(hasattr(value, "fetch") for value in got):
                return "return the fetched results (remote_value.fetch()), not the RemoteValues"
            try:
                values = sorted(int(value) for value in got)
            except (TypeError, ValueError):
                return f"return numbers (what each step returned), got {got!r:.80}"
            if values != recorded:
                return (f"the steps computed {recorded[:6]}..., you returned {values[:6]}...: "
                        "return what step_fn returned on the workers, fetched")
            return None

        return Case(args=(coordinator, dataset_fn, step_fn, num_steps), verify=verify,
                    label=f"(coordinator, dataset_fn, step_fn, num_steps={num_steps})")

    cases = [case(rng.randint(4, 12)) for _ in range(2)]
    return run_check("run_steps", fn, cases,
                     hint="lesson 04, sections 2 and 3: the dataset_fn must run on each worker "
                          "(coordinator.create_per_worker_dataset), every step must be "
                          "scheduled and joined, and each RemoteValue fetched.")


def _batches_per_worker(strategy: Any, dataset_fn: Any, num_steps: int) -> Any:
    """Run ``num_steps`` steps in rounds of one per worker; each worker's batches, in order.

    Returns ``(batches, error)``: ``batches[w]`` lists worker ``w``'s batches of example ids,
    ``error`` is the exception that ended the job early (or None).
    """
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    barrier = barrier_fn(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(iterator: Any) -> Any:
        with tf.control_dependencies([barrier()]):
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            features, _ = next(iterator)
            return worker, tf.cast(features[:, 0], tf.int64), tf.timestamp()

    remotes = [coordinator.schedule(step, args=(iterator,)) for _ in range(num_steps)]
    try:
        coordinator.join()
    except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as error:
        return None, error
    results = sorted((float(when), int(worker), ids.tolist())
                     for worker, ids, when in (remote.fetch() for remote in remotes))
    batches: dict[int, list[list[int]]] = {}
    for _, worker, ids in results:
        batches.setdefault(worker, []).append(ids)
    return batches, None


@register
def check_make_dataset_fn(fn: Any, strategy: Any) -> bool:
    """Check ``make_dataset_fn(features, labels, batch_size, num_workers)``: a repeating,
    per-worker, shuffled ``dataset_fn`` for parameter-server training."""
    tf = _tf()
    rng = fresh_rng()
    workers = num_workers_of(strategy)

    def case() -> Case:
        examples = workers * rng.randint(6, 10) * 4
        batch_size = rng.choice([2, 4])
        order = list(range(examples))
        rng.shuffle(order)
        features = tf.constant([[float(i), rng.random()] for i in order])  # column 0: the id
        labels = tf.constant([i % 3 for i in order])
        # enough steps for every worker to pass over its own examples more than once
        num_steps = workers * (examples // workers // batch_size + 3)

        def verify(dataset_fn: Any) -> str | None:
            if not callable(dataset_fn):
                return f"return a dataset_fn (a function), got {dataset_fn!r:.80}"
            batches, error = _batches_per_worker(strategy, dataset_fn, num_steps)
            if error is not None:
                return (f"the job ended early with {type(error).__name__}: a worker's dataset ran "
                        f"out before {num_steps} steps; a parameter-server dataset must "
                        "repeat()")
            if len(batches) != workers:
                return f"only workers {sorted(batches)} ran steps; expected {workers}"
            sizes = {len(b) for per_worker in batches.values() for b in per_worker}
            if sizes != {batch_size}:
                return f"batches of {sorted(sizes)} examples, {batch_size} asked for"
            seen = {w: {i for b in per_worker for i in b} for w, per_worker in batches.items()}
            shared = set.intersection(*seen.values())
            if shared:
                return (f"the workers read the same examples (e.g. {sorted(shared)[:5]}): give "
                        "each worker its own shard (its index: experimental_get_current_worker_"
                        "index)")
            if set.union(*seen.values()) != set(range(examples)):
                missing = sorted(set(range(examples)) - set.union(*seen.values()))
                return f"examples {missing[:5]}... were never read by any worker"
            for w, per_worker in batches.items():
                first_pass = [i for b in per_worker for i in b][:len(seen[w])]
                if first_pass == [i for i in order if i in seen[w]]:
                    return f"worker {w} reads its examples in their stored order: shuffle them"
            return None

        return Case(args=(features, labels, batch_size, workers), verify=verify,
                    label=f"({examples} examples, batch_size={batch_size}, num_workers={workers})")

    return run_check("make_dataset_fn", fn, [case(), case()],
                     hint="lesson 04, sections 2 and 3: shard by the worker index, shuffle, "
                          "batch, and repeat() so that no worker runs dry.")


@register
def check_count_examples(fn: Any, strategy: Any) -> bool:
    """Check ``count_examples(counter, labels)``: no update lost when workers add at once."""
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    rng = fresh_rng()
    workers = num_workers_of(strategy)
    barrier = barrier_fn(strategy)
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64, name="check_examples_counter")
    sizes = [rng.randint(2, 9) for _ in range(workers * rng.randint(4, 7))]

    def sizes_fn() -> Any:
        return tf.data.Dataset.from_tensor_slices(sizes).repeat()

    @tf.function
    def step(iterator: Any) -> Any:
        size = next(iterator)
        labels = tf.zeros([size], tf.int32) + tf.cast(barrier() * 0, tf.int32)
        fn(counter, labels)
        return size

    def verify(_: Any) -> str | None:
        counter.assign(0)
        iterator = iter(coordinator.create_per_worker_dataset(sizes_fn))
        remotes = [coordinator.schedule(step, args=(iterator,)) for _ in range(len(sizes))]
        coordinator.join()
        expected = sum(int(remote.fetch()) for remote in remotes)
        got = int(counter.numpy())
        if got != expected:
            lost = "lost" if got < expected else "added"
            return (f"{len(sizes)} steps with {expected} examples, {workers} workers adding at "
                    f"the same moment: the counter reads {got} ({abs(expected - got)} {lost}). "
                    "Add the batch's size in one atomic operation on the variable")
        return None

    first = tf.zeros([rng.randint(2, 9)], tf.int32)
    cases = [Case(args=(counter, first), verify=verify,
                  label=f"({len(sizes)} steps of 2-9 examples, workers in step)")]
    return run_check("count_examples", fn, cases,
                     hint="lesson 04, section 6: a tf.Variable's assign_add is one operation on "
                          "the parameter server; counter.assign(counter + n) is a read and a "
                          "write. Cast the size to the counter's dtype.")
