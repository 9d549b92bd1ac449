"""Scoring one executed submission: a gradebook row per check, with feedback a learner can act
on (not attempted, failed and why, an error and the learner's first failing cell, a time-out,
a dead kernel, a tampered check)."""

from __future__ import annotations

import re
from typing import Any

from course_utils.instructor.assemble import CHECK_MARKER, Prepared
from course_utils.instructor.gradebook import (
    ERROR,
    FAILED,
    GRADER_ERROR,
    KERNEL_DIED,
    NOT_ATTEMPTED,
    PASSED,
    TAMPERED,
    TIMEOUT,
    Row,
)

__all__ = ["FEEDBACK_LIMIT", "RAISED_OUTSIDE", "one_line", "raised_outside_checks", "score"]

FEEDBACK_LIMIT = 600


def one_line(text: str, limit: int = FEEDBACK_LIMIT) -> str:
    """Feedback for a CSV cell: one line, no ANSI colours, at most ``limit`` characters."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    text = " / ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cell_label(nb: Any, index: int) -> str:
    source = nb.cells[index].get("source", "")
    source = source.split(CHECK_MARKER, 1)[-1]  # a check cell: name the check, not the guard
    first = next((line.strip() for line in source.splitlines()
                  if line.strip() and not line.startswith("#")), "")
    return f"the cell {first[:60]!r}" if first else f"code cell {index + 1}"


#: The tag of a cell that raises by design (it calls an exercise's function before it is
#: answered); nbval lets it raise, and so does the grader's report.
RAISES_TAG = "raises-exception"
#: The sentence that starts the list of cells that raised outside the checks.
RAISED_OUTSIDE = "cells that raised outside the checks:"


def raised_outside_checks(prepared: Prepared, result: dict[str, Any]) -> str:
    """``RAISED_OUTSIDE`` and up to three cells (not checks, not tagged ``raises-exception``)
    that raised, each with its error; "" where none did: what nbval would have failed."""
    checks = {check.cell_index for check in prepared.checks}
    cells = prepared.notebook.cells
    raised = [o for o in result.get("cells", []) if o["status"] == "error"
              and o["index"] not in checks
              and RAISES_TAG not in cells[o["index"]].get("metadata", {}).get("tags", [])]
    named = "; ".join(f"{_cell_label(prepared.notebook, o['index'])} raised {o['ename']}: "
                      f"{o['evalue'][:120]}" for o in raised[:3])
    more = f" (and {len(raised) - 3} more)" if len(raised) > 3 else ""
    return f"{RAISED_OUTSIDE} {named}{more}" if raised else ""


def score(prepared: Prepared, result: dict[str, Any], timeout: float,
          student: str, notebook: str) -> list[Row]:
    """Gradebook rows for one executed submission; the first row also names the cells that
    raised outside the checks (``raised_outside_checks``)."""
    outcomes = {cell["index"]: cell for cell in result.get("cells", [])}
    run_status = str(result.get("status", ""))
    nb = prepared.notebook
    stop = next((o for o in result.get("cells", []) if o["status"] in ("timeout", "dead")), None)
    first_error = next((o for o in result.get("cells", []) if o["status"] == "error"
                        and o["index"] not in {c.cell_index for c in prepared.checks}), None)
    notes = {note.split("'")[1]: note for note in prepared.notes if "'" in note}
    rows = []
    for check in prepared.checks:
        outcome = outcomes.get(check.cell_index, {"status": "not run"})
        state, ename = outcome["status"], outcome.get("ename", "")
        message = outcome.get("evalue", "")
        feedback, got = "", 0.0
        if state == "ok":
            status, got = PASSED, check.points
        elif state == "error" and ename == "NotAttemptedError":
            status, feedback = NOT_ATTEMPTED, "not attempted: the function still raises " \
                                              "NotImplementedError"
        elif state == "error" and ename == "AssertionError":
            status, feedback = FAILED, message
        elif state == "error" and message.startswith("grader:"):
            status, feedback = TAMPERED, message
        elif state == "error":
            status, feedback = ERROR, f"{ename}: {message}"
            if first_error is not None:
                feedback += (f" (first error in your cells: {_cell_label(nb, first_error['index'])}"
                             f" raised {first_error['ename']}: {first_error['evalue']})")
        elif state == "timeout":
            status = TIMEOUT
            feedback = f"the time limit of {timeout:g} s was reached while this check ran " \
                       "(an endless loop?)"
        elif run_status == "timeout":
            status = TIMEOUT
            where = f" in {_cell_label(nb, stop['index'])}" if stop else ""
            feedback = f"not run: the time limit of {timeout:g} s was reached earlier{where}"
        elif run_status == "dead" or state == "dead":
            status = KERNEL_DIED
            where = f" in {_cell_label(nb, stop['index'])}" if stop else ""
            feedback = (f"not run: the Python kernel died{where} (os._exit, a crash or out of "
                        "memory)")
        else:
            status, feedback = GRADER_ERROR, f"not run: {run_status or 'unknown reason'}"
        note = notes.get(check.grade_id)
        if not rows:  # notes on restored cells that are not checks (the set-up cell)
            others = [n for k, n in notes.items() if k not in {c.grade_id for c in prepared.checks}]
            note = ". ".join([*others, note] if note else others)
            raised = raised_outside_checks(prepared, result)  # last: the first to be cut
            feedback = f"{feedback}. {raised}" if raised and feedback else feedback or raised
        if note:
            feedback = f"{note}. {feedback}".strip()
        rows.append(Row(student, notebook, check.grade_id, got, check.points, status,
                        one_line(feedback)))
    return rows


