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
ALL_CAPS = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Modules whose job is to build environments for others (checked all the same).
SCANNED = [*sorted((REPO / "course_utils").rglob("*.py")), REPO / "conftest.py"]
TF_CONFIG_SETTER = re.compile(r"(^|\.)config\.(\w+\.)*(set_|enable_|disable_)\w+$")


def module_constants(sources) -> dict[str, str]:
    """``NAME = <string expression>`` at module level in any scanned module (keys built from a
    constant, however they are spelled, resolve to their value)."""
    constants: dict[str, str] = {}
    for source in sources:
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                value = string_value(node.value, constants)
                if value is not None:
                    constants[node.targets[0].id] = value
    return constants


def string_value(node, constants) -> str | None:
    """The string an expression of constants makes (literal, +, f-string, "x".join), or None."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.Attribute):  # settings.NAME, module.CONSTANT
        return constants.get(node.attr)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = string_value(node.left, constants), string_value(node.right, constants)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.JoinedStr):
        parts = [string_value(v.value if isinstance(v, ast.FormattedValue) else v, constants)
                 for v in node.values]
        return None if None in parts else "".join(parts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "join" and len(node.args) == 1 \
            and isinstance(node.args[0], ast.Tuple | ast.List):
        glue = string_value(node.func.value, constants)
        parts = [string_value(e, constants) for e in node.args[0].elts]
        return None if glue is None or None in parts else glue.join(parts)
    return None


def _environment_like(node) -> bool:
    """os.environ, environ, env, extra_env ...: a mapping that is an environment by its name."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return "env" in name.lower()


def environment_names_set(source: str, constants: dict[str, str] | None = None) -> set[str]:
    """Names of environment variables a module's code sets: item assignments and
    ``setdefault``/``putenv``/``update``/``pop``-free writes on an environment whatever the key
    expression (an unresolved key is reported as ``<expression>``), dict literals and
    ``dict(..., NAME=...)`` calls that build one."""
    constants = module_constants([source]) | (constants or {})
    names: set[str] = set()
    loose: set[str] = set()  # dict keys outside an environment: only NAME_LIKE_THIS counts

    tree = ast.parse(source)
    dicts = {t.id: [string_value(k, constants) for k in node.value.keys if k is not None]
             for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Dict) for t in node.targets if isinstance(t, ast.Name)}
    loop_keys: dict[str, list] = {}  # for NAME[, value] in DICT[.items()]: NAME is each key
    for node in ast.walk(tree):
        if isinstance(node, ast.For):
            iterated = node.iter.func.value if isinstance(node.iter, ast.Call) \
                and isinstance(node.iter.func, ast.Attribute) else node.iter
            target = node.target.elts[0] if isinstance(node.target, ast.Tuple) else node.target
            if isinstance(iterated, ast.Name) and iterated.id in dicts \
                    and isinstance(target, ast.Name):
                loop_keys[target.id] = dicts[iterated.id]

    def keys(node) -> set[str]:
        if isinstance(node, ast.Name) and node.id in loop_keys:
            return {k or f"<{node.id}>" for k in loop_keys[node.id]}
        value = string_value(node, constants)
        return {value if value is not None else f"<{ast.unparse(node)}>"}

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript):
                    (names if _environment_like(target.value) else loose).update(
                        keys(target.slice))
            if any(_environment_like(t) for t in targets) and isinstance(node.value, ast.Dict):
                names.update(*(keys(k) for k in node.value.keys if k is not None))
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("setdefault", "putenv") \
                    and node.args:
                (names if _environment_like(func.value) or func.attr == "putenv"
                 else loose).update(keys(node.args[0]))
            if isinstance(func, ast.Attribute) and func.attr == "update":
                target = names if _environment_like(func.value) else loose
                target.update(k.arg for k in node.keywords if k.arg)
                for arg in node.args:
                    if isinstance(arg, ast.Dict):
                        target.update(*(keys(k) for k in arg.keys if k is not None))
            if isinstance(func, ast.Name) and func.id == "dict":
                loose.update(k.arg for k in node.keywords if k.arg)
        elif isinstance(node, ast.Dict):
            loose.update(v for v in (string_value(k, constants) for k in node.keys if k)
                         if v is not None)
    return ({n for n in names if ALL_CAPS.match(n) or n.startswith("<")}
            | {n for n in loose if ENV_NAME.match(n)})


def tf_config_settings(source: str) -> set[str]:
    """``tf.config`` setters called and ConfigProto thread fields assigned in a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and TF_CONFIG_SETTER.search(ast.unparse(node.func)):
            found.add(ast.unparse(node.func).rsplit(".", 1)[-1])
        elif isinstance(node, ast.Assign):
            found.update(t.attr for t in node.targets if isinstance(t, ast.Attribute)
                         and t.attr.endswith("_parallelism_threads"))
    return found


CONSTANTS = module_constants(path.read_text(encoding="utf-8") for path in SCANNED)


def test_the_scanner_finds_every_way_of_setting_a_variable():
    source = """
