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

from course_utils.settings import ONEDNN_DEFAULT_FLAGS, onednn_rule

__all__ = [
    "FORMATS",
    "PRECISION_CPU_FLAGS",
    "NumberFormat",
    "ONEDNN_DEFAULT_FLAGS",
    "ONEDNN_VARIABLE",
    "PRECISION_CASES",
    "REFERENCE_DIR",
    "TENSOR_FLOAT_32",
    "benchmark_caption",
    "benchmark_rows",
    "count_new_zeros",
    "cpu_flags",
    "cpu_model_name",
    "cpu_precision_features",
    "onednn_16bit_dtypes",
    "onednn_state",
    "precision_case",
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

#: x86 CPU flags that decide the 16-bit path (Linux ``/proc/cpuinfo`` names): TensorFlow sends
#: bfloat16 to oneDNN only with avx512f or avx_ne_convert, float16 only with avx_ne_convert or
#: with avx512bw and one of avx512_fp16/amx_fp16 (``tensorflow/core/util/util.cc``,
#: ``IsDataTypeSupportedByOneDNNOnThisCPU``); the others are 16-bit dot products and tiles.
PRECISION_CPU_FLAGS = ("avx512f", "avx512bw", "avx_ne_convert", "avx512_bf16", "avx512_fp16",
                       "amx_tile", "amx_bf16", "amx_fp16")

#: The environment variable TensorFlow reads to switch oneDNN (this module only reads it;
#: spelled in parts so that tests/test_settings.py's scan for code that sets it stays simple).
ONEDNN_VARIABLE = "_".join(("TF", "ENABLE", "ONEDNN", "OPTS"))

#: The x86 flags for which TensorFlow turns the oneDNN ops on by default on Linux: one home, in
#: ``course_utils.settings`` (which lists every setting of the course and reads oneDNN's state).

_TF_BLOG_BF16 = ("TensorFlow blog (Intel), 'Accelerating AI performance on 3rd Gen Intel Xeon "
                 "Scalable processors with TensorFlow and Bfloat16', 2020: "
                 "https://blog.tensorflow.org/2020/06/accelerating-ai-performance-on-3rd-gen-"
                 "processors-with-tensorflow-bfloat16.html")
_INTEL_AMX = ("Intel, 'Accelerate TensorFlow Machine Learning Performance using Intel AMX': "
              "https://www.intel.com/content/www/us/en/developer/articles/technical/"
              "accelerate-tensorflow-ml-performance-amx.html")
_NVIDIA = ("NVIDIA, 'Train With Mixed Precision' (Tensor Cores: 8x the float32 math "
           "throughput on Volta): https://docs.nvidia.com/deeplearning/performance/"
           "mixed-precision-training/index.html; TensorFlow guide 'Mixed precision' "
           "(more than 3x on modern GPUs): https://www.tensorflow.org/guide/mixed_precision")
_ONEDNN = ("oneDNN developer guide, 'Data Types', Hardware Limitations (low-precision support "
           "depends on the instruction set): https://oneapi-src.github.io/oneDNN/"
           "dev_guide_data_types.html; tensorflow/core/util/port.cc (DefaultOneDnnPolicy) and "
           "util.cc (IsDataTypeSupportedByOneDNNOnThisCPU: bfloat16 to oneDNN only with "
           "avx512f or avx_ne_convert, else Eigen)")
_ONEDNN_EMULATED = ("oneDNN developer guide, 'Data Types', Hardware Limitations and its "
                    "footnote: bf16 on AVX-512 without avx512_bf16 is functional support for "
                    "validation, slower than f32: https://oneapi-src.github.io/oneDNN/"
                    "dev_guide_data_types.html; tensorflow/core/util/port.cc "
                    "(DefaultOneDnnPolicy turns the oneDNN ops on with avx512_vnni)")

_AMX_RESULT = ("benchmarks/reference/mixed_precision_intel_r_xeon_r_processor_avx512f_"
               "avx512bw_avx512_bf16_avx512_fp16_amx_tile_amx_bf16_onednn_ops_on.json")
_AVX512_BF16_RESULT = ("benchmarks/reference/mixed_precision_amd_epyc_avx512f_avx512bw_"
                       "avx512_bf16_onednn_ops_on.json")

#: The hardware cases of lesson 08, section 9: what runs the 16-bit matrix products,
#: what to expect, and the source of that expectation.
PRECISION_CASES: dict[str, dict[str, str]] = {
    "no 16-bit path": {
        "hardware": "x86 CPU where the oneDNN ops stay off (none of avx512_vnni, "
                    "avx512_bf16, avx_vnni, AMX: AVX2 laptops, many cloud VMs; or switched "
                    "off in the user's environment), or on without avx512f and "
                    "avx_ne_convert (an avx_vnni CPU: TensorFlow keeps bfloat16 in Eigen)",
        "16-bit matrix products": "converted to float32 and back: the same arithmetic "
                                  "plus the casts",
        "expect": "mixed_bfloat16 and mixed_float16 no faster than float32",
        "source": _ONEDNN,
    },
    "oneDNN ops, bfloat16 emulated": {
        "hardware": "x86 CPU with the oneDNN ops on and avx512f (or avx_ne_convert) but "
                    "neither avx512_bf16 nor AMX (avx512_vnni: Intel Cascade Lake, Ice Lake)",
        "16-bit matrix products": "oneDNN's bfloat16 kernels without bfloat16 dot "
                                  "products (on AVX-512: emulated, for validation)",
        "expect": "mixed_bfloat16 matrix products slower than float32's (oneDNN: its "
                  "AVX-512 bfloat16 primitives 3-4x slower; with avx_ne_convert only, "
                  "supported via conversion, speed not given)",
        "source": _ONEDNN_EMULATED,
    },
    "AVX512-BF16": {
        "hardware": "x86 CPU with avx512_bf16 (Intel Cooper Lake, AMD Zen 4), oneDNN ops on",
        "16-bit matrix products": "bfloat16 dot products in AVX-512 (VDPBF16PS); "
                                  "float16 converted to float32 (native only with amx_fp16)",
        "expect": "mixed_bfloat16 faster than float32 for matrix-heavy steps (measured "
                  "on an AMD EPYC: about x2 and more on lesson 08's MLPs; mixed_float16 "
                  "about as fast as float32)",
        "source": f"{_TF_BLOG_BF16}; measured: {_AVX512_BF16_RESULT} and lesson 08, "
                  "section 9",
    },
    "AMX": {
        "hardware": "x86 CPU with AMX tiles (Intel Sapphire Rapids and later), oneDNN ops on",
        "16-bit matrix products": "bfloat16 (and with amx_fp16, float16) on tile "
                                  "matrix units; without amx_fp16, float16 goes to oneDNN "
                                  "through avx512_fp16",
        "expect": "mixed_bfloat16 faster than float32 (measured: about x2 on lesson 08's "
                  "MLP); without amx_fp16, "
                  "mixed_float16 far slower than float32 unless XLA compiles the step "
                  "(TensorFlow 2.21's fused float16 matrix product, measured)",
        "source": f"{_INTEL_AMX}; measured: {_AMX_RESULT} and lesson 08, section 9",
    },
    "GPU tensor cores": {
        "hardware": "NVIDIA GPU with tensor cores (V100 and later; bfloat16 from A100)",
        "16-bit matrix products": "on the tensor cores; activations move half the bytes",
        "expect": "mixed_float16 / mixed_bfloat16 faster once layers keep the GPU busy",
        "source": _NVIDIA,
    },
}


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
    """One row per layer: its policy, compute dtype, output dtype (an input layer's tensor
    keeps its own dtype, whatever its policy says: the next layer casts it) and the dtypes
    of its variables."""
    rows = []
    for layer in model.layers:
        variable_dtypes = sorted({str(v.dtype) for v in layer.weights})
        rows.append({
            "layer": layer.name,
            "policy": layer.dtype_policy.name,
            "compute dtype": str(layer.compute_dtype),
            "output dtype": str(layer.output.dtype),
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


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's flags from ``/proc/cpuinfo`` (Linux), or None where they cannot be read."""
    text = _cpuinfo(cpuinfo)
    lines = [line for line in text.splitlines() if line.startswith(("flags", "Features"))]
    if not lines:
        return None
    flags: set[str] = set()
    for line in lines:
        flags.update(line.partition(":")[2].split())
    return flags


def cpu_precision_features(cpuinfo: str | None = None) -> dict[str, bool | None]:
    """Which 16-bit fast paths this x86 CPU has (``PRECISION_CPU_FLAGS``); None: unknown."""
    flags = cpu_flags(cpuinfo)
    return {flag: None if flags is None else flag in flags for flag in PRECISION_CPU_FLAGS}


def onednn_state(
    cpuinfo: str | None = None, environ: dict[str, str] | None = None,
    system: str | None = None, machine: str | None = None,
) -> dict[str, Any]:
    """Whether TensorFlow's oneDNN ops are on here (``enabled``: True, False or None) and why.

    These are the graph rewrite to oneDNN's own (fused, bfloat16) kernels; float32 matrix
    products reach oneDNN's sgemm either way (Eigen's contraction kernel calls it).
    TensorFlow's rule, from its one home ``course_utils.settings.onednn_rule``:
    ``ONEDNN_VARIABLE`` decides when it is 0/1/false/true (another value is ignored); else, on
    Linux x86, the ops are on when the CPU has one of ``ONEDNN_DEFAULT_FLAGS``; elsewhere
    "unknown" (None).
    """
    import os
    import platform

    environ = os.environ if environ is None else environ
    flags = cpu_flags(cpuinfo)
    enabled, reason = onednn_rule(
        environ.get(ONEDNN_VARIABLE), platform.system() if system is None else system,
        platform.machine() if machine is None else machine, flags)
    return {"enabled": enabled, "reason": reason}


def onednn_16bit_dtypes(
    features: dict[str, bool | None], onednn_enabled: bool | None
) -> set[str] | None:
    """The 16-bit dtypes TensorFlow hands to oneDNN on this CPU (None: unknown).

    With the oneDNN ops on: bfloat16 with avx512f or avx_ne_convert, float16 with avx_ne_convert
    or with avx512bw and one of avx512_fp16, amx_fp16; the others fall back to Eigen
    (``tensorflow/core/util/util.cc``, ``IsDataTypeSupportedByOneDNNOnThisCPU``).
    """
    if onednn_enabled is None or None in features.values():
        return None
    if not onednn_enabled:
        return set()
    has = {flag for flag, found in features.items() if found}
    dtypes = set()
    if has & {"avx512f", "avx_ne_convert"}:
        dtypes.add("bfloat16")
    if "avx_ne_convert" in has or ("avx512bw" in has and has & {"avx512_fp16", "amx_fp16"}):
        dtypes.add("float16")
    return dtypes


def precision_case(
    features: dict[str, bool | None], onednn_enabled: bool | None, gpus: int = 0
) -> str:
    """Which of ``PRECISION_CASES`` this machine is (or ``"unknown"``)."""
    if gpus:
        return "GPU tensor cores"
    dtypes = onednn_16bit_dtypes(features, onednn_enabled)
    if dtypes is None:
        return "unknown"
    if "bfloat16" not in dtypes:
        return "no 16-bit path"
    if features.get("amx_bf16") or features.get("amx_tile"):
        return "AMX"
    if features.get("avx512_bf16"):
        return "AVX512-BF16"
    return "oneDNN ops, bfloat16 emulated"


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
    benchmarks: Iterable[dict[str, Any]], hardware: str,
    cpu_16bit_flags: Iterable[str] | None = None, onednn_enabled: bool | None = None,
) -> dict[str, Any] | None:
    """The benchmark measured on ``hardware`` (a GPU or CPU model name), or None.

    A CPU name such as "AMD EPYC" covers several generations: give the CPU's 16-bit flags
    and oneDNN state too, and only a result with the same ones matches.
    """
    for payload in benchmarks:
        machine = payload["machine"]
        if machine["hardware"] != hardware:
            continue
        if cpu_16bit_flags is not None and set(machine.get("cpu_16bit_flags", ())) != set(
                cpu_16bit_flags):
            continue
        if onednn_enabled is not None and machine.get("onednn", {}).get(
                "enabled") != onednn_enabled:
            continue
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
                         "speed-up": result["speedup"],
                         # results written before slow variants were timed once: all rounds
                         "timed rounds": result.get("timed_rounds", payload.get(
                             "method", {}).get("rounds"))})
    return rows


def benchmark_caption(payload: dict[str, Any], this_machine: bool) -> str:
    """A caption for ``benchmark_rows(payload)``: whose hardware, its 16-bit flags, oneDNN ops,
    CPU threads, TensorFlow, date and load, the command that made it (results that record
    one) and the baseline its speed-ups are over."""
    machine = payload["machine"]
    load = machine["load_average_1min"]  # [at the start, at the end] of the run, or one figure
    load_text = (f"load average {load[0]} at the start, {load[-1]} at the end"
                 if isinstance(load, list | tuple) else f"load average {load}")
    return (f"{'This hardware' if this_machine else 'Not this machine'}: "
            f"{machine['hardware']}, 16-bit flags {machine['cpu_16bit_flags'] or 'none'}, "
            f"oneDNN ops {'on' if machine['onednn']['enabled'] else 'off'}, "
            f"{machine['cpu_count']} CPU threads, TensorFlow {machine['tensorflow']}, "
            f"{payload['date']}, {load_text}; "
            + (f"made by `{payload['command']}`; " if payload.get("command") else "")
            + f"speed-up over {payload['baseline']}")
