"""Every setting the course makes to TensorFlow's processes, in one place, with its reason.

The course measures TensorFlow as its users run it: its math libraries (oneDNN on x86), its
threading, XLA and gRPC behave as TensorFlow's defaults say. What the course does change is
listed here, and nowhere else: log filters that hide messages without changing any
computation, the logical devices, seeds and (lesson 07) op determinism a lesson needs, and the
few process settings that clusters and sandboxes need to run at all. ``tests/test_settings.py``
fails when a module of the course sets an environment variable this list does not name, or
makes a ``tf.config`` setting ``API_SETTINGS`` does not name.

This module imports neither TensorFlow nor anything else from ``course_utils``.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

__all__ = [
    "API_CALLS",
    "API_SETTINGS",
    "ENVIRONMENT",
    "ONEDNN_DEFAULT_FLAGS",
    "OUTPUT_ONLY",
    "Setting",
    "course_settings",
    "cpu_flags",
    "gpu_visibility",
    "onednn_rule",
    "onednn_state",
    "settings_line",
]


@dataclass(frozen=True)
class Setting:
    """One thing the course sets: where, whether it changes computation, and why."""

    name: str
    value: str
    where: str
    changes_computation: bool
    reason: str


#: Environment variables a module of the course may set, with the reason for each.
ENVIRONMENT: dict[str, Setting] = {s.name: s for s in (
    Setting("TF_CPP_MIN_LOG_LEVEL", "3", "every lesson (cu.setup), workers, grader", False,
            "hides TensorFlow's C++ start-up and info logs; a log filter"),
    Setting("GRPC_VERBOSITY", "ERROR", "every lesson (cu.setup)", False,
            "hides gRPC's info logs; a log filter"),
    Setting("ABSL_MIN_LOG_LEVEL", "3", "every lesson (cu.setup)", False,
            "hides absl's C++ logs; a log filter"),
    Setting("KMP_WARNINGS", "0", "every lesson (cu.setup)", False,
            "hides OpenMP runtime warnings; a log filter"),
    Setting("PYTHONUNBUFFERED", "1", "local cluster workers", False,
            "workers' prints reach their log files at once, so the notebook can follow them"),
    Setting("CUDA_VISIBLE_DEVICES", "one GPU per worker, or none",
            "local cluster workers and fresh probe processes", True,
            "several processes on one machine must not all take every GPU: each local worker "
            "gets a GPU of its own when there is one per worker, else none (CPU workers, said "
            "so when the cluster starts); a fresh probe process (cu.child) sees no GPU"),
    Setting("GRPC_FAIL_FAST", "use_caller", "lesson 04 and its tasks, in view", False,
            "TensorFlow's parameter-server guide sets it on the coordinator; 'use_caller' is "
            "already TensorFlow's default when it is unset (xla/tsl/distributed_runtime/rpc/"
            "grpc_state.h, RFC 355), so it changes nothing: lesson 04 sets it where the "
            "learner sees it, and no module of the course sets it"),
    Setting("TF_CONFIG", "the task's cluster spec", "local cluster workers", False,
            "who each worker is: the variable TensorFlow's cluster resolver reads"),
    Setting("COURSE_COLLECTIVE_TIMEOUT", "seconds", "local cluster workers", False,
            "the course's own variable: the worker scripts pass it to CommunicationOptions"),
    Setting("PYTHONPATH", "the course's folder first", "workers, probes, grader", False,
            "child processes import the same course_utils as the notebook"),
    Setting("COURSE_TEST_RUN_GPUS", "the GPUs make test started with", "the tests (conftest.py)",
            False, "the course's own variable: the unit tests hide the GPUs from their own "
            "processes, and each lesson's kernel under make test gets these back"),
    Setting("COURSE_DRY_RUNS", "a folder", "the tests (conftest.py)", False,
            "the course's own variable: where pip's dry runs, started as the run begins, "
            "write for tests/test_dependencies.py; no effect on TensorFlow"),
    Setting("MPLBACKEND", "Agg", "tests and the grader", False,
            "plots render without a display; no effect on TensorFlow"),
    Setting("MPLCONFIGDIR", "a private folder", "the grader", False,
            "matplotlib's cache in a folder the grading kernel may write"),
    Setting("IPYTHONDIR", "a private folder", "the grader", False,
            "IPython's profile in a folder the grading kernel may write"),
    Setting("JUPYTER_RUNTIME_DIR", "a private folder", "the grader", False,
            "kernel connection files in a private, writable folder"),
    Setting("PYDEVD_DISABLE_FILE_VALIDATION", "1", "the grader", False,
            "hides a debugger warning printed by frozen modules"),
    Setting("HOME", "the grading folder", "the grader", False,
            "a graded notebook reads no user configuration and writes only in its folder"),
    *(Setting(name, "the grading folder's tmp", "the grader", False,
              "temporary files stay in the graded notebook's own folder")
      for name in ("TMPDIR", "TEMP", "TMP")),
    Setting("PYTHONDONTWRITEBYTECODE", "1", "the grader", False,
            "graded code leaves no .pyc files behind"),
    Setting("COURSE_STRICT_CHECKS", "1", "the grader and the solutions' tests", False,
            "the course's own variable: a check that does not pass raises"),
)}

#: Settings made through TensorFlow's API rather than the environment, each shown where made.
API_SETTINGS: tuple[Setting, ...] = (
    Setting("logical devices", "cu.setup(logical_devices=N)", "every lesson's set-up cell", True,
            "N replicas on one machine: the CPU is split into N logical CPUs; a machine with "
            "exactly one GPU also gets N logical GPUs of 1024 MB each, and TensorFlow then "
            "ignores memory growth (tensorflow/python/eager/context.py)"),
    Setting("seeds", "cu.setup(seed=42)", "every lesson's set-up cell", True,
            "Python, NumPy, Keras and TensorFlow seeded, so a lesson's numbers repeat"),
    Setting("inter-op threads", "workers + 1, only when the CPU has fewer cores",
            "in-process parameter-server clusters", True,
            "in-process servers share one process: with fewer inter-op threads than "
            "workers + 1, a blocked worker can starve the others"),
    Setting("op determinism", "cu.setup(deterministic=True)", "lesson 07's set-up cell", True,
            "tf.config.experimental.enable_op_determinism(): ops that have no deterministic "
            "kernel raise, and Keras turns XLA off even when a model asks for it "
            "(jit_compile=True or 'auto': keras/src/trainers/trainer.py, model_supports_jit)"),
)

#: The ``tf.config`` calls (and ConfigProto fields) that make the ``API_SETTINGS`` above:
#: ``tests/test_settings.py`` fails when a module makes any other ``tf.config`` setting.
API_CALLS: dict[str, str] = {
    "set_logical_device_configuration": "logical devices",
    "inter_op_parallelism_threads": "inter-op threads",
    "enable_op_determinism": "op determinism",
}

#: The environment variables above that only filter output.
OUTPUT_ONLY = frozenset(name for name, s in ENVIRONMENT.items() if not s.changes_computation)

#: The values TensorFlow accepts for ``TF_ENABLE_ONEDNN_OPTS`` (``ReadBoolFromEnvVar`` lowers
#: the case and strips nothing); any other value is ignored with a warning.
_ONEDNN_VALUES = {"0": False, "false": False, "1": True, "true": True}
_ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"


def onednn_rule(value: str | None, system: str, machine: str,
                flags: frozenset[str] | set[str] | None) -> tuple[bool | None, str]:
    """TensorFlow's rule for its oneDNN ops: ``(enabled, why)``; ``enabled`` is None where this
    rule cannot tell (not Linux x86, or no CPU flags). The one home of the rule
    (``tensorflow/core/util/port.cc``: ``IsMklEnabled``, ``DefaultOneDnnPolicy``).

    ``value`` (the variable) decides when it is 0/1/false/true in any case; any other value,
    even ``"yes"``, TensorFlow ignores with a warning and uses its default. The default, on
    Linux x86: on when the CPU has one of ``ONEDNN_DEFAULT_FLAGS``.
    """
    if value is not None and value.lower() in _ONEDNN_VALUES:
        return _ONEDNN_VALUES[value.lower()], f"{_ONEDNN_VARIABLE}={value}"
    ignored = (f"{_ONEDNN_VARIABLE}={value!r} ignored: not 0/1/false/true; "
               if value is not None else "")
    if system != "Linux" or machine.lower() not in ("x86_64", "amd64", "x64"):
        return None, f"{ignored}unknown: TensorFlow's default on {system} {machine} is not " \
                     "read here"
    if flags is None:
        return None, f"{ignored}unknown: /proc/cpuinfo has no flags"
    found = [flag for flag in ONEDNN_DEFAULT_FLAGS if flag in flags]
    if found:
        return True, f"{ignored}TensorFlow's default: this CPU has {', '.join(found)}"
    return False, f"{ignored}TensorFlow's default: this CPU has no AVX512-VNNI/BF16, " \
                  "AVX-VNNI or AMX"


def onednn_state(environ: dict[str, str] | None = None, machine: str | None = None,
                 system: str | None = None) -> str:
    """Whether TensorFlow's oneDNN ops are on here (its graph rewrite to oneDNN's fused and
    16-bit kernels; float32 matrix products reach oneDNN's sgemm either way), and why, e.g.
    ``"on (TensorFlow's default: this CPU has avx512_vnni)"``: :func:`onednn_rule` in words.
    When TensorFlow is already imported, its own answer is read (``IsMklEnabled``).
    """
    environ = os.environ if environ is None else environ
    enabled, why = onednn_rule(environ.get(_ONEDNN_VARIABLE),
                               system or platform.system(), machine or platform.machine(),
                               cpu_flags() or None)
    imported = _tensorflow_uses_onednn() if environ is os.environ else None
    if imported is not None:
        enabled = imported
    return f"{'unknown' if enabled is None else 'on' if enabled else 'off'} ({why})"


def _determinism_enabled() -> bool:
    """Whether op determinism is on (False while TensorFlow is not imported)."""
    import sys

    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.framework.config import is_op_determinism_enabled  # no public one

    return bool(is_op_determinism_enabled())


def _tensorflow_uses_onednn() -> bool | None:
    """TensorFlow's own answer, when TensorFlow is imported (else ``None``)."""
    import sys

    if "tensorflow" not in sys.modules:
        return None
    try:
        from tensorflow.python.util import _pywrap_util_port  # no public getter exists
    except ImportError:  # pragma: no cover - a TensorFlow without it
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


