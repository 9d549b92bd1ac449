"""What a lesson's page must show after Run All, in JupyterLab 4 or the classic Notebook 6.5.

The browser tests read each page into one plain state (``LAB_STATE`` or ``CLASSIC_STATE``, both
JavaScript run in the page): per code cell its prompt, error outputs, other output texts, images
and widget outputs, and whether the kernel is idle. ``lesson_problems`` turns a state and the
notebook's code cells into a list of problems; it needs no browser, so its unit test runs in
``make test``.

A widget output counts as drawn only when the front end put a widget view into it: a widget the
manager cannot draw keeps its output node, with the text "Error displaying widget" (JupyterLab's
manager, which even adds the ``jupyter-widgets`` class to it) or "Loading widget..." and no view.
In JupyterLab a widget output is the output node without ``data-mime-type`` (every other renderer
sets it); in the classic Notebook it is the ``output_subarea`` marked ``jupyter-widgets-view``.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
from collections.abc import Callable
from typing import Any

# A cell that builds one of the course's widgets (course_utils.widgets.<name>_widget(...)).
WIDGET_CALL = re.compile(r"\bwidgets\.\w+_widget\(")
# A lesson that draws: its page must show at least one loaded image.
PLOT_CALL = re.compile(r"\bcu\.plots\.|\bplt\.")
# A cell that shows a results table (cu.show_table(...)): the page must show an HTML table.
TABLE_CALL = re.compile(r"\bshow_table\(")
# Matplotlib's text stand-in for a figure that was not drawn as an image.
FIGURE_TEXT = re.compile(r"<Figure size \d+x\d+ with \d+ Axes>")
# A widget's text fallback (the front end had no widget manager): "VBox(children=(...".
WIDGET_REPR = re.compile(r"^\s*[A-Z]\w*\((children|value|layout|description)=")
BROKEN_WIDGET = ("Error displaying widget", "Loading widget", "could not be displayed",
                 "Error rendering Jupyter widget")

# Per code cell: prompt "[n]:", "[*]:" or "[ ]:"; errors; texts of non-widget outputs; images;
# the course's HTML result tables (cu.show_table); widget outputs (text, hidden, drawn = holds a
# widget view, controls = inputs it shows).
LAB_STATE = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) { return null; }
// Every renderer of JupyterLab's rendermime marks its node with data-mime-type; the widget
// manager's renderer (application/vnd.jupyter.widget-view+json) does not.
const WIDGET = '.jp-OutputArea-output:not([data-mime-type])';
const bar = document.querySelector('#jp-main-statusbar');
const cells = [...panel.querySelectorAll('.jp-CodeCell')].map(cell => {
  const outputs = [...cell.querySelectorAll('.jp-OutputArea-output')];
  const prompt = cell.querySelector('.jp-InputArea-prompt');
  return {
    prompt: prompt ? prompt.textContent.trim() : '',
    errors: outputs.filter(o => o.matches('[data-mime-type="application/vnd.jupyter.error"]'))
        .map(o => o.textContent.slice(0, 2000)),
    texts: outputs.filter(o => !o.matches(WIDGET)).map(o => o.textContent.slice(0, 300)),
    images: [...cell.querySelectorAll('.jp-OutputArea-output img')]
        .map(i => ({complete: i.complete, width: i.naturalWidth})),
    tables: cell.querySelectorAll('.jp-OutputArea-output table.course-table').length,
    widgets: [...cell.querySelectorAll(WIDGET)].map(o => ({
      text: o.textContent.slice(0, 200),
      hidden: o.classList.contains('lm-mod-hidden'),
      drawn: o.querySelector('.jupyter-widgets') !== null,
      controls: o.querySelectorAll('input, select, textarea, .widget-slider').length})),
  };
});
return {idle: !!bar && bar.textContent.includes('Idle'), status: bar ? bar.textContent : '',
        cells: cells};
"""

CLASSIC_STATE = """
if (!window.Jupyter || !Jupyter.notebook || !Jupyter.notebook._fully_loaded) { return null; }
const WIDGET = '.output_subarea.jupyter-widgets-view';
const icon = document.querySelector('#kernel_indicator_icon');
const cells = Jupyter.notebook.get_cells().filter(c => c.cell_type === 'code').map(cell => {
  const el = cell.element[0];
  const outputs = [...el.querySelectorAll('.output_subarea')];
  const n = cell.input_prompt_number;
  return {
    prompt: '[' + (n === undefined || n === null ? ' ' : n) + ']:',
    errors: outputs.filter(o => o.matches('.output_error')).map(o => o.textContent.slice(0, 2000)),
    texts: outputs.filter(o => !o.matches(WIDGET)).map(o => o.textContent.slice(0, 300)),
    images: [...el.querySelectorAll('.output_subarea img')]
        .map(i => ({complete: i.complete, width: i.naturalWidth})),
    tables: el.querySelectorAll('.output_subarea table.course-table').length,
    widgets: [...el.querySelectorAll(WIDGET)].map(o => ({
      text: o.textContent.slice(0, 200),
      hidden: o.style.display === 'none',
      drawn: o.querySelector('.jupyter-widgets') !== null,
      controls: o.querySelectorAll('input, select, textarea, .widget-slider').length})),
  };
});
const idle = !!icon && icon.classList.contains('kernel_idle_icon')
    && !!Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected();
return {idle: idle, status: icon ? icon.className : '', cells: cells};
"""


