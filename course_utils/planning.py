"""A training job's choices for the hardware at hand, each with the reason that decided it (09).

Lesson 09 does not hard-code "use mixed precision" or "accumulate 4 batches": it asks what this
machine has and prints the answer with its reason, so the same notebook makes other choices on
a GPU or a TPU. Every function here is pure (the hardware is passed in), so each rule is tested
for every kind of machine on any machine.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "Decision",
    "available_memory_bytes",
    "choose_accumulation",
    "choose_precision",
    "choose_strategy",
    "sixteen_bit_candidate",
    "step_memory_bytes",
]

#: GPU compute capability from which tensor cores multiply float16 (Volta, V100).
TENSOR_CORES_FROM = (7, 0)
#: The share of the free memory a step may plan to use: the activation count is a lower bound,
#: and the framework, the input pipeline and fragmentation need the rest.
DEFAULT_HEADROOM = 0.5
_MIB = 2**20


def _mib(num_bytes: float) -> str:
    """Bytes as MiB, with the digits that matter: "5,120 MiB", "0.83 MiB"."""
    value = num_bytes / _MIB
    return f"{value:,.0f} MiB" if value >= 100 else f"{value:.3g} MiB"


@dataclasses.dataclass(frozen=True)
class Decision:
    """A choice (``choice``) and the reason the code found for it (``reason``)."""

    choice: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.choice} – {self.reason}"


def choose_strategy(tpu: bool = False, num_gpus: int = 0, num_cpu_devices: int = 1) -> Decision:
    """The strategy ``cu.make_strategy("auto")`` picks here, by name, and why.

    ``num_cpu_devices`` counts the logical CPU devices (``cu.setup(logical_devices=...)``); they
    are replicas only when there is no GPU, as in ``cu.strategies.replica_devices``.
    """
    if num_gpus < 0 or num_cpu_devices < 0:
        raise ValueError(f"device counts cannot be negative: {num_gpus} GPU(s), "
                         f"{num_cpu_devices} CPU device(s)")
    if tpu:
        return Decision("tpu", "a TPU is attached: one replica per TPU core")
    if num_gpus > 1:
        return Decision("mirrored", f"no TPU; {num_gpus} GPUs: one replica on each, mirrored")
    if num_gpus == 1:
        return Decision("default", "no TPU; one GPU: nothing to mirror over, the default "
                        "strategy runs on it")
    if num_cpu_devices > 1:
        return Decision("mirrored", f"no TPU, no GPU; {num_cpu_devices} logical CPU devices: "
                        "mirrored over them (they share the same cores)")
    return Decision("default", "no TPU, no GPU, one CPU device: nothing to mirror over")


def sixteen_bit_candidate(
    gpu_compute_capabilities: Sequence[tuple[int, int]] = (),
    tpu: bool = False,
    cpu_features: Mapping[str, bool] | None = None,
) -> Decision:
    """The mixed-precision policy worth measuring against float32 on this hardware, and why.

    A TPU, and a CPU with bfloat16 instructions (``avx512_bf16``, ``amx_bf16``), compute in
    bfloat16; GPUs and CPUs with float16 units (tensor cores, ``avx512_fp16``, ``amx_fp16``) in
    float16. Elsewhere bfloat16: it needs no loss scaling, and a CPU converts it cheaply.
    """
    features = {flag for flag, present in (cpu_features or {}).items() if present}
    if tpu:
        return Decision("mixed_bfloat16", "a TPU's matrix units multiply bfloat16")
    if gpu_compute_capabilities:
        slowest = min(gpu_compute_capabilities)
        cores = "tensor cores" if slowest >= TENSOR_CORES_FROM else "no tensor cores"
        return Decision("mixed_float16", f"GPUs of compute capability "
                        f"{slowest[0]}.{slowest[1]} ({cores}) compute in float16")
    bf16 = sorted(features & {"avx512_bf16", "amx_bf16"})
    if bf16:
        return Decision("mixed_bfloat16", f"this CPU has {', '.join(bf16)}: bfloat16 has a fast "
                        "path here")
    fp16 = sorted(features & {"avx512_fp16", "amx_fp16"})
    if fp16:
        return Decision("mixed_float16", f"this CPU has {', '.join(fp16)}: float16 has a fast "
                        "path here")
    return Decision("mixed_bfloat16", "this CPU has no 16-bit arithmetic: bfloat16, the cheaper "
                    "format to convert and free of loss scaling, shows what the casts cost")


def choose_precision(
    gpu_compute_capabilities: Sequence[tuple[int, int]] = (),
    tpu: bool = False,
    cpu_features: Mapping[str, bool] | None = None,
) -> Decision:
    """The Keras dtype policy that pays on this hardware: TPU, tensor-core GPU, or CPU.

    ``gpu_compute_capabilities`` holds one ``(major, minor)`` per GPU (empty: no GPU);
    ``cpu_features`` maps x86 flags to presence (``cu.mixed_precision.cpu_precision_features()``).
    """
    if tpu:
        return Decision("mixed_bfloat16", "a TPU's matrix units multiply bfloat16 natively, and "
                        "bfloat16 has float32's range: no loss scaling is needed")
    if gpu_compute_capabilities:
        slowest = min(gpu_compute_capabilities)
        version = f"{slowest[0]}.{slowest[1]}"
        if slowest >= TENSOR_CORES_FROM:
            return Decision("mixed_float16", f"every GPU has compute capability {version} "
                            "(tensor cores): float16 matrix products run on them, up to about "
                            "twice float32's speed when layers are wide enough to keep them busy "
                            "(a small model is launch-bound and gains little: the benchmark "
                            "measures it), and activations take half the memory")
        return Decision("float32", f"a GPU of compute capability {version} has no tensor cores "
                        "(they start at 7.0): float16 saves memory but little or no time")
    flags = sorted(flag for flag, present in (cpu_features or {}).items() if present)
    if flags:
        return Decision("float32", f"no accelerator; this CPU has {', '.join(flags)}, so "
                        "bfloat16 has a fast path, but on a model this small the casts cost "
                        "what it saves (lesson 08): measure before switching")
    return Decision("float32", "no accelerator, and this CPU has no 16-bit arithmetic (no "
                    "avx512_fp16, avx512_bf16 or AMX): oneDNN computes float16 and bfloat16 in "
                    "float32 plus casts, so mixed precision only adds work (lesson 08)")


def step_memory_bytes(
    per_replica_batch: int, activation_bytes_per_example: int, weight_bytes: int,
    optimizer_slots: int = 2,
) -> int:
    """Bytes one replica holds during a step: weights, gradients, optimizer slots, activations.

    ``optimizer_slots`` is 2 for Adam, 1 for SGD with momentum, 0 for plain SGD.
    """
    if per_replica_batch < 1:
        raise ValueError(f"per_replica_batch must be at least 1, got {per_replica_batch}")
    return (2 + optimizer_slots) * weight_bytes + per_replica_batch * activation_bytes_per_example


def choose_accumulation(
    global_batch: int, num_replicas: int, activation_bytes_per_example: int, weight_bytes: int,
    available_bytes: int | None, *, optimizer_slots: int = 2,
    headroom: float = DEFAULT_HEADROOM,
) -> Decision:
    """The fewest micro-batches per update (``k``) whose step fits each replica's memory.

    ``k`` divides the per-replica batch, so every micro-batch has the same size. The step may
    use ``headroom`` of ``available_bytes`` (per replica); ``None`` means unknown: then ``k=1``.
    Raises ValueError when even one example per replica does not fit.
    """
    if global_batch % num_replicas:
        raise ValueError(f"a global batch of {global_batch} does not split evenly over "
                         f"{num_replicas} replicas")
    per_replica = global_batch // num_replicas
    need = step_memory_bytes(per_replica, activation_bytes_per_example, weight_bytes,
                             optimizer_slots)
    if available_bytes is None:
        return Decision(1, f"the free memory is unknown here; a step needs about "
                        f"{_mib(need)} per replica: accumulate only if it fails")
    budget = available_bytes * headroom
    plan = (f"{_mib(budget)} per replica may be used ({headroom:.0%} of "
            f"{_mib(available_bytes)} free)")
    for k in (k for k in range(1, per_replica + 1) if per_replica % k == 0):
        micro = per_replica // k
        need = step_memory_bytes(micro, activation_bytes_per_example, weight_bytes,
                                 optimizer_slots)
        if need <= budget:
            if k == 1:
                return Decision(1, f"the whole batch fits: a step needs {_mib(need)} "
                                f"per replica, and {plan}: no accumulation")
            return Decision(k, f"{per_replica} examples per replica would not fit; "
                            f"{k} micro-batches of {micro} need {_mib(need)} each, "
                            f"and {plan}")
    raise ValueError(f"even one example per replica needs {_mib(need)} and {plan}: "
                     "use a smaller model, mixed precision or more devices")


def available_memory_bytes(device_type: str = "CPU", num_devices: int = 1) -> int | None:
    """Free memory per device: host RAM shared by ``num_devices`` logical CPUs, or the first
    GPU's free memory (``nvidia-smi``); None when it cannot be read."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    if device_type.upper() == "GPU":
        return _gpu_free_bytes()
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency of the course
        return None
    return int(psutil.virtual_memory().available) // num_devices


def _gpu_free_bytes() -> int | None:
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        result = subprocess.run(
            [executable, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=False,
            env={**os.environ, "LC_ALL": "C"})
        return int(float(result.stdout.split()[0]) * _MIB) if result.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
