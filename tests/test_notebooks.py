"""Every notebook follows the course's conventions; course_utils.notebooks itself works."""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import subprocess
import sys

import pytest

import course_utils as cu
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
    lines = source.splitlines()
    assert lines[:6] == notebooks.colab_install_lines()
    assert lines[1].startswith('if "google.colab" in sys.modules:')
    assert lines[2] == f'    course = "git+https://github.com/{cu.COURSE_REPO}@{cu.COURSE_BRANCH}"'
    install = lines[3]
    # a shell escape: IPython's %pip would print "you may need to restart the kernel" each time
    assert install.startswith("    !{sys.executable} -m pip install -q --report ")
    assert "%pip" not in source
    assert install.endswith(" {course}")
    for forbidden in ("--force-reinstall", "--upgrade ", "-U ", "==", "restart"):
        assert forbidden not in install  # the ranges keep Colab's TensorFlow; no restart needed
    assert all(line.startswith("    ") for line in lines[2:6])  # all of it on Colab only
    assert source.endswith("import course_utils as cu\n"
                           "cu.setup(logical_devices=4, seed=1, deterministic=True)")
    assert len(lines) == 8


def test_the_tpu_lesson_decides_about_tensorflow_tpu_before_installing_the_course():
    assert notebooks.TPU_LESSONS == ("05",)
    assert notebooks.is_tpu_notebook("notebooks/05_tpus.ipynb")
    assert notebooks.is_tpu_notebook(REPO / "exercises" / "05_tpus_exercises.ipynb")
    assert not notebooks.is_tpu_notebook("notebooks/06_model_parallelism.ipynb")
    assert not notebooks.is_tpu_notebook("notebooks/A_what_works_where.ipynb")
    lines = notebooks.colab_install_lines(tpu=True)
    assert lines[:2] == ["import sys", 'if "google.colab" in sys.modules:  # Colab: '
                         "tensorflow-tpu on a TPU, then the course"]
    # the course alone first (no TensorFlow from its requirements), then course_utils.tpu decides
    assert lines[2] == f'    course = "git+https://github.com/{cu.COURSE_REPO}@{cu.COURSE_BRANCH}"'
    assert lines[3] == "    !{sys.executable} -m pip install -q --no-deps {course}"
    assert lines[4:] == [
        "    from course_utils.tpu import install_course_on_colab  # imports no TensorFlow",
        f'    install_course_on_colab("{notebooks.INSTALL_REPORT}")']
    source = notebooks.setup_cell_source(logical_devices=2, seed=42, tpu=True)
    assert source.split("\n") == [*lines, "import course_utils as cu",
                                  "cu.setup(logical_devices=2, seed=42)"]
    assert notebooks.setup_cell_source().split("\n")[:6] == notebooks.colab_install_lines()


def test_the_tpu_set_up_cell_runs_in_that_order_on_colab(monkeypatch):
    import types

    from IPython.core.inputtransformer2 import TransformerManager

    from course_utils import tpu

    events = []

    class Shell:  # what IPython's `!` calls
        def system(self, command):
            events.append(("shell", command))

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(tpu, "install_course_on_colab", lambda path: events.append(("tpu", path)))
    code = TransformerManager().transform_cell("\n".join(notebooks.colab_install_lines(True)))
    namespace = {"get_ipython": Shell}
    exec(code, namespace)
    assert namespace["course"] == f"git+https://github.com/{cu.COURSE_REPO}@{cu.COURSE_BRANCH}"
    assert events == [
        ("shell", "{sys.executable} -m pip install -q --no-deps {course}"),
        ("tpu", notebooks.INSTALL_REPORT)]


def test_refresh_keeps_the_tpu_variant_in_the_tpu_lesson_only(tmp_path):
    tpu_path = notebooks.new_notebook(tmp_path / "solutions" / "05_tpus_solutions.ipynb", "TPUs",
                                      root=tmp_path)
    other = notebooks.new_notebook(tmp_path / "notebooks" / "06_x.ipynb", "X", root=tmp_path)
    for path in (tpu_path, other):
        assert notebooks.convention_problems(path, tmp_path) == []
    assert notebooks.refresh_setup_cells(tmp_path) == []  # both already current
    setup = json.loads(tpu_path.read_text())["cells"][3]["source"]
    assert "install_course_on_colab" in "".join(setup)
    # a TPU lesson with the ordinary block is refreshed to the TPU variant, and vice versa
    for path, wrong in ((tpu_path, False), (other, True)):
        notebook = json.loads(path.read_text())
        notebook["cells"][3]["source"] = notebooks.setup_cell_source(tpu=wrong)
        path.write_text(json.dumps(notebook))
        assert notebooks.convention_problems(path, tmp_path) != []
    assert notebooks.refresh_setup_cells(tmp_path) == [other, tpu_path]
    for path in (tpu_path, other):
        assert notebooks.convention_problems(path, tmp_path) == []
    refreshed = json.loads(tpu_path.read_text())["cells"][3]["source"]
    assert "install_course_on_colab" in "".join(refreshed)


def _report(tmp_path, *installed: tuple[str, str]) -> pathlib.Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"version": "1", "install": [
        {"metadata": {"name": name, "version": version}} for name, version in installed]}))
    return path


