"""TPU runtimes: what to install on Colab's TPU runtime, and how TPUs pad shapes.

Importing this module never imports TensorFlow: Colab's TPU runtime ships none, and the point of
:func:`prepare_tpu_runtime` is to decide what to install before TensorFlow is imported.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "LIBTPU_INDEX",
    "TENSORFLOW_TPU_PYTHONS",
    "TENSORFLOW_TPU_VERSION",
    "TpuRuntimePlan",
    "installed_versions",
    "padded_fraction",
    "plan_tpu_runtime",
    "prepare_tpu_runtime",
]

#: The newest TensorFlow build for TPUs (there is none for 2.21).
TENSORFLOW_TPU_VERSION = "2.20.0"
#: Python versions with a ``tensorflow-tpu`` 2.20.0 wheel.
TENSORFLOW_TPU_PYTHONS = ((3, 9), (3, 10), (3, 11), (3, 12), (3, 13))
#: Where ``libtpu`` wheels are published (pip's ``-f``).
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
_PACKAGES = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu")


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
    commands.append(("install", "-q", f"tensorflow-tpu=={TENSORFLOW_TPU_VERSION}",
                     "-f", LIBTPU_INDEX))
    restart = (" TensorFlow is already imported: restart the session (Runtime > Restart session)"
               " afterwards." if tensorflow_imported or plain else "")
    return TpuRuntimePlan("install", f"Colab TPU runtime, but {replace}: installing "
                          f"tensorflow-tpu {TENSORFLOW_TPU_VERSION} (the newest TPU build; if it "
                          "fails, choose a GPU runtime instead)." + restart, tuple(commands))


def _pip(arguments: Sequence[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pip", *arguments])


def prepare_tpu_runtime(run: Callable[[Sequence[str]], int] | None = None) -> TpuRuntimePlan:
    """Print what this runtime needs and, on a Colab TPU runtime only, install it with pip."""
    from course_utils.devices import is_colab, tpu_available

    plan = plan_tpu_runtime(colab=is_colab(), tpu=tpu_available(), installed=installed_versions(),
                            python=sys.version_info[:2],
                            tensorflow_imported="tensorflow" in sys.modules)
    print(plan.message)
    for command in plan.commands:
        if (run or _pip)(command) != 0:
            print("pip failed: choose a GPU runtime (Runtime > Change runtime type) instead.")
            return dataclasses.replace(plan, action="explain")
    return plan


def padded_fraction(shape: Sequence[int], tile: tuple[int, int] = (8, 128)) -> float:
    """The share of a TPU tile layout that is padding when ``shape``'s last two dims are padded
    up to multiples of ``tile`` (8 sublanes by 128 lanes)."""
    if len(shape) < 2:
        shape = (1, *shape)
    rows, cols = shape[-2], shape[-1]
    padded = math.ceil(rows / tile[0]) * tile[0] * math.ceil(cols / tile[1]) * tile[1]
    return 1 - rows * cols / padded
