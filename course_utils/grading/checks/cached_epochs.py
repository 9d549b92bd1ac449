"""Lesson 01, exercise 3 (cache the slow step that follows a random one): the check's stages and
two epochs and more of a learner's pipeline judged.

The colleague's pipeline keeps lesson 01's rule as written: ``decode`` (deterministic), a
cache, then ``crop`` (random) and ``featurize`` (deterministic, slow, value by value). Every
epoch featurizes again. ``featurize`` works on each value on its own, so it commutes with a
crop, which only selects values: featurize before the crop and the cache can keep its results.

Judged: every record once per epoch, as ``featurize(crop(decode(record)))`` (its values
divided by featurize's scale, drawn by the check, and squared give ``100 record + start + j``:
featurize run once, on a window of consecutive values; every value one featurize returned, of
one decode returned: both mark theirs per call), decode and featurize counted (each record
decoded in epoch 1, neither called in epoch 2, each call by an op upstream of a tf.data cache
and none by an op that reaches the output by a path with no cache on it), crop's windows
drawn anew every epoch (replayed from its generator: one a record, the windows the elements
hold), and the shuffle's reach for the buffer given (``shuffle_order``), every other step
keeping the order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import batches as _batches
from course_utils.grading.checks.batch_shapes import (
    dataset_steps,
    expected_sizes,
    py_function_token,
    py_function_tokens,
)
from course_utils.grading.checks.shuffle_order import buffer_problem, places_ahead
from course_utils.grading.checks.static_batches import order_problem
from course_utils.quiet import import_tensorflow

__all__ = ["cached_verifier", "cropped_stages"]


def cropped_stages(calls: dict[str, Any], seed: int, length: int, width: int, scale: float
                   ) -> tuple[Callable[[Any], Any], ...]:
    """The check's ``decode`` (a record ``r`` -> ``100 r + arange(length)``, float32),
    ``crop`` (a window of ``width`` consecutive values, its start drawn from a generator whose
    state moves on every call) and ``featurize`` (the square root of every value times
    ``scale``, drawn by the check: an answer cannot compute it without featurize). decode and
    featurize mark every value they return (1 to 8 units in its last place, drawn on each call,
    kept in ``calls["returned"][name]`` with the value it came from): a value computed
    otherwise lacks the mark. decode and featurize count their calls in ``calls[name]`` and
    the token of the op that made each in
    ``calls["by"][name]`` (None: an eager call); ``calls["drawn"](calls["state"]())`` later
    gives the window starts crop drew since."""
    tf = import_tensorflow()
    generator = tf.random.Generator.from_seed(seed, tf.random.Algorithm.PHILOX)
    starts = length - width + 1
    calls.update(decode=0, featurize=0, by={"decode": [], "featurize": []})
    calls["returned"] = {"decode": {}, "featurize": {}}  # a value's bits -> its input's bits
    marks = np.random.default_rng(seed + 1)  # a few ulps on every value returned, per call
    calls["state"] = lambda: generator.state.numpy().copy()

    def drawn(since: Any) -> Any:  # crop's starts drawn since the state ``since``, again:
        count = (int(generator.state.numpy()[0]) - int(since[0])) // 256  # Philox (counter,
        flat = tf.raw_ops.StatelessRandomUniformV2(  # key): a scalar draw moves the counter
            shape=[1024 * count], key=since[2:].astype(np.uint64),  # 256, 4 floats each
            counter=since[:2].astype(np.uint64), alg=1, dtype=tf.float32)  # 1: Philox
        uniform = flat.numpy()[::1024]
        return (uniform * np.float32(starts)).astype(np.int32)  # as crop computes them

    calls["drawn"] = drawn

    def counted(name: str, work: Callable[[Any], Any]) -> Callable[[Any], Any]:
        made: list[str | None] = []  # the token of every op of this stage made, in order

        def run(value: Any, op: int) -> Any:
            calls[name] += 1
            calls["by"][name].append(made[op])
            given = np.asarray(value.numpy(), np.float32)
            out = np.ascontiguousarray(work(given), np.float32)
            bits = out.view(np.uint32)  # marked: 1 to 8 units in the last place (not 0.0)
            bits += (marks.integers(1, 9, size=bits.shape) * (bits != 0)).astype(np.uint32)
            inputs = np.broadcast_to(given.view(np.uint32), out.shape)
            calls["returned"][name].update(zip(bits.flat, inputs.flat, strict=True))
            return out

        def stage(value: Any) -> Any:
            op = len(made)
            made.append(None)
            result = tf.py_function(lambda v: run(v, op), [value], tf.float32)
            result.set_shape([length] if name == "decode" else value.shape)
            made[op] = py_function_token(result)
            return result

        return stage

    decode = counted("decode", lambda r: (100 * int(r) + np.arange(length)).astype(np.float32))
    featurize = counted("featurize",
                        lambda v: (np.sqrt(v.astype(np.float32)) * scale).astype(np.float32))

    def crop(values: Any) -> Any:
        start = tf.cast(generator.uniform([], 0.0, 1.0) * starts, tf.int32)
        return tf.slice(values, [start], [width])

    return decode, crop, featurize


def _bases(elements: np.ndarray, scale: float, times: int) -> np.ndarray | None:
    """``100 record + start`` of every element that is a window of a decoded record featurized
    ``times`` times (undone: consecutive whole numbers), or None."""
    values = elements.astype(np.float64)
    for _ in range(times):
        values = (values / scale) ** 2
    whole = np.round(values)
    if np.abs(values - whole).max() > 0.2 or (np.diff(whole, axis=1) != 1).any():
        return None
    return whole[:, 0].astype(int)


def _marks_problem(elements: np.ndarray, returned: dict[str, dict[Any, Any]]) -> str | None:
    """Whether every value of ``elements`` is one featurize returned, on a value decode
    returned (both mark theirs: ``cropped_stages``)."""
    bits = np.ascontiguousarray(elements, np.float32).view(np.uint32).ravel()
    featured, decoded = returned["featurize"], returned["decode"]
    unfeatured = sum(int(value) not in featured for value in bits)
    if unfeatured:
        return (f"{unfeatured} of the elements' {bits.size} values are none that featurize "
                "returned: the check's featurize marks every value it returns (a few units in "
                "its last place, drawn on each call), so features computed without it, or from "
                "part of its output, lack the mark: every element must hold featurize's output")
    undecoded = sum(int(featured[int(value)]) not in decoded for value in bits)
    if undecoded:
        return (f"{undecoded} of the elements' {bits.size} values are featurize's, of values "
                "decode never returned: decode marks its values too (drawn on each call), so "
                "values typed in lack the mark: featurize decode's output")
    return None


def _windows(epoch: list[np.ndarray], first: int, count: int, batch_size: int, length: int,
             width: int, scale: float, returned: dict[str, dict[Any, Any]]
             ) -> tuple[str | None, Any]:
    """(a problem, None) or (None, (record positions, window starts)) of one epoch."""
    if any(batch.ndim != 2 or batch.shape[1:] != (width,) for batch in epoch):
        shapes = sorted({batch.shape for batch in epoch})[:3]
        return (f"expected batches of shape [batch, {width}] (crop keeps {width} of a record's "
                f"{length} values), got shapes {shapes}: crop every record, then batch"), None
    sizes = [len(batch) for batch in epoch]
    if sizes != expected_sizes(count, batch_size):
        return (f"batch sizes differ: expected {count // batch_size} batches of {batch_size}"
                f"{f' and one of {count % batch_size}' if count % batch_size else ''} (the "
                f"short one last), got sizes {sizes[:12]}"), None
    elements = np.concatenate(epoch)
    bases = _bases(elements, scale, 1)
    if bases is None:
        said = {0: "featurize never ran on them (each value is decode's own)",
                2: "featurize ran twice on them"}
        why = next((said[n] for n in (0, 2) if _bases(elements, scale, n) is not None),
                   "their values are not featurize's, of a window of a decoded record")
        return (f"the elements are not featurize(crop(decode(record))): {why}"), None
    records, starts = bases // 100, bases % 100
    if (starts > length - width).any() or sorted(records.tolist()) != list(
            range(first, first + count)):
        return (f"every record must come once per epoch, cropped ({len(set(records.tolist()))} "
                f"distinct records of {count}, window starts {sorted(set(starts.tolist()))[:6]})"
                ), None
    problem = _marks_problem(elements, returned)
    return (f"the elements are not featurize(crop(decode(record))): {problem}", None) if (
        problem) else (None, (records - first, starts))


def cached_verifier(first: int, count: int, batch_size: int, buffer: int, length: int,
                    width: int, scale: float, calls: dict[str, Any]
                    ) -> Callable[[Any], str | None]:
    """``verify`` of exercise 3 for ``range(first, first + count)`` shuffled with ``buffer``."""
    def epoch_of(dataset: Any) -> tuple[str | None, Any]:
        return _windows(_batches(dataset), first, count, batch_size, length, width, scale,
                        calls["returned"])

    def verify(dataset: Any) -> str | None:
        if not isinstance(dataset, import_tensorflow().data.Dataset):
            return f"expected a tf.data.Dataset, got {type(dataset).__name__}"
        built = {name: calls[name] for name in ("decode", "featurize") if calls[name]}
        if built:  # the records read while the answer ran, not as its pipeline is iterated
            return (f"{' and '.join(f'{name} ran {n} times' for name, n in built.items())} "
                    "while your function built its dataset, before the check iterated it: "
                    "decode and featurize in the pipeline, as it runs (real records need not "
                    "fit in memory)")
        orders, windows, ran, draws = [], [], [], []
        for _ in range(2):
            before = {name: calls[name] for name in ("decode", "featurize")}
            since = calls["state"]()
            problem, epoch = epoch_of(dataset)
            if problem:
                return problem
            ran.append({name: calls[name] - before[name] for name in before})
            draws.append(calls["drawn"](since))  # crop's starts drawn in this epoch
            orders.append(epoch[0].tolist())
            windows.append(epoch[1])
        decoded = [epoch["decode"] for epoch in ran]
        if decoded != [count, 0]:
            return (f"decode ran {decoded[0]} times in epoch 1 and {decoded[1]} times in "
                    f"epoch 2; expected {count} and 0: which elements does the cache keep?")
        featurized = [epoch["featurize"] for epoch in ran]
        if featurized[1]:
            return (f"featurize ran {featurized[0]} times in epoch 1 and {featurized[1]} times "
                    "in epoch 2; expected none in epoch 2: the cache must keep featurize's "
                    "results too. It works on each value on its own: does it need the crop "
                    "first?")
        if not featurized[0]:
            return ("featurize never ran in the pipeline's epochs: where were the values "
                    "featurized?")
        steps = dataset_steps(dataset)
        if not any(step.startswith("CacheDataset") for step in steps):
            return (f"decode and featurize ran in epoch 1 only, but your pipeline holds no "
                    f"tf.data cache (its steps: {', '.join(steps)}): which step keeps their "
                    "results for epoch 2?")
        cached = py_function_tokens(dataset, feeding="CacheDataset")
        for name in ("decode", "featurize"):
            uncached = sum(token not in cached for token in calls["by"][name])
            if uncached:  # called in Python, memoised, or by a map the cache never receives
                return (f"{uncached} of {name}'s {len(calls['by'][name])} calls came from no "
                        f"{name} op upstream of your pipeline's tf.data cache (called in Python, "
                        "or by a map whose results the cache never receives): which step's "
                        "output must the cache keep?")
        uncached = py_function_tokens(dataset, short_of="CacheDataset")
        for name in ("decode", "featurize"):
            bypass = sum(token in uncached for token in calls["by"][name])
            if bypass:  # a cache on a side branch, and the work remembered in another way
                return (f"{bypass} of {name}'s calls came from an op that feeds your "
                        "pipeline's output by a path with no tf.data cache on it (a cache on a "
                        "side branch, and a memo of your own on the main one?): the elements "
                        "of epoch 2 must come from the cache")
        drew = [len(starts) for starts in draws]
        if drew == [0, 0]:
            return ("crop never ran in two epochs (its generator drew nothing): the windows are "
                    "not crop's")
        if not drew[1]:
            return (f"crop drew {drew[0]} windows in epoch 1 and none in epoch 2: the cache "
                    "froze the crops (epoch 2's windows are epoch 1's)")
        if drew != [count, count]:
            return (f"crop drew {drew[0]} windows in epoch 1 and {drew[1]} in epoch 2, for "
                    f"{count} records an epoch: crop every record once, after the cache")
        for epoch, (held, starts) in enumerate(zip(windows, draws, strict=True), 1):
            if sorted(held.tolist()) != sorted(starts.tolist()):
                return (f"the windows of epoch {epoch} are not the ones crop drew in it: whose "
                        "windows do the elements hold?")
        if orders[0] == list(range(count)):
            return "the records came in their stored order: shuffle them"
        if orders[0] == orders[1]:
            return ("the two epochs came in the same order: something froze the shuffle (a "
                    "cache after it, reshuffle_each_iteration=False, or an order drawn once; a "
                    "shuffle is random work too)")
        problem = order_problem(dataset)  # finish orders, kept by a cache: not the shuffle's
        if problem:
            return (f"{problem} (the check measures your shuffle's reach from the records' "
                    "stored order: every step but the shuffle must keep it)")
        # b < n: 8 epochs, each missing the reach b - 1 with P < 4.3 % (count >= 4 b) and a
        # record b late with P < 1.4 %: < 2e-11 (checks/shuffle_order.py). The whole set
        # brings none k = count // 2 early with P = k^(count-k) k!/count! < 0.8 % (count >= 21);
        # in 4 epochs: < 1e-8.
        for _ in range(2 if buffer == count else 6):
            problem, epoch = epoch_of(dataset)
            if problem:
                return f"in a later epoch: {problem}"
            orders.append(epoch[0].tolist())
        if buffer < count:
            return buffer_problem(orders, buffer, "record")
        jump = max(places_ahead(order) for order in orders)
        if jump < count // 2:
            return (f"no record came more than {jump} places before its stored place "
                    f"in {len(orders)} epochs; a shuffle over all {count} records brings some "
                    f"{count // 2} or more; the buffer given was {count}")
        return None

    return verify
