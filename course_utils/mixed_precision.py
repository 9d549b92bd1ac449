"""Mixed precision, measured: number formats, layer dtypes, underflow counts, memory, CPU flags.

Lesson 08 and its exercise checks use these. The training side (policy scope, loss scaling in
the Trainer) lives in ``course_utils.training.precision``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "FORMATS",
    "PRECISION_CPU_FLAGS",
    "NumberFormat",
    "REFERENCE_DIR",
    "TENSOR_FLOAT_32",
    "benchmark_rows",
    "count_new_zeros",
    "cpu_model_name",
    "cpu_precision_features",
    "matching_benchmark",
    "reference_benchmarks",
    "dtype_bytes",
    "layer_dtypes",
    "model_memory",
    "number_format",
]

#: Where ``benchmarks/mixed_precision.py`` writes its committed results (absent when the course
#: is installed from a package, as on Colab).
REFERENCE_DIR = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "reference"

#: NVIDIA's tensor-core format for float32 matrix products (Ampere and later): float32's
#: 8 exponent bits with float16's 10 mantissa bits, 19 bits held in a float32.
TENSOR_FLOAT_32 = "tensorfloat32"

#: The three floating-point formats of deep learning, widest first.
FORMATS = ("float32", "float16", "bfloat16")

#: x86 CPU flags that give 16-bit floats a fast path (Linux ``/proc/cpuinfo`` names).
PRECISION_CPU_FLAGS = ("avx512_fp16", "avx512_bf16", "amx_bf16", "amx_fp16", "amx_tile")


@dataclasses.dataclass(frozen=True)
class NumberFormat:
    """Bits, range and precision of one floating-point format."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    epsilon: float


def _numpy_dtype(name: str) -> Any:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def number_format(name: str) -> NumberFormat:
    """The :class:`NumberFormat` of ``"float32"``, ``"float16"``, ``"bfloat16"`` or TF32."""
    import ml_dtypes

    if name == TENSOR_FLOAT_32:  # no NumPy dtype: IEEE rules with 8 exponent, 10 mantissa bits
        return NumberFormat(
            name=name, bits=19, exponent_bits=8, mantissa_bits=10,
            max=float((2 - 2.0**-10) * 2.0**127), smallest_normal=2.0**-126,
            smallest_subnormal=2.0**-136, epsilon=2.0**-10,
        )
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; use one of {', '.join(FORMATS)} or "
                         f"{TENSOR_FLOAT_32!r}")
    info = ml_dtypes.finfo(_numpy_dtype(name))
    return NumberFormat(
        name=name, bits=int(info.bits), exponent_bits=int(info.nexp),
        mantissa_bits=int(info.nmant), max=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_subnormal), epsilon=float(info.eps),
    )


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given by name, NumPy, TensorFlow or Keras."""
    name = getattr(dtype, "name", dtype)
    return _numpy_dtype(str(name)).itemsize


def layer_dtypes(model: Any) -> list[dict[str, str]]:
    """One row per layer: its policy, compute dtype and the dtypes of its variables."""
    rows = []
    for layer in model.layers:
        variable_dtypes = sorted({str(v.dtype) for v in layer.weights})
        rows.append({
            "layer": layer.name,
            "policy": layer.dtype_policy.name,
            "compute dtype": str(layer.compute_dtype),
            "variable dtypes": ", ".join(variable_dtypes) or "-",
        })
    return rows


def count_new_zeros(reference: Iterable[Any], values: Iterable[Any]) -> int:
    """How many entries are zero in ``values`` but not in ``reference`` (underflow counted)."""
    total = 0
    for ref, got in zip(reference, values, strict=True):
        ref, got = np.asarray(ref, dtype=np.float32), np.asarray(got, dtype=np.float32)
        if ref.shape != got.shape:
            raise ValueError(f"shapes differ: {ref.shape} and {got.shape}")
        total += int(np.sum((got == 0) & (ref != 0)))
    return total


def model_memory(model: Any, batch_size: int) -> dict[str, int]:
    """Bytes of a functional model's weights and of one batch's layer outputs (activations)."""
    weights = sum(int(np.prod(v.shape)) * dtype_bytes(v.dtype) for v in model.weights)
    activations = 0
    for layer in model.layers:
        shape: Sequence[Any] = layer.output.shape
        elements = batch_size * int(np.prod([d for d in shape[1:]]))
        activations += elements * dtype_bytes(layer.output.dtype)
    return {"weights": weights, "activations": activations}


def cpu_precision_features(cpuinfo: str | None = None) -> dict[str, bool]:
    """Which 16-bit fast paths this x86 CPU has (``PRECISION_CPU_FLAGS``); all False elsewhere."""
    flags: set[str] = set()
    for line in _cpuinfo(cpuinfo).splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return {flag: flag in flags for flag in PRECISION_CPU_FLAGS}


def _cpuinfo(cpuinfo: str | None) -> str:
    if cpuinfo is not None:
        return cpuinfo
    path = pathlib.Path("/proc/cpuinfo")
    return path.read_text() if path.exists() else ""


def cpu_model_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (the platform's processor elsewhere)."""
    for line in _cpuinfo(cpuinfo).splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def reference_benchmarks(directory: str | pathlib.Path | None = None) -> list[dict[str, Any]]:
    """Every committed result of ``benchmarks/mixed_precision.py`` (an empty list if none)."""
    folder = pathlib.Path(directory) if directory is not None else REFERENCE_DIR
    return [json.loads(path.read_text())
            for path in sorted(folder.glob("mixed_precision_*.json"))] if folder.is_dir() else []


def matching_benchmark(
    benchmarks: Iterable[dict[str, Any]], hardware: str
) -> dict[str, Any] | None:
    """The benchmark measured on ``hardware`` (a GPU or CPU model name), or None."""
    for payload in benchmarks:
        if payload["machine"]["hardware"] == hardware:
            return payload
    return None


def benchmark_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per model and variant of a benchmark result."""
    rows = []
    for model, results in payload["results"].items():
        for result in results:
            rows.append({"model": model, "policy": result["policy"],
                         "XLA (jit_compile)": result["jit_compile"],
                         "TF32": "-" if result["tf32"] is None else result["tf32"],
                         "ms per step": result["ms_per_step"],
                         "speed-up": result["speedup"]})
    return rows
