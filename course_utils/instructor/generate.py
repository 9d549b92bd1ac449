"""Exercise notebooks from solution notebooks, and the check that they are in sync.

``solutions/NN_name_solutions.ipynb`` is the only source. Its exercise twin
``exercises/NN_name_exercises.ipynb`` is the same notebook with:

* every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block of a solution cell replaced by
  nbgrader's stub (``# YOUR CODE HERE`` / ``raise NotImplementedError()``, same indentation);
  a markdown solution cell's block becomes ``YOUR ANSWER HERE``;
* the title's "Solutions" turned into "Exercises" and links to the solution notebook (the Colab
  badge) pointing at the exercise notebook;
* nbgrader's hidden tests (``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``) removed
  from check cells, exactly as nbgrader's ``generate_assignment`` removes them;
* check cells, and code cells that use a name a solution cell defines, tagged
  ``raises-exception`` so nbval accepts a learner's half-done attempt;
* no outputs, no execution counts; cell ids and nbgrader metadata unchanged.

Generation is deterministic, so ``out_of_sync`` can compare text.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from course_utils.instructor.cells import (
    EXERCISE_SUFFIX,
    SOLUTION_SUFFIX,
    dumps,
    is_check_cell,
    is_solution_cell,
    read_notebook,
)
from course_utils.instructor.hidden_tests import (
    HiddenTestsFormatError,
    has_hidden_tests,
    strip_hidden_tests,
)

__all__ = ["BEGIN", "CODE_STUB", "END", "MARKDOWN_STUB", "TOLERANT_TAG", "SolutionFormatError",
           "exercise_from_solution", "exercise_path_for", "generate", "out_of_sync",
           "render_exercise", "solution_notebooks", "strip_solution"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = ("YOUR ANSWER HERE",)
TOLERANT_TAG = "raises-exception"
_DEFINED = re.compile(r"^(?:def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)",
                      re.MULTILINE)


class SolutionFormatError(ValueError):
    """A solution notebook breaks the format (unbalanced markers, markers outside a solution)."""


def strip_solution(source: str, stub: tuple[str, ...] = CODE_STUB) -> str:
    """Replace each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block by ``stub``."""
    out: list[str] = []
    inside = False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise SolutionFormatError(f"nested {BEGIN!r}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + text for text in stub)
        elif stripped == END:
            if not inside:
                raise SolutionFormatError(f"{END!r} without {BEGIN!r}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise SolutionFormatError(f"{BEGIN!r} without {END!r}")
    return "\n".join(out)


def exercise_path_for(solution: Path, exercises_dir: Path) -> Path:
    """``solutions/NN_name_solutions.ipynb`` -> ``exercises/NN_name_exercises.ipynb``."""
    stem = solution.stem
    if not stem.endswith(SOLUTION_SUFFIX):
        raise SolutionFormatError(f"{solution.name}: a solution notebook ends in "
                                  f"'{SOLUTION_SUFFIX}.ipynb'")
    return exercises_dir / f"{stem[: -len(SOLUTION_SUFFIX)]}{EXERCISE_SUFFIX}.ipynb"


def _defined_names(source: str) -> set[str]:
    return {a or b for a, b in _DEFINED.findall(source)}


def _relink(cell: Any, solution_link: str, exercise_link: str, title: bool) -> None:
    """Markdown: links to the solution point at the exercise; the title says "Exercises"."""
    source = cell.source.replace(solution_link, exercise_link)
    if title:
        lines = source.split("\n")
        lines[0] = re.sub(r"\bSolutions\b", "Exercises", lines[0])
        source = "\n".join(lines)
    cell.source = source


def _clear_solution(cell: Any) -> set[str]:
    """A solution cell's blocks become stubs; returns the names its solution defines."""
    if is_solution_cell(cell):
        if BEGIN not in cell.source:
            raise SolutionFormatError(f"solution cell {cell.get('id')} has no {BEGIN!r}")
        if cell.cell_type != "code":
            cell.source = strip_solution(cell.source, MARKDOWN_STUB)
            return set()
        names = _defined_names(cell.source)
        cell.source = strip_solution(cell.source)
        return names
    if BEGIN in cell.source or END in cell.source:
        raise SolutionFormatError(f"cell {cell.get('id')} has solution markers but is not "
                                  "marked as a solution cell (nbgrader solution: true)")
    return set()


