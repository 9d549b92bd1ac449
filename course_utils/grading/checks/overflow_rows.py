"""Lesson 08, exercise 3: batches whose rows overflow float16 first at a chosen layer, built
from one forward pass of every scale of the rows (``row_firsts``): the outlier rows' cases, the
batches with one row scaled and the batch with two. ``overflow.py``'s check uses them."""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.quiet import import_tensorflow

__all__ = ["SCALES", "one_row_cases", "outputs_model", "overflow_cases", "row_firsts",
           "two_row_case"]


#: The input scales the check tries (outlier rows of the batch multiplied by each).
SCALES = tuple(10.0 ** (i / 4) for i in range(-8, 29))


def outputs_model(model: Any) -> tuple[list[Any], Any]:
    """The model's layers (its input layer left out) and a Keras model of every one's output."""
    import_tensorflow()  # quiet, before Keras
    import keras

    layers = [layer for layer in model.layers
              if not isinstance(layer, keras.layers.InputLayer)]
    return layers, keras.Model(model.input, [layer.output for layer in layers])


def row_firsts(model: Any, x: np.ndarray, rows: list[int]
                ) -> tuple[list[Any], list[np.ndarray], np.ndarray]:
    """The batches with ``rows`` of ``x`` times each of ``SCALES``, and for each batch and
    example the index of the first layer whose output is not finite there (``len(layers)``
    where none): ``first[scale, row]``. Examples do not interact in an MLP, so every scale's
    batch runs in one call."""
    layers, every_output = outputs_model(model)
    batches = []
    for scale in SCALES:
        batch = x.copy()
        batch[rows] *= scale
        batches.append(batch)
    finite = np.stack([np.all(np.isfinite(np.asarray(output, np.float32)).reshape(
        len(SCALES), len(x), -1), axis=2) for output in every_output(np.concatenate(
            batches))])  # [layer, scale, row]
    first = np.where(finite.all(axis=0), len(layers), np.argmin(finite, axis=0))
    return layers, batches, first


def overflow_cases(model: Any, x: np.ndarray, rows: list[int], rng: Any,
                    decoy: str | None, firsts: Any = None,
                    ) -> list[tuple[np.ndarray, str | None, float]]:
    """Batches whose first overflowing layer differs: (x, the answer, the scale), computed
    (``firsts``: :func:`row_firsts` of the same arguments, where already computed)."""
    layers, batches, first = firsts or row_firsts(model, x, rows)
    names = [layer.name for layer in layers] + [None]
    by_answer: dict[str | None, tuple[np.ndarray, float]] = {}
    for batch, scale, index in zip(batches, SCALES, first.min(axis=1), strict=True):
        by_answer.setdefault(names[index], (batch, scale))
    named = [name for name in by_answer if name is not None]
    chosen = [None] + rng.sample(named, min(len(named), 1 if decoy else 2))
    return [(by_answer[name][0], name, by_answer[name][1]) for name in chosen
            if name in by_answer]


def one_row_cases(layers: list[Any], x: np.ndarray, first: np.ndarray, rows: list[int],
                   rng: Any, count: int) -> list[tuple[np.ndarray, str, float]]:
    """Up to ``count`` batches in each of which one row of ``rows``, drawn, is scaled and is
    the only row whose output overflows at the answer (the others are ``x``'s, left alone):
    (x, the answer, the scale). The first and the last row of ``x`` come first, where they
    are in ``rows`` and have such a scale (``x[1:]`` and ``x[:-1]`` miss one of them).
    ``first`` is :func:`row_firsts` of ``rows``. A row's scale is one whose neighbouring
    scales (a factor 1.78 either side) overflow at the same layer, and the rows left alone
    overflow at no layer up to the answer even 1.78 times larger: a different batch size's
    rounding does not move the answer."""
    one = SCALES.index(1.0)
    alone = first[one + 1]  # every row left alone, with a margin (times 1.78)
    pairs = [(row, at) for row in rows for at in range(1, len(SCALES) - 1)
             if first[at, row] < len(layers)
             and first[at - 1, row] == first[at, row] == first[at + 1, row]
             and first[at, row] < min(np.delete(alone, row), default=len(layers))]
    cases: list[tuple[np.ndarray, str, float]] = []
    used: set[int] = set()
    for end in (0, len(x) - 1):  # the batch's ends first: an answer off by one misses them
        choices = [(row, at) for row, at in pairs if row == end]
        if choices and len(cases) < count:
            row, at = rng.choice(choices)
            used.add(row)
            batch = x.copy()
            batch[row] *= SCALES[at]
            cases.append((batch, layers[int(first[at, row])].name, SCALES[at]))
    layer_order = sorted({int(first[at, row]) for row, at in pairs})
    rng.shuffle(layer_order)
    while pairs and len(cases) < count:
        progress = False
        for index in layer_order:
            choices = [(row, at) for row, at in pairs
                       if first[at, row] == index and row not in used]
            if not choices or len(cases) >= count:
                continue
            row, at = rng.choice(choices)
            used.add(row)
            batch = x.copy()
            batch[row] *= SCALES[at]
            cases.append((batch, layers[index].name, SCALES[at]))
            progress = True
        if not progress:
            break
    return cases


