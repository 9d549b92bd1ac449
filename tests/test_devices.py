"""course_utils.devices and course_utils.environment: hardware, logical devices, set-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

import course_utils as cu
from course_utils import devices


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def test_importing_the_package_does_not_import_tensorflow():
    result = run_python("import sys, course_utils as cu; cu.devices; cu.grading; cu.notebooks;"
                        "print('tensorflow' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_unit_tests_see_four_logical_cpus():
    import tensorflow as tf

    assert len(tf.config.list_logical_devices("CPU")) == 4


def test_hardware_reports_this_machine():
    hw = devices.hardware()
    assert hw.cpu_cores >= 1
    assert hw.logical_cpus == 4
    assert hw.accelerator in ("CPU", "GPU", "TPU")
    assert hw.tpu is devices.tpu_available()


def test_describe_machine_is_one_line_with_versions():
    line = devices.describe_machine()
    import tensorflow as tf

    assert "\n" not in line
    assert f"TensorFlow {tf.__version__}" in line
    assert "4 logical CPU device(s)" in line


def test_asking_again_for_the_same_layout_is_fine():
    assert len(devices.configure_logical_devices(4)) == 4


def test_changing_devices_after_start_says_restart_the_kernel():
    with pytest.raises(devices.LogicalDevicesError, match="Restart the kernel"):
        devices.configure_logical_devices(2)


@pytest.mark.parametrize("bad", [0, -1])
def test_configure_rejects_a_non_positive_count(bad):
    with pytest.raises(ValueError, match="at least 1"):
        devices.configure_logical_devices(bad)


def test_configure_rejects_an_unknown_device_type():
    with pytest.raises(ValueError, match="'CPU' or 'GPU'"):
        devices.configure_logical_devices(2, device_type="TPU")


def test_configure_gpu_without_a_gpu_is_a_clear_error():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no physical GPU"):
        devices.configure_logical_devices(2, device_type="GPU")


def test_tpu_detection_reads_only_the_environment(monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
    monkeypatch.setattr(devices.os.path, "exists", lambda path: False)
    assert devices.tpu_address() is None and not devices.tpu_available()
    monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.2:8470")
    assert devices.tpu_address() == "grpc://10.0.0.2:8470"
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    assert devices.tpu_address() == "my-tpu"


def test_colab_detection(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert not devices.is_colab()
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-2026")
    assert devices.is_colab()


def test_lesson_hardware_covers_every_lesson():
    rows = devices.lesson_hardware(devices.hardware())
    assert [number for number, _, _ in rows] == [f"{i:02d}" for i in range(10)]
    assert "4 logical CPU" in dict((n, use) for n, _, use in rows)["02"]


def test_doctor_prints_versions_devices_and_lessons(capsys):
    cu.doctor()
    report = capsys.readouterr().out
    for expected in ("machine report", "tensorflow", "keras", "CPU threads", "/device:CPU:3",
                     "TPU", "Colab", "02 MirroredStrategy"):
        assert expected in report


@pytest.mark.slow
def test_doctor_command_line():
    result = subprocess.run([sys.executable, "-m", "course_utils", "doctor",
                             "--logical-devices", "3"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "/device:CPU:2" in result.stdout
    assert "What each lesson will use here" in result.stdout


@pytest.mark.slow
def test_setup_in_a_fresh_process_is_quiet_safe_to_run_twice_and_another_layout_says_restart():
    # One fresh process for both properties: the same layout twice is fine, another after it
    # asks for a restart.
    code = ("import course_utils as cu\n"
            "cu.setup(logical_devices=3, seed=1)\n"
            "assert cu.setup(logical_devices=3, seed=1) is None  # no value shown under the cell\n"
            "print('logical', cu.hardware().logical_cpus)\n"
            "try:\n"
            "    cu.setup(logical_devices=2)\n"
            "except cu.devices.LogicalDevicesError as e:\n"
            "    print('RESTART' if 'Restart the kernel' in str(e) else 'OTHER')\n")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-2] == "logical 3", f"setup twice with 3 devices: {lines}"
    assert lines[0].startswith("TensorFlow ") and "3 logical CPU device(s)" in lines[0], lines
    assert "cuda" not in result.stderr.lower(), result.stderr
    assert lines[-1] == "RESTART", f"another layout afterwards should say restart: {lines}"


def test_seed_everything_makes_keras_initialisation_repeatable():
    cu.seed_everything(7)
    first = cu.models.mlp(4, 2, (8,)).get_weights()
    cu.seed_everything(7)
    second = cu.models.mlp(4, 2, (8,)).get_weights()
    assert all((a == b).all() for a, b in zip(first, second, strict=True))


def test_quiet_tensorflow_lowers_python_loggers():
    import logging

    cu.quiet_tensorflow()
    assert logging.getLogger("tensorflow").level == logging.ERROR


def test_native_stderr_is_silenced_inside_the_block_only():
    code = ("import os\n"
            "from course_utils.quiet import native_stderr_silenced\n"
            "with native_stderr_silenced():\n"
            "    os.write(2, b'hidden\\n')\n"
            "os.write(2, b'shown\\n')\n")
    result = run_python(code)
    assert result.returncode == 0
    assert "hidden" not in result.stderr and "shown" in result.stderr


def test_native_stderr_is_restored_after_an_exception():
    code = ("import os\n"
            "from course_utils.quiet import native_stderr_silenced\n"
            "try:\n"
            "    with native_stderr_silenced():\n"
            "        raise KeyError('boom')\n"
            "except KeyError:\n"
            "    os.write(2, b'after\\n')\n")
    assert "after" in run_python(code).stderr


@pytest.mark.slow
def test_import_tensorflow_is_quiet_and_devices_initialize_at_the_first_op():
    # One fresh process: import_tensorflow returns the module quietly, and the devices exist
    # neither before nor after the import, only after the first op.
    assert devices.devices_initialized()  # conftest created this process's devices
    code = ("import sys\n"
            "from course_utils import devices\n"
            "from course_utils.quiet import import_tensorflow\n"
            "before = devices.devices_initialized()\n"
            "tf = import_tensorflow()\n"
            "imported = devices.devices_initialized()\n"
            "print(tf is sys.modules['tensorflow'], import_tensorflow() is tf)\n"
            "tf.constant(1.0) + 1\n"
            "print(before, imported, devices.devices_initialized())\n")
    result = run_python(code)
    lines = result.stdout.strip().splitlines()
    assert lines[:1] == ["True True"], f"import_tensorflow: {lines}\n{result.stderr}"
    assert "cuda" not in result.stderr.lower(), result.stderr
    assert lines[1:] == ["False False True"], f"devices_initialized: {lines}\n{result.stderr}"


def test_logical_device_plan_splits_a_single_gpu_too():
    assert devices.logical_device_plan(None, 1) == {}
    assert devices.logical_device_plan(4, 0) == {"CPU": 4}
    assert devices.logical_device_plan(4, 1) == {"CPU": 4, "GPU": 4}  # Colab's T4
    assert devices.logical_device_plan(1, 1) == {"CPU": 1}
    assert devices.logical_device_plan(4, 2) == {"CPU": 4}  # real GPUs are replicas already


def test_setup_on_a_mocked_one_gpu_machine_gives_several_gpu_replicas(monkeypatch):
    """On one GPU, cu.setup splits the GPU as well, and the strategies then take every logical
    GPU: lesson 02 runs 4 replicas on a T4, not 1."""
    import tensorflow as tf

    from course_utils import environment, strategies

    fake_gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    real_list = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: (
        [fake_gpu] if kind == "GPU" else real_list(kind)))
    calls = []
    monkeypatch.setattr(devices, "configure_logical_devices",
                        lambda count, kind="CPU", limit=None: calls.append((kind, count, limit)))
    monkeypatch.setattr(devices, "describe_machine", lambda hw=None: "a mocked one-GPU machine")
    monkeypatch.setattr(devices, "hardware", lambda: None)
    environment.setup(logical_devices=4, seed=None, gpu_memory_limit_mb=2048)
    assert calls == [("CPU", 4, 2048), ("GPU", 4, 2048)]

    logical_gpus = [tf.config.LogicalDevice(name=f"/job:localhost/replica:0/task:0/device:GPU:{i}",
                                            device_type="GPU") for i in range(4)]
    real_logical = tf.config.list_logical_devices
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: (
        logical_gpus if kind == "GPU" else real_logical(kind)))
    assert strategies.replica_devices() == [device.name for device in logical_gpus]
    assert len(strategies.replica_devices(2)) == 2


def test_lesson_hardware_names_logical_gpus_on_a_split_gpu():
    one_gpu_split = devices.Hardware(cpu_cores=2, physical_cpus=1, gpus=("Tesla T4",),
                                     logical_cpus=4, logical_gpus=4, tpu=False, colab=True)
    uses = {number: use for number, _, use in devices.lesson_hardware(one_gpu_split)}
    assert uses["02"] == "MirroredStrategy over 4 logical GPU device(s)"
