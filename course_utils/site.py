"""The rendered copy of the course (``make html``): its index page, in course order.

``make html`` executes every notebook and renders it with nbconvert into
``_build/html/<folder>/<name>.html`` (``notebooks/``, ``exercises/``, ``solutions/``); then
``python -m course_utils.site _build/html`` writes ``_build/html/index.html`` linking each one:
every lesson, followed by its exercises and its solutions, titled as the notebooks title
themselves (``# NN · Title``); then the appendices (``A_name.ipynb``, ``# A · Title``), which
have no exercises, in a list of their own.
"""

from __future__ import annotations

import html
import json
import os
import pathlib
import re
import sys

__all__ = ["FOLDERS", "course_order", "index_html", "notebook_title", "write_index"]

#: The folders of the course's notebooks, in the order a lesson's entries are listed.
FOLDERS = ("notebooks", "exercises", "solutions")

_NUMBER = re.compile(r"^(\d+)_")
_APPENDIX = re.compile(r"^([A-Z])_")
#: Appendices sort after every lesson, by letter.
_APPENDIX_RANK = 1_000_000


def notebook_title(path: str | os.PathLike) -> str:
    """The notebook's title: the first line of its first cell without ``#`` (else its name)."""
    path = pathlib.Path(path)
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        cells = []
    if cells and cells[0].get("cell_type") == "markdown":
        source = cells[0].get("source", "")
        lines = ("".join(source) if isinstance(source, list) else source).strip().splitlines()
        if lines and lines[0].startswith("#"):
            return lines[0].lstrip("#").strip()
    return path.stem


def course_order(root: str | os.PathLike = ".") -> list[pathlib.Path]:
    """Every course notebook under ``root``, relative to it: by lesson number, then
    lesson, exercises, solutions (the order of :data:`FOLDERS`); appendices last, by letter."""
    root = pathlib.Path(root)
    found = []
    for rank, folder in enumerate(FOLDERS):
        for path in (root / folder).glob("*.ipynb"):
            match, appendix = _NUMBER.match(path.name), _APPENDIX.match(path.name)
            if match:
                number = int(match.group(1))
            elif appendix:
                number = _APPENDIX_RANK + ord(appendix.group(1))
            else:
                number = sys.maxsize
            found.append((number, rank, path.name, path.relative_to(root)))
    return [path for *_, path in sorted(found)]


def _items(groups: list[list[str]]) -> str:
    """One ``<li>`` per group: its first link, the others nested under it."""
    return "\n".join(f"  <li>{links[0]}" + (
        "<ul>" + "".join(f"<li>{link}</li>" for link in links[1:]) + "</ul>"
        if len(links) > 1 else "") + "</li>" for links in groups)


def index_html(root: str | os.PathLike = ".", title: str = "Scaling TensorFlow",
               rendered: str | os.PathLike | None = None) -> str:
    """The index page: one list item per lesson, linking its rendered lesson, exercises and
    solutions (``<folder>/<name>.html``) under the titles read from the notebooks; then the
    appendices, in a list headed "Appendices". With ``rendered`` (the output folder), a page
    that is not there is listed without a link, marked "not rendered"."""
    root = pathlib.Path(root)
    lessons: dict[str, list[str]] = {}
    for relative in course_order(root):
        number = relative.name.split("_", 1)[0]
        href = relative.with_suffix(".html").as_posix()
        label = html.escape(notebook_title(root / relative))
        if rendered is not None and not (pathlib.Path(rendered) / href).is_file():
            item = f"{label} <em>(not rendered)</em>"
        else:
            item = f'<a href="{html.escape(href)}">{label}</a>'
        lessons.setdefault(number, []).append(item)
    lesson_groups = [links for key, links in lessons.items() if not _APPENDIX.match(key + "_")]
    appendix_groups = [links for key, links in lessons.items() if _APPENDIX.match(key + "_")]
    appendices = (f"\n<h2>Appendices</h2>\n<ul>\n{_items(appendix_groups)}\n</ul>"
                  if appendix_groups else "")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title></head>\n<body><h1>{html.escape(title)}</h1>\n<ol>\n"
            f"{_items(lesson_groups)}\n</ol>{appendices}\n</body></html>\n")


def write_index(out_dir: str | os.PathLike, root: str | os.PathLike = ".") -> pathlib.Path:
    """Write ``index.html`` of the notebooks under ``root`` into ``out_dir``; its path."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(index_html(root, rendered=out), encoding="utf-8")
    return path


if __name__ == "__main__":  # python -m course_utils.site OUT_DIR [ROOT]
    written = write_index(*sys.argv[1:3]) if len(sys.argv) > 1 else None
    print(f"wrote {written}" if written else "usage: python -m course_utils.site OUT_DIR [ROOT]")
