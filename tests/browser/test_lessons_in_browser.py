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

import json
import os
import pathlib
import time

import pytest
from lab import REPO, processes_in_group, processes_mentioning, running_browser, running_lab
from page_checks import (
    LAB_STATE,
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

SHOTS = REPO / "_build" / "browser"
LESSON_TIMEOUT_S = float(os.environ.get("COURSE_BROWSER_TIMEOUT", "900"))
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


@pytest.fixture(scope="module")
def session():
    with running_lab() as lab, running_browser() as driver:
        yield lab, driver


@pytest.mark.parametrize("relative", LESSONS)
def test_lesson_runs_in_jupyterlab(session, relative):
    lab, driver = session
    code = code_cells(REPO / relative)
    committed = (REPO / relative).read_bytes()
    start = time.monotonic()
    console_errors(driver)  # forget the previous lesson's
    try:
        driver.get(lab.notebook_url(relative))
        wait_for(driver, LAB_STATE, lambda s: len(s["cells"]) == len(code) and s["idle"], 180,
                 "the notebook and an idle kernel")
        _run_all(driver)
        wait_for(driver, LAB_STATE, lambda s: any(p not in ("[ ]:", "") for p in prompts(s)),
                 60, "the first cell to start")
        wait_for(driver, LAB_STATE, finished, LESSON_TIMEOUT_S, "every cell to run")
        time.sleep(3)  # widgets and images finish drawing after the kernel is idle
        state = driver.execute_script(LAB_STATE)
        TIMES[relative] = time.monotonic() - start
        SHOTS.mkdir(parents=True, exist_ok=True)
        (SHOTS / (pathlib.Path(relative).stem + ".json")).write_text(json.dumps(state, indent=1))
        driver.execute_script(SHOW_FIRST_CONTROL)
        time.sleep(0.5)
        driver.save_screenshot(str(SHOTS / (pathlib.Path(relative).stem + ".png")))
    finally:  # the lesson's kernel stops before the next lesson, whatever happened
        stopped = lab.shut_down_kernels()
    shown, drawn, controls = widget_summary(state)
    images = sum(len(cell["images"]) for cell in state["cells"])
    print(f"{relative}: {TIMES[relative]:.0f} s in the browser, {images} images, "
          f"{drawn}/{shown} widget outputs drawn, {controls} controls")

    assert stopped >= 1 and lab.kernel_processes() == []
    assert (REPO / relative).read_bytes() == committed, "the run wrote into the notebook"
    problems = lesson_problems(code, state)
    assert not problems, f"{relative}:\n" + "\n".join(problems) + "\nconsole errors:\n" + (
        "\n".join(console_errors(driver)[-5:]))
    assert all_ran(state)


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
