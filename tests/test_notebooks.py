"""Every notebook follows the course's conventions; course_utils.notebooks itself works."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from course_utils import notebooks

REPO = pathlib.Path(__file__).resolve().parents[1]
ALL_NOTEBOOKS = sorted(
    path for folder in notebooks.NOTEBOOK_FOLDERS for path in (REPO / folder).glob("*.ipynb")
)


def test_the_course_has_its_welcome_lesson():
    assert (REPO / "notebooks" / "00_welcome.ipynb") in ALL_NOTEBOOKS


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_follows_the_conventions(path):
    assert notebooks.convention_problems(path, REPO) == []


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_reads_only_relative_paths(path):
    text = path.read_text(encoding="utf-8")
    for machine_path in ("/work/", "/root/", "/home/", "C:\\\\"):
        assert machine_path not in text, f"{path.name} mentions {machine_path}"


def test_every_exercise_has_its_solution():
    exercises = {p.name.replace("_exercises", "") for p in (REPO / "exercises").glob("*.ipynb")}
    solutions = {p.name.replace("_solutions", "") for p in (REPO / "solutions").glob("*.ipynb")}
    assert exercises == solutions


def test_colab_badge_points_at_the_file():
    url = notebooks.colab_url("notebooks/01_input_pipelines.ipynb")
    assert url.startswith("https://colab.research.google.com/github/")
    assert url.endswith("/blob/main/notebooks/01_input_pipelines.ipynb")
    assert url in notebooks.colab_badge("notebooks/01_input_pipelines.ipynb")


def test_setup_cell_installs_on_colab_only_and_calls_setup():
    source = notebooks.setup_cell_source(logical_devices=4, seed=1, deterministic=True)
    assert 'if "google.colab" in sys.modules' in source
    assert "%pip install" in source.splitlines()[2] and source.splitlines()[2].startswith("    ")
    assert source.endswith("cu.setup(logical_devices=4, seed=1, deterministic=True)")


def test_new_notebook_follows_the_conventions(tmp_path):
    path = notebooks.new_notebook(tmp_path / "notebooks" / "07_accumulation.ipynb",
                                  "Gradient accumulation", root=tmp_path)
    assert notebooks.convention_problems(path, tmp_path) == []
    with pytest.raises(ValueError):
        notebooks.new_notebook(tmp_path / "notebooks" / "intro.ipynb", "Intro", root=tmp_path)


@pytest.mark.slow
def test_new_command_line_writes_a_skeleton(tmp_path):
    result = subprocess.run([sys.executable, "-m", "course_utils", "new",
                             "notebooks/05_tpus.ipynb", "TPUs"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert notebooks.convention_problems(tmp_path / "notebooks/05_tpus.ipynb", tmp_path) == []


def _write(path: pathlib.Path, notebook: dict) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(notebook))
    return path


def _good(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    path = notebooks.new_notebook(tmp_path / "notebooks" / "03_x.ipynb", "X", root=tmp_path)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("breakage, message", [
    (lambda nb: nb["cells"][0].update(source="# Three · X"), "first cell"),
    (lambda nb: nb["cells"][0].update(source="# 04 · X\n" + "".join(nb["cells"][0]["source"])),
     "match"),
    (lambda nb: nb["cells"][0].update(source="# 03 · X\nno badge"), "Colab badge"),
    (lambda nb: nb["cells"].pop(1), "What you will learn"),
    (lambda nb: nb["cells"][3].update(source="import tensorflow"), "cu.setup"),
    (lambda nb: nb["cells"][4]["metadata"].update(tags=[]), "parameters"),
    (lambda nb: nb["cells"][4].update(outputs=[{"output_type": "stream", "name": "stdout",
                                                "text": "x"}]), "stored outputs"),
    (lambda nb: nb["metadata"]["kernelspec"].update(name="tf"), "kernelspec"),
    (lambda nb: nb["cells"][2].update(id=nb["cells"][1]["id"]), "unique id"),
])
def test_convention_checker_catches_each_breakage(tmp_path, breakage, message):
    path, notebook = _good(tmp_path)
    breakage(notebook)
    problems = notebooks.convention_problems(_write(path, notebook), tmp_path)
    assert any(message in problem for problem in problems), problems


def test_convention_checker_reports_unreadable_files(tmp_path):
    path = tmp_path / "notebooks" / "01_broken.ipynb"
    path.parent.mkdir()
    path.write_text("{not json")
    assert "cannot read" in notebooks.convention_problems(path, tmp_path)[0]
