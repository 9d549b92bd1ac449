"""TPU runtimes: what to install on Colab's TPU runtime, which branch a lesson runs on, the
chips' published sizes, and how TPUs pad shapes.

Importing this module never imports TensorFlow: Colab's TPU runtime ships none, and the point of
:func:`install_course_on_colab` (lesson 05's set-up cell) and :func:`prepare_tpu_runtime` is to
decide what to install before TensorFlow is imported. Plain ``tensorflow`` cannot drive a TPU,
and the course's own requirements ask for ``tensorflow``: on a TPU runtime, ``tensorflow-tpu``
goes in first and the course's other requirements after it, without plain TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "comparison_tolerance",
    "COURSE_DISTRIBUTION",
    "course_requirements",
    "install_course_on_colab",
    "LIBTPU_INDEX",
    "NEEDS_PLAIN_TENSORFLOW",
    "TENSORFLOW_TPU_PYTHONS",
    "TENSORFLOW_TPU_VERSION",
    "TpuRuntimePlan",
    "installed_versions",
    "padded_fraction",
    "plan_tpu_runtime",
    "prepare_tpu_runtime",
    "runtime_rows",
    "strategy_branch",
    "TPU_CHIPS",
    "TpuChip",
    "critical_batch",
    "slice_replicas",
    "tpu_failure_reason",
]

#: The newest TensorFlow build for TPUs (there is none for 2.21).
TENSORFLOW_TPU_VERSION = "2.20.0"
#: Python versions with a ``tensorflow-tpu`` 2.20.0 wheel.
TENSORFLOW_TPU_PYTHONS = ((3, 9), (3, 10), (3, 11), (3, 12), (3, 13))
#: Where ``libtpu`` wheels are published (pip's ``-f``).
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
_PACKAGES = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu")
#: The course's distribution (what ``pip install git+...`` of its repository installs).
COURSE_DISTRIBUTION = "scaling-tensorflow-course"
#: The course's requirements that would install plain ``tensorflow`` over the TPU build
#: (``tf-keras`` requires the distribution named ``tensorflow``; lesson 05 does not use it).
NEEDS_PLAIN_TENSORFLOW = ("tensorflow", "tf-keras")
_INSTALL_TPU = ("install", "-q", f"tensorflow-tpu=={TENSORFLOW_TPU_VERSION}", "-f", LIBTPU_INDEX)


@dataclasses.dataclass(frozen=True)
class TpuRuntimePlan:
    """What to do on this runtime: ``nothing``, ``install`` (``commands``) or ``explain``."""

    action: str
    message: str
    commands: tuple[tuple[str, ...], ...] = ()


def installed_versions(names: Sequence[str] = _PACKAGES) -> dict[str, str | None]:
    """The installed version of each distribution in ``names`` (None when absent)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def plan_tpu_runtime(*, colab: bool, tpu: bool, installed: Mapping[str, str | None],
                     python: tuple[int, int], tensorflow_imported: bool = False
                     ) -> TpuRuntimePlan:
    """Decide, from facts alone (nothing is contacted or installed), what a TPU runtime needs."""
    tpu_build = installed.get("tensorflow-tpu")
    plain = installed.get("tensorflow") or installed.get("tensorflow-cpu")
    if not tpu:
        return TpuRuntimePlan("nothing", "No TPU on this machine: nothing to install; the lesson "
                              "falls back to the best strategy here.")
    restart = (" TensorFlow is already imported: restart the session (Runtime > Restart "
               "session) afterwards." if tensorflow_imported else "")
    if tpu_build and plain:  # both write the same `tensorflow` package: the last one won
        broken = (f"tensorflow-tpu {tpu_build} and plain TensorFlow {plain} are both installed "
                  "and share one `tensorflow` package, so which one imports is an accident")
        uninstall = ("uninstall", "-y", "tensorflow", "tensorflow-cpu", "tensorflow-tpu")
        if not colab:
            return TpuRuntimePlan("explain", f"{broken}. Reinstall the TPU build alone: pip "
                                  f"{' '.join(uninstall)} && pip {' '.join(_INSTALL_TPU)}")
        return TpuRuntimePlan("install", f"{broken}: reinstalling tensorflow-tpu "
                              f"{TENSORFLOW_TPU_VERSION} alone." + restart,
                              (uninstall, _INSTALL_TPU))
    if tpu_build:
        return TpuRuntimePlan("nothing", f"TPU runtime with tensorflow-tpu {tpu_build}: ready.")
    python_text = f"{python[0]}.{python[1]}"
    if tuple(python) not in TENSORFLOW_TPU_PYTHONS:
        return TpuRuntimePlan("explain", f"This TPU runtime runs Python {python_text}, for which "
                              f"no tensorflow-tpu {TENSORFLOW_TPU_VERSION} wheel exists: choose a "
                              "GPU or CPU runtime (Runtime > Change runtime type) for this course.")
    replace = ("plain TensorFlow " + plain + " cannot drive a TPU (\"No OpKernel ... "
               "ConfigureDistributedTPU\", colabtools#5203)") if plain else "it ships no TensorFlow"
    if not colab:
        return TpuRuntimePlan("explain", f"A TPU is attached but {replace}. Install the TPU build "
                              f"yourself: pip install tensorflow-tpu=={TENSORFLOW_TPU_VERSION} "
                              f"-f {LIBTPU_INDEX}")
    commands: list[tuple[str, ...]] = []
    if plain:
        commands.append(("uninstall", "-y", "tensorflow", "tensorflow-cpu"))
    commands.append(_INSTALL_TPU)
    return TpuRuntimePlan("install", f"Colab TPU runtime, but {replace}: installing "
                          f"tensorflow-tpu {TENSORFLOW_TPU_VERSION} (the newest TPU build; if it "
                          "fails, choose a GPU runtime instead)." + restart, tuple(commands))


