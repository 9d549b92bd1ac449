"""Colab badges: each opens the notebook's own file on COURSE_REPO at COURSE_BRANCH, and the
Colab install lines are the first thing the first code cell runs (before course_utils loads).

``tests/test_notebooks.py`` checks the conventions of every notebook (the badge among them,
through ``convention_problems``); this file spells out the URL and the order of the set-up cell.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

import course_utils
from course_utils import notebooks

REPO = pathlib.Path(__file__).resolve().parents[1]
PATHS = sorted(p.relative_to(REPO) for folder in notebooks.NOTEBOOK_FOLDERS
               for p in (REPO / folder).glob("*.ipynb"))
BADGE = re.compile(r"\]\((https://colab\.research\.google\.com/github/[^)\s]+)\)")


def _cells(relative: pathlib.Path) -> list[dict]:
    return json.loads((REPO / relative).read_text(encoding="utf-8"))["cells"]


@pytest.mark.parametrize("relative", PATHS, ids=str)
def test_every_badge_points_at_its_own_file(relative):
    first = "".join(_cells(relative)[0]["source"])
    urls = BADGE.findall(first)
    assert urls == [f"https://colab.research.google.com/github/{course_utils.COURSE_REPO}"
                    f"/blob/{course_utils.COURSE_BRANCH}/{relative.as_posix()}"]


@pytest.mark.parametrize("relative", PATHS, ids=str)
def test_the_colab_install_runs_first(relative):
    code = [c for c in _cells(relative) if c["cell_type"] == "code"]
    lines = "".join(code[0]["source"]).split("\n")
    install = notebooks.colab_install_lines(notebooks.is_tpu_notebook(relative))
    start = lines.index(install[0])
    assert lines[start:start + len(install)] == install
    assert all("course_utils" not in line and "tensorflow" not in line
               for line in lines[:start] if not line.lstrip().startswith("#"))
    assert lines.index("import course_utils as cu") > start + len(install) - 1


def test_all_notebooks_are_checked():
    assert len(PATHS) >= 15 and all(p.suffix == ".ipynb" for p in PATHS)
    assert any(notebooks.is_appendix(p) for p in PATHS)  # appendices have badges too
