"""What hardware is here, logical devices, Colab and TPU detection, and the ``doctor`` report."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import sys

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use
from course_utils.settings import ENVIRONMENT, onednn_state

__all__ = [
    "LESSONS", "LogicalDevicesError", "Hardware", "is_colab", "tpu_address", "tpu_available",
    "devices_initialized", "configure_logical_devices", "logical_device_plan", "hardware",
    "describe_machine",
    "lesson_hardware", "doctor_report", "doctor", "doctor_main",
]

#: Lessons and the hardware each one can use. Used by ``doctor()``.
LESSONS: tuple[tuple[str, str], ...] = (
    ("00", "Welcome and set-up"),
    ("01", "Input pipelines"),
    ("02", "MirroredStrategy"),
    ("03", "Multi-worker training"),
    ("04", "Parameter-server training"),
    ("05", "TPUs"),
    ("06", "Model parallelism"),
    ("07", "Gradient accumulation"),
    ("08", "Mixed precision"),
    ("09", "Capstone"),
)

_RESTART_MESSAGE = (
    "TensorFlow has already initialized its devices in this process, so logical devices can no "
    "longer be changed (currently {current}, asked for {wanted}). Restart the kernel "
    "(Kernel > Restart, or Runtime > Restart session on Colab) and run the set-up cell first."
)


class LogicalDevicesError(RuntimeError):
    """Logical devices were asked for after TensorFlow had initialized its devices."""


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A summary of this machine's accelerators and processors. ``cpu_cores`` is
    ``os.cpu_count()``: all the hardware threads the OS reports (two per core with
    hyper-threading), also those outside this process's affinity mask; not TensorFlow's logical
    CPU devices (``logical_cpus``)."""

    cpu_cores: int
    physical_cpus: int
    gpus: tuple[str, ...]
    logical_cpus: int
    logical_gpus: int
    tpu: bool
    colab: bool

    @property
    def accelerator(self) -> str:
        """The best accelerator present: ``"TPU"``, ``"GPU"`` or ``"CPU"``."""
        if self.tpu:
            return "TPU"
        return "GPU" if self.gpus else "CPU"


