"""Lesson 04's exercise 2, ``check_make_dataset_fn(make_dataset_fn, strategy)``, with what the
checks of lesson 04 share: the workers' count and barrier (lesson 04's module re-exports them).

The check runs the learner's ``dataset_fn`` on the notebook's own ``ParameterServerStrategy``
and asks for a ``dataset_fn`` of infinite cardinality (read on each worker), each worker its own
examples (each with its own label), each pass reshuffled over the whole share: read, each of a
number of passes drawn per case (up to :data:`PASSES_READ`, by another iterator of the worker's
dataset beside its steps) is a fresh
order, neither the stored order nor an earlier pass's (places and neighbours in common,
:data:`~course_utils.grading.checks.worker_passes.SAME_ORDER`), nor, in every pass, the stored
order rotated, reversed or read at a stride then shuffled a little (how far examples came in the
best such frame, :func:`~course_utils.grading.checks.worker_passes.turned_reach`), nor, in each of
the last 4, the order the earlier passes set (each example's mean place) shuffled a little
(:func:`~course_utils.grading.checks.worker_passes.usual_reach`), nor passes in which a part of
the share keeps to places of its own (halves shuffled apart then interleaved, a few examples
kept in stored order: :func:`~course_utils.grading.checks.share_parts.kept_apart`; or parts
that trade only a pair or two of examples a pass:
:func:`~course_utils.grading.checks.share_parts.seldom_mixed`), however the dataset is made; and
in its graph (on each way from the worker's dataset down to a source, a branch of a ``zip`` or a
``concatenate`` included, that has a shuffle that reshuffles each pass a known number of elements,
more than one, one of them must hold all its elements in its buffer, and they must be a worker's
share or more: a full shuffle of another branch, or of fewer elements, does not stand for it; one
of an unknown number, a ``filter`` shard say, stands for it with a buffer of the share or more; a
shuffle of groups of examples never does, whatever their number (a batch or window below it with
no ``unbatch`` nor ``flat_map`` that makes examples again between, but a ``batch(1)`` with no
rebatch, scan, reducer, group_by_window, zip of two ways through ``batch(1)``s, function that
reads datasets (a map's, a flat_map's), map (or flat_map of a from_tensors) that computes its
outputs rather than passing its element's own components on, nor step with a function of another
kind (a snapshot's ``reader_func``), after it; or elements of a higher rank than an example's,
however made, but ``[1, ...]``); a way from the examples' slices (``from_list``'s too, or a finite
``range``, or an ``unbatch`` of tensors) with no shuffle at all (no ``ShuffleDataset``, nor random
draws in a map's, flat_map's, interleave's or scan's function or the functions it calls:
``tf.random.shuffle``, ``tf.random.uniform``, not a ``tf.cond``) reads them in stored order –
unless its only branching steps are zips, ids read beside shuffled examples, say: stored order
there shows in the passes read –, and a way whose only shuffles that reshuffle are of one element
(or of an unknown number, with a buffer below the share) while one never reshuffles, the same
order every pass, whatever passes the check reads, as does one below a ``cache()`` or snapshot (a
``flat_map`` or ``interleave`` that shuffles included), or below or inside a step whose function
holds one (``d.cache()`` in a ``map`` or ``flat_map``, or in a ``group_by_window``'s
``reduce_func``: 32 passes cached so passed 11 of 11, three ways, and 3 of 3; a right ``cache()``
then ``shuffle`` inside one is refused with them), or a shuffle with a fixed seed inside one
(``seed=7``, or any once ``tf.random.set_seed`` set one, as the notebook's setup does), made anew
with it at each call (``flat_map(lambda _: d.shuffle(n, seed=7).repeat(32)).repeat()``: passed 2
of 2; a right one whose function runs once, its shuffle repeated inside, is refused with it; a
seed computed from the function's arguments, a counter's, is not read), which replays its first
passes, or holds every element of an endless input; with more than 62 ways, each such shuffle must
hold its whole input). Still passes: a shuffle inside a ``flat_map``, an ``interleave`` or any
function of a step (a ``group_by_window``'s ``reduce_func``) stands for a whole one, and random
draws in a ``map`` exempt the slices below (a decoy as easily as a whole permutation): there only
how far examples move is read (a few examples left in stored order below them keep to their
places, refused by the passes read), a hidden buffer of three quarters of
the share passes (one just over half is refused now and then); groups made into elements whose
shapes do not show them (flattened into vectors of an example's rank or of an unknown rank,
sparse, ragged, serialized, tuples of examples zipped from two ways of the share, datasets of
them, or ids of groups gathered in a ``map`` or ``flat_map``) count as examples (shapes are all
the graph tells): groups of a batch's size shuffled whole then ``shuffle(batch_size)`` pass about
7 in 8 checks simulated, 24 of 33 real runs; and more fresh passes than the check draws, then
stored order or those passes again (``repeat(32)``), from a source the graph does not list (a
``counter``, slices made inside a ``flat_map`` or below random draws, a tensor of 32 passes
unbatched below a shuffle of its one element: 2 of 2): no number of passes read rules out a larger
one. Refused though right, as groups: elements with a component of a higher rank than an example's
(its batches' largest, less one), dropped or reshaped after the shuffle (an axis added, an image
carried), and batches whose rank tf.data cannot tell (the example rank is read from the other
components), and ``batch(1)``s that a zip or ``enumerate`` joins, a scan numbers, a map computes
new components of (a cast, an added id), or a snapshot stores, before the shuffle (a map after the
unbatch instead, or a snapshot of the examples before the shuffle: one after it stores its first
pass's order for every pass); and a whole ``tf.random.shuffle`` then a smaller shuffle of an
unknown number (a decoy's random draws look the same); a dataset that calls Python
(``from_generator``, a permutation drawn in a ``tf.py_function`` or ``tf.numpy_function``):
refused before any step, since a real job's remote workers cannot run one (it runs only in the
process of the Python program that made it); and a dataset that comes out of a ``tf.function`` or
``tf.cond`` (or a loop) that ``dataset_fn`` calls, or is another dataset's element
(``get_single_element``, an iterator's), rebuilt from a serialized graph (``DatasetFromGraph``) or
served by the tf.data service (``distribute``), right or not: its steps are not in the graph read
(32 passes cached and replayed there passed 4 of 4 when it was, 4 of 4 each hidden those ways, 2
of 2 served), so it must be made in ``dataset_fn`` itself (a ``dataset_fn`` decorated with
``tf.function`` is traced as its Python function, and read). Passes each another fixed arrangement
shuffled a little (drawn from a table of orders, one arrangement turned by a random ``roll`` or
read at a random stride each pass, its blocks in an order drawn each pass, or a stride with a
buffer of more than a third, up to a half, of the share), and one fixed arrangement behind a
hidden buffer of half the share (all but about 1 in 100 per worker at 33-35 examples) or a third
of it, or two ``shuffle(8)`` (now and then): a frame is tried only where it is set apart from the
passes it judges (rotations, reflections and strides; the earlier passes' order for the last 4),
as a uniform shuffle too is some arrangement in the frame its own pass sets. And every batch full
although a worker's share does not fill its last batch; the first case has one example more than
its workers share evenly (worker 0's share one longer), so that shares of ``len(features) //
num_workers`` leave some out (and a buffer of that many is one short of worker 0's share); the
second case is a job sized for one worker more than run (one joins later), so that shards cut by
the notebook's worker count instead of ``num_workers`` read too much; its shares are of
105-130 examples, more than the notebook's whole data, so that a buffer copied from the
notebook (``shuffle(100)``) is refused. A dataset that
``assert_cardinality(INFINITE_CARDINALITY)`` says is endless over an input tf.data counts
finite (``repeat(40)``, more passes than the check reads) is refused; over an input of a count
tf.data cannot tell (a ``filter`` or ``flat_map`` before a ``repeat(40)``) it still passes.

"""

