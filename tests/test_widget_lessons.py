"""At least four lessons let a learner turn a knob (call a ``cu.widgets.*_widget``)."""

from __future__ import annotations

import json
import pathlib
import re

from course_utils import widgets

REPO = pathlib.Path(__file__).resolve().parents[1]
WIDGET_CALL = re.compile(r"\bcu\.widgets\.(\w+_widget)\(")


def _widget_calls(notebook: pathlib.Path) -> set[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return {name for cell in cells if cell["cell_type"] == "code"
            for name in WIDGET_CALL.findall("".join(cell["source"]))}


def test_at_least_four_lessons_show_a_widget_of_course_utils():
    lessons = sorted((REPO / "notebooks").glob("*.ipynb"))
    calls = {path.name: _widget_calls(path) for path in lessons}
    with_widget = sorted(name for name, found in calls.items() if found)
    assert len(with_widget) >= 4, f"lessons with a widget: {with_widget}"
    used = set().union(*calls.values())
    missing = used - set(widgets.__all__)
    assert not missing, f"lessons call widgets that course_utils.widgets lacks: {missing}"
