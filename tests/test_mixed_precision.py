"""course_utils.mixed_precision, the lesson 08 pictures and bench.time_interleaved."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import course_utils as cu  # noqa: E402
from course_utils import mixed_precision as mp  # noqa: E402


def test_number_formats_have_the_textbook_bits_and_limits():
    half, brain, single = (mp.number_format(n) for n in ("float16", "bfloat16", "float32"))
    assert (half.bits, half.exponent_bits, half.mantissa_bits) == (16, 5, 10)
    assert (brain.bits, brain.exponent_bits, brain.mantissa_bits) == (16, 8, 7)
    assert (single.bits, single.exponent_bits, single.mantissa_bits) == (32, 8, 23)
    assert half.max == 65504 and half.smallest_subnormal == 2.0**-24
    assert half.smallest_normal == 2.0**-14 and brain.epsilon == 2.0**-7
    assert brain.smallest_normal == single.smallest_normal


def test_tensor_float_32_has_float32_range_and_float16_precision():
    tf32, single, half = (mp.number_format(n) for n in (mp.TENSOR_FLOAT_32, "float32", "float16"))
    assert (tf32.bits, tf32.exponent_bits, tf32.mantissa_bits) == (19, 8, 10)
    assert tf32.smallest_normal == single.smallest_normal and tf32.epsilon == half.epsilon
    assert single.max * (1 - 2**-10) < tf32.max <= single.max


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown format"):
        mp.number_format("float8")


def test_dtype_bytes_accepts_names_and_dtypes():
    assert mp.dtype_bytes("float32") == 4 and mp.dtype_bytes("bfloat16") == 2
    assert mp.dtype_bytes(np.dtype("float16")) == 2


def test_count_new_zeros_counts_only_values_that_vanished():
    reference = [np.array([1.0, 0.0, 1e-9]), np.array([[2.0, 3.0]])]
    values = [np.array([1.0, 0.0, 0.0]), np.array([[0.0, 3.0]])]
    assert mp.count_new_zeros(reference, values) == 2
    with pytest.raises(ValueError, match="shapes differ"):
        mp.count_new_zeros([np.zeros(2)], [np.zeros(3)])


def test_cpu_precision_features_reads_the_flags_line():
    found = mp.cpu_precision_features("processor : 0\nflags : fpu avx512f avx512_bf16 sse\n")
    assert found["avx512_bf16"] and not found["avx512_fp16"]
    assert set(found) == set(mp.PRECISION_CPU_FLAGS)
    assert all(v is None for v in mp.cpu_precision_features("").values())  # unknown


AVX2_ONLY = "processor : 0\nflags : fpu sse avx avx2 f16c\n"
ALDER_LAKE = "processor : 0\nflags : fpu avx2 avx_vnni\n"
CASCADE_LAKE = "processor : 0\nflags : fpu avx2 avx512f avx512bw avx512_vnni\n"
COOPER_LAKE = "processor : 0\nflags : fpu avx2 avx512f avx512bw avx512_vnni avx512_bf16\n"
SAPPHIRE_RAPIDS = ("processor : 0\nflags : avx2 avx512f avx512bw avx512_vnni avx512_bf16 "
                   "avx512_fp16 amx_bf16 amx_tile amx_int8\n")


@pytest.mark.parametrize(("cpuinfo", "environ", "enabled", "case"), [
    (AVX2_ONLY, {}, False, "no 16-bit path"),
    (COOPER_LAKE, {}, True, "AVX512-BF16"),
    (SAPPHIRE_RAPIDS, {}, True, "AMX"),
    (COOPER_LAKE, {"TF_ENABLE_ONEDNN_OPTS": "0"}, False, "no 16-bit path"),
    # oneDNN ops on, but bfloat16 needs avx512f or avx_ne_convert (util.cc): Eigen runs it
    (AVX2_ONLY, {"TF_ENABLE_ONEDNN_OPTS": "1"}, True, "no 16-bit path"),
    (ALDER_LAKE, {}, True, "no 16-bit path"),
    (CASCADE_LAKE, {}, True, "oneDNN ops, bfloat16 emulated"),
    (CASCADE_LAKE, {"TF_ENABLE_ONEDNN_OPTS": "yes"}, True, "oneDNN ops, bfloat16 emulated"),
    (COOPER_LAKE, {"TF_ENABLE_ONEDNN_OPTS": "FALSE"}, False, "no 16-bit path"),
    ("", {}, None, "unknown"),
])
def test_onednn_state_and_case_follow_tensorflows_rule(cpuinfo, environ, enabled, case):
    state = mp.onednn_state(cpuinfo, environ, system="Linux", machine="x86_64")
    assert state["enabled"] is enabled and state["reason"]
    assert mp.precision_case(mp.cpu_precision_features(cpuinfo), state["enabled"]) == case
    assert set(mp.PRECISION_CASES) >= {case} - {"unknown"}


@pytest.mark.parametrize(("cpuinfo", "environ", "dtypes"), [
    (AVX2_ONLY, {"TF_ENABLE_ONEDNN_OPTS": "1"}, set()),
    (CASCADE_LAKE, {}, {"bfloat16"}),
    (CASCADE_LAKE, {"TF_ENABLE_ONEDNN_OPTS": "0"}, set()),
    (SAPPHIRE_RAPIDS, {}, {"bfloat16", "float16"}),
    # float16 too: avx_ne_convert alone is enough for it, without avx512bw (util.cc)
    (ALDER_LAKE.replace("avx_vnni", "avx_vnni avx_ne_convert"), {}, {"bfloat16", "float16"}),
    ("", {}, None),
])
def test_onednn_16bit_dtypes_follow_tensorflows_cpu_rule(cpuinfo, environ, dtypes):
    state = mp.onednn_state(cpuinfo, environ, system="Linux", machine="x86_64")
    features = mp.cpu_precision_features(cpuinfo)
    assert mp.onednn_16bit_dtypes(features, state["enabled"]) == dtypes


def test_onednn_state_is_unknown_off_linux_x86_and_cases_cite_a_source():
    assert mp.onednn_state(COOPER_LAKE, {}, system="Darwin", machine="arm64")["enabled"] is None
    assert mp.onednn_state(COOPER_LAKE, {}, system="Linux", machine="aarch64")["enabled"] is None
    assert mp.precision_case({}, None, gpus=1) == "GPU tensor cores"
    assert len(mp.PRECISION_CASES) == 5
    assert all("http" in row["source"] for row in mp.PRECISION_CASES.values())


# TensorFlow's own IsMklEnabled, loaded without importing the tensorflow package (its
# __init__ costs ~15 s a process; this extension module alone ~1 s): the same compiled rule.
PORT_PROBE = """
import importlib.util, pathlib, sys
import importlib.machinery as machinery
root = pathlib.Path(importlib.util.find_spec("tensorflow").submodule_search_locations[0])
path = next(p for p in (root / "python" / "util").glob("_pywrap_util_port*")
            if p.name.endswith(tuple(machinery.EXTENSION_SUFFIXES)))
