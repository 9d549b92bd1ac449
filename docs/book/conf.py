"""Sphinx configuration of the course as a book (``make book``).

The source folder is the repository's root: the README is the landing page, the notebooks are
the chapters (executed once by MyST-NB, results kept in a cache under ``_build``), and the table
of contents is derived from the files in course order (``course_utils.book``). Everything builds
offline: the theme, search and MathJax (from the ``jupyter-server-mathjax`` package) come from
installed packages. ``BOOK_SOLUTIONS=0`` leaves the solutions out of the build.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import course_utils  # noqa: E402
from course_utils import book  # noqa: E402

WITH_SOLUTIONS = os.environ.get("BOOK_SOLUTIONS", "1") != "0"
BUILD = ROOT / "_build"

project = "Scaling TensorFlow"
author = "The Scaling TensorFlow authors"
copyright = "the Scaling TensorFlow authors"  # noqa: A001 (Sphinx's name)
release = course_utils.__version__

extensions = ["myst_nb", "sphinx_external_toc"]

# The table of contents, written where the build writes everything else.
BUILD.mkdir(exist_ok=True)
_toc = BUILD / ("book_toc.json" if WITH_SOLUTIONS else "book_toc_public.json")
_toc.write_text(json.dumps(book.table_of_contents(ROOT, solutions=WITH_SOLUTIONS), indent=1))
external_toc_path = str(_toc)  # YAML is a superset of JSON
external_toc_exclude_missing = True  # only what the table of contents lists is built

# Only the course's own pages: no hidden or generated folder (caches, environments, run output).
exclude_patterns = ["_build", ".*", "**/.*", "**/runs", "tests", "benchmarks", "course_utils",
                    "requirements", "docs/book", "submissions", "feedback"]
if not WITH_SOLUTIONS:
    exclude_patterns.append("solutions")

# MyST and MyST-NB: notebooks executed once, into a cache; a failing cell fails the build.
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath", "colon_fence"]
nb_execution_mode = os.environ.get("BOOK_EXECUTE", "cache")
nb_execution_cache_path = str(BUILD / "book_cache")
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
nb_ipywidgets_js: dict = {}  # the widget manager is on a CDN: widgets get a note instead

# The theme, with each notebook's "Open in Colab" and "Download notebook" buttons.
html_theme = "sphinx_book_theme"
html_title = "Scaling TensorFlow"
html_theme_options = {
    "repository_url": f"https://github.com/{course_utils.COURSE_REPO}",
    "repository_branch": course_utils.COURSE_BRANCH,
    "path_to_docs": "",
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "use_download_button": True,
    "use_repository_button": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
}
html_last_updated_fmt = None
html_show_sourcelink = False

# MathJax from an installed package, not from a CDN.
import jupyter_server_mathjax  # noqa: E402

html_static_path = [str(pathlib.Path(jupyter_server_mathjax.__file__).parent / "static")]
mathjax_path = "MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"  # the config the package ships
# The package ships the STIX-Web fonts only: tell MathJax 2 to use them (no font from the web).
mathjax2_config = {"HTML-CSS": {"availableFonts": [], "preferredFont": None,
                                "webFont": "STIX-Web", "imageFont": None},
                   "SVG": {"font": "STIX-Web"}}
html_additional_pages = {"index": "redirect.html"}
templates_path = [str(pathlib.Path(__file__).parent / "_templates")]

# A broken cross-reference or a missing image is an error (make book runs sphinx-build -W).
nitpicky = False
# A shell escape (`!pip`) in a notebook that has not run yet lexes as plain Python: cosmetic.
suppress_warnings = ["misc.highlighting_failure"]


WIDGET_VIEW = '<script type="application/vnd.jupyter.widget-view+json">'
LIVE_KERNEL_NOTE = ("This is an interactive control: it needs a live kernel. Open the notebook "
                    "in JupyterLab or Colab (the buttons at the top of the page) to use it.")
#: The notebooks' own "Open in Colab" badge is an image on the web; offline, the book keeps the
#: link as text (the theme's launch button does the same job).
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def _offline_page(app, doctree, docname) -> None:
    """Make a page whole offline: each widget view (drawn only by a live kernel's widget
    manager) becomes a note, and the web-hosted Colab badge becomes its link's text."""
    from docutils import nodes

    for raw in list(doctree.findall(nodes.raw)):
        if raw.astext().startswith(WIDGET_VIEW):
            note = nodes.note()
            note += nodes.paragraph(text=LIVE_KERNEL_NOTE)
            raw.replace_self(note)
    for image in list(doctree.findall(nodes.image)):
        if image.get("uri") == COLAB_BADGE:
            image.replace_self(nodes.Text("Open in Colab"))


def setup(app) -> None:
    app.connect("doctree-resolved", _offline_page)
