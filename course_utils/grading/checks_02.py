"""Checks of lesson 02's exercises (re-exported by ``course_utils.grading.checks``)."""

from __future__ import annotations

__all__: list[str] = []
