"""cu.planning: a job's precision and accumulation chosen for the hardware, with the reason."""

from __future__ import annotations

import pytest

from course_utils import planning

MIB = 2**20


def test_a_tpu_gets_bfloat16_without_loss_scaling():
    decision = planning.choose_precision(tpu=True)
    assert decision.choice == "mixed_bfloat16" and "TPU" in decision.reason


@pytest.mark.parametrize("capabilities, expected", [
    ([(8, 0)], "mixed_float16"),
    ([(7, 0), (9, 0)], "mixed_float16"),
    ([(6, 1)], "float32"),
    ([(8, 6), (6, 0)], "float32"),  # the slowest GPU decides
])
def test_gpus_get_float16_only_with_tensor_cores(capabilities, expected):
    decision = planning.choose_precision(capabilities)
    assert decision.choice == expected
    assert f"{min(capabilities)[0]}.{min(capabilities)[1]}" in decision.reason


def test_a_cpu_stays_float32_and_says_which_fast_paths_it_has():
    plain = planning.choose_precision(cpu_features={"avx512_bf16": False, "amx_bf16": False})
    assert plain.choice == "float32" and "no 16-bit arithmetic" in plain.reason
    with_bf16 = planning.choose_precision(cpu_features={"avx512_bf16": True, "amx_bf16": False})
    assert with_bf16.choice == "float32" and "avx512_bf16" in with_bf16.reason
    assert str(with_bf16).startswith("float32 – ")


def test_step_memory_counts_weights_gradients_slots_and_activations():
    assert planning.step_memory_bytes(10, 100, 1000, optimizer_slots=2) == 4 * 1000 + 10 * 100
    assert planning.step_memory_bytes(1, 100, 1000, optimizer_slots=0) == 2 * 1000 + 100
    with pytest.raises(ValueError, match="at least 1"):
        planning.step_memory_bytes(0, 100, 1000)


def test_a_batch_that_fits_is_not_accumulated():
    decision = planning.choose_accumulation(256, 2, MIB, MIB, available_bytes=10_000 * MIB)
    assert decision.choice == 1 and "no accumulation" in decision.reason


def test_the_fewest_equal_micro_batches_that_fit_are_chosen():
    # 128 examples per replica of 1 MiB each, 4 MiB fixed; 2 × 40 MiB usable per replica:
    # k = 4 gives 32 MiB + 4 MiB = 36 MiB <= 40 MiB; k = 2 gives 68 MiB.
    decision = planning.choose_accumulation(256, 2, MIB, MIB, available_bytes=80 * MIB)
    assert decision.choice == 4
    assert "4 micro-batches of 32" in decision.reason
    per_replica = 256 // 2
    assert per_replica % decision.choice == 0


def test_unknown_memory_means_no_accumulation_and_says_so():
    decision = planning.choose_accumulation(64, 1, MIB, MIB, available_bytes=None)
    assert decision.choice == 1 and "unknown" in decision.reason


def test_accumulation_refuses_what_cannot_fit_or_split():
    with pytest.raises(ValueError, match="even one example"):
        planning.choose_accumulation(64, 1, MIB, 100 * MIB, available_bytes=10 * MIB)
    with pytest.raises(ValueError, match="does not split evenly"):
        planning.choose_accumulation(65, 2, MIB, MIB, available_bytes=10_000 * MIB)


def test_available_memory_is_shared_by_logical_cpus():
    one = planning.available_memory_bytes("CPU", 1)
    two = planning.available_memory_bytes("CPU", 2)
    assert one is not None and one > 0 and two is not None
    assert abs(two - one // 2) < one // 4  # free memory moves a little between the two reads
    with pytest.raises(ValueError, match="at least 1"):
        planning.available_memory_bytes("CPU", 0)


def test_gpu_memory_is_none_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(planning.shutil, "which", lambda name: None)
    assert planning.available_memory_bytes("GPU") is None


def test_gpu_memory_is_read_from_nvidia_smi(monkeypatch):
    class Result:
        returncode, stdout = 0, "4096\n"

    monkeypatch.setattr(planning.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(planning.subprocess, "run", lambda *args, **kwargs: Result())
    assert planning.available_memory_bytes("GPU") == 4096 * MIB


@pytest.mark.parametrize("tpu, gpus, cpus, choice, words", [
    (True, 8, 2, "tpu", "TPU is attached"),
    (False, 4, 2, "mirrored", "4 GPUs"),
    (False, 1, 2, "default", "one GPU"),  # logical CPUs are not replicas beside a GPU
    (False, 0, 2, "mirrored", "2 logical CPU devices"),
    (False, 0, 1, "default", "one CPU device"),
])
def test_the_strategy_follows_the_devices_and_says_why(tpu, gpus, cpus, choice, words):
    decision = planning.choose_strategy(tpu=tpu, num_gpus=gpus, num_cpu_devices=cpus)
    assert decision.choice == choice and words in decision.reason
    with pytest.raises(ValueError, match="negative"):
        planning.choose_strategy(num_gpus=-1)


@pytest.mark.parametrize("kwargs, choice, words", [
    ({"tpu": True}, "mixed_bfloat16", "TPU"),
    ({"gpu_compute_capabilities": [(8, 0)]}, "mixed_float16", "8.0 (tensor cores)"),
    ({"gpu_compute_capabilities": [(6, 1)]}, "mixed_float16", "no tensor cores"),
    ({"cpu_features": {"avx512_bf16": True, "avx512_fp16": True}}, "mixed_bfloat16",
     "avx512_bf16"),
    ({"cpu_features": {"avx512_bf16": False, "amx_fp16": True}}, "mixed_float16", "amx_fp16"),
    ({"cpu_features": {"avx512_bf16": False}}, "mixed_bfloat16", "no 16-bit arithmetic"),
    ({}, "mixed_bfloat16", "no 16-bit arithmetic"),
])
def test_the_sixteen_bit_candidate_is_the_format_the_hardware_computes_in(kwargs, choice, words):
    decision = planning.sixteen_bit_candidate(**kwargs)
    assert decision.choice == choice and words in decision.reason