def test_install_summary_says_what_pip_did_in_one_line(tmp_path, monkeypatch):
    versions = {"tensorflow": "2.20.0", "keras": "3.13.2", "ipywidgets": "7.7.1",
                "ipykernel": "6.17.1"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions[name])
    monkeypatch.setattr(importlib.metadata, "packages_distributions",
                        lambda: {"yaml": ["PyYAML"], "never_imported_x": ["tensorflow"]})
    monkeypatch.setitem(sys.modules, "yaml", sys.modules.get("yaml", object()))
    report = _report(tmp_path, ("scaling-tensorflow-course", "0.1.0"), ("portpicker", "1.6.0"))
    summary = notebooks.install_summary(report)
    assert summary == ("course_utils 0.1.0 installed; kept Colab's TensorFlow 2.20.0, "
                       "Keras 3.13.2, ipywidgets 7.7.1, ipykernel 6.17.1; added 1 other package")
    assert "\n" not in summary
    replaced = notebooks.install_summary(_report(
        tmp_path, ("scaling-tensorflow-course", "0.1.0"), ("tensorflow", "2.21.0"),
        ("PyYAML", "6.0.3")))
    assert "kept Colab's Keras 3.13.2" in replaced and "installed TensorFlow 2.21.0" in replaced
    assert replaced.endswith("restart the session (Runtime > Restart session): pip replaced "
                             "pyyaml, already imported")
    assert notebooks.install_summary(_report(tmp_path)).startswith("course_utils already installed")


def _old_style_notebook(tmp_path: pathlib.Path) -> pathlib.Path:
    path = notebooks.new_notebook(tmp_path / "solutions" / "03_x_solutions.ipynb", "X",
                                  root=tmp_path)
    notebook = json.loads(path.read_text())
    notebook["cells"][3]["source"] = [
        "import os\n", "import sys\n",
        'if "google.colab" in sys.modules:  # Colab only: install the course package\n',
        '    %pip install -q "git+https://github.com/old/place"\n',
        "import course_utils as cu\n", "cu.setup(logical_devices=None, seed=7)"]
    notebook["cells"][3]["metadata"] = {"tags": ["keep-me"]}
    path.write_text(json.dumps(notebook, indent=1))
    return path


def test_refresh_setup_cell_rewrites_only_the_colab_install_lines(tmp_path):
    path = _old_style_notebook(tmp_path)
    before = json.loads(path.read_text())
    assert "must install the course on Colab only" in " ".join(
        notebooks.convention_problems(path, tmp_path))
    assert notebooks.refresh_setup_cell(path) is True
    after = json.loads(path.read_text())
    cell = after["cells"][3]
    assert "".join(cell["source"]).split("\n") == [
        "import os", *notebooks.colab_install_lines(), "import course_utils as cu",
        "cu.setup(logical_devices=None, seed=7)"]
    assert cell["id"] == before["cells"][3]["id"] and cell["metadata"] == {"tags": ["keep-me"]}
    assert [c for i, c in enumerate(after["cells"]) if i != 3] == [
        c for i, c in enumerate(before["cells"]) if i != 3]
    assert notebooks.convention_problems(path, tmp_path) == []
    text = path.read_text()
    assert notebooks.refresh_setup_cell(path) is False and path.read_text() == text


def test_refresh_setup_cells_walks_the_course_folders(tmp_path):
    old = _old_style_notebook(tmp_path)
    current = notebooks.new_notebook(tmp_path / "notebooks" / "03_x.ipynb", "X", root=tmp_path)
    assert notebooks.refresh_setup_cells(tmp_path) == [old]
    assert notebooks.refresh_setup_cells(tmp_path) == []
    assert notebooks.convention_problems(current, tmp_path) == []
    broken = tmp_path / "exercises" / "04_y_exercises.ipynb"
    notebooks.new_notebook(broken, "Y", root=tmp_path)
    notebook = json.loads(broken.read_text())
    notebook["cells"][3]["source"] = "import course_utils as cu\ncu.setup()"
    broken.write_text(json.dumps(notebook))
    with pytest.raises(ValueError, match="no Colab-install block"):
        notebooks.refresh_setup_cell(broken)


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


def test_an_appendix_is_a_first_class_notebook(tmp_path):
    path = notebooks.new_notebook(tmp_path / "notebooks" / "A_where.ipynb", "Where",
                                  root=tmp_path)
    assert "".join(json.loads(path.read_text())["cells"][0]["source"]).startswith("# A · Where")
    assert notebooks.convention_problems(path, tmp_path) == []
    assert notebooks.is_appendix(path) and not notebooks.is_appendix("notebooks/01_x.ipynb")
    wrong = _write(tmp_path / "notebooks" / "B_where.ipynb", json.loads(path.read_text()))
    assert any("does not match the file name" in p
               for p in notebooks.convention_problems(wrong, tmp_path))
    with pytest.raises(ValueError, match="capital letter"):
        notebooks.new_notebook(tmp_path / "notebooks" / "AB_where.ipynb", "X", root=tmp_path)


def test_appendices_have_no_exercises():
    appendices = [p for p in ALL_NOTEBOOKS if notebooks.is_appendix(p)]
    assert [p.relative_to(REPO).as_posix() for p in appendices] == [
        "notebooks/A_what_works_where.ipynb"]  # a reference: nothing to solve
    for folder in ("solutions", "exercises"):
        assert not [p for p in (REPO / folder).glob("*.ipynb") if notebooks.is_appendix(p)]


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


def test_error_line_finds_the_line_and_drops_terminal_colours():
    error = ValueError("first\n\x1b[1mTried to call merge_call\x1b[0m in a cond\nlast")
    assert notebooks.error_line(error, "merge_call") == "Tried to call merge_call in a cond"
    assert notebooks.error_line(error, "absent") == ""
