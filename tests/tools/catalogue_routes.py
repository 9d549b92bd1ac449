"""Which answers of a long catalogue of wrong answers ``make test`` runs.

A catalogue maps each answer to the words its verdict must contain. Wrong answers that share
those words reach one rejection by different routes (a pass cached behind a ``flat_map``, a
``group_by_window``, a map of datasets ...). ``make test`` runs every right answer and the first
wrong answer of each rejection, so every rejection stays asserted on every change; ``make
test-grading`` (``COURSE_FULL_CATALOGUES=1``) runs every route as well.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import pytest

FULL_ENV = "COURSE_FULL_CATALOGUES"
LEFT_OUT = ("another answer of this catalogue reaches the same rejection: make test-grading "
            "(COURSE_FULL_CATALOGUES=1) runs every route")
RIGHT = ("PASS", "BLANK")  # verdicts of right (or unanswered) answers: each always runs


def routes_to_run(expected: Mapping[Hashable, str]) -> set[Hashable]:
    """The keys of ``expected`` (answer -> the words its verdict must contain) to run: all of
    them with ``COURSE_FULL_CATALOGUES=1``, else the right answers and the first answer of each
    rejection (the same words; a key ``(kind, name)`` groups within its kind)."""
    if os.environ.get(FULL_ENV) == "1":
        return set(expected)
    seen, chosen = set(), set()
    for key, words in expected.items():
        group = (key[0] if isinstance(key, tuple) else None, words)
        if words in RIGHT or group not in seen:
            chosen.add(key)
            seen.add(group)
    return chosen


def catalogue_params(catalogue: Mapping[str, Sequence[Any]] | Iterable[Sequence[Any]]
                     ) -> list[Any]:
    """``pytest.mark.parametrize`` values for a catalogue of wrong answers whose last item is
    the words the verdict must contain (a mapping's keys are the ids): every answer, the
    routes ``routes_to_run`` leaves out marked skipped, with the reason."""
    items = (list(catalogue.items()) if isinstance(catalogue, Mapping)
             else [(None, entry) for entry in catalogue])
    run = routes_to_run({index: tuple(entry)[-1] for index, (_, entry) in enumerate(items)})
    return [pytest.param(*entry, id=key,
                         marks=() if index in run else pytest.mark.skip(reason=LEFT_OUT))
            for index, (key, entry) in enumerate(items)]
