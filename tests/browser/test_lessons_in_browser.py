"""Each lesson as a learner meets it: JupyterLab in headless Chromium, Run All, then the page.

Asserts, per lesson (``page_checks.lesson_problems``): every code cell ran and the kernel is idle,
no cell shows a traceback (stderr text is allowed) or a figure as text, every image has loaded
(``naturalWidth > 0``) and a lesson that plots shows one, every widget output holds a drawn
widget (no "Error displaying widget", "Loading widget..." or ``VBox(children=...)`` text), and
each cell that builds a course widget shows a control. After each lesson its kernel is shut
down and its process checked gone. A screenshot per lesson goes to
``_build/browser/<lesson>.png``, the page state to ``<lesson>.json`` beside it.
Run with ``make test-browser`` (BROWSER_NOTEBOOKS picks lessons).
"""

from __future__ import annotations

import os
import pathlib

import pytest
from lab import REPO, processes_in_group, processes_mentioning, running_browser, running_lab
from lesson_run import FrontEnd, check_lesson_run, run_lesson
from page_checks import LAB_STATE

pytestmark = pytest.mark.browser

LESSONS = (os.environ.get("BROWSER_NOTEBOOKS", "").split()
           or sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").glob("*.ipynb")))
TIMES: dict[str, float] = {}
SHOW_FIRST_CONTROL = """
const w = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .widget-slider, '
    + '.jp-NotebookPanel:not(.lm-mod-hidden) .widget-text');
if (w) { w.scrollIntoView({block: 'center'}); }
return !!w;
"""


def _run_all(driver) -> None:
    """Run > Run All Cells, through the menu as a learner would."""
    from selenium.webdriver.common.by import By

    menus = driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")
    next(m for m in menus if m.text.strip() == "Run").click()
    item = driver.find_element(
        By.CSS_SELECTOR, '.lm-Menu-item[data-command="runmenu:run-all"]')
    item.click()


def _activate(driver) -> None:
    """Click the notebook's tab: JupyterLab's status bar shows the kernel's state (read by
    ``LAB_STATE``) only for its current widget, which headless Chromium 150, whose window has
    no focus (``document.hasFocus()`` is false), leaves unset until a click."""
    from selenium.webdriver.common.by import By

    tab = "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current"
    driver.find_element(By.CSS_SELECTOR, tab).click()


@pytest.fixture(scope="module")
def session():
    with running_lab() as lab, running_browser() as driver:
        yield lab, driver


JUPYTERLAB = FrontEnd(state_js=LAB_STATE, run_all=_run_all, show_first_control=SHOW_FIRST_CONTROL,
                     shots=REPO / "_build" / "browser", unstarted=("[ ]:", ""), activate=_activate)


@pytest.mark.parametrize("relative", LESSONS)
def test_lesson_runs_in_jupyterlab(session, relative):
    lab, driver = session
    run = run_lesson(lab, driver, relative, JUPYTERLAB)
    TIMES[relative] = run.seconds
    check_lesson_run(lab, driver, run)


def test_lab_and_browser_stop_every_process():
    with running_lab() as lab, running_browser() as driver:
        driver.get(f"{lab.url}/lab?token={lab.token}")
        group = lab.process.pid
        assert processes_in_group(group), "JupyterLab is running inside the block"
        user_data = driver.capabilities["chrome"]["userDataDir"]
        assert processes_mentioning(user_data), "Chromium is running inside the block"
        assert lab.start_kernel("notebooks/stop-check.ipynb"), "a kernel runs inside the block"
        folder = str(lab.folder)
    assert processes_in_group(group) == []
    assert processes_mentioning(user_data) == []
    assert processes_mentioning(folder) == [], "a kernel survived JupyterLab"
    assert not pathlib.Path(folder).exists()


def teardown_module(module):
    for relative, seconds in TIMES.items():
        print(f"browser run time {relative}: {seconds:.0f} s")
