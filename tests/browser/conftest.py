"""Browser tests run only through ``make test-browser`` (it sets COURSE_BROWSER_TESTS=1).

``make test`` collects ``tests/`` with the course's ``.venv``, which has no selenium: here the
browser test files are left out of collection unless the variable is set.
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("COURSE_BROWSER_TESTS") == "1" else ["*.py"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "browser: opens lessons in JupyterLab in headless Chromium (make test-browser)")
