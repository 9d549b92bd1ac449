"""The widget lessons in Colab's front end: classic Notebook 6.5 with ipywidgets 7.7.

``.venv-colab`` (``make test-colab-stack``: TensorFlow 2.20, ipywidgets 7.7.1, notebook 6.5.7,
widgetsnbextension 3.6) serves each lesson; headless Chromium opens it, runs Cell > Run All and
checks the page as ``test_lessons_in_browser`` does (``page_checks.lesson_problems``): every
widget drawn with its controls, no error, no text fallback, images loaded, kernel idle; then the
kernel is shut down and every process checked gone. Screenshots: ``_build/browser/classic/``.
Run with ``make test-browser-classic`` (BROWSER_CLASSIC_NOTEBOOKS picks lessons).

Known (2026-11): widgetsnbextension 3.6.7 to 3.6.10 (Colab's pin is 3.6.10) ship ES2015 classes,
and their classic ``OutputModel``, made with Backbone's ``extend``, loses the static
``_deserialize_state``: no ``ipywidgets.Output`` can be drawn there ("_deserialize_state is not a
function" in the console). 3.6.6 and older draw it; sliders, checkboxes, number boxes and
``HTML`` draw on 3.6.10, so the course's widgets show their results in ``HTML`` views.
"""

from __future__ import annotations

import os

import pytest
from lab import (
    REPO,
    processes_in_group,
    processes_mentioning,
    running_browser,
    running_classic_notebook,
)
from lesson_run import FrontEnd, check_lesson_run, run_lesson
from page_checks import CLASSIC_STATE, WIDGET_CALL, code_cells, widget_summary

pytestmark = pytest.mark.browser

WIDGET_LESSONS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").glob("*.ipynb")
                        if any(WIDGET_CALL.search(c) for c in code_cells(p)))
LESSONS = os.environ.get("BROWSER_CLASSIC_NOTEBOOKS", "").split() or WIDGET_LESSONS
TIMES: dict[str, float] = {}
# No autosave (the run must not write outputs into the committed notebook), no "leave page?"
# dialog when the next lesson is opened.
QUIET_PAGE = "Jupyter.notebook.set_autosave_interval(0); window.onbeforeunload = null;"
SHOW_FIRST_CONTROL = """
const w = document.querySelector('#notebook .widget-slider, #notebook .widget-text');
if (w) { w.scrollIntoView({block: 'center'}); }
return !!w;
"""


def _run_all(driver) -> None:
    """Cell > Run All, through the menu as a learner would."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "celllink").click()
    driver.find_element(By.CSS_SELECTOR, "#run_all_cells > a").click()


@pytest.fixture(scope="module")
def session():
    with running_classic_notebook() as server, running_browser() as driver:
        yield server, driver


def test_every_widget_lesson_is_chosen():
    assert len(WIDGET_LESSONS) >= 4, WIDGET_LESSONS


CLASSIC = FrontEnd(state_js=CLASSIC_STATE, run_all=_run_all, show_first_control=SHOW_FIRST_CONTROL,
                   shots=REPO / "_build" / "browser" / "classic", quiet_page=QUIET_PAGE)


@pytest.mark.parametrize("relative", LESSONS)
def test_widget_lesson_runs_in_classic_notebook(session, relative):
    server, driver = session
    run = run_lesson(server, driver, relative, CLASSIC)
    TIMES[relative] = run.seconds
    check_lesson_run(server, driver, run, label=" (classic)")
    assert widget_summary(run.state)[0] >= 1  # a widget lesson shows a widget


def test_classic_notebook_stops_every_process():
    with running_classic_notebook() as server:
        group = server.process.pid
        assert processes_in_group(group), "the Notebook server is running inside the block"
        assert server.start_kernel("notebooks/stop-check.ipynb"), "a kernel runs inside the block"
        folder = str(server.folder)
    assert processes_in_group(group) == []
    assert processes_mentioning(folder) == [], "a kernel survived the Notebook server"


def teardown_module(module):
    for relative, seconds in TIMES.items():
        print(f"classic browser run time {relative}: {seconds:.0f} s")
