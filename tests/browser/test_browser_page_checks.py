"""The page checks of the browser tests, on page states written by hand (no browser needed)."""

from __future__ import annotations

import copy

from page_checks import lesson_problems, widget_summary

CODE = ["import course_utils as cu", "cu.widgets.pipeline_widget()", "cu.plots.bars([1, 2])"]


def _cell(prompt="[1]:", errors=(), texts=(), images=(), widgets=(), tables=0):
    return {"prompt": prompt, "errors": list(errors), "texts": list(texts),
            "images": list(images), "widgets": list(widgets), "tables": tables}


SLIDER = {"text": "parallel calls 1", "hidden": False, "drawn": True, "controls": 3}
IMAGE = {"complete": True, "width": 640}
GOOD = {"idle": True, "status": "Idle", "cells": [
    _cell(), _cell("[2]:", widgets=[SLIDER]), _cell("[3]:", images=[IMAGE])]}


def _with(cell: int, **changes) -> dict:
    state = copy.deepcopy(GOOD)
    state["cells"][cell].update(changes)
    return state


def test_a_good_page_has_no_problems():
    assert lesson_problems(CODE, GOOD) == []
    assert widget_summary(GOOD) == (1, 1, 3)


def test_a_widget_the_manager_could_not_draw_is_a_problem():
    # JupyterLab's manager writes this text and adds the jupyter-widgets class, but no view.
    broken = {"text": "Error displaying widget: model not found", "hidden": False,
              "drawn": False, "controls": 0}
    problems = lesson_problems(CODE, _with(1, widgets=[broken]))
    assert len(problems) == 2
    assert "not drawn" in problems[0] and "no control" in problems[1]
    loading = {**SLIDER, "text": "Loading widget...", "drawn": False, "controls": 0}
    assert len(lesson_problems(CODE, _with(1, widgets=[SLIDER, loading]))) == 1


def test_a_hidden_widget_output_is_ignored_but_the_cell_still_needs_a_control():
    hidden = {"text": "Loading widget...", "hidden": True, "drawn": False, "controls": 0}
    assert lesson_problems(CODE, _with(1, widgets=[SLIDER, hidden])) == []
    assert "no control" in lesson_problems(CODE, _with(1, widgets=[hidden]))[0]


def test_text_fallbacks_errors_and_missing_images_are_problems():
    figure = lesson_problems(CODE, _with(2, images=[], texts=["<Figure size 640x480 with 1 Axes>"]))
    assert len(figure) == 2 and "figure as text" in figure[0] and "no loaded image" in figure[1]
    fallback = lesson_problems(CODE, _with(1, widgets=[], texts=["VBox(children=(IntSlider("]))
    assert "widget as text" in fallback[0]
    assert "did not load" in lesson_problems(
        CODE, _with(2, images=[IMAGE, {"complete": False, "width": 0}]))[0]
    assert "shows an error" in lesson_problems(CODE, _with(0, errors=["NameError: x"]))[0]


def test_unrun_cells_a_busy_kernel_and_missing_cells_are_problems():
    assert "did not run" in lesson_problems(CODE, _with(0, prompt="[ ]:"))[0]
    busy = {**GOOD, "idle": False, "status": "Busy"}
    assert "not idle" in lesson_problems(CODE, busy)[0]
    assert "3 code cells" in lesson_problems([*CODE, "print(1)"], GOOD)[0]


def test_a_results_table_must_arrive_as_an_html_table():
    code = [*CODE, "cu.show_table(rows)"]
    shown = {**GOOD, "cells": [*GOOD["cells"], _cell("[4]:", tables=1)]}
    assert lesson_problems(code, shown) == []
    as_text = {**GOOD, "cells": [*GOOD["cells"], _cell("[4]:", texts=["replicas  speed-up"])]}
    assert "not as an HTML <table>" in lesson_problems(code, as_text)[0]
