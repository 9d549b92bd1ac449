"""The checks' registry: every lesson module found without a list, one check per name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import course_utils as cu
from course_utils.grading import checks
from course_utils.grading.checks import registry


def test_every_lesson_module_is_found_and_registers_checks(repo):
    files = sorted(p.stem for p in (repo / "course_utils/grading/checks").glob("lesson_*.py"))
    assert checks.lesson_module_names() == files
    assert {"lesson_00", "lesson_01", "lesson_02"} <= set(files)
    for name in files:
        module = getattr(checks, name)
        own = [n for n in module.__all__ if n.startswith("check_")]
        assert own, f"{name} registers no check"
        assert all(registry.get(n) is getattr(module, n) for n in own)


def test_checks_are_reached_by_name_from_the_package_and_from_cu_grading():
    assert checks.check("check_global_batch_size") is cu.grading.check_global_batch_size
    assert "check_compute_loss" in checks.__all__ and "check_compute_loss" in dir(cu.grading)
    with pytest.raises(KeyError, match="known: .*check_global_batch_size"):
        checks.check("check_no_such_exercise")
    with pytest.raises(AttributeError):
        cu.grading.check_no_such_exercise  # noqa: B018


def test_a_duplicate_check_name_fails():
    def check_global_batch_size(fn):
        return True

    with pytest.raises(registry.DuplicateCheckError, match="registered twice.*rename"):
        registry.register(check_global_batch_size)
    assert registry.get("check_global_batch_size") is checks.lesson_00.check_global_batch_size


def test_a_duplicate_in_a_second_lesson_module_fails_at_import(tmp_path):
    package = Path(checks.__file__).parents[2]  # course_utils/
    shutil.copytree(package, tmp_path / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    lessons = tmp_path / "course_utils" / "grading" / "checks"
    (lessons / "lesson_99.py").write_text((lessons / "lesson_00.py").read_text())
    result = subprocess.run([sys.executable, "-c", "import course_utils.grading.checks"],
                            cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode != 0
    assert "DuplicateCheckError" in result.stderr and "lesson_99" in result.stderr


def test_a_check_name_must_start_with_check():
    def global_batch_size(fn):
        return True

    with pytest.raises(ValueError, match="starts with 'check_'"):
        registry.register(global_batch_size)


def test_registering_the_same_check_again_is_not_a_duplicate():
    same = checks.lesson_00.check_global_batch_size
    assert registry.register(same) is same
    assert registry.get("check_global_batch_size") is same
