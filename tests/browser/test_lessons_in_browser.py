"""Each lesson as a learner meets it: JupyterLab in headless Chromium, Run All, then the page.

Asserts, per lesson: the kernel ran every code cell and is idle, no cell shows a traceback
(stderr text is allowed), every image has loaded (``naturalWidth > 0``), and every widget is
drawn as a widget (no "Loading widget..." and no ``VBox(children=...)`` text fallback); lessons
that build widgets show at least one slider or input. A screenshot per lesson goes to
``_build/browser/<lesson>.png``. Run with ``make test-browser`` (BROWSER_NOTEBOOKS picks lessons).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import time

import pytest
from lab import REPO, processes_in_group, processes_mentioning, running_browser, running_lab

pytestmark = pytest.mark.browser

SHOTS = REPO / "_build" / "browser"
LESSON_TIMEOUT_S = float(os.environ.get("COURSE_BROWSER_TIMEOUT", "900"))
LESSONS = (os.environ.get("BROWSER_NOTEBOOKS", "").split()
           or sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").glob("*.ipynb")))
TIMES: dict[str, float] = {}

# Everything the page is asked about, in one round trip.
PAGE_STATE = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) { return null; }
const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
    .map(p => p.textContent.trim());
const bar = document.querySelector('#jp-main-statusbar');
return {
  prompts: prompts,
  statusbar: bar ? bar.textContent : '',
  errors: [...panel.querySelectorAll('[data-mime-type="application/vnd.jupyter.error"]')]
      .map(e => e.textContent.slice(0, 2000)),
  images: [...panel.querySelectorAll('.jp-OutputArea img')]
      .map(i => ({complete: i.complete, width: i.naturalWidth})),
  widgets: panel.querySelectorAll('.jupyter-widgets').length,
  knobs: panel.querySelectorAll('.widget-slider, .widget-text, .widget-checkbox').length,
  texts: [...panel.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent),
};
"""


def _code_cells(relative: str) -> list[str]:
    notebook = json.loads((REPO / relative).read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def _wait(driver, predicate, timeout_s: float, what: str, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = driver.execute_script(PAGE_STATE)
        if state is not None and predicate(state):
            return state
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}: {state}")


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
    code = _code_cells(relative)
    committed = (REPO / relative).read_bytes()
    start = time.monotonic()
    driver.get(lab.notebook_url(relative))
    _wait(driver, lambda s: len(s["prompts"]) == len(code)
          and "Idle" in s["statusbar"], 180, "the notebook and an idle kernel")
    _run_all(driver)
    _wait(driver, lambda s: any(p not in ("[ ]:", "") for p in s["prompts"]), 60,
          "the first cell to start")
    _wait(driver, lambda s: "[*]:" not in s["prompts"] and "Idle" in s["statusbar"] and (
        bool(s["errors"]) or all(re.fullmatch(r"\[\d+\]:", p) for p in s["prompts"])),
        LESSON_TIMEOUT_S, "every cell to run")
    time.sleep(3)  # widgets and images finish drawing after the kernel is idle
    state = driver.execute_script(PAGE_STATE)
    TIMES[relative] = time.monotonic() - start
    SHOTS.mkdir(parents=True, exist_ok=True)
    widget_cell = driver.execute_script(
        "const w = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
        ".widget-slider, .jp-NotebookPanel:not(.lm-mod-hidden) .widget-text');"
        "if (w) { w.scrollIntoView({block: 'center'}); } return !!w;")
    time.sleep(0.5)
    driver.save_screenshot(str(SHOTS / (pathlib.Path(relative).stem + ".png")))
    assert lab.shut_down_kernels() >= 1  # the lesson's kernel, stopped before the next lesson
    print(f"{relative}: {TIMES[relative]:.0f} s in the browser, "
          f"{len(state['images'])} images, {state['widgets']} widget elements")

    assert (REPO / relative).read_bytes() == committed, "the run wrote into the notebook"
    assert state["errors"] == [], f"{relative} shows a traceback:\n{state['errors'][0]}"
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in state["prompts"]), state["prompts"]
    assert "Idle" in state["statusbar"], state["statusbar"]
    bad = [i for i in state["images"] if not (i["complete"] and i["width"] > 0)]
    assert not bad, f"{len(bad)} of {len(state['images'])} images did not render"
    fallback = [t[:80] for t in state["texts"] if "Loading widget" in t
                or re.match(r"\s*(VBox|HBox|IntSlider)\(", t)]
    assert not fallback, f"widgets shown as text: {fallback}"
    if any("cu.widgets." in source for source in code):
        assert widget_cell and state["knobs"] > 0, "the lesson's widget did not render"


def test_lab_and_browser_stop_every_process():
    with running_lab() as lab, running_browser() as driver:
        driver.get(f"{lab.url}/lab?token={lab.token}")
        group = lab.process.pid
        assert processes_in_group(group), "JupyterLab is running inside the block"
        user_data = driver.capabilities["chrome"]["userDataDir"]
        assert processes_mentioning(user_data), "Chromium is running inside the block"
    assert processes_in_group(group) == []
    assert processes_mentioning(user_data) == []


def teardown_module(module):
    for relative, seconds in TIMES.items():
        print(f"browser run time {relative}: {seconds:.0f} s")
