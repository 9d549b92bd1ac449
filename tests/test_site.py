"""The index of the rendered course (make html): course order, titles from the notebooks."""

from __future__ import annotations

import json
import pathlib
import re

from course_utils import site

REPO = pathlib.Path(__file__).resolve().parents[1]


def _notebook(path: pathlib.Path, first_line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "metadata": {},
                                           "source": [first_line + "\n", "text"]}]}))


def test_notebook_title_reads_the_first_heading(tmp_path):
    _notebook(tmp_path / "a.ipynb", "# 03 · Multi-worker")
    assert site.notebook_title(tmp_path / "a.ipynb") == "03 · Multi-worker"
    (tmp_path / "b.ipynb").write_text("{broken")
    assert site.notebook_title(tmp_path / "b.ipynb") == "b"


def test_course_order_and_index(tmp_path):
    for folder, name, title in [("solutions", "01_x_solutions", "# 01 · X: Solutions"),
                                ("notebooks", "10_z", "# 10 · Z"),
                                ("notebooks", "01_x", "# 01 · X"),
                                ("exercises", "01_x_exercises", "# 01 · X: Exercises"),
                                ("notebooks", "02_y", "# 02 · Y & more")]:
        _notebook(tmp_path / folder / f"{name}.ipynb", title)
    order = [p.as_posix() for p in site.course_order(tmp_path)]
    assert order == ["notebooks/01_x.ipynb", "exercises/01_x_exercises.ipynb",
                     "solutions/01_x_solutions.ipynb", "notebooks/02_y.ipynb",
                     "notebooks/10_z.ipynb"]  # 10 after 02: numbers, not strings
    out = tmp_path / "out"
    for relative in order[:-1]:  # make html rendered all but 10_z (HTML_NOTEBOOKS, say)
        (out / relative).with_suffix(".html").parent.mkdir(parents=True, exist_ok=True)
        (out / relative).with_suffix(".html").write_text("<html></html>")
    page = site.write_index(out, tmp_path).read_text()
    links = re.findall(r'<a href="([^"]+)">([^<]+)</a>', page)
    assert links == [("notebooks/01_x.html", "01 · X"),
                     ("exercises/01_x_exercises.html", "01 · X: Exercises"),
                     ("solutions/01_x_solutions.html", "01 · X: Solutions"),
                     ("notebooks/02_y.html", "02 · Y &amp; more")]
    assert "<li>10 · Z <em>(not rendered)</em></li>" in page  # listed, not linked
    assert page.count("<li>") == 5 and page.count("<ul>") == 1  # 01's extras nested under it


def test_index_of_the_course_links_every_notebook():
    notebooks = sorted(p.relative_to(REPO).with_suffix(".html").as_posix()
                       for folder in site.FOLDERS for p in (REPO / folder).glob("*.ipynb"))
    links = re.findall(r'<a href="([^"]+)">', site.index_html(REPO))
    assert sorted(links) == notebooks and links[0] == "notebooks/00_welcome.html"


def test_appendices_come_last_in_a_list_of_their_own(tmp_path):
    for name, title in [("A_where", "# A · Where"), ("10_z", "# 10 · Z"), ("01_x", "# 01 · X")]:
        _notebook(tmp_path / "notebooks" / f"{name}.ipynb", title)
    _notebook(tmp_path / "exercises" / "01_x_exercises.ipynb", "# 01 · X: Exercises")
    order = [p.as_posix() for p in site.course_order(tmp_path)]
    assert order == ["notebooks/01_x.ipynb", "exercises/01_x_exercises.ipynb",
                     "notebooks/10_z.ipynb", "notebooks/A_where.ipynb"]
    page = site.index_html(tmp_path)
    lessons, appendices = page.split("<h2>Appendices</h2>")
    assert "notebooks/A_where.html" in appendices and "A_where" not in lessons
    assert re.findall(r'<a href="([^"]+)">([^<]+)</a>', appendices) == [
        ("notebooks/A_where.html", "A · Where")]
