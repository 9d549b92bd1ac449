"""nbgrader's hidden tests: lines of a check cell that the learner never sees.

In a solution notebook a check cell may hold a region between ``### BEGIN HIDDEN TESTS`` and
``### END HIDDEN TESTS``. nbgrader's ``generate_assignment`` removes it from the student version
(``ClearHiddenTests``) and ``autograde`` puts the instructor's cell back, hidden tests included.
:func:`strip_hidden_tests` removes it exactly as nbgrader 0.9 does (any line that contains a
marker is a marker; the lines between are dropped), so our exercises equal nbgrader's release
version. The course's check cells use it as::

    cu.grading.check_<exercise>(<exercise>)
    ### BEGIN HIDDEN TESTS
    cu.grading.require_passed("check_<exercise>")
    ### END HIDDEN TESTS
"""

from __future__ import annotations

import re

__all__ = ["BEGIN_HIDDEN", "END_HIDDEN", "HiddenTestsFormatError", "check_cell_problems",
           "check_cell_source", "has_hidden_tests", "strip_hidden_tests"]

#: nbgrader's default delimiters (``ClearHiddenTests.begin_test_delimeter`` and the end one).
BEGIN_HIDDEN = "BEGIN HIDDEN TESTS"
END_HIDDEN = "END HIDDEN TESTS"


_CALL = re.compile(r"cu\.grading\.(check_\w+)\(")
_REQUIRE = re.compile(r"cu\.grading\.require_passed\(\s*[\"'](check_\w+)[\"']\s*\)")


class HiddenTestsFormatError(ValueError):
    """Unbalanced or nested hidden-test markers, or hidden tests outside a check cell."""


def has_hidden_tests(source: str) -> bool:
    """Whether ``source`` holds a hidden-test marker."""
    return BEGIN_HIDDEN in source


def _split(source: str) -> tuple[list[str], list[str]]:
    """The visible lines and the hidden ones (markers dropped), as nbgrader reads a cell."""
    visible: list[str] = []
    hidden: list[str] = []
    inside = False
    for line in source.split("\n"):
        if BEGIN_HIDDEN in line:
            if inside:
                raise HiddenTestsFormatError(f"nested {BEGIN_HIDDEN!r}")
            inside = True
        elif END_HIDDEN in line:
            if not inside:
                raise HiddenTestsFormatError(f"{END_HIDDEN!r} without {BEGIN_HIDDEN!r}")
            inside = False
        else:
            (hidden if inside else visible).append(line)
    if inside:
        raise HiddenTestsFormatError(f"{BEGIN_HIDDEN!r} without {END_HIDDEN!r}")
    return visible, hidden


def strip_hidden_tests(source: str) -> str:
    """``source`` without its hidden-test regions, line for line as nbgrader removes them."""
    return "\n".join(_split(source)[0])


def check_cell_source(check: str, function: str) -> str:
    """The source of a check cell: the learner's visible check, then its hidden test."""
    return (f"cu.grading.{check}({function})\n### {BEGIN_HIDDEN}\n"
            "# graded: an unsolved exercise scores 0\n"
            f'cu.grading.require_passed("{check}")\n'
            f"### {END_HIDDEN}")


def check_cell_problems(source: str) -> list[str]:
    """What keeps a check cell from failing an unsolved exercise under nbgrader (empty: fine).

    Every check the visible part calls needs ``cu.grading.require_passed("check_<exercise>")``
    in the hidden part, and the hidden part holds nothing the visible part does not check.
    """
    try:
        visible, hidden = map("\n".join, _split(source))
    except HiddenTestsFormatError as error:
        return [str(error)]
    called = _CALL.findall(visible)
    required = _REQUIRE.findall(hidden)
    problems = [f"no check called in {visible!r}"] if not called else []
    problems += [f'{name}: add cu.grading.require_passed("{name}") between "### {BEGIN_HIDDEN}" '
                 f'and "### {END_HIDDEN}"' for name in called if name not in required]
    problems += [f"{name}: required in the hidden tests but not called"
                 for name in required if name not in called]
    return problems
