"""The course's notebook conventions: Colab badges, the set-up cell, a checker and a template.

Every notebook in ``notebooks/``, ``solutions/`` and ``exercises/`` starts with a
``# NN · Title`` heading (``# A · Title`` for an appendix, ``notebooks/A_name.ipynb``, which has
no exercises) and an Open-in-Colab badge whose path is the file's own, says what you
will learn before any code, has the set-up cell as its first code cell and a ``parameters``
cell, and is committed without outputs. ``convention_problems`` checks all of that;
``new_notebook`` writes a skeleton that passes it (``python -m course_utils new PATH TITLE``).
``python -m course_utils.notebooks`` rewrites the Colab-install lines of every set-up cell
(``refresh_setup_cells``) after ``setup_cell_source`` changes. The TPU lesson (``TPU_LESSONS``)
gets a variant that installs ``tensorflow-tpu`` first on a Colab TPU runtime.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any

from course_utils import COURSE_BRANCH, COURSE_REPO

__all__ = [
    "BADGE_IMAGE",
    "colab_badge",
    "colab_install_lines",
    "COLAB_RUNTIME",
    "colab_url",
    "convention_problems",
    "error_line",
    "INSTALL_REPORT",
    "install_summary",
    "is_appendix",
    "is_tpu_notebook",
    "LEARN_HEADING",
    "new_notebook",
    "NOTEBOOK_FOLDERS",
    "refresh_setup_cell",
    "refresh_setup_cells",
    "setup_cell_source",
    "TITLE_PATTERN",
    "TPU_LESSONS",
]

NOTEBOOK_FOLDERS = ("notebooks", "solutions", "exercises")
#: A lesson's title is ``# NN · Title``; an appendix's ``# A · Title`` (one capital letter).
TITLE_PATTERN = re.compile(r"^# (\d{2}|[A-Z]) · \S.*")
_PREFIX = re.compile(r"^(\d{2}|[A-Z])_")
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
LEARN_HEADING = re.compile(r"^#+ What you will learn", re.MULTILINE)


def is_appendix(path: str | os.PathLike) -> bool:
    """True for an appendix notebook (``A_name.ipynb``): a reference with no exercises."""
    return re.match(r"^[A-Z]_", pathlib.PurePath(path).name) is not None


def colab_url(relative_path: str | os.PathLike) -> str:
    """The Open-in-Colab URL of a notebook, from its path inside the repository."""
    path = pathlib.PurePosixPath(relative_path).as_posix()
    return f"https://colab.research.google.com/github/{COURSE_REPO}/blob/{COURSE_BRANCH}/{path}"


def colab_badge(relative_path: str | os.PathLike) -> str:
    """The Markdown of the Open-in-Colab badge of a notebook."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(relative_path)})"


#: Where the Colab install cell asks pip to write its report (``pip install --report``).
INSTALL_REPORT = "/tmp/course_install.json"
#: Colab's packages the install must keep, by distribution name: the names the summary uses.
COLAB_RUNTIME = {"tensorflow": "TensorFlow", "keras": "Keras", "ipywidgets": "ipywidgets",
                 "ipykernel": "ipykernel"}
_COLAB_IF = 'if "google.colab" in sys.modules:'
#: Lessons whose set-up cell decides, before TensorFlow is imported, whether to install
#: ``tensorflow-tpu`` (Colab's TPU runtime ships no TensorFlow; plain TensorFlow cannot drive it).
TPU_LESSONS = ("05",)


def is_tpu_notebook(path: str | os.PathLike) -> bool:
    """True for the TPU lesson's notebooks (lesson, solutions, exercises): see ``TPU_LESSONS``."""
    prefix = _PREFIX.match(pathlib.PurePath(path).name)
    return prefix is not None and prefix.group(1) in TPU_LESSONS


def colab_install_lines(tpu: bool = False) -> list[str]:
    """The Colab-install lines of the set-up cell: on Colab only, pip keeps the runtime's stack.

    With ``tpu`` (the TPU lesson), the course goes in without its requirements first, so that
    ``course_utils.tpu`` (which imports no TensorFlow) can put ``tensorflow-tpu`` in on a TPU
    runtime before the course's other requirements, which then leave plain TensorFlow out.
    """
    if tpu:
        return [
            "import sys",
            f"{_COLAB_IF}  # Colab: tensorflow-tpu on a TPU, then the course",
            f'    course = "git+https://github.com/{COURSE_REPO}@{COURSE_BRANCH}"',
            "    !{sys.executable} -m pip install -q --no-deps {course}",
            "    from course_utils.tpu import install_course_on_colab  # imports no TensorFlow",
            f'    install_course_on_colab("{INSTALL_REPORT}")',
        ]
    return [
        "import sys",
        f"{_COLAB_IF}  # Colab only; keeps Colab's TensorFlow",
        # A shell escape, not %pip: IPython's %pip always adds "you may need to restart the
        # kernel"; install_summary says when a restart is really needed.
        f'    course = "git+https://github.com/{COURSE_REPO}@{COURSE_BRANCH}"',
        f"    !{{sys.executable}} -m pip install -q --report {INSTALL_REPORT} {{course}}",
        "    from course_utils.notebooks import install_summary",
        f'    print(install_summary("{INSTALL_REPORT}"))',
    ]