#: The x86 flags (as Linux names them) for which TensorFlow turns oneDNN on by default: any one
#: of them (``tensorflow/core/util/port.cc``, ``DefaultOneDnnPolicy`` and ``IsMklEnabled``).
ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                        "amx_bf16")
_ONEDNN_DEFAULT_FLAGS = frozenset(ONEDNN_DEFAULT_FLAGS)


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def gpu_visibility(index: int, num_processes: int, num_gpus: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for local process ``index`` of ``num_processes``.

    One GPU each when there are at least as many GPUs as processes, none otherwise: processes
    that share a GPU would each reserve nearly all of its memory.
    """
    if num_gpus >= num_processes > index >= 0:
        return str(index)
    return ""


def course_settings(logical_cpus: int | None = None, logical_gpus: int | None = None,
                    seed: int | None = None) -> list[dict[str, str]]:
    """The settings in force in this process, as rows for ``cu.show_table``."""
    rows = [{"setting": "oneDNN ops (TF_ENABLE_ONEDNN_OPTS)", "value": onednn_state(),
             "why": "TensorFlow decides; the course leaves it alone"}]
    if logical_cpus:
        rows.append({"setting": "logical CPU devices", "value": str(logical_cpus),
                     "why": "replicas on one machine (cu.setup)"})
    if logical_gpus:
        rows.append({"setting": "logical GPU devices", "value": f"{logical_gpus}",
                     "why": "one GPU split so that strategies have several replicas; "
                            "memory growth is then ignored"})
    if seed is not None:
        rows.append({"setting": "seed", "value": str(seed),
                     "why": "repeatable numbers (cu.setup)"})
    if _determinism_enabled():
        rows.append({"setting": "op determinism", "value": "on",
                     "why": API_SETTINGS[-1].reason})
    for name, setting in ENVIRONMENT.items():
        if name in os.environ and setting.where.startswith("every lesson"):
            rows.append({"setting": name, "value": os.environ[name],
                         "why": setting.reason})
    return rows


def settings_line(seed: int | None = None, split: bool = True,
                  deterministic: bool = False) -> str:
    """The set-up cell's second line: what the course changed and what it left alone."""
    made = [*(["logical devices"] if split else []),
            *([f"seed {seed}"] if seed is not None else []),
            *(["op determinism (Keras keeps XLA off)"] if deterministic else []),
            "log filters"]
    return (f"oneDNN ops {onednn_state()} · the course set: {', '.join(made)}; "
            "nothing else (cu.settings.course_settings())")