def _pip(arguments: Sequence[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pip", *arguments])


def _plan_here(colab: bool | None = None) -> TpuRuntimePlan:
    from course_utils.devices import is_colab, tpu_available  # imports no TensorFlow

    return plan_tpu_runtime(colab=is_colab() if colab is None else colab, tpu=tpu_available(),
                            installed=installed_versions(), python=sys.version_info[:2],
                            tensorflow_imported="tensorflow" in sys.modules)


def prepare_tpu_runtime(run: Callable[[Sequence[str]], int] | None = None) -> TpuRuntimePlan:
    """Print what this runtime needs and, on a Colab TPU runtime only, install it with pip."""
    plan = _plan_here()
    print(plan.message)
    for command in plan.commands:
        if (run or _pip)(command) != 0:
            print("pip failed: choose a GPU runtime (Runtime > Change runtime type) instead.")
            return dataclasses.replace(plan, action="explain")
    return plan


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def course_requirements(tpu_build: bool = False, requires: Sequence[str] | None = None
                        ) -> list[str]:
    """The course's runtime requirements (no extras); with ``tpu_build``, only those that do not
    install plain TensorFlow over the TPU build (``NEEDS_PLAIN_TENSORFLOW`` left out)."""
    if requires is None:
        requires = importlib.metadata.requires(COURSE_DISTRIBUTION) or []
    kept = []
    for requirement in requires:
        if re.search(r"extra\s*==", requirement.partition(";")[2]):
            continue
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        if tpu_build and name and _canonical(name.group(1)) in NEEDS_PLAIN_TENSORFLOW:
            continue
        kept.append(requirement.strip())
    return kept


def install_course_on_colab(report_path: str | pathlib.Path = "/tmp/course_install.json",
                            run: Callable[[Sequence[str]], int] | None = None) -> TpuRuntimePlan:
    """Lesson 05's Colab install: on a TPU runtime ``tensorflow-tpu`` first, then the course's
    requirements (without plain TensorFlow beside the TPU build); say what happened.

    The set-up cell has already installed the course itself with ``--no-deps``; this decides,
    before TensorFlow is imported, what else goes in. Elsewhere it installs the requirements as
    ``pip install`` of the course would, keeping Colab's TensorFlow.
    """
    run = run or _pip
    plan = _plan_here(colab=True)
    if plan.action != "nothing" or plan.message.startswith("TPU runtime"):
        print(plan.message)
    failed = next((command for command in plan.commands if run(command) != 0), None)
    if failed is not None:
        print("pip could not install tensorflow-tpu: this session runs on the host's CPU (the "
              "lesson falls back); for a TPU, try again later, or choose a GPU runtime.")
        plan = dataclasses.replace(plan, action="explain")
    tpu_build = installed_versions(("tensorflow-tpu",))["tensorflow-tpu"] is not None
    report = pathlib.Path(report_path)
    report.unlink(missing_ok=True)  # a report left from an earlier run would say pip worked
    run(("install", "-q", "--report", str(report), *course_requirements(tpu_build)))
    if not report.exists():
        print("pip could not install the course's requirements (its message is above)")
        return dataclasses.replace(plan, action="explain")
    print(_colab_install_summary(report, tpu_build))
    return plan


def _colab_install_summary(report: pathlib.Path, tpu_build: bool) -> str:
    """What lesson 05's Colab install did, from pip's report, in one line."""
    from course_utils.notebooks import install_summary  # imports no TensorFlow

    # the course itself went in with --no-deps just before: name its version, not "already"
    summary = install_summary(report).replace(
        "course_utils already installed",
        f"course_utils {installed_versions((COURSE_DISTRIBUTION,))[COURSE_DISTRIBUTION]} installed")
    if tpu_build:
        summary += "; left out tf-keras (it needs plain TensorFlow; lesson 05 does not use it)"
    return summary


def tpu_failure_reason(error_message: str, attached: bool) -> str:
    """Why connecting to a TPU failed, in words, from the error's text and whether a TPU is
    attached (``cu.devices.tpu_available()``): no TPU, plain TensorFlow, or another failure."""
    if not attached:
        return "no TPU is attached here"
    if "ConfigureDistributedTPU" in error_message:
        return ("plain TensorFlow cannot drive this TPU; install tensorflow-tpu "
                "(cu.tpu.prepare_tpu_runtime(), then restart the session)")
    return "a TPU is attached but could not be initialized"


def padded_fraction(shape: Sequence[int], tile: tuple[int, int] = (8, 128)) -> float:
    """The share of work that is padding when ``shape``'s last two dims are padded up to
    multiples of ``tile``: the Cloud TPU performance guide's rule ("8 X 128 vector registers",
    data "tiled into 128x8 chunks"), a model of XLA's layouts, not read from a TPU."""
    if len(shape) < 2:
        shape = (1, *shape)
    rows, cols = shape[-2], shape[-1]
    padded = math.ceil(rows / tile[0]) * tile[0] * math.ceil(cols / tile[1]) * tile[1]
    return 1 - rows * cols / padded


@dataclasses.dataclass(frozen=True)
class TpuChip:
    """One TPU generation's chip, as Google's Cloud TPU pages describe it (``source``)."""

    name: str
    tensor_cores: int  # TensorCores per chip
    devices_per_chip: int  # TPU devices (TPUStrategy replicas) per chip: 1 with megacore
    mxus_per_core: int  # matrix-multiply units per TensorCore
    mxu_size: int  # an MXU is mxu_size × mxu_size multiply-accumulate cells
    hbm_gb: int  # high-bandwidth memory per chip, in ``hbm_unit`` (GiB for v4 and v5p, GB else)
    peak_bf16_tflops: float  # peak bfloat16 compute per chip
    hbm_gbps: float  # HBM bandwidth per chip, GB/s
    source: str  # the Cloud TPU page the figures come from
    cores_in_name: bool  # the slice name counts TensorCores ("v4-8": 8 cores), not chips
    quoted: str = ""  # the rows of ``source``'s chip table the figures are copied from

    @property
    def hbm_unit(self) -> str:
        """The unit of ``hbm_gb`` as the chip's page gives it: "GiB" (v4, v5p) or "GB"."""
        return "GiB" if "GiB" in self.quoted else "GB"


#: Published chip figures, not measured by the course; ``quoted`` holds the page's own rows.
#: Pages read on 2026-11-26. Pages change and disagree: one version of the v5e page says
#: "819 GBps", another "800 GiBps"; the v6e page gives v6e 1600 GBps in this version (beside
#: 800 GBps for v5e in its comparison), 1640 GBps (beside 819) or 1638 GBps in others; each
#: chip's figures come from its own page. Megacore (v4, v5p): the chip's two TensorCores form
#: one device, so one replica per chip (JAX's ``pallas.tpu.ChipVersion`` table, "Megacore
#: support"). A slice name counts TensorCores for v4 and v5p ("v4-128 specifies a configuration
#: with TPU v4 and 128 TensorCores", Cloud TPU's types-topologies page; v5p's topology table:
#: 2x2x1 = 8 cores, 4 chips) and chips for v5e and v6e (the v5e page's AcceleratorType
#: "v$VERSION_NUMBER-$CHIP_COUNT").
TPU_CHIPS = {
    "v4": TpuChip("v4", tensor_cores=2, devices_per_chip=1, mxus_per_core=4, mxu_size=128,
                  hbm_gb=32, peak_bf16_tflops=275, hbm_gbps=1200,
                  source="https://cloud.google.com/tpu/docs/v4", cores_in_name=True,
                  quoted="Peak compute per chip (bf16): 275 TFLOPs; "
                         "HBM2 capacity and bandwidth: 32 GiB, 1200 GBps"),
    "v5e": TpuChip("v5e", tensor_cores=1, devices_per_chip=1, mxus_per_core=4, mxu_size=128,
                   hbm_gb=16, peak_bf16_tflops=197, hbm_gbps=819,
                   source="https://cloud.google.com/tpu/docs/v5e", cores_in_name=False,
                   quoted="Peak compute per chip (bf16): 197 TFLOPs; "
                          "HBM2 capacity and bandwidth: 16 GB, 819 GBps"),
    "v5p": TpuChip("v5p", tensor_cores=2, devices_per_chip=1, mxus_per_core=4, mxu_size=128,
                   hbm_gb=95, peak_bf16_tflops=459, hbm_gbps=2765,
                   source="https://cloud.google.com/tpu/docs/v5p", cores_in_name=True,
                   quoted="Peak compute per chip (BF16) (TFLOPs): 459; HBM capacity per chip "
                          "(GiB): 95; HBM bandwidth per chip (GBps): 2765"),
    "v6e": TpuChip("v6e", tensor_cores=1, devices_per_chip=1, mxus_per_core=2, mxu_size=256,
                   hbm_gb=32, peak_bf16_tflops=918, hbm_gbps=1600,
                   source="https://cloud.google.com/tpu/docs/v6e", cores_in_name=False,
                   quoted="Peak compute per chip (bf16): 918 TFLOPs; HBM capacity per chip: "
                          "32 GB; HBM bandwidth per chip: 1600 GBps"),
}


def slice_replicas(accelerator_type: str) -> int:
    """``TPUStrategy.num_replicas_in_sync`` on a one-host slice such as "v4-8" or "v5e-8"."""
    generation, _, size = accelerator_type.partition("-")
    chip = TPU_CHIPS.get(generation)
    if chip is None or not size.isdigit():
        raise ValueError(f"expected a slice like 'v4-8', one of {sorted(TPU_CHIPS)}, "
                         f"got {accelerator_type!r}")
    chips = int(size) // chip.tensor_cores if chip.cores_in_name else int(size)
    return chips * chip.devices_per_chip


def critical_batch(chip: TpuChip) -> float:
    """Rows of a bfloat16 matmul above which the chip is compute-bound: peak FLOP/s / HBM B/s.

    ``x (B×D) @ W (D×F)`` does 2·B·D·F FLOPs and moves at least 2·(B·D + D·F + B·F) bytes;
    with ``D, F`` much larger than ``B`` that is B FLOPs per byte, so compute outpaces memory
    once B exceeds peak / bandwidth (the roofline's ridge point).
    """
    return chip.peak_bf16_tflops * 1e12 / (chip.hbm_gbps * 1e9)


_BRANCH_EFFECTS = {
    "TPU": "every step compiled by XLA for the TPU; float32 matmuls in bfloat16 passes unless "
           "TensorFloat-32 is off; ops without an XLA kernel moved to the host",
    "GPU": "steps run op by op on the GPU(s) unless jit_compile=True; float32 matmuls use "
           "TensorFloat-32 on Ampere or newer unless it is off",
    "CPU fallback": "no TPU here: the TPU's rules are checked with XLA on this CPU "
                    "(jit_compile=True), and its speed cannot be shown",
}


def strategy_branch(strategy: object) -> tuple[str, str]:
    """Which branch of lesson 05 runs under ``strategy`` (``"TPU"``, ``"GPU"`` or ``"CPU
    fallback"``) and what that changes, read from the strategy's type and its replica devices."""
    if any(cls.__name__.startswith("TPUStrategy") for cls in type(strategy).__mro__):
        return "TPU", _BRANCH_EFFECTS["TPU"]
    try:
        devices = tuple(strategy.extended.worker_devices)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # the default strategy has no worker devices
        devices = ()
    if any("GPU" in str(device).upper() for device in devices):
        return "GPU", _BRANCH_EFFECTS["GPU"]
    return "CPU fallback", _BRANCH_EFFECTS["CPU fallback"]


def comparison_tolerance(branch: str) -> float:
    """The largest weight difference lesson 05 accepts between a strategy and one device after
    the same training, with TensorFloat-32 off (float32 matmuls): float32 rounding, ten times
    that on a TPU, whose float32 matmuls are then several bfloat16 passes ("one or several
    bfloat16 passes on TPU", https://docs.jax.dev/en/latest/201/precision.html; never run here)."""
    if branch not in _BRANCH_EFFECTS:
        raise ValueError(f"branch must be one of {sorted(_BRANCH_EFFECTS)}, got {branch!r}")
    return 1e-4 if branch == "TPU" else 1e-5


def runtime_rows(report_path: str | pathlib.Path = "/tmp/course_install.json"
                 ) -> list[dict[str, str]]:
    """Rows for ``cu.show_table``: which runtime this is (Colab or not, TPU attached), which
    TensorFlow build is installed, and what lesson 05's set-up cell installed here."""
    from course_utils.devices import is_colab, tpu_available  # imports no TensorFlow

    colab, tpu = is_colab(), tpu_available()
    versions = installed_versions()
    builds = ", ".join(f"{name} {version}" for name, version in versions.items() if version)
    if not colab:
        installed = "nothing: the set-up cell installs only on Colab"
    elif pathlib.Path(report_path).exists():
        installed = _colab_install_summary(pathlib.Path(report_path),
                                           tpu_build=bool(versions.get("tensorflow-tpu")))
    else:
        installed = "the course's requirements could not be installed (pip's message is above)"
    return [{"": "runtime", "here": ("Colab" if colab else "this machine")
             + (", TPU attached" if tpu else ", no TPU")},
            {"": "TensorFlow build", "here": builds or "none installed"},
            {"": "set-up cell installed", "here": installed}]
