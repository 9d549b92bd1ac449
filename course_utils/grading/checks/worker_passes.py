"""What each worker of a ``ParameterServerStrategy`` job read, for lesson 04's
``check_make_dataset_fn``: each worker's batches in order (:func:`batches_per_worker`, steps in
rounds of one per worker), the shuffles its dataset holds
(:func:`~course_utils.grading.checks.dataset_shuffles.shuffles_of`, read on the worker), what is
wrong with its first passes (:func:`passes_message`), and whether each of many passes of another
iterator is a fresh order (:func:`fresh_passes_message`: groups of examples shuffled whole keep
their neighbours in every pass, however the graph counts them; nor, every one, the stored order
rotated, reversed or strided then shuffled a little: :func:`turned_reach`; nor, each of the last
few, the order the earlier passes set shuffled a little: :func:`usual_reach`)."""

from __future__ import annotations

from math import gcd
from typing import Any

import numpy as np

from course_utils.grading.checks.dataset_shuffles import shuffles_of
from course_utils.grading.checks.share_parts import mixed_message, split_message
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["ASSERTED", "SAME_ORDER", "HiddenDataset", "RunsPython", "batches_per_worker",
           "fresh_passes_message", "graph_ops", "made_hidden", "passes_message", "reach",
           "runs_python", "turned_reach", "unmade_dataset_message", "usual_reach"]


_PYTHON = frozenset(("PyFunc", "PyFuncStateless", "EagerPyFunc"))


class RunsPython(Exception):
    """A worker's dataset calls back into Python (``Dataset.from_generator``,
    ``tf.py_function``, ``tf.numpy_function``)."""


class HiddenDataset(Exception):
    """A worker's dataset comes out of a function call or control flow (a ``tf.function`` or
    ``tf.cond`` that ``dataset_fn`` calls), another dataset's element (``get_single_element``,
    an iterator's), a serialized graph or the tf.data service, whose steps its graph does not
    show."""


def unmade_dataset_message(failure: Exception) -> str | None:
    """What to tell a learner whose ``dataset_fn`` no worker could run (None: another
    failure): one that calls Python, comes out of a function call or control flow, or that a
    worker failed to make (TF's first line of why; a dataset made on the coordinator, which
    cannot be copied to a worker, named)."""
    if isinstance(failure, RunsPython):
        return ("a worker's dataset calls Python (Dataset.from_generator, tf.py_function or "
                "tf.numpy_function): a real job's workers cannot run it (it runs only in the "
                "process of the Python program that made it: TensorFlow's from_generator and "
                "py_function docs). Make it of tf.data steps and TensorFlow ops")
    if isinstance(failure, HiddenDataset):
        return ("a worker's dataset comes out of a tf.function, tf.cond or loop that dataset_fn "
                "calls, another dataset's element, a serialized graph or the tf.data service: "
                "the check reads the "
                "steps of a dataset made in dataset_fn itself (its shuffles, caches, branches). "
                "Make the dataset's steps there")
    if type(failure).__name__ != "ClosureInputError":
        return None
    said = [line.strip() for line in str(failure).split("error message is ")[-1].splitlines()
            if line.strip() and not line.strip().startswith(
                ("Graph execution", "Detected at", "File ", "[["))]
    said = (said or [""])[0][:160]
    if "Failed copying input tensor" not in said:
        return f"a worker could not make its dataset: {said}"
    return (f"a worker could not make its dataset ({said}): is every step of it made inside "
            "dataset_fn? A dataset made here, on the coordinator, cannot be copied to a "
            "worker (lesson 04: datasets are made inside a dataset_fn, once per worker)")


_HIDES = frozenset(("PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "Case",
                    "StatelessCase", "While", "StatelessWhile", "DatasetFromGraph",
                    "DatasetToSingleElement", "DataServiceDataset", "DataServiceDatasetV2",
                    "DataServiceDatasetV3", "DataServiceDatasetV4"))
# a dataset op's type ends so (``TensorSliceDataset``, ``ShuffleDatasetV3``)
_DATASET_OPS = ("Dataset", "DatasetV2", "DatasetV3", "DatasetV4", "DatasetV5")