def code_cells(path: pathlib.Path) -> list[str]:
    """The sources of a notebook's code cells, in order."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def wait_for(driver: Any, script: str, predicate: Callable[[dict], bool], timeout_s: float,
             what: str, poll_s: float = 1.0) -> dict:
    """Poll the page state until ``predicate`` holds; raise AssertionError naming ``what``."""
    deadline, state = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        state = driver.execute_script(script)
        if state is not None and predicate(state):
            return state
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}: {state}")


def console_errors(driver: Any) -> list[str]:
    """The page's console errors since the last call (a widget that fails to draw logs why)."""
    try:
        entries = driver.get_log("browser")
    except Exception:  # noqa: BLE001 (a driver without log support: nothing to add)
        return []
    # Left out: offline, the Colab badge cannot load; the previous lesson's page asking for its
    # session after the test shut it down.
    return [e["message"][:300] for e in entries if e.get("level") == "SEVERE"
            and "net::ERR_" not in e["message"] and "/api/sessions/" not in e["message"]]


def prompts(state: dict) -> list[str]:
    """The code cells' prompts in a page state."""
    return [cell["prompt"] for cell in state["cells"]]


def all_ran(state: dict) -> bool:
    """Every code cell has an execution count."""
    return all(re.fullmatch(r"\[\d+\]:", p) for p in prompts(state))


def finished(state: dict) -> bool:
    """The kernel is idle and every cell ran, or a cell shows an error (Run All stops there)."""
    return ("[*]:" not in prompts(state) and state["idle"]
            and (all_ran(state) or any(cell["errors"] for cell in state["cells"])))


def lesson_problems(code: list[str], state: dict) -> list[str]:
    """Everything wrong with a lesson's page after Run All; empty when it is as a learner needs."""
    problems = []
    if len(state["cells"]) != len(code):
        problems.append(f"the page shows {len(state['cells'])} code cells, the notebook has "
                        f"{len(code)}")
    if not state["idle"]:
        problems.append(f"the kernel is not idle: {state['status'][:200]}")
    images = 0
    for number, (source, cell) in enumerate(zip(code, state["cells"], strict=False), 1):
        first = source.strip().splitlines()[0][:60] if source.strip() else ""
        where = f"code cell {number} ({first})"
        if not re.fullmatch(r"\[\d+\]:", cell["prompt"]):
            problems.append(f"{where} did not run: prompt {cell['prompt']!r}")
        problems += [f"{where} shows an error: {error[:1500]}" for error in cell["errors"]]
        for text in cell["texts"]:
            if FIGURE_TEXT.search(text):
                problems.append(f"{where} shows a figure as text: {text[:80]!r}")
            if WIDGET_REPR.match(text) or any(b in text for b in BROKEN_WIDGET):
                problems.append(f"{where} shows a widget as text: {text[:80]!r}")
        for image in cell["images"]:
            if image["complete"] and image["width"] > 0:
                images += 1
            else:
                problems.append(f"{where} has an image that did not load")
        if TABLE_CALL.search(source) and not cell.get("tables"):
            problems.append(f"{where} shows a results table, but not as an HTML <table>")
        shown = [w for w in cell["widgets"] if not w["hidden"]]
        for widget in shown:
            if not widget["drawn"] or any(b in widget["text"] for b in BROKEN_WIDGET):
                problems.append(f"{where} has a widget that was not drawn: {widget['text'][:80]!r}")
        if WIDGET_CALL.search(source) and not any(
                w["drawn"] and w["controls"] > 0 for w in shown):
            problems.append(f"{where} builds a widget but the page shows no control of it")
    if any(PLOT_CALL.search(source) for source in code) and images == 0:
        problems.append("the lesson plots but the page shows no loaded image")
    return problems


def widget_summary(state: dict) -> tuple[int, int, int]:
    """Widget outputs shown, drawn, and their controls, over the whole page."""
    shown = [w for cell in state["cells"] for w in cell["widgets"] if not w["hidden"]]
    return len(shown), sum(w["drawn"] for w in shown), sum(w["controls"] for w in shown)
