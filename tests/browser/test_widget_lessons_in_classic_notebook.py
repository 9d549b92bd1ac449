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
function" in the console), so a widget holding one is not drawn and this test fails. 3.6.6 and
older draw it; sliders, checkboxes, number boxes and ``HTML`` draw on 3.6.10.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest
from lab import (
    REPO,
    processes_in_group,
    processes_mentioning,
    running_browser,
    running_classic_notebook,
)
from page_checks import (
    CLASSIC_STATE,
    WIDGET_CALL,
    all_ran,
    code_cells,
    console_errors,
    finished,
    lesson_problems,
    prompts,
    wait_for,
    widget_summary,
)

pytestmark = pytest.mark.browser

SHOTS = REPO / "_build" / "browser" / "classic"
LESSON_TIMEOUT_S = float(os.environ.get("COURSE_BROWSER_TIMEOUT", "900"))
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


@pytest.mark.parametrize("relative", LESSONS)
def test_widget_lesson_runs_in_classic_notebook(session, relative):
    server, driver = session
    code = code_cells(REPO / relative)
    committed = (REPO / relative).read_bytes()
    start = time.monotonic()
    console_errors(driver)  # forget the previous lesson's
    try:
        driver.get(server.notebook_url(relative))
        wait_for(driver, CLASSIC_STATE, lambda s: len(s["cells"]) == len(code) and s["idle"],
                 180, "the notebook and an idle kernel")
        driver.execute_script(QUIET_PAGE)
        _run_all(driver)
        wait_for(driver, CLASSIC_STATE, lambda s: any(p != "[ ]:" for p in prompts(s)), 60,
                 "the first cell to start")
        wait_for(driver, CLASSIC_STATE, finished, LESSON_TIMEOUT_S, "every cell to run")
        time.sleep(3)  # widgets and images finish drawing after the kernel is idle
        state = driver.execute_script(CLASSIC_STATE)
        TIMES[relative] = time.monotonic() - start
        SHOTS.mkdir(parents=True, exist_ok=True)
        (SHOTS / (pathlib.Path(relative).stem + ".json")).write_text(json.dumps(state, indent=1))
        driver.execute_script(SHOW_FIRST_CONTROL)
        time.sleep(0.5)
        driver.save_screenshot(str(SHOTS / (pathlib.Path(relative).stem + ".png")))
        driver.execute_script(QUIET_PAGE)
    finally:  # the lesson's kernel stops before the next lesson, whatever happened
        stopped = server.shut_down_kernels()
    shown, drawn, controls = widget_summary(state)
    print(f"{relative} (classic): {TIMES[relative]:.0f} s in the browser, "
          f"{drawn}/{shown} widget outputs drawn, {controls} controls")

    assert stopped >= 1 and server.kernel_processes() == []
    assert (REPO / relative).read_bytes() == committed, "the run wrote into the notebook"
    problems = lesson_problems(code, state)
    assert not problems, f"{relative}:\n" + "\n".join(problems) + "\nconsole errors:\n" + (
        "\n".join(console_errors(driver)[-5:]))
    assert all_ran(state) and shown >= 1


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