spec = importlib.util.spec_from_file_location("_pywrap_util_port", path)
port = importlib.util.module_from_spec(spec)
spec.loader.exec_module(port)
assert "tensorflow" not in sys.modules
print(port.IsMklEnabled())
"""


@pytest.mark.parametrize("setting", [None, "1", "yes"])
def test_onednn_state_agrees_with_tensorflow_here(setting):
    """The rule against TensorFlow's own answer (a fresh process: it reads the variable once;
    "yes" is ignored by TensorFlow, which then uses its default)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    out = subprocess.run([sys.executable, "-c", PORT_PROBE], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()[-1]
    expected = mp.onednn_state(environ={} if setting is None else {
        "TF_ENABLE_ONEDNN_OPTS": setting})["enabled"]
    assert expected is None or out == str(expected)


def test_layer_dtypes_and_memory_follow_the_policy():
    from course_utils.training.precision import policy_scope

    with policy_scope("mixed_float16"):
        mixed = cu.models.mlp(8, 3, hidden_units=(16,))
    single = cu.models.mlp(8, 3, hidden_units=(16,))
    rows = {row["layer"]: row for row in mp.layer_dtypes(mixed)}
    assert rows["dense_0"]["compute dtype"] == "float16"
    assert rows["dense_0"]["variable dtypes"] == "float32"
    assert rows["logits"]["compute dtype"] == "float32"
    # the input layer takes the policy's compute dtype, yet its tensor stays float32: the
    # first Dense casts it
    assert rows["features"]["compute dtype"] == "float16"
    assert rows["features"]["output dtype"] == "float32"
    assert rows["dense_0"]["output dtype"] == "float16"
    mixed_memory, single_memory = mp.model_memory(mixed, 10), mp.model_memory(single, 10)
    assert mixed_memory["weights"] == single_memory["weights"] == (8 * 16 + 16 + 16 * 3 + 3) * 4
    # inputs 10x8 and logits 10x3 stay float32; the hidden 10x16 halves
    assert single_memory["activations"] == (80 + 160 + 30) * 4
    assert mixed_memory["activations"] == (80 + 30) * 4 + 160 * 2


def test_draw_number_formats_draws_one_row_per_format():
    figure = cu.plots.draw_number_formats()
    bits_axes, range_axes = figure.axes
    assert [t.get_text() for t in bits_axes.get_yticklabels()] == ["bfloat16", "float16",
                                                                   "float32"]
    assert len(range_axes.patches) == 6  # subnormal and normal bars of three formats


def test_draw_loss_scaling_marks_the_float16_limits():
    ax = cu.plots.draw_loss_scaling(np.array([1e-9, 1e-6, 0.0, 1e-3]), 2.0**15)
    assert len(ax.lines) == 3
    with pytest.raises(ValueError):
        cu.plots.draw_loss_scaling(np.zeros(3), 2.0)


def test_draw_mixed_precision_step_labels_each_dtype():
    ax = cu.plots.draw_mixed_precision_step()
    texts = [t.get_text() for t in ax.texts]
    assert "backward\nfloat16" in texts and "yes: ÷ scale\nfloat32" in texts
    # Keras checks the scaled gradients before it divides them (LossScaleOptimizer)
    assert texts.index("scaled gradients, float32\n(cast back): all finite?") < texts.index(
        "yes: ÷ scale\nfloat32")
    assert any("skip" in text for text in texts)


def test_time_interleaved_times_every_function_in_rounds():
    calls = []
    timings = cu.bench.time_interleaved({"a": lambda: calls.append("a"),
                                         "b": lambda: calls.append("b")},
                                        repeats=3, calls_per_repeat=2, warmup=1)
    assert set(timings) == {"a", "b"} and all(len(t.times) == 3 for t in timings.values())
    assert calls == ["a", "b"] + ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    with pytest.raises(ValueError):
        cu.bench.time_interleaved({"a": lambda: None}, repeats=0)


def test_cpu_model_name_reads_the_model_name_line():
    assert mp.cpu_model_name("processor : 0\nmodel name\t: AMD EPYC 9B14\nflags : fpu\n") == (
        "AMD EPYC 9B14")
    assert mp.cpu_model_name("processor : 0\n")  # falls back to the platform's name


def _payload(hardware, gpus=()):
    return {"machine": {"hardware": hardware, "gpus": list(gpus)}, "results": {
        "MLP": [{"policy": "float32", "jit_compile": False, "tf32": None, "ms_per_step": 2.0,
                 "speedup": 1.0},
                {"policy": "mixed_float16", "jit_compile": True, "tf32": None,
                 "ms_per_step": 4.0, "speedup": 0.5}]}}


def test_reference_benchmarks_are_read_and_matched_by_hardware(tmp_path):
    import json

    assert mp.reference_benchmarks(tmp_path / "absent") == []
    payloads = {"a": _payload("AMD EPYC"), "b": _payload("NVIDIA H100", ["H100"])}
    for name, payload in payloads.items():
        (tmp_path / f"mixed_precision_{name}.json").write_text(json.dumps(payload))
    (tmp_path / "other.json").write_text("{}")  # not a result of this benchmark
    found = mp.reference_benchmarks(tmp_path)
    assert [p["machine"]["hardware"] for p in found] == ["AMD EPYC", "NVIDIA H100"]
    assert mp.matching_benchmark(found, "NVIDIA H100")["machine"]["gpus"] == ["H100"]
    assert mp.matching_benchmark(found, "Intel Xeon") is None
    assert mp.matching_benchmark(found, "AMD EPYC", cpu_16bit_flags=["avx512_bf16"]) is None


def test_benchmark_rows_give_one_row_per_model_and_variant():
    rows = mp.benchmark_rows(_payload("AMD EPYC"))
    assert [(r["policy"], r["XLA (jit_compile)"], r["TF32"], r["speed-up"]) for r in rows] == [
        ("float32", False, "-", 1.0), ("mixed_float16", True, "-", 0.5)]
    payload = _payload("AMD EPYC")
    payload["method"] = {"rounds": 5}
    payload["results"]["MLP"][1]["timed_rounds"] = 1  # a variant timed once, outside the rounds
    assert [r["timed rounds"] for r in mp.benchmark_rows(payload)] == [5, 1]


def test_benchmark_caption_names_the_machine_and_the_baseline():
    payload = _payload("AMD EPYC")
    payload["machine"].update(cpu_16bit_flags=[], onednn={"enabled": False}, cpu_count=2,
                              tensorflow="2.21.0", load_average_1min=3.5)
    payload.update(date="2026-11-26", baseline="float32")
    caption = mp.benchmark_caption(payload, this_machine=True)
    assert caption.startswith("This hardware: AMD EPYC, 16-bit flags none, oneDNN ops off")
    assert "2 CPU threads" in caption and caption.endswith("speed-up over float32")
    assert mp.benchmark_caption(payload, this_machine=False).startswith("Not this machine")
    payload["machine"]["load_average_1min"] = [2.24, 5.65]  # as benchmarks/ writes it
    assert "load average 2.24 at the start, 5.65 at the end" in mp.benchmark_caption(
        payload, this_machine=True)
    payload["command"] = "python benchmarks/mixed_precision.py"  # newer results name it
    assert "made by `python benchmarks/mixed_precision.py`; speed-up" in mp.benchmark_caption(
        payload, this_machine=True)


def test_committed_reference_results_name_their_hardware_and_baseline():
    committed = mp.reference_benchmarks()
    assert committed, "benchmarks/reference/ holds at least this course's CPU result"
    for payload in committed:
        machine = payload["machine"]
        assert machine["hardware"] and machine["tensorflow"] and machine["cpu_count"]
        assert machine["onednn"]["enabled"] in (True, False) and machine["onednn"]["why"]
        assert isinstance(machine["cpu_16bit_flags"], list)
        for results in payload["results"].values():
            baseline = [r for r in results if r["policy"] == "float32" and not r["jit_compile"]
                        and not r["tf32"]]
            assert len(baseline) == 1 and baseline[0]["speedup"] == 1.0


def test_benchmark_script_names_its_file_after_the_hardware():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "mixed_precision.py"
    spec = importlib.util.spec_from_file_location("mixed_precision_benchmark", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert script.slug("AMD EPYC") == "amd_epyc"
    machine = {"hardware": "AMD EPYC", "gpus": [], "cpu_16bit_flags": ["avx512_bf16"],
               "onednn": {"enabled": True}}
    assert script.result_name(machine) == "amd_epyc_avx512_bf16_onednn_ops_on"
    assert "float32" in script.POLICIES and len(script.MODELS) >= 2
