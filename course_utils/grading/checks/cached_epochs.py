"""Lesson 01, exercise 3 (cache before augmenting): two epochs and more of a learner's cached
pipeline judged: every record once per epoch, decodes counted (once over two epochs, by a decode
op upstream of a tf.data cache), augmentation and order that change every epoch (every element
carries one of the offsets augment drew in its epoch, replayed from augment's generator, one a
record, not one a batch), the shuffle's reach for the buffer given (``shuffle_order``), every
other step keeping the order (no ``deterministic=False``: a cache after such a decode keeps its
finish order)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import batches as _batches
from course_utils.grading.checks.batch_shapes import dataset_steps, py_function_tokens
from course_utils.grading.checks.batch_shapes import size_problem as _size_problem
from course_utils.grading.checks.shuffle_order import buffer_problem, places_ahead
from course_utils.grading.checks.static_batches import order_problem
from course_utils.quiet import import_tensorflow

__all__ = ["cached_verifier"]


def cached_verifier(count: int, batch_size: int, buffer: int,
                     calls: dict[str, Any]) -> Callable[[Any], str | None]:
    """``verify`` of exercise 3 for ``range(count)`` shuffled with ``buffer``."""
    def verify(dataset: Any) -> str | None:
        if not isinstance(dataset, import_tensorflow().data.Dataset):
            return f"expected a tf.data.Dataset, got {type(dataset).__name__}"
        epochs, decoded, draws = [], [], []
        for _ in range(2):
            before, since = calls["decode"], calls["state"]()
            batches = _batches(dataset)
            decoded.append(calls["decode"] - before)
            draws.append(calls["drawn"](since))  # augment's offsets drawn in this epoch
            problem = _size_problem(batches, count, batch_size)
            if problem:
                return problem
            epochs.append(np.concatenate(batches))
        orders = [(epoch // 10).astype(int).tolist() for epoch in epochs]
        if sorted(orders[0]) != list(range(count)):
            return "every record must come once per epoch, decoded (decode gives 10 × record)"
        if decoded != [count, 0]:
            return (f"decode ran {decoded[0]} times in epoch 1 and {decoded[1]} times in "
                    f"epoch 2; expected {count} and 0: which elements does the cache keep?")
        steps = dataset_steps(dataset)
        if not any(step.startswith("CacheDataset") for step in steps):
            return (f"decode ran once per record, but your pipeline holds no tf.data cache "
                    f"(its steps: {', '.join(steps)}): which step keeps them for epoch 2?")
        cached = py_function_tokens(dataset, feeding="CacheDataset")
        uncached = sum(token not in cached for token in calls["by"])
        if uncached:  # decoded in Python, memoised, or by a map the cache does not receive
            return (f"{uncached} of decode's {len(calls['by'])} calls came from no decode op "
                    "upstream of your pipeline's tf.data cache (called in Python, or by a map "
                    "whose results the cache never receives): the cache holds no decoded "
                    "record. Which step's output must it keep?")
        if np.array_equal(np.floor(epochs[0]), epochs[0]):
            return "the elements were not augmented (each is 10 × its record exactly)"
        # 10 × record + an offset in [0, 1): sorted, each record's element meets its own
        if np.array_equal(np.sort(epochs[0]), np.sort(epochs[1])):  # whatever the order
            return ("the two epochs hold the same augmented elements (in any order): the cache "
                    "froze the augmentation")
        drew = [len(offsets) for offsets in draws]  # fresh values, but whose noise?
        if drew == [0, 0]:
            return ("augment never ran in two epochs (its generator drew nothing): the "
                    "elements' noise is not augment's")
        if not drew[1]:
            return (f"augment drew {drew[0]} offsets in epoch 1 and none in epoch 2: the cache "
                    "froze the augmentation (epoch 2's noise is not augment's)")
        if drew[0] != drew[1]:  # more in epoch 1: augment before the cache too
            return (f"augment drew {drew[0]} offsets in epoch 1 and {drew[1]} in epoch 2: does "
                    "it run before the cache too, or a cache keep some augmented elements? "
                    "Augment after the cache only, anew every epoch")
        for epoch, (elements, offsets) in enumerate(zip(epochs, draws, strict=True), 1):
            away = np.abs(elements % 10 - offsets[:, None]).min(axis=0) >= 1e-4  # rounding:
            if away.any():  # < 6.2e-5 (10 × record < 1024)
                return (f"{away.sum()} of epoch {epoch}'s {count} elements are not 10 × their "
                        "record plus one of the offsets augment drew in that epoch: whose "
                        "noise do they carry?")
        if drew[0] < count:  # one offset a record (a batch's, a pair's: fewer)
            return (f"augment drew {drew[0]} offsets in an epoch of {count} records: augment "
                    "every record (not whole batches)")
        for elements, offsets in zip(epochs, draws, strict=True):  # each its own offset
            free = iter(np.sort(offsets))  # greedy on a line: the lowest offset still in reach
            for element in np.sort(elements % 10):
                offset = next((o for o in free if o > element - 1e-4), 2.0)
                if offset >= element + 1e-4:
                    return "some elements share one augment offset: augment every record"
        if orders[0] == list(range(count)):
            return "the records came in their stored order: shuffle them"
        if orders[0] == orders[1]:
            return ("the two epochs came in the same order: something froze the shuffle (a "
                    "cache after it, reshuffle_each_iteration=False, or random keys or a "
                    "permutation drawn once, e.g. Dataset.random() without "
                    "rerandomize_each_iteration=True; a shuffle is random work too)")
        problem = order_problem(dataset)  # finish orders, kept by a cache: not the shuffle's
        if problem:
            return (f"{problem} (the check measures your shuffle's reach from the records' "
                    "stored order: every step but the shuffle must keep it)")
        # b < n: 8 epochs, each missing the reach b - 1 with P < 4.3 % (count >= 4 b) and a
        # record b late with P < 1.4 %: < 2e-11 (checks/shuffle_order.py). The whole set
        # brings none k = count // 2 early with P = k^(count-k) k!/count! < 0.8 % (count >= 21);
        # in 4 epochs: < 1e-8.
        orders += [(np.concatenate(_batches(dataset)) // 10).astype(int).tolist()
                   for _ in range(2 if buffer == count else 6)]
        if buffer < count:
            return buffer_problem(orders, buffer, "record")
        jump = max(places_ahead(order) for order in orders)
        if jump < count // 2:
            return (f"no record came more than {jump} places before its stored place "
                    f"in {len(orders)} epochs; a shuffle over all {count} records brings some "
                    f"{count // 2} or more; the buffer given was {count}")
        return None

    return verify