def made_hidden(dataset: Any) -> bool:
    """Whether a step on the ways from ``dataset`` down to its sources is a function call or
    control flow, another dataset's element (``get_single_element``; an iterator's, a
    variable's or a queue's: no dataset op), a serialized graph (``DatasetFromGraph``) or the
    tf.data service's elements (``distribute``: ``DataServiceDataset``, its dataset registered
    by id): the dataset steps inside it are not read. A dataset captured from outside ``dataset_fn``
    (``Placeholder``) is left to fail when a worker makes it."""
    tf = _tf()
    todo, seen = [dataset._variant_tensor.op], set()
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        inputs = [tensor.op for tensor in op.inputs if tensor.dtype == tf.variant]
        if op.type in _HIDES or not inputs and op.type != "Placeholder" and not (
                op.type.endswith(_DATASET_OPS)):
            return True
        todo.extend(inputs)
    return False


def runs_python(graph: Any) -> bool:
    """Whether ``graph`` (where a ``dataset_fn`` or a step was traced) or a function it calls
    holds an op that runs Python code."""
    return any(op.type in _PYTHON for op in graph_ops(graph))


def graph_ops(graph: Any) -> Any:
    """Every op of ``graph`` and of the functions it calls (a ``tf.cond``'s branches, a
    ``tf.while_loop``'s body, a nested ``tf.function``), each function's body read once; a
    body's node is read like an op (``type``, ``node_def``)."""
    todo = [graph.get_operations()]
    seen: set[str] = set()
    while todo:
        for op in todo.pop():
            yield op
            for value in op.node_def.attr.values():
                for name in [value.func.name] * value.HasField("func") + [
                        each.name for each in value.list.func]:
                    if name in seen:
                        continue
                    seen.add(name)
                    try:
                        function = graph._get_function(name)
                        body = getattr(function, "cached_definition", None) or function.definition
                    except (AttributeError, KeyError, ValueError):
                        continue
                    todo.append([_Node(node, graph) for node in body.node_def])


class _Node:  # a function body's node, read like an op
    def __init__(self, node: Any, graph: Any) -> None:
        self.type, self.node_def, self.graph = node.op, node, graph


#: The cardinality read for a dataset that ``assert_cardinality(INFINITE_CARDINALITY)`` says is
#: endless over an input that tf.data counts finite: it runs dry after that input's elements
#: (more passes, ``repeat(40)``, than the check reads), with an error in place of OutOfRange.
ASSERTED = -4


def _asserted_infinite(dataset: Any) -> list[Any]:
    """The ``AssertCardinalityDataset`` ops on the ways from ``dataset`` down to its sources
    that assert an infinite cardinality."""
    tf = _tf()
    todo, seen, found = [dataset._variant_tensor.op], set(), []
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "AssertCardinalityDataset" and tf.get_static_value(op.inputs[1]) == int(
                tf.data.INFINITE_CARDINALITY):
            found.append(op)
        todo.extend(tensor.op for tensor in op.inputs if tensor.dtype == tf.variant)
    return found


