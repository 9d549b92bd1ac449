"""The course changes only the settings it lists (course_utils/settings.py), each with a reason."""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

from course_utils import settings

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")
# Modules whose job is to build environments for others (checked all the same).
SCANNED = [*sorted((REPO / "course_utils").rglob("*.py")), REPO / "conftest.py"]


def environment_names_set(source: str) -> set[str]:
    """Names of environment variables a module's code sets (assignments, setdefault, update,
    dict literals and ``dict(..., NAME=...)`` calls that build an environment)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                    names.add(str(target.slice.value))
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("setdefault", "putenv") \
                    and node.args and isinstance(node.args[0], ast.Constant):
                names.add(str(node.args[0].value))
            if isinstance(func, ast.Name) and func.id == "dict":
                names.update(k.arg for k in node.keywords if k.arg)
        elif isinstance(node, ast.Dict):
            names.update(str(k.value) for k in node.keys if isinstance(k, ast.Constant))
    return {n for n in names if ENV_NAME.match(n)}


def test_the_scanner_finds_every_way_of_setting_a_variable():
    source = """
import os
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
env = dict(os.environ, XLA_FLAGS="--xla")
env.update({"OMP_NUM_THREADS": "1"})
os.putenv("TF_XLA_FLAGS", "x")
plan = {"CPU": 2}
"""
    assert environment_names_set(source) == {
        "TF_ENABLE_ONEDNN_OPTS", "GRPC_FAIL_FAST", "XLA_FLAGS", "OMP_NUM_THREADS",
        "TF_XLA_FLAGS"}


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_sets_an_environment_variable_outside_the_list(path):
    unlisted = environment_names_set(path.read_text(encoding="utf-8")) - set(settings.ENVIRONMENT)
    assert not unlisted, (
        f"{path.relative_to(REPO)} sets {sorted(unlisted)}, which course_utils/settings.py does "
        "not list: TensorFlow runs with its defaults; list a needed setting there with its "
        "reason, or filter output instead of changing the computation")


def test_nothing_switches_onednn_off_or_changes_threading_or_xla():
    forbidden = re.compile(r"TF_ENABLE_ONEDNN_OPTS|OMP_NUM_THREADS|TF_XLA_FLAGS|XLA_FLAGS|"
                           r"set_inter_op_parallelism|set_intra_op_parallelism|"
                           r"optimizer\.set_jit|MKL_NUM_THREADS")
    for path in SCANNED:
        text = path.read_text(encoding="utf-8")
        if path.name == "settings.py":
            continue
        assert not forbidden.search(text), f"{path.relative_to(REPO)} changes TensorFlow's math"


def test_every_listed_setting_gives_its_reason():
    for setting in [*settings.ENVIRONMENT.values(), *settings.API_SETTINGS]:
        assert len(setting.reason) > 20 and setting.where, setting.name
    assert "TF_ENABLE_ONEDNN_OPTS" not in settings.ENVIRONMENT


@pytest.mark.parametrize(("environ", "machine", "flags", "expected"), [
    ({}, "x86_64", {"avx2", "avx512_bf16"}, "on (TensorFlow's default on this CPU)"),
    ({}, "x86_64", {"avx", "avx2"}, "off (TensorFlow's default on this CPU)"),
    ({"TF_ENABLE_ONEDNN_OPTS": "0"}, "x86_64", {"amx_tile"}, "off (TF_ENABLE_ONEDNN_OPTS=0)"),
    ({"TF_ENABLE_ONEDNN_OPTS": "1"}, "aarch64", set(), "on (TF_ENABLE_ONEDNN_OPTS=1)"),
    ({}, "aarch64", set(), "off (TensorFlow's default on this CPU)"),
])
def test_onednn_state_reads_the_variable_the_platform_and_the_cpu(
        monkeypatch, environ, machine, flags, expected):
    monkeypatch.setattr(settings, "cpu_flags", lambda: frozenset(flags))
    assert settings.onednn_state(environ, machine) == expected


def test_onednn_state_agrees_with_tensorflow_in_this_process():
    import tensorflow as tf  # noqa: F401 - the state is read from TensorFlow once imported
    from tensorflow.python.util import _pywrap_util_port

    expected = "on" if _pywrap_util_port.IsMklEnabled() else "off"
    assert settings.onednn_state().startswith(expected)


@pytest.mark.parametrize(("num_gpus", "expected"), [(0, ["", ""]), (1, ["", ""]),
                                                    (2, ["0", "1"]), (4, ["0", "1"])])
def test_local_workers_get_a_gpu_each_or_none(num_gpus, expected):
    assert [settings.gpu_visibility(i, 2, num_gpus) for i in range(2)] == expected


def test_setup_changes_only_listed_variables_and_says_so():
    script = (
        "import json, os\n"
        "before = dict(os.environ)\n"
        "import course_utils as cu\n"
        "cu.setup(logical_devices=2)\n"
        "changed = sorted(k for k in os.environ if os.environ[k] != before.get(k))\n"
        "print('CHANGED', json.dumps(changed))\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in settings.ENVIRONMENT and k != "TF_ENABLE_ONEDNN_OPTS"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=180, check=True)
    lines = done.stdout.splitlines()
    changed = json.loads(next(line for line in lines if line.startswith("CHANGED"))[8:])
    assert set(changed) <= settings.OUTPUT_ONLY, changed
    assert any("oneDNN ops o" in line and "the course set" in line for line in lines), lines