def setup_cell_source(logical_devices: int | None = 2, seed: int = 42, *, tpu: bool = False,
                      **options: Any) -> str:
    """The source of the first code cell of every notebook (Colab install, then ``cu.setup``)."""
    arguments = [f"logical_devices={logical_devices}", f"seed={seed}"]
    arguments += [f"{key}={value!r}" for key, value in options.items()]
    return "\n".join([*colab_install_lines(tpu), "import course_utils as cu",
                      f"cu.setup({', '.join(arguments)})"])


def install_summary(report_path: str | os.PathLike = INSTALL_REPORT) -> str:
    """One line on what ``pip install --report`` installed and which of Colab's packages it kept.

    Asks for a restart only when pip replaced a package whose modules this kernel already
    imported (the new version would load only in a new session).
    """
    import importlib.metadata
    import sys

    from packaging.utils import canonicalize_name

    path = pathlib.Path(report_path)
    if not path.exists():
        return "course_utils was not installed: pip failed (its message is above)"
    report = json.loads(path.read_text(encoding="utf-8"))
    installed = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
                 for item in report.get("install", [])}
    course = installed.pop("scaling-tensorflow-course", None)
    parts = [f"course_utils {course} installed" if course else "course_utils already installed"]
    kept, replaced = [], []
    for name, label in COLAB_RUNTIME.items():
        if name in installed:
            replaced.append(f"{label} {installed[name]}")
        else:
            try:
                kept.append(f"{label} {importlib.metadata.version(name)}")
            except importlib.metadata.PackageNotFoundError:
                pass
    if kept:
        parts.append("kept Colab's " + ", ".join(kept))
    if replaced:
        parts.append("installed " + ", ".join(replaced))
    others = [name for name in installed if name not in COLAB_RUNTIME]
    if others:
        parts.append(f"added {len(others)} other package{'s' * (len(others) != 1)}")
    modules = importlib.metadata.packages_distributions()
    stale = sorted({canonicalize_name(dist) for module, dists in modules.items()
                    if module in sys.modules for dist in dists} & set(installed))
    if stale:
        parts.append("restart the session (Runtime > Restart session): pip replaced "
                     + ", ".join(stale) + ", already imported")
    return "; ".join(parts)


def refresh_setup_cell(path: str | os.PathLike) -> bool:
    """Rewrite the Colab-install lines of a notebook's set-up cell; True when the file changed.

    Only the ``import sys`` + ``if "google.colab" in sys.modules:`` block (and its indented
    body) of the first code cell is replaced by ``colab_install_lines()`` (its TPU variant for
    ``is_tpu_notebook(path)``); its other lines, its id, metadata and every other cell stay as
    they are.
    """
    import nbformat

    path = pathlib.Path(path)
    notebook = nbformat.read(str(path), as_version=4)
    cell = next((c for c in notebook.cells if c.cell_type == "code"), None)
    if cell is None:
        raise ValueError(f"{path} has no code cell")
    lines = cell.source.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(_COLAB_IF)), None)
    if start is None:
        raise ValueError(f"the first code cell of {path} has no Colab-install block")
    end = start + 1
    while end < len(lines) and lines[end].startswith((" ", "\t")):
        end += 1
    if start > 0 and lines[start - 1] == "import sys":
        start -= 1
    source = "\n".join(lines[:start] + colab_install_lines(is_tpu_notebook(path)) + lines[end:])
    if source == cell.source:
        return False
    cell.source = source
    nbformat.write(notebook, str(path))
    return True


