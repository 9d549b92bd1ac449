"""Lesson 01's exercise 3: how far a shuffle moved ``range(n)``, against its buffer.

``tf.data``'s ``shuffle(b)`` fills a buffer with the first ``b`` elements, then hands out one
drawn uniformly from the buffer and puts the next element of its input in that place. So the
``i``-th element out is one of ``0 .. i + b - 1``: none comes out more than ``b - 1`` places
ahead; at each of the ``n - b + 1`` draws from a full buffer the newest element, ``b - 1``
places ahead, comes out with probability ``1 / b``; and an element stays in the buffer as long
as the draws miss it, ``1 - 1 / b`` each, so some come out ``b`` or more places late. A buffer
smaller than ``b`` never brings one ``b - 1`` ahead; fixed windows of ``b`` elements, each
shuffled, never bring one ``b`` late.

``global_seed`` reads TensorFlow's global seed back without drawing from it: lesson 01's
exercise 2 and lesson 02's exercise 4 fail an answer that changed it (``tf.random.set_seed``
seeds every unseeded random op of the process, the learner's notebook or worker included).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["buffer_problem", "global_seed", "places_ahead", "places_late"]


def global_seed() -> int:
    """TensorFlow's global seed as its random ops read it: ``tf.compat.v1.random.get_seed``
    (``tensorflow/python/framework/random_seed.py``, ``get_seed``: the global seed truncated to
    31 bits, TensorFlow's default graph seed where none is set). Asked with an op seed of its
    own, so that reading it draws no operation seed from the global one (``get_seed(None)``
    would: ``context.internal_operation_seed()``) and changes nothing a later op gets."""
    from course_utils.quiet import import_tensorflow

    return int(import_tensorflow().compat.v1.random.get_seed(1)[0])


def places_ahead(order: Sequence[int]) -> int:
    """The most places an element of ``range(n)`` came out ahead of its own place."""
    order = np.asarray(order)
    return int(np.max(order - np.arange(len(order))))


def places_late(order: Sequence[int]) -> int:
    """The most places an element of ``range(n)`` came out after its own place."""
    order = np.asarray(order)
    places = np.empty(len(order), dtype=int)
    places[order] = np.arange(len(order))
    return int(np.max(places - np.arange(len(order))))


def buffer_problem(orders: Sequence[Sequence[int]], buffer: int, noun: str) -> str | None:
    """What shows that the epochs ``orders`` of ``range(n)`` were not shuffled with a buffer of
    ``buffer`` (smaller than ``n``), or None. A right shuffle misses the reach ``buffer - 1`` in
    an epoch with probability ``(1 - 1/buffer) ** (n - buffer + 1)``; the callers draw enough
    independent epochs to make that, and a lateness under ``buffer``, far below one in a
    million."""
    epochs, article = len(orders), "an" if noun[0] in "aeiou" else "a"
    ahead = max(places_ahead(order) for order in orders)
    if ahead > buffer - 1:
        return (f"{article} {noun} came out {ahead} places ahead of its place in the data; a "
                f"shuffle buffer of {buffer} reaches at most {buffer - 1} ahead: is the buffer "
                "the one given?")
    if ahead < buffer - 1:
        return (f"no {noun} came more than {ahead} places ahead of its place in {epochs} "
                f"epochs; a shuffle buffer of {buffer} brings its newest {noun}, {buffer - 1} "
                f"ahead, nearly every epoch: is the buffer counted in {noun}s, and is it the "
                "one given?")
    late = max(places_late(order) for order in orders)
    if late < buffer:
        return (f"no {noun} came out more than {late} places after its place in {epochs} "
                f"epochs; a shuffle buffer of {buffer} keeps some {noun}s for {buffer} draws or "
                f"more (each draw misses one with chance 1 - 1/{buffer}): does one buffer run "
                "over the whole epoch, or were fixed windows shuffled?")
    return None
