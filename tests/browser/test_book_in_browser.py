"""The course as a book, as a reader meets it: headless Chromium over the built site.

``make test-book`` builds the book (``make book``), serves ``_build/book`` on a free local port
and checks: the landing page loads and lists the course in its sidebar; every page of the table
of contents loads with no console error and every image loaded; "next" walks the whole course in
the table of contents' order and "previous" walks it back; a search for a term that one lesson
teaches lists that lesson first; results tables are HTML ``<table>`` elements and widgets carry
a note that they need a live kernel. Screenshots go to ``_build/browser/book/``.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import pathlib
import re
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from lab import REPO, free_port, running_browser
from page_checks import console_errors

sys.path.insert(0, str(REPO))
from course_utils import book  # noqa: E402 (stdlib only: no TensorFlow in the browser venv)

pytestmark = pytest.mark.browser

BOOK = REPO / os.environ.get("BOOK_DIR", "_build/book")
SHOTS = REPO / "_build" / "browser" / "book"
#: A term each of these lessons teaches, and the page a search for it must list first.
SEARCHES = {"ClusterCoordinator": "notebooks/04_parameter_server",
            "LossScaleOptimizer": "notebooks/08_mixed_precision"}
PAGE_STATE = """
const images = [...document.querySelectorAll('article img, .bd-article img')];
return {ready: document.readyState,
        title: document.title,
        images: images.map(i => ({src: i.getAttribute('src'),
                                   ok: i.complete && i.naturalWidth > 0})),
        tables: document.querySelectorAll('table.course-table').length,
        widgetNotes: [...document.querySelectorAll('.admonition.note')]
            .filter(n => n.textContent.includes('live kernel')).length,
        next: (document.querySelector('a.right-next') || {}).href || null,
        prev: (document.querySelector('a.left-prev') || {}).href || null,
        sidebar: document.querySelectorAll('nav.bd-links a.reference').length};
"""


def toc_pages() -> list[str]:
    """The book's pages in reading order (no suffix), as ``course_utils.book`` lists them."""
    toc = book.table_of_contents(REPO, solutions=(BOOK / "solutions").is_dir())
    pages = [toc["root"]]
    for part in toc["parts"]:
        for chapter in part["chapters"]:
            pages.append(chapter["file"])
            pages += [section["file"] for section in chapter.get("sections", [])]
    return pages


@contextlib.contextmanager
def serving(folder: pathlib.Path) -> Iterator[str]:
    """The folder over HTTP on 127.0.0.1 (a thread of this process), stopped on exit."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no request log on the test's output
        pass


def _page(url: str) -> str:
    """The page an absolute URL of the served book, or a link relative to its root, names."""
    path = re.sub(r"[#?].*$", "", url)
    return (path.split("/", 3)[-1] if "://" in path else path).removesuffix(".html")


@pytest.fixture(scope="module")
def site() -> Iterator[tuple[str, object]]:
    if not (BOOK / "README.html").is_file():
        pytest.fail(f"no book in {BOOK}: run make book first (make test-book does)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with serving(BOOK) as base, running_browser() as driver:
        yield base, driver


def _open(driver, url: str, timeout_s: float = 30.0) -> dict:
    driver.get(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = driver.execute_script(PAGE_STATE)
        if state["ready"] == "complete":
            return state
        time.sleep(0.2)
    raise AssertionError(f"{url} did not finish loading in {timeout_s:.0f} s")


def test_the_landing_page_is_the_readme_with_the_course_in_its_sidebar(site):
    base, driver = site
    state = _open(driver, f"{base}/index.html")
    time.sleep(1)  # the redirect
    assert driver.current_url.endswith("/README.html"), driver.current_url
    state = driver.execute_script(PAGE_STATE)
    assert "Scaling TensorFlow" in state["title"]
    assert state["sidebar"] >= len(toc_pages()) - 1, state["sidebar"]
    driver.save_screenshot(str(SHOTS / "README.png"))


def test_every_page_loads_without_console_errors_and_with_its_images(site):
    base, driver = site
    console_errors(driver)  # forget the landing page's
    problems = []
    for page in toc_pages():
        state = _open(driver, f"{base}/{page}.html")
        broken = [image["src"] for image in state["images"] if not image["ok"]]
        errors = console_errors(driver)
        if broken or errors:
            problems.append(f"{page}: images not loaded {broken}, console errors {errors}")
        driver.save_screenshot(str(SHOTS / (page.replace("/", "__") + ".png")))
    assert not problems, "\n".join(problems)


def test_next_walks_the_course_in_order_and_previous_walks_it_back(site):
    base, driver = site
    pages = toc_pages()
    walked, state = [pages[0]], _open(driver, f"{base}/{pages[0]}.html")
    while state["next"] and len(walked) <= len(pages):
        walked.append(_page(state["next"]))
        state = _open(driver, state["next"])
    assert walked == pages
    back = [walked[-1]]
    while state["prev"] and len(back) <= len(pages):
        back.append(_page(state["prev"]))
        state = _open(driver, state["prev"])
    assert back == pages[::-1]


@pytest.mark.parametrize(("term", "lesson"), SEARCHES.items())
def test_a_search_lists_the_lesson_that_teaches_the_term_first(site, term, lesson):
    base, driver = site
    _open(driver, f"{base}/search.html?q={term}")
    deadline, links = time.monotonic() + 30, []
    while time.monotonic() < deadline and not links:
        links = driver.execute_script(
            "return [...document.querySelectorAll('#search-results li a')]"
            ".map(a => a.getAttribute('href'))")
        time.sleep(0.3)
    assert links, f"a search for {term} found nothing"
    assert _page(links[0]) == lesson, links[:5]
    driver.save_screenshot(str(SHOTS / f"search_{term}.png"))


def test_results_tables_are_html_tables_and_widgets_say_they_need_a_kernel(site):
    base, driver = site
    tables, notes = {}, {}
    for page in toc_pages():
        if page.startswith("notebooks/"):
            source = (REPO / f"{page}.ipynb").read_text()
            state = _open(driver, f"{base}/{page}.html")
            if "show_table(" in source:
                tables[page] = state["tables"]
            if re.search(r"widgets\.\w+_widget\(", source):
                notes[page] = state["widgetNotes"]
    assert tables and all(tables.values()), tables
    assert all(notes.values()), notes