def two_row_case(layers: list[Any], x: np.ndarray, first: np.ndarray, rows: list[int],
                  rng: Any) -> list[tuple[np.ndarray, str, float, int]]:
    """At most two batches with two rows of ``rows`` scaled, every other row left alone: a row
    ``a`` overflowing first at a layer ``j`` and a row ``b`` at a layer before ``j`` (the
    answer), both before any other row's first overflow even 1.78 times larger; each row's
    scale has neighbouring scales (a factor 1.78 either side) that overflow at the same layer.
    In the first batch ``a`` is in the first half of ``x`` and ``b`` in the second, in the other
    the other way round; in one of them ``a`` is the larger row (scaled, by max and by L2 norm,
    else by max; where such rows exist: 4 models in 5), in the other the smaller. An answer that
    walks the rows in one order (of the batch, from either end, one by one or in chunks; by
    size, either way) and returns the first overflow it meets misses one of them. ``a`` and
    ``b`` are at different parities where they can be (``a`` even in one batch, odd in the
    other; ``x[::2]``'s answer first, or ``x[1::2]``'s, misses one), and in the second batch a
    third row overflows first at ``a``'s layer where one can (the layer most rows overflow at
    is not the answer). (x, the answer, ``b``'s scale, how many rows are scaled); ``first`` is
    :func:`row_firsts` of ``rows``, no new forward pass."""
    one = SCALES.index(1.0)
    alone = first[one + 1]  # every row left alone, with a margin (times 1.78)
    pairs = [(row, at) for row in rows for at in range(1, len(SCALES) - 1)
             if first[at, row] < len(layers)
             and first[at - 1, row] == first[at, row] == first[at + 1, row]]
    scales = np.asarray(SCALES)
    size, norm = np.max(np.abs(x), axis=1), np.linalg.norm(x, axis=1)
    half = [np.array([pair for pair in pairs if (pair[0] < len(x) // 2) == front],
                     dtype=int).reshape(-1, 2) for front in (True, False)]
    want = rng.randrange(2)  # a's parity in the first batch, the other in the second
    found = []  # for each batch: every option, those where a is larger, those where smaller
    for late, early in ((half[0], half[1]), (half[1], half[0])):
        a, b = late[:, None, :], early[None, :, :]  # every (a, b): [a's, b's, (row, scale)]
        layer_a, layer_b = first[a[..., 1], a[..., 0]], first[b[..., 1], b[..., 0]]
        rest = np.full(layer_a.shape[:1] + layer_b.shape[1:], len(layers))  # the other rows' first
        for row in np.argsort(alone, kind="stable")[2::-1]:
            rest = np.where((a[..., 0] != row) & (b[..., 0] != row), alone[row], rest)
        options = (layer_b < layer_a) & (layer_a < rest)
        ratio = [measure[a[..., 0]] * scales[a[..., 1]] / (measure[b[..., 0]]
                                                           * scales[b[..., 1]])
                 for measure in (size, norm)]
        larger = options & (ratio[0] > 1)
        split = (a[..., 0] % 2 == want) & (b[..., 0] % 2 != want)  # a, b at other parities
        want = 1 - want
        masks = (options,
                 (larger & (ratio[1] > 1)) if np.any(larger & (ratio[1] > 1)) else larger,
                 options & (ratio[0] < 1) & (ratio[1] < 1))
        found.append([list(zip(*np.nonzero(mask & split if np.any(mask & split) else mask),
                               strict=True)) for mask in masks] + [late, early])
    flip = not found[0][1] and bool(found[1][1])  # a the larger in the second batch
    cases = []
    for index, (options, a_larger, a_smaller, late, early) in enumerate(found):
        chosen = (a_larger if (index == 1) == flip else a_smaller) or options
        if not chosen:
            continue
        i, j = rng.choice(chosen)
        (a, at_a), (b, at_b) = late[i], early[j]
        batch = x.copy()
        batch[a] *= SCALES[at_a]
        batch[b] *= SCALES[at_b]
        # a third row at a's layer (the other rows overflow after it even 1.78 times larger),
        # at b's other parity where it can be
        third = [(row, at) for row, at in pairs if index == 1 and row not in (a, b)
                 and first[at, row] == first[at_a, a]]
        third = [pair for pair in third if pair[0] % 2 != b % 2] or third
        if third:
            row, at = rng.choice(third)
            batch[row] *= SCALES[at]
        cases.append((batch, layers[int(first[at_b, b])].name, SCALES[at_b], 2 + bool(third)))
    return cases