def is_colab() -> bool:
    """True when running inside Google Colab."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def tpu_address() -> str | None:
    """Where a TPU would be found: ``"local"`` on a Colab/Cloud TPU VM, a gRPC address, or None.

    This only looks at the environment and never contacts anything, so it is instant.
    """
    if os.environ.get("TPU_NAME"):
        return os.environ["TPU_NAME"]
    if os.environ.get("COLAB_TPU_ADDR"):
        return "grpc://" + os.environ["COLAB_TPU_ADDR"]
    if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"):
        return "local"
    return None


def tpu_available() -> bool:
    """True when a TPU is attached to this machine (checked without contacting any server)."""
    return tpu_address() is not None


def devices_initialized() -> bool:
    """True once TensorFlow has created its devices in this process (they are then fixed)."""
    if "tensorflow" not in sys.modules:
        return False
    tf = sys.modules["tensorflow"]
    try:
        from tensorflow.python.eager import context

        return bool(context.context()._context_handle is not None)  # noqa: SLF001
    except Exception:  # pragma: no cover - private API moved
        return tf.executing_eagerly() and False


def configure_logical_devices(
    num_devices: int, device_type: str = "CPU", memory_limit_mb: int | None = None
) -> list[str]:
    """Split the first CPU (or GPU) into ``num_devices`` logical devices; return their names.

    Must run before TensorFlow creates its devices (before the first op). Asking again for the
    layout that is already in place is fine; asking for another raises ``LogicalDevicesError``
    telling you to restart the kernel. For a GPU, ``memory_limit_mb`` is each device's share
    (default: 1024 MB).
    """
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    device_type = device_type.upper()
    if device_type not in ("CPU", "GPU"):
        raise ValueError(f"device_type must be 'CPU' or 'GPU', got {device_type!r}")
    tf = _tf()
    physical = tf.config.list_physical_devices(device_type)
    if not physical:
        raise ValueError(f"no physical {device_type} on this machine to split into logical devices")
    if device_type == "GPU":
        limit = memory_limit_mb or 1024
        config = [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * num_devices
    else:
        config = [tf.config.LogicalDeviceConfiguration()] * num_devices
    current = tf.config.get_logical_device_configuration(physical[0])
    current_count = len(current) if current else 1
    if devices_initialized():
        if current_count == num_devices:
            return [d.name for d in tf.config.list_logical_devices(device_type)]
        raise LogicalDevicesError(
            _RESTART_MESSAGE.format(
                current=f"{current_count} logical {device_type}(s)",
                wanted=f"{num_devices}",
            )
        )
    try:
        tf.config.set_logical_device_configuration(physical[0], config)
    except RuntimeError as error:  # TensorFlow initialized its devices meanwhile
        raise LogicalDevicesError(
            _RESTART_MESSAGE.format(current=f"{current_count}", wanted=f"{num_devices}")
        ) from error
    return [d.name for d in tf.config.list_logical_devices(device_type)]


def logical_device_plan(logical_devices: int | None, physical_gpus: int) -> dict[str, int]:
    """How many logical devices of each type ``cu.setup(logical_devices=...)`` creates.

    The CPU is always split. A machine with exactly one GPU (Colab's usual runtime) gets its GPU
    split too, into as many logical GPUs, so that a strategy over the GPUs has several replicas
    there as well; several physical GPUs are left whole (each is a replica already).
    """
    if not logical_devices:
        return {}
    plan = {"CPU": logical_devices}
    if physical_gpus == 1 and logical_devices > 1:
        plan["GPU"] = logical_devices
    return plan


def hardware() -> Hardware:
    """Inspect this machine: CPU threads, GPUs, logical devices, TPU and Colab."""
    tf = _tf()
    gpus = tuple(
        tf.config.experimental.get_device_details(g).get("device_name", g.name)
        for g in tf.config.list_physical_devices("GPU")
    )
    return Hardware(
        cpu_cores=os.cpu_count() or 1,
        physical_cpus=len(tf.config.list_physical_devices("CPU")),
        gpus=gpus,
        logical_cpus=len(tf.config.list_logical_devices("CPU")),
        logical_gpus=len(tf.config.list_logical_devices("GPU")),
        tpu=tpu_available(),
        colab=is_colab(),
    )


def describe_machine(hw: Hardware | None = None) -> str:
    """One line describing the machine, e.g. for the first cell of a notebook."""
    hw = hw or hardware()
    tf = _tf()
    import keras

    parts = [f"TensorFlow {tf.__version__}", f"Keras {keras.__version__}"]
    parts.append(f"{hw.cpu_cores} CPU threads")
    parts.append(f"{hw.logical_cpus} logical CPU device(s)")
    if hw.gpus:
        parts.append(f"{len(hw.gpus)} GPU(s): {', '.join(sorted(set(hw.gpus)))}")
        if hw.logical_gpus != len(hw.gpus):
            parts.append(f"{hw.logical_gpus} logical GPU device(s)")
    else:
        parts.append("no GPU")
    parts.append("TPU attached" if hw.tpu else "no TPU")
    if hw.colab:
        parts.append("Colab")
    return " · ".join(parts)


def lesson_hardware(hw: Hardware) -> list[tuple[str, str, str]]:
    """For each lesson: (number, title, what it will use on this machine)."""
    replicas = max(hw.logical_gpus, len(hw.gpus)) or hw.logical_cpus
    device = ("logical GPU" if hw.logical_gpus > len(hw.gpus) else "GPU") if hw.gpus else (
        "logical CPU")
    uses = {
        "00": f"{device} devices for the baseline",
        "01": f"parallel map and prefetch on the CPU ({hw.cpu_cores} threads; tf.data's pool: "
        "those this process may use)",
        "02": f"MirroredStrategy over {replicas} {device} device(s)",
        "03": "a 2-worker cluster of local processes, "
        + ("a GPU each" if len(hw.gpus) >= 2 else "on the CPU"),
        "04": "in-process workers and parameter servers on localhost",
        "05": "the TPU" if hw.tpu else "CPU fallback (no TPU here); TPU rules checked on CPU",
        "06": f"manual placement and pipelines over {replicas} {device} device(s)",
        "07": f"gradient accumulation on {device}s",
        "08": "mixed precision on the GPU" if hw.gpus
        else "mixed precision on the CPU: faster only with a 16-bit path (measured)",
        "09": f"the best strategy for {hw.accelerator}",
    }
    return [(number, title, uses[number]) for number, title in LESSONS]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def doctor_report() -> str:
    """The text of ``doctor()``: versions, devices, TPU/Colab, and what each lesson can use."""
    hw = hardware()
    tf = _tf()
    lines = ["Scaling TensorFlow · machine report", ""]
    lines.append(f"Python               {platform.python_version()} ({sys.executable})")
    lines.append(f"Platform             {platform.platform()}")
    for package in ("tensorflow", "keras", "tf-keras", "tensorflow-datasets", "numpy",
                    "jupyterlab", "ipywidgets", "course_utils"):
        name = "scaling-tensorflow-course" if package == "course_utils" else package
        lines.append(f"{package:<21}{_version(name)}")
    lines.append("")
    lines.append(f"CPU threads          {hw.cpu_cores}")
    logical = ", ".join(d.name for d in tf.config.list_logical_devices())
    gpu_names = f" ({', '.join(hw.gpus)})" if hw.gpus else ""
    lines.append(f"GPUs                 {len(hw.gpus)}{gpu_names}")
    lines.append(f"Logical devices      {logical}")
    lines.append(f"TPU                  {'yes, at ' + str(tpu_address()) if hw.tpu else 'no'}")
    lines.append(f"Colab                {'yes' if hw.colab else 'no'}")
    lines.append(f"Built with CUDA      {tf.test.is_built_with_cuda()}")
    lines.append("")
    lines.append("Settings (TensorFlow's defaults unless listed; course_utils/settings.py):")
    lines.append(f"  oneDNN ops (graph rewrite)  {onednn_state()}")
    if hw.logical_gpus > len(hw.gpus) == 1:
        lines.append(f"  one GPU split into {hw.logical_gpus} logical GPUs (memory growth is "
                     "then ignored)")
    for name in sorted(ENVIRONMENT):
        if name in os.environ and ENVIRONMENT[name].where.startswith("every lesson"):
            lines.append(f"  {name}={os.environ[name]}  ({ENVIRONMENT[name].reason})")
    lines.append("")
    lines.append("What each lesson will use here:")
    for number, title, use in lesson_hardware(hw):
        lines.append(f"  {number} {title:<28}{use}")
    return "\n".join(lines)


def doctor() -> None:
    """Print a readable report of this machine and what each lesson can use on it."""
    print(doctor_report())


def doctor_main(argv: list[str]) -> int:
    """``python -m course_utils doctor [--logical-devices N]``: print the machine report."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_utils doctor",
                                     description=doctor.__doc__)
    parser.add_argument("--logical-devices", type=int, default=None,
                        help="split the CPU into N logical devices first")
    args = parser.parse_args(argv)
    if args.logical_devices:
        configure_logical_devices(args.logical_devices)
    doctor()
    return 0
