"""The book's table of contents (make book): course order, titles from the notebooks, the
solutions in a part an instructor can leave out, and the Sphinx configuration that uses it."""

from __future__ import annotations

import json
import pathlib
import re

from course_utils import book

REPO = pathlib.Path(__file__).resolve().parents[1]


def _notebook(path: pathlib.Path, first_line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "metadata": {},
                                           "source": [first_line + "\n", "text"]}]}))


def _course(root: pathlib.Path) -> None:
    for folder, name, title in [("solutions", "01_x_solutions", "# 01 · X: Solutions"),
                                ("notebooks", "10_z", "# 10 · Z"),
                                ("notebooks", "01_x", "# 01 · X"),
                                ("exercises", "01_x_exercises", "# 01 · X: Exercises"),
                                ("notebooks", "A_where", "# A · Where"),
                                ("notebooks", "02_y", "# 02 · Y & more")]:
        _notebook(root / folder / f"{name}.ipynb", title)


def test_notebook_title_reads_the_first_heading(tmp_path):
    _notebook(tmp_path / "a.ipynb", "# 03 · Multi-worker")
    assert book.notebook_title(tmp_path / "a.ipynb") == "03 · Multi-worker"
    (tmp_path / "b.ipynb").write_text("{broken")
    assert book.notebook_title(tmp_path / "b.ipynb") == "b"


def test_course_order_by_number_then_folder_appendices_last(tmp_path):
    _course(tmp_path)
    assert [p.as_posix() for p in book.course_order(tmp_path)] == [
        "notebooks/01_x.ipynb", "exercises/01_x_exercises.ipynb",
        "solutions/01_x_solutions.ipynb", "notebooks/02_y.ipynb",
        "notebooks/10_z.ipynb",  # 10 after 02: numbers, not strings
        "notebooks/A_where.ipynb"]


def test_table_of_contents_nests_exercises_and_keeps_solutions_apart(tmp_path):
    _course(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "course_design.md").write_text("# Design\n")
    toc = book.table_of_contents(tmp_path)
    assert toc["format"] == "jb-book" and toc["root"] == "README"
    parts = {part["caption"]: part["chapters"] for part in toc["parts"]}
    assert list(parts) == ["Lessons", "Appendix", "Reference", "Solutions"]
    assert parts["Lessons"] == [
        {"file": "notebooks/01_x", "sections": [{"file": "exercises/01_x_exercises"}]},
        {"file": "notebooks/02_y"}, {"file": "notebooks/10_z"}]
    assert parts["Appendix"] == [{"file": "notebooks/A_where"}]
    assert parts["Reference"] == [{"file": "docs/course_design"}]  # only pages that exist
    assert parts["Solutions"] == [{"file": "solutions/01_x_solutions"}]
    public = book.table_of_contents(tmp_path, solutions=False)
    assert [part["caption"] for part in public["parts"]] == ["Lessons", "Appendix", "Reference"]


def test_the_course_table_of_contents_lists_every_notebook_once():
    toc = book.table_of_contents(REPO)
    listed = [toc["root"]]
    for part in toc["parts"]:
        for chapter in part["chapters"]:
            listed += [chapter["file"], *(s["file"] for s in chapter.get("sections", []))]
    notebooks = {p.relative_to(REPO).with_suffix("").as_posix()
                 for folder in book.FOLDERS for p in (REPO / folder).glob("*.ipynb")}
    assert len(listed) == len(set(listed))
    assert notebooks <= set(listed)
    assert listed[1] == "notebooks/00_welcome"
    assert all((REPO / f"{page}.md").is_file() for page in book.REFERENCE_PAGES)


def test_the_book_configuration_builds_offline_and_fails_on_warnings():
    conf = (REPO / "docs" / "book" / "conf.py").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"sphinx-build -b html \\\n\t\t-c docs/book -W", makefile)
    assert "nb_execution_raise_on_error = True" in conf
    assert "nb_ipywidgets_js: dict = {}" in conf  # no widget manager from a CDN
    assert "jupyter_server_mathjax" in conf  # MathJax from a package, not a CDN
    assert "BOOK_SOLUTIONS" in conf and "BOOK_SOLUTIONS" in makefile
