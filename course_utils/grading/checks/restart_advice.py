"""Lesson 00, exercise 2: does a refusal's message tell the learner to restart the kernel?

The exercise asks for a ``RuntimeError`` "whose message says to restart the kernel". The word
"restart" alone is not that advice: ``NORESTARTNEEDED``, ``restarted=False`` or "no need to
restart" contain it and say the opposite (xf00 L1). The advice is "restart" followed, within a
few words, by "kernel" ("restart the kernel", "restart your Jupyter kernel"), not negated
right before ("do not", "don't", "no need to", "never", "without")."""

from __future__ import annotations

import re

__all__ = ["says_restart"]

_ADVICE = re.compile(r"\brestart\b(?:\W+\w+){0,3}?\W+kernel\b", re.IGNORECASE)
_NEGATED = re.compile(r"(?:\bno|\bnot|n't|\bnever|\bwithout)\s+(?:(?:need|needs|have|has)\s+)?"
                      r"(?:to\s+)?restart", re.IGNORECASE)


def says_restart(message: str) -> bool:
    """Whether ``message`` advises restarting the kernel (and does not advise against it)."""
    return bool(_ADVICE.search(message)) and not _NEGATED.search(message)
