"""Passes in which a part of a worker's share keeps to places of its own (lesson 04's exercise 2):
halves shuffled apart then interleaved, or a few examples kept in stored order, which no
shuffle of the whole share does (:func:`kept_apart`)."""

from __future__ import annotations

import numpy as np

__all__ = ["kept_apart", "mixed_message", "seldom_mixed", "split_message"]


def kept_apart(orders: np.ndarray) -> tuple[int, int]:
    """``(examples, places)`` of the smallest part of the share whose examples took, over the
    passes ``orders`` (``orders[k, j]``: the example at place j of pass k), only places that no
    other example took (``(n, n)`` where there is none): a connected component of the graph that
    joins each example to every place it took.

    Each pass of a uniform shuffle is a random matching of examples to places; the union of P
    of them leaves a part of k examples and k places apart with chance at most
    ``C(n, k) ** (2 - P)`` summed over k (examples and places chosen, matched within in every
    pass): at n = 33 and P = 8 (the fewest the check reads), 8e-10, all but all of it one
    example always at one place (20,000 simulated at 33-71 examples and 8 or 10 passes: none
    apart). Halves each shuffled then interleaved in a fixed pattern, or a few examples kept in
    stored order at the end of each pass, stay apart in every pass."""
    passes, n = orders.shape
    parent = list(range(2 * n))  # examples 0..n-1, places n..2n-1

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for one in orders:
        for place, example in enumerate(one.tolist()):
            parent[root(int(example))] = root(n + place)
    parts: dict[int, list[int]] = {}
    for node in range(2 * n):
        parts.setdefault(root(node), [0, 0])[node >= n] += 1
    examples, places = min(parts.values(), key=lambda part: part[0] + part[1])
    return examples, places


def seldom_mixed(orders: np.ndarray) -> tuple[float, float, int]:
    """``(gap, bound, part)``: the spectral gap (second-smallest Laplacian eigenvalue) of the
    multigraph that joins each example to the place it took in each pass, the least a uniform
    shuffle gives (half of ``P - 2 * sqrt(P - 1)``, the gap of a random P-regular bipartite graph,
    to which the union of P random matchings comes close), and the examples on the smaller side
    of its Fiedler vector. Parts shuffled apart that trade only one or two examples a pass (halves
    interleaved, one pair swapped across each pass) join every example to every place, so
    :func:`kept_apart` passes them, but the graph stays nearly cut: at P = 8, uniform passes gave
    gaps of 2.29 or more (1,800 simulated at 33-71 examples; bound 1.35), halves with one swap a
    pass 0.79 at most, with two 1.54; at P = 32, 19.6 or more (bound 10.4), one and two swaps
    7.25 at most; 10,000 more uniform sets at 33 examples and P = 8: 1.94 at least. Four swaps a
    pass pass now and then (2.62 at most at P = 8)."""
    passes, n = orders.shape
    joins = np.zeros((2 * n, 2 * n))
    for one in orders:
        np.add.at(joins, (one, n + np.arange(n)), 1)
    joins += joins.T
    values, vectors = np.linalg.eigh(np.diag(joins.sum(axis=1)) - joins)
    side = vectors[:n, 1] > 0
    part = int(min(side.sum(), n - side.sum()))
    return float(values[1]), max(0.0, (passes - 2 * (passes - 1) ** 0.5) / 2), part


def split_message(worker: int, orders: np.ndarray, size: int) -> str | None:
    """Refuses passes whose examples keep, part by part, to places of their own (see
    :func:`kept_apart`): each part shuffled on its own, not the whole share."""
    examples, places = kept_apart(orders)
    if examples >= size:
        return None
    return (f"over {len(orders)} passes, {examples} of worker {worker}'s {size} examples took "
            f"only {places} of its {size} places, and no other example took those: a part of "
            "the share kept to places of its own (shuffled apart, or kept in its order), not a "
            "shuffle of the whole share, which can bring any example to any place (lesson 01, "
            "section 7)")


def mixed_message(worker: int, orders: np.ndarray, size: int) -> str | None:
    """Refuses passes whose examples fall into parts that seldom trade places (see
    :func:`seldom_mixed`): parts shuffled apart, a pair or two crossing each pass. Judged after
    the frames of :mod:`worker_passes` (an arrangement shuffled a little is a band of places,
    also seldom mixed, and their message says more)."""
    gap, bound, part = seldom_mixed(orders)
    if gap >= bound:
        return None
    return (f"over {len(orders)} passes, worker {worker}'s {size} examples fall into two "
            f"parts ({part} and {size - part} examples) that seldom trade places (spectral "
            f"gap {gap:.2f} of the examples-to-places graph; shuffles of the whole share keep "
            f"it above {bound:.2f}, about twice that as a rule): each part shuffled on its own, "
            "not the whole share, which can bring any example to any place (lesson 01, "
            "section 7)")