def batches_per_worker(strategy: Any, dataset_fn: Any, num_steps: int, barrier: Any,
                       read: int = 0) -> Any:
    """Run ``num_steps`` steps in rounds of one per worker; each worker's batches, in order.

    Returns ``(batches, cardinality, error, shuffles, long)``: ``batches[w]`` lists worker
    ``w``'s batches of ``(example id, label)`` pairs, ``cardinality`` the cardinality of each
    worker's dataset as made on it, ``shuffles[w]`` the shuffles of worker ``w``'s dataset (rows
    of :func:`shuffles_of`), ``long[w]`` the ids of the first ``read`` examples of another
    iterator of worker ``w``'s dataset, read once on the worker ahead of its steps (in the
    background, from the start) and returned by each, and
    ``error`` the exception that ended the job early (or None; a ``TimeoutError`` where a
    worker waited out ``barrier``'s timeout, or where gRPC itself failed between the check's
    in-process tasks – "Unable to parse request", seen now and then on 2 busy cores – so that
    the caller runs the job again).
    """
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    timeouts_before = int(barrier.timeouts.numpy())

    def probed_fn() -> Any:
        dataset = getattr(dataset_fn, "python_function", dataset_fn)()  # a tf.function: traced here
        if runs_python(dataset._variant_tensor.graph):
            raise RunsPython("Python")
        if made_hidden(dataset):
            raise HiddenDataset("hidden")
        cardinality = dataset.cardinality()  # on the worker, as made there
        for asserted in _asserted_infinite(dataset):  # said endless, of a known finite input
            inner = tf.raw_ops.DatasetCardinality(input_dataset=asserted.inputs[0])
            cardinality = tf.where(inner >= 0, tf.constant(ASSERTED, tf.int64), cardinality)
        shuffles = shuffles_of(dataset)
        probed = dataset.map(lambda features, labels: (features, labels, cardinality, shuffles))
        # another iterator's first examples, read once (in the background, from the start)
        long = dataset.unbatch().take(read).batch(max(read, 1)).take(1).cache().repeat()
        return tf.data.Dataset.zip((probed, long.prefetch(1)))

    iterator = iter(coordinator.create_per_worker_dataset(probed_fn))

    @tf.function
    def step(iterator: Any) -> Any:
        batch = iterator.get_next_as_optional()  # a worker whose data ran out opens the barrier
        with tf.control_dependencies([barrier(batch.has_value())]):
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            ids, labels, cardinality, shuffles, more = tf.cond(
                batch.has_value(),
                lambda: (tf.cast(batch.get_value()[0][0][:, 0], tf.int64),
                         tf.cast(batch.get_value()[0][1], tf.int64), batch.get_value()[0][2],
                         tf.reshape(batch.get_value()[0][3], [-1, 4]),
                         tf.cast(batch.get_value()[1][0][:, 0], tf.int64)),
                lambda: (tf.zeros([0], tf.int64), tf.zeros([0], tf.int64),
                         tf.constant(-1, tf.int64), tf.zeros([0, 4], tf.int64),
                         tf.zeros([0], tf.int64)))
            return (worker, ids, labels, cardinality, shuffles, more, batch.has_value(),
                    tf.timestamp())

    remotes = [coordinator.schedule(step, args=(iterator,)) for _ in range(num_steps)]
    try:
        coordinator.join()
    except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as error:
        return None, None, error, None, None
    except tf.errors.OpError as error:
        if "GRPC error" in str(error) and isinstance(
                error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
            return (None, None,
                    TimeoutError(f"gRPC failed between the check's tasks: {error}"), None, None)
        return None, None, error, None, None  # the answer's own dataset failed on a worker
    fetched = [remote.fetch() for remote in remotes]
    if not all(bool(has_value) for *_, has_value, _ in fetched):
        return None, None, tf.errors.OutOfRangeError(None, None, "End of sequence"), None, None
    if int(barrier.timeouts.numpy()) > timeouts_before:
        return None, None, TimeoutError("a worker waited out the barrier"), None, None
    results = sorted(
        (float(when), int(worker), list(zip(ids.tolist(), labels.tolist(), strict=True)),
         int(cardinality))
        for worker, ids, labels, cardinality, _, _, _, when in fetched)
    batches: dict[int, list[list[tuple[int, int]]]] = {}
    for _, worker, pairs, _ in results:
        batches.setdefault(worker, []).append(pairs)
    shuffles: dict[int, set[tuple[int, int, int, int]]] = {}
    long: dict[int, list[int]] = {}
    for worker, *_, rows, more, _, _ in fetched:
        shuffles.setdefault(int(worker), set()).update(
            tuple(int(v) for v in row) for row in rows.tolist())
        long.setdefault(int(worker), more.tolist())  # the same read in each of its steps
    return batches, {result[3] for result in results}, None, shuffles, long


def reach(before: list[int], after: list[int]) -> int:
    """How far ahead of its place in ``before`` an example came in ``after`` (at most): a
    shuffle buffer of B examples never brings one more than B - 1 places forward."""
    place = {example: index for index, example in enumerate(before)}
    return max(place[example] - index for index, example in enumerate(after))


def passes_message(worker: int, stream: list[int], own: set[int], order: list[int]) -> Any:
    """What is wrong with worker ``worker``'s first two passes over its ``own`` examples."""
    size = len(own)
    first, second = stream[:size], stream[size:2 * size]
    if set(first) != own or set(second) != own or len(second) < size:
        return (f"worker {worker}'s first {size} examples are not its {size} examples once "
                "each: a pass reads each example once. Which step of yours mixes passes or "
                "drops examples? (lesson 01, section 7)")
    stored = [i for i in order if i in own]
    if first == stored:
        return f"worker {worker} reads its examples in their stored order: nothing shuffles"
    if first == second:
        return (f"worker {worker} reads its examples in the same order in every pass: what "
                "does your shuffle do at a new pass? (lesson 01, section 7)")
    # Each pass shuffles the stored order anew, and a buffer of B never brings an example
    # more than B - 1 places forward: a buffer of half the share or less never reaches
    # size // 2 in any pass. A uniform shuffle of n examples stays below k places in a pass
    # with chance k**(n - k + 1) * (k - 1)! / n!: for k = n // 2, at most 1.0e-3 at these
    # sizes (33-71), so in every one of three passes below 1e-9.
    passes = [stream[k * size:(k + 1) * size] for k in range(3)]
    farthest = max(reach(stored, one) for one in passes if set(one) == own)
    if farthest < size // 2:
        return (f"worker {worker}'s {size} examples came at most {farthest} place(s) earlier "
                f"than where they were stored, in every pass: the shuffle buffer is too small "
                "to shuffle its share (lesson 01, section 7: how far can a buffer move one?)")
    return None


#: Two orders of the same n examples that agree on this many places, or keep this many of one's
#: neighbours (b right after a) in the other, are the same order, not two fresh draws: for a
#: uniform shuffle, independent of the other order, each count is at least k with chance at most
#: 1/k! (its k-th factorial moment: 1/k! for places, (n - k)/(n k!) for neighbours), 1.2e-11
#: for 14; the check compares 4 workers' 33 orders at most (2 cases of 2 workers, the stored
#: order and up to 32 passes) pairwise, 2 counts each: a right answer is refused with chance
#: below 5e-8.
SAME_ORDER = 14


def fresh_passes_message(worker: int, stream: list[int], own: set[int], order: list[int],
                         count: int) -> str | None:
    """What is wrong with the ``count`` passes of ``stream`` (one iterator's first passes over
    worker ``worker``'s ``own`` examples): fewer read, a pass that is not the share once, or
    one whose order is the stored order or an earlier pass's (:data:`SAME_ORDER` places or
    neighbours in common)."""
    size = len(own)
    if len(stream) < count * size:
        return (f"another iterator of worker {worker}'s dataset ran out after {len(stream)} "
                f"examples, {count} passes over its {size} asked for: a parameter-server "
                "dataset must never run dry (section 2)")
    passes = [stream[k * size:(k + 1) * size] for k in range(count)]
    for number, one in enumerate(passes, 1):
        if set(one) != own or len(one) != size:
            return (f"worker {worker}'s pass {number} is not its {size} examples once each: a "
                    "pass reads each example once. Which step of yours mixes passes or drops "
                    "examples? (lesson 01, section 7)")
    stored = [i for i in order if i in own]
    index = {example: place for place, example in enumerate(stored)}
    orders = np.array([[index[i] for i in one] for one in [stored, *passes]])
    after = np.full(orders.shape, -1)  # after[k, e]: the example right after e in order k
    np.put_along_axis(after[:, :], orders[:, :-1], orders[:, 1:], axis=1)
    places = (orders[:, None, :] == orders[None, :, :]).sum(axis=2)
    neighbours = ((after[:, None, :] == after[None, :, :]) & (after[:, None, :] >= 0)).sum(axis=2)
    common = np.triu(np.maximum(places, neighbours), k=1)
    if common.max() < SAME_ORDER:
        return (split_message(worker, orders[1:], size)
                or _arranged_message(worker, orders[1:], size)
                or _usual_message(worker, orders[1:], size)
                or mixed_message(worker, orders[1:], size))
    first, later = (int(k) for k in np.argwhere(common >= SAME_ORDER)[0])
    than = "their stored order" if first == 0 else f"the order of pass {first}"
    return (f"worker {worker}'s pass {later} keeps too much of {than}: "
            f"{places[first, later]} of its {size} examples at the same place, "
            f"{neighbours[first, later]} followed by the same example (a fresh shuffle keeps "
            "about 1 of each). Each pass must shuffle the examples themselves anew, however "
            "many passes are read (lesson 01, section 7)")


def turned_reach(at: np.ndarray) -> tuple[int, int]:
    """How far ahead (at most) the examples came in one pass (``at[i]``: the place in the pass
    of the example stored i-th) in its best frame: the stored order turned, a rotation or a
    reflection (``(b - j) mod n``), then read at a stride (``(a * j + b) mod n``, ``a`` prime
    to ``n``, neither 1 nor -1): ``(turned, strided)``, the least reach over each kind of frame."""
    size = len(at)
    units = np.array([a for a in range(1, size) if gcd(a, size) == 1])
    j = np.arange(size)
    frames = (units[:, None, None] * j[None, None, :] + j[None, :, None]) % size  # [a, b, j]
    best = (j[None, None, :] - at[frames]).max(axis=2).min(axis=1)  # per stride a
    turned = (units == 1) | (units == size - 1)
    return int(best[turned].min()), int(best[~turned].min(initial=size))


def _arranged_message(worker: int, orders: np.ndarray, size: int) -> str | None:
    """Refuses passes that are each a fixed arrangement of the stored order shuffled a little.

    A buffer of B never brings an example more than B - 1 places ahead of where its input had
    it: every pass a rotation or reflection of the stored order then a buffer of half the share
    or less reaches below size // 2 in that frame; a stride of it then a buffer of a third or
    less, below size // 3. A uniform shuffle of n examples reaches below k in a given frame with
    chance k**(n - k + 1) * (k - 1)! / n!; over the 2n turned frames (k = n // 2) and the
    strided ones (n per stride, k = n // 3), at most 0.068 per pass at these sizes (33-71, 34
    the worst), so in every one of 8 passes or more, on any of 4 workers, below 2e-9."""
    reaches = []
    for one in orders:
        turned, strided = turned_reach(np.argsort(one))
        if turned < size // 2:
            reaches.append(turned)
        elif strided < size // 3:
            reaches.append(strided)
        else:
            return None
    return (f"each of worker {worker}'s {len(orders)} passes is its stored order turned "
            "(rotated, reversed or read at a stride) with every example at most "
            f"{max(reaches)} place(s) ahead of where that arrangement had it: a fixed "
            "arrangement shuffled a little, not a shuffle of the whole share. A buffer of B "
            "never brings an example more than B - 1 places earlier (lesson 01, section 7)")


#: The passes the check tests against the frame its earlier passes set (:func:`usual_reach`).
LATER = 4


#: A rank correlation with the usual order that each of the last passes must not all exceed:
#: a uniform shuffle's pass exceeds 0.47 once in 320 at 33 examples (fewer above; 10**6 passes
#: simulated), so all of the last 4 of one worker once in 10**10.
RANK_BAR = 0.47


def usual_reach(orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How far ahead (at most) the examples came in each of the last :data:`LATER` passes of
    ``orders`` (``orders[k, i]``: the example at place i of pass k) in the frame the passes
    before set (the examples sorted by their mean place over those passes), and each such
    pass's rank correlation (Spearman's) with that frame."""
    before, n = len(orders) - LATER, orders.shape[1]
    mean = np.argsort(orders[:before], axis=1).mean(axis=0)  # each example's mean place
    frame = np.argsort(mean, kind="stable")
    later = np.argsort(orders[before:], axis=1)[:, frame]  # [k, j]: frame's j-th example's place
    moved = np.arange(n)[None, :] - later
    return moved.max(axis=1), 1 - 6 * (moved.astype(float) ** 2).sum(axis=1) / (n * (n * n - 1))


def _usual_message(worker: int, orders: np.ndarray, size: int) -> str | None:
    """Refuses passes that are each one fixed arrangement shuffled a little, whatever it is.

    The frame is read from all passes but the last :data:`LATER` (at least 4 of them): each
    example's mean place there. A buffer of B never brings an example more than B - 1 places
    ahead of where its input had it, so that passes of one fixed arrangement then a small buffer
    (8, a quarter of the share) reach below size // 2 in that frame, which their mean places set
    close to the arrangement (simulated: refused per worker 98% at 33-35 examples, more above). The
    last passes are drawn apart from that frame: a uniform shuffle of n examples reaches below
    k in a given frame with chance k**(n - k + 1) * (k - 1)! / n! (k = n // 2: at most 1.0e-3
    at these sizes, 33-71), so in each of the last 4 below 1e-12; a buffer of three quarters of
    the share, below 0.005 per pass (simulated), so in each of the last 4 below 1e-9. Each
    of the last 4 with a rank correlation above :data:`RANK_BAR` with the frame is refused too
    (two ``shuffle(8)`` of one arrangement, or a hidden buffer of a third of the share: refused
    per worker 69 % and 88 % at 33 examples, 84-98 % from 34; a buffer of three quarters of
    the share: all of the last 4 above the bar about 3e-8 per worker at 33 examples)."""
    if len(orders) < 2 * LATER:
        return None
    reaches, ranks = usual_reach(orders)
    if reaches.max() < size // 2:
        found = f"has every example at most {reaches.max()} place(s) ahead of its usual place"
    elif ranks.min() > RANK_BAR:
        found = (f"keeps its usual order (a rank correlation of {ranks.min():.2f} at least; a "
                 f"shuffle of the whole share exceeds {RANK_BAR} at most once in 300 passes)")
    else:
        return None
    return (f"each of worker {worker}'s last {LATER} passes {found} (the order of its mean "
            f"places over the {len(orders) - LATER} passes before): a fixed arrangement shuffled "
            "a little, not a shuffle of the whole share. A buffer of B never brings an example "
            "more than B - 1 places earlier (lesson 01, section 7)")