from __future__ import annotations

from typing import Any

from course_utils.grading.checks import worker_passes
from course_utils.grading.checks.dataset_shuffles import share_message
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["BARRIER_TIMEOUT_S", "PASSES_READ", "barrier_fn", "check_make_dataset_fn",
           "num_workers_of"]

#: The longest a step waits at the barrier for the other workers (a safety net, never reached
#: when every worker is alive).
BARRIER_TIMEOUT_S = 60.0
#: The most passes over its share another iterator of each worker's dataset reads (a number
#: from a quarter of it drawn per case): every one must be shuffled anew.
PASSES_READ = 32
_WORKER_OFFSET = 1_000_000  # the check's dataset: worker w yields w * offset + position


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


@register
def check_make_dataset_fn(fn: Any, strategy: Any) -> bool:
    """Check ``make_dataset_fn(features, labels, batch_size, num_workers)``: a never-ending,
    per-worker, reshuffled ``dataset_fn`` whose batches are all full."""
    tf = _tf()
    rng = fresh_rng()
    workers = num_workers_of(strategy)
    barrier = barrier_fn(strategy)

    def case(sized_for: int) -> Case:
        """A job sized for ``sized_for`` workers: the running ones, or one more that has not
        joined yet (its share stays unread), so that only ``num_workers`` tells the shares."""
        batch_size = rng.choice([8, 12])  # shares of 33-71 (105-130) examples
        # the job sized for one worker more: shares over 100 (the notebook's whole data), so
        # that a buffer copied from the notebook (shuffle(100)) does not hold one
        blocks = (rng.randint(4, 5) if sized_for == workers
                  else 100 // batch_size + rng.randint(1, 2))
        per_worker = batch_size * blocks + rng.randint(1, batch_size - 2)
        # a worker's share does not fill its last batch; with as many workers as run, 1 to
        # sized_for - 1 examples more, so that shares of len(features) // num_workers leave some
        # out (worker w's share: every sized_for-th example from w, one more for the first)
        extra = 0 if sized_for != workers else rng.randint(1, max(1, sized_for - 1))
        examples = sized_for * per_worker + extra
        longest = per_worker + (extra > 0)
        order = list(range(examples))
        rng.shuffle(order)
        features = tf.constant([[float(i), rng.random()] for i in order])  # column 0: the id
        labels = tf.constant([i % 3 for i in order])  # example i's label: i % 3
        # every worker passes over its share about three times in steps, and another iterator
        # of its dataset reads a number of passes drawn now (returned by its steps)
        num_steps = workers * (3 * per_worker // batch_size + 1)
        passes = rng.randint(PASSES_READ // 4, PASSES_READ)

        def verify(dataset_fn: Any) -> str | None:
            if not callable(dataset_fn):
                return f"return a dataset_fn (a function), got {dataset_fn!r:.80}"
            for _ in range(2):  # again if a busy machine starved a worker past the barrier
                try:
                    batches, cardinalities, error, shuffles, long = (
                        worker_passes.batches_per_worker(
                            strategy, dataset_fn, num_steps, barrier, passes * longest))
                except (TypeError, ValueError) as failure:
                    return ("the dataset must yield (features, labels) batches: "
                            f"{type(failure).__name__}: {str(failure)[:160]}")
                except Exception as failure:  # Python in it, or a worker could not make it
                    if worker_passes.unmade_dataset_message(failure) is None:
                        raise
                    return worker_passes.unmade_dataset_message(failure)
                if not isinstance(error, TimeoutError):
                    break
            else:
                if "gRPC" in str(error):
                    return (f"{str(error)[:300]} (twice: a failure of the check's cluster, "
                            "not of your answer; run the check again)")
                return _overloaded(barrier)
            if error is not None and not isinstance(
                    error, (tf.errors.OutOfRangeError, tf.errors.CancelledError)) and (
                    "expected to contain an infinite" not in str(error)):
                said = [line.strip() for line in str(error).splitlines() if line.strip()
                        and not line.strip().startswith(("Graph execution", "Detected at",
                                                         "File ", "[["))]
                return (f"a worker's dataset failed: {type(error).__name__}: "
                        f"{(said or [''])[0][:200]}")
            if error is not None:
                return (f"the job ended early with {type(error).__name__}: a worker's dataset "
                        f"ran out before {num_steps} steps; a parameter-server dataset must "
                        "never run dry (section 2)")
            infinite = int(tf.data.INFINITE_CARDINALITY)
            unknown = int(tf.data.UNKNOWN_CARDINALITY)
            if unknown in cardinalities:
                return ("a worker's dataset has a number of batches tf.data cannot tell ahead "
                        "(-2, UNKNOWN_CARDINALITY: after a rebatch, flat_map or filter, say): "
                        "the exercise asks for infinite cardinality, a dataset that never runs "
                        "dry – a repeat() after that step")
            if worker_passes.ASSERTED in cardinalities:
                return ("a worker's dataset is said to be endless (assert_cardinality("
                        "INFINITE_CARDINALITY)) over a finite input, whose number of elements "
                        "tf.data counts: it runs dry after them, however many steps remain. "
                        "What makes a dataset endless? (section 2)")
            if cardinalities != {infinite}:
                return (f"each worker's dataset has {sorted(cardinalities)} batches: it must "
                        "never run dry, whatever the number of steps the coordinator runs")
            if len(batches) != workers:
                return f"only workers {sorted(batches)} ran steps; expected {workers}"
            pairs = [pair for per in batches.values() for b in per for pair in b]
            if not all(isinstance(v, int) for pair in pairs for v in pair):
                return ("the dataset must yield (features, labels) batches: features of "
                        "shape [batch, 2] and labels of shape [batch], as stored; an example "
                        "read as (column 0 of its features, its label): "
                        f"{next(p for p in pairs if not all(isinstance(v, int) for v in p))!r:.80}")
            apart = [(i, label) for i, label in pairs if label != i % 3]
            if apart:
                i, label = apart[0]
                return (f"{len(apart)} of the {len(pairs)} examples read came with another "
                        f"example's label (e.g. example {i}: label {label}, stored with "
                        f"{i % 3}): does each example keep its own label through your steps?")
            batches = {w: [[i for i, _ in b] for b in per] for w, per in batches.items()}
            sizes = {len(b) for per in batches.values() for b in per}
            if sizes != {batch_size}:
                return (f"batches of {sorted(sizes)} examples, every one must hold "
                        f"{batch_size}: a worker's {per_worker} examples do not fill its "
                        "last batch. Can a batch of yours span two passes?")
            seen = {w: {i for b in per for i in b} for w, per in batches.items()}
            shared = set.intersection(*seen.values())
            if shared:
                return (f"the workers read the same examples (e.g. {sorted(shared)[:5]}): "
                        "each must read its own share (section 3: which worker runs it?)")
            read = {w: len(ids) for w, ids in seen.items()}
            if sized_for != workers and set(read.values()) != {per_worker}:
                return (f"the workers read {read} distinct examples of {examples}; with "
                        f"num_workers={sized_for} (a job sized for {sized_for} workers, "
                        f"{workers} of them running) each worker's share is {per_worker}: "
                        "which number of workers did your shards use?")
            if sized_for == workers and set.union(*seen.values()) != set(range(examples)):
                missing = sorted(set(range(examples)) - set.union(*seen.values()))
                return f"examples {missing[:5]}... were never read by any worker"
            for w, per in batches.items():
                stream = [i for b in per for i in b]
                message = worker_passes.passes_message(w, stream, seen[w], order)
                if message:
                    return message
            for w in sorted(shuffles):
                message = share_message(w, shuffles[w], len(seen[w]))
                if message:
                    return message
            for w in sorted(batches):  # the passes of another iterator, however it is made
                message = worker_passes.fresh_passes_message(
                    w, long.get(w, []), seen[w], order, passes)
                if message:
                    return message
            return None

        late = ("" if sized_for == workers else
                f": {workers} workers running, one more to join later")
        return Case(args=(features, labels, batch_size, sized_for), verify=verify,
                    label=f"({examples} examples, batch_size={batch_size}, "
                          f"num_workers={sized_for}{late})")

    return run_check("make_dataset_fn", fn, [case(workers), case(workers + 1)],
                     hint="lesson 04, sections 2 and 3 (data for as many steps as the "
                          "coordinator runs; each worker its own) and lesson 01, section 7 "
                          "(the order of tf.data's steps): what does each of yours do to a "
                          "pass?")