def _clear_hidden_tests(cell: Any) -> None:
    """A check cell loses its hidden tests, as nbgrader's ``ClearHiddenTests`` does."""
    if is_check_cell(cell):
        cell.source = strip_hidden_tests(cell.source)
    elif has_hidden_tests(cell.source):
        raise HiddenTestsFormatError(f"cell {cell.get('id')} has hidden tests but is not a "
                                     "check cell (nbgrader grade: true, solution: false)")


def _tag_tolerant(cell: Any, answer_names: set[str]) -> None:
    """Check cells and cells using an answer may raise while the learner works: tag them."""
    if cell.cell_type != "code" or is_solution_cell(cell) or not (is_check_cell(cell) or any(
            re.search(rf"\b{re.escape(name)}\b", cell.source) for name in answer_names)):
        return
    tags = list(cell.metadata.get("tags", []))
    if TOLERANT_TAG not in tags:
        cell.metadata["tags"] = [*tags, TOLERANT_TAG]


def _clear_outputs(cell: Any) -> None:
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
    cell.metadata.pop("execution", None)


def exercise_from_solution(solution_nb: Any, solution_link: str, exercise_link: str) -> Any:
    """The exercise notebook for ``solution_nb`` (a new object; the input is not changed).

    ``solution_link``/``exercise_link`` are the repository paths of the two notebooks, e.g.
    ``solutions/00_setup_solutions.ipynb``: links to the first become links to the second.
    """
    nb = copy.deepcopy(solution_nb)
    answer_names: set[str] = set()
    markdown = [cell for cell in nb.cells if cell.cell_type == "markdown"]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            _relink(cell, solution_link, exercise_link, title=cell is markdown[0])
        answer_names |= _clear_solution(cell)
        _clear_hidden_tests(cell)
        _tag_tolerant(cell, answer_names)
        _clear_outputs(cell)
    return nb


def render_exercise(solution: Path, exercises_dir: Path) -> tuple[Path, str]:
    """The exercise path for ``solution`` and the text it must hold."""
    target = exercise_path_for(solution, exercises_dir)
    nb = exercise_from_solution(read_notebook(solution),
                                f"{solution.parent.name}/{solution.name}",
                                f"{target.parent.name}/{target.name}")
    return target, dumps(nb)


def solution_notebooks(solutions_dir: Path) -> list[Path]:
    """Every ``*_solutions.ipynb`` in ``solutions_dir``, sorted."""
    return sorted(solutions_dir.glob(f"*{SOLUTION_SUFFIX}.ipynb"))


def generate(solutions_dir: Path, exercises_dir: Path) -> list[Path]:
    """Write every exercise notebook; return the paths whose content changed."""
    exercises_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for solution in solution_notebooks(solutions_dir):
        target, text = render_exercise(solution, exercises_dir)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            changed.append(target)
    return changed


def out_of_sync(solutions_dir: Path, exercises_dir: Path) -> list[str]:
    """Problems that ``generate`` would fix: missing, different or orphaned exercise notebooks."""
    problems = []
    expected = set()
    for solution in solution_notebooks(solutions_dir):
        target, text = render_exercise(solution, exercises_dir)
        expected.add(target.name)
        if not target.exists():
            problems.append(f"{target}: missing (generated from {solution})")
        elif target.read_text(encoding="utf-8") != text:
            problems.append(f"{target}: differs from what {solution} generates")
    for orphan in sorted(exercises_dir.glob(f"*{EXERCISE_SUFFIX}.ipynb")):
        if orphan.name not in expected:
            problems.append(f"{orphan}: has no solution notebook in {solutions_dir}")
    return problems