import os
ONEDNN_VARIABLE = "_".join(("TF", "ENABLE", "ONEDNN", "OPTS"))
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ[ONEDNN_VARIABLE] = "0"
os.environ["OMP" + "_NUM_THREADS"] = "1"
os.environ[f"{'KMP'}_AFFINITY"] = "x"
os.environ[name_from_somewhere] = "1"
os.environ.update(TF_NUM_INTEROP_THREADS="1")
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
env = dict(os.environ, XLA_FLAGS="--xla")
env.update({"OMP_NUM_THREADS": "1", "HOME": "/tmp"})
env["TMPDIR"] = "/tmp"
os.putenv("TF_XLA_FLAGS", "x")
os.environ |= {"MKL_NUM_THREADS": "1"}
child_env = {**os.environ, "TZ": "UTC"}
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3"}
for name, value in QUIET.items():
    os.environ.setdefault(name, value)
plan = {"CPU": 2}
plan["GPU"] = 1
"""
    assert environment_names_set(source) == {
        "TF_ENABLE_ONEDNN_OPTS", "OMP_NUM_THREADS", "KMP_AFFINITY", "<name_from_somewhere>",
        "TF_NUM_INTEROP_THREADS", "GRPC_FAIL_FAST", "XLA_FLAGS", "HOME", "TMPDIR",
        "TF_XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL", "MKL_NUM_THREADS", "TZ"}


def test_the_scanner_finds_tf_config_settings():
    source = """
tf.config.experimental.enable_op_determinism()
tf.config.optimizer.set_experimental_options({"auto_mixed_precision": True})
config.threading.set_intra_op_parallelism_threads(1)
proto.inter_op_parallelism_threads = 3
tf.config.list_logical_devices()
"""
    assert tf_config_settings(source) == {
        "enable_op_determinism", "set_experimental_options",
        "set_intra_op_parallelism_threads", "inter_op_parallelism_threads"}


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_makes_a_setting_outside_the_list(path):
    source = path.read_text(encoding="utf-8")
    unlisted = environment_names_set(source, CONSTANTS) - set(settings.ENVIRONMENT)
    assert not unlisted, (
        f"{path.relative_to(REPO)} sets {sorted(unlisted)}, which course_utils/settings.py does "
        "not list: TensorFlow runs with its defaults; list a needed setting there with its "
        "reason, or filter output instead of changing the computation")
    unlisted_api = tf_config_settings(source) - set(settings.API_CALLS)
    assert not unlisted_api, (
        f"{path.relative_to(REPO)} calls {sorted(unlisted_api)}, which settings.API_CALLS "
        "does not name: list the setting in API_SETTINGS with its reason")


def test_every_api_call_names_a_listed_setting():
    assert set(settings.API_CALLS.values()) <= {s.name for s in settings.API_SETTINGS}


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


DEFAULT = "TensorFlow's default: this CPU has"


@pytest.mark.parametrize(("environ", "machine", "flags", "expected"), [
    ({}, "x86_64", {"avx2", "avx512_bf16"}, f"on ({DEFAULT} avx512_bf16)"),
    ({}, "x86_64", {"avx", "avx2"}, f"off ({DEFAULT} no AVX512"),
    ({"TF_ENABLE_ONEDNN_OPTS": "0"}, "x86_64", {"amx_tile"}, "off (TF_ENABLE_ONEDNN_OPTS=0)"),
    ({"TF_ENABLE_ONEDNN_OPTS": "True"}, "x86_64", set(), "on (TF_ENABLE_ONEDNN_OPTS=True)"),
    # TensorFlow ignores other values with a warning ("Using the default setting: false"):
    ({"TF_ENABLE_ONEDNN_OPTS": "yes"}, "x86_64", {"avx2"},
     f"off (TF_ENABLE_ONEDNN_OPTS='yes' ignored: not 0/1/false/true; {DEFAULT} no AVX512"),
    ({"TF_ENABLE_ONEDNN_OPTS": "off"}, "x86_64", {"avx_vnni"},
     f"on (TF_ENABLE_ONEDNN_OPTS='off' ignored: not 0/1/false/true; {DEFAULT} avx_vnni)"),
    ({"TF_ENABLE_ONEDNN_OPTS": "1"}, "aarch64", set(), "on (TF_ENABLE_ONEDNN_OPTS=1)"),
    ({}, "aarch64", {"asimd"}, "unknown (unknown: TensorFlow's default on Linux aarch64 "),
])
def test_onednn_state_reads_the_variable_the_platform_and_the_cpu(
        monkeypatch, environ, machine, flags, expected):
    monkeypatch.setattr(settings, "cpu_flags", lambda: frozenset(flags))
    assert settings.onednn_state(environ, machine, "Linux").startswith(expected)


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
        "cu.setup(logical_devices=2, deterministic=True)\n"
        "print('ROWS', json.dumps(cu.settings.course_settings()))\n"
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
    line = next(line for line in lines if "the course set" in line)
    assert "oneDNN ops o" in line and "op determinism" in line, line
    rows = json.loads(next(line for line in lines if line.startswith("ROWS"))[5:])
    assert any(row["setting"] == "op determinism" for row in rows), rows
