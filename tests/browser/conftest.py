"""Browser tests run only through ``make test-browser``, ``make test-browser-classic`` and
``make test-book``.

``make test`` collects ``tests/`` with the course's ``.venv``, which has no selenium: here the
files that open a browser are left out of collection unless COURSE_BROWSER_TESTS=1 is set; the
unit test of the page checks (no browser) runs everywhere.
"""

from __future__ import annotations

import os

import pytest

pytest.register_assert_rewrite("lesson_run")  # its asserts explain themselves like a test's

BROWSER_FILES = ["test_lessons_in_browser.py", "test_widget_lessons_in_classic_notebook.py",
                 "test_book_in_browser.py"]
collect_ignore = [] if os.environ.get("COURSE_BROWSER_TESTS") == "1" else BROWSER_FILES


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "browser: opens lessons in JupyterLab in headless Chromium (make test-browser)")