def refresh_setup_cells(root: str | os.PathLike = ".") -> list[pathlib.Path]:
    """``refresh_setup_cell`` on every notebook of the course under ``root``; the changed ones."""
    paths = sorted(path for folder in NOTEBOOK_FOLDERS
                   for path in (pathlib.Path(root) / folder).glob("*.ipynb"))
    return [path for path in paths if refresh_setup_cell(path)]


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def convention_problems(path: str | os.PathLike, root: str | os.PathLike = ".") -> list[str]:
    """Everything about the notebook at ``path`` that breaks the course's conventions.

    ``root`` is the repository root, used to derive the path the Colab badge must point at.
    An empty list means the notebook follows every convention.
    """
    path = pathlib.Path(path)
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [f"cannot read the notebook as JSON: {error}"]
    problems: list[str] = []
    if notebook.get("nbformat") != 4:
        problems.append(f"nbformat must be 4, got {notebook.get('nbformat')}")
    kernel = notebook.get("metadata", {}).get("kernelspec", {}).get("name")
    if kernel != "python3":
        problems.append(f"kernelspec name must be 'python3', got {kernel!r}")
    cells = notebook.get("cells", [])
    if not cells:
        return problems + ["the notebook has no cells"]
    first = _source(cells[0]) if cells[0].get("cell_type") == "markdown" else ""
    match = TITLE_PATTERN.match(first.splitlines()[0] if first else "")
    if not match:
        problems.append("the first cell must be Markdown starting with '# NN · Title'")
    elif not path.name.startswith(match.group(1) + "_"):
        problems.append(f"title number {match.group(1)} does not match the file name {path.name}")
    relative = path.resolve().relative_to(pathlib.Path(root).resolve())
    if colab_url(relative) not in first:
        problems.append(f"the first cell must hold the Colab badge for {relative.as_posix()}")
    code_indices = [i for i, cell in enumerate(cells) if cell.get("cell_type") == "code"]
    if not code_indices:
        return problems + ["the notebook has no code cell"]
    before_code = "\n".join(_source(c) for c in cells[: code_indices[0]])
    if not LEARN_HEADING.search(before_code):
        problems.append("a 'What you will learn' heading must come before the first code cell")
    setup = _source(cells[code_indices[0]])
    if "import course_utils as cu" not in setup or "cu.setup(" not in setup:
        problems.append("the first code cell must import course_utils as cu and call cu.setup(")
    if not all(line in setup.split("\n") for line in colab_install_lines(is_tpu_notebook(path))):
        problems.append("the set-up cell must install the course on Colab only, as "
                        "setup_cell_source() does (python -m course_utils.notebooks)")
    if not any("parameters" in cells[i].get("metadata", {}).get("tags", [])
               for i in code_indices):
        problems.append("no code cell is tagged 'parameters'")
    for i in code_indices:
        if cells[i].get("outputs") or cells[i].get("execution_count") is not None:
            problems.append(f"cell {i} has stored outputs: strip them (make strip)")
            break
    ids = [cell.get("id") for cell in cells]
    if None in ids or len(set(ids)) != len(ids):
        problems.append("every cell needs a unique id (nbformat 4.5)")
    return problems


def new_notebook(
    path: str | os.PathLike, title: str, root: str | os.PathLike = ".",
    logical_devices: int | None = 2,
) -> pathlib.Path:
    """Write a skeleton notebook at ``path`` that follows every convention; return its path."""
    import nbformat

    path = pathlib.Path(path)
    prefix = _PREFIX.match(path.name)
    if prefix is None:
        raise ValueError("notebook names start with a two-digit number (a lesson) or a capital "
                         f"letter (an appendix) and '_', got {path.name!r}")
    number = prefix.group(1)
    relative = path.resolve().relative_to(pathlib.Path(root).resolve())
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell(f"# {number} · {title}\n\n{colab_badge(relative)}", id="title"),
        v4.new_markdown_cell(
            "## What you will learn\n\n- ...\n\n**Prerequisites:** ...  \n"
            "**Time:** ... minutes; runs on a CPU-only laptop.", id="overview"),
        v4.new_markdown_cell("## Setup", id="setup-heading"),
        v4.new_code_cell(setup_cell_source(logical_devices, tpu=is_tpu_notebook(path)),
                         id="setup"),
        v4.new_code_cell("# Sizes: scale them up on a bigger machine.\nNUM_STEPS = 10",
                         id="parameters", metadata={"tags": ["parameters"]}),
        v4.new_markdown_cell("## Summary\n\n- ...\n\n## Further reading\n\n- ...",
                             id="summary"),
    ]
    notebook = v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(path))
    return path


_TERMINAL_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def error_line(error: BaseException, containing: str) -> str:
    """The first line of ``error``'s message that contains ``containing``, with the terminal
    colour codes that Keras and TensorFlow put in some messages removed; "" if no line does."""
    text = _TERMINAL_COLOURS.sub("", str(error))
    return next((line.strip() for line in text.splitlines() if containing in line), "")


if __name__ == "__main__":  # python -m course_utils.notebooks: new Colab install lines everywhere
    for changed in refresh_setup_cells():
        print(f"refreshed the set-up cell of {changed}")

