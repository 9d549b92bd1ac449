"""One lesson in a browser page, for either front end: open, Run All, wait, record, check.

``test_lessons_in_browser`` (JupyterLab) and ``test_widget_lessons_in_classic_notebook``
(classic Notebook 6.5) differ only in the page: the script that reads its state, the menu that
runs every cell, the element a screenshot scrolls to. Everything else lives here once.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab import REPO
from page_checks import (
    all_ran,
    code_cells,
    console_errors,
    finished,
    lesson_problems,
    prompts,
    wait_for,
    widget_summary,
)

LESSON_TIMEOUT_S = float(os.environ.get("COURSE_BROWSER_TIMEOUT", "900"))


@dataclass(frozen=True)
class FrontEnd:
    """What differs between JupyterLab and classic Notebook for :func:`run_lesson`."""

    state_js: str  # returns the page state page_checks reads
    run_all: Callable[[Any], None]  # clicks Run All through the menu
    show_first_control: str  # scrolls the first slider or number box into view
    shots: pathlib.Path  # folder for <lesson>.png and <lesson>.json
    unstarted: tuple[str, ...] = ("[ ]:",)  # prompts of a cell that has not started
    quiet_page: str | None = None  # run before Run All and after the screenshot
    #: clicks the opened notebook, where the page needs it to make the notebook its current
    #: widget (a headless window may have no focus, so no focus event says which one is)
    activate: Callable[[Any], None] | None = None


@dataclass
class LessonRun:
    """What one lesson's run left: its code cells, page state, time and kernels stopped."""

    relative: str
    code: list[str]
    committed: bytes
    state: dict
    seconds: float
    stopped: int


def run_lesson(server: Any, driver: Any, relative: str, front: FrontEnd) -> LessonRun:
    """Open ``relative``, Run All, wait until every cell ran, save the page state and a
    screenshot; the lesson's kernel is shut down afterwards, whatever happened."""
    code = code_cells(REPO / relative)
    committed = (REPO / relative).read_bytes()
    start = time.monotonic()
    console_errors(driver)  # forget the previous lesson's
    try:
        driver.get(server.notebook_url(relative))
        if front.activate:
            wait_for(driver, front.state_js, lambda s: len(s["cells"]) == len(code), 180,
                     "the notebook")
            front.activate(driver)
        wait_for(driver, front.state_js, lambda s: len(s["cells"]) == len(code) and s["idle"],
                 180, "the notebook and an idle kernel")
        if front.quiet_page:
            driver.execute_script(front.quiet_page)
        front.run_all(driver)
        wait_for(driver, front.state_js,
                 lambda s: any(p not in front.unstarted for p in prompts(s)),
                 60, "the first cell to start")
        wait_for(driver, front.state_js, finished, LESSON_TIMEOUT_S, "every cell to run")
        time.sleep(3)  # widgets and images finish drawing after the kernel is idle
        state = driver.execute_script(front.state_js)
        seconds = time.monotonic() - start
        front.shots.mkdir(parents=True, exist_ok=True)
        stem = pathlib.Path(relative).stem
        (front.shots / f"{stem}.json").write_text(json.dumps(state, indent=1))
        driver.execute_script(front.show_first_control)
        time.sleep(0.5)
        driver.save_screenshot(str(front.shots / f"{stem}.png"))
        if front.quiet_page:
            driver.execute_script(front.quiet_page)
    finally:  # the lesson's kernel stops before the next lesson, whatever happened
        stopped = server.shut_down_kernels()
    return LessonRun(relative, code, committed, state, seconds, stopped)


def check_lesson_run(server: Any, driver: Any, run: LessonRun, label: str = "") -> None:
    """Print the run's summary and assert it: kernel gone, notebook file untouched, no
    problem on the page (``page_checks.lesson_problems``), every cell ran."""
    shown, drawn, controls = widget_summary(run.state)
    images = sum(len(cell["images"]) for cell in run.state["cells"])
    print(f"{run.relative}{label}: {run.seconds:.0f} s in the browser, {images} images, "
          f"{drawn}/{shown} widget outputs drawn, {controls} controls")

    assert run.stopped >= 1 and server.kernel_processes() == []
    assert (REPO / run.relative).read_bytes() == run.committed, "the run wrote into the notebook"
    problems = lesson_problems(run.code, run.state)
    assert not problems, f"{run.relative}:\n" + "\n".join(problems) + "\nconsole errors:\n" + (
        "\n".join(console_errors(driver)[-5:]))
    assert all_ran(run.state)
