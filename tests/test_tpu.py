"""course_utils.tpu: what each runtime needs (simulated, nothing installed) and tile padding."""

from __future__ import annotations

import json
import re
import sys

import pytest

from course_utils import tpu

NONE = {"tensorflow": None, "tensorflow-cpu": None, "tensorflow-tpu": None}


def plan(**overrides):
    facts = {"colab": True, "tpu": True, "installed": NONE, "python": (3, 12)}
    facts.update(overrides)
    return tpu.plan_tpu_runtime(**facts)


def test_no_tpu_means_nothing_to_do_on_colab_and_elsewhere():
    for colab in (True, False):
        result = plan(colab=colab, tpu=False, installed={**NONE, "tensorflow": "2.21.0"})
        assert result.action == "nothing" and result.commands == ()
        assert "No TPU" in result.message


def test_colab_tpu_without_tensorflow_installs_the_tpu_build_only():
    result = plan()
    assert result.action == "install"
    assert result.commands == (("install", "-q", "tensorflow-tpu==2.20.0", "-f",
                                tpu.LIBTPU_INDEX),)
    assert "restart" not in result.message.lower()


def test_colab_tpu_with_plain_tensorflow_replaces_it_and_asks_for_a_restart_if_imported():
    result = plan(installed={**NONE, "tensorflow": "2.21.0"})
    assert result.action == "install"
    assert result.commands == (("uninstall", "-y", "tensorflow", "tensorflow-cpu"),
                               ("install", "-q", "tensorflow-tpu==2.20.0", "-f", tpu.LIBTPU_INDEX))
    assert "ConfigureDistributedTPU" in result.message and "Restart" not in result.message
    imported = plan(installed={**NONE, "tensorflow": "2.21.0"}, tensorflow_imported=True)
    assert imported.commands == result.commands and "Restart session" in imported.message


def test_tpu_build_and_plain_tensorflow_together_are_broken():
    both = {**NONE, "tensorflow": "2.21.0", "tensorflow-tpu": "2.20.0"}
    result = plan(installed=both)
    assert result.action == "install" and "both installed" in result.message
    assert result.commands == (
        ("uninstall", "-y", "tensorflow", "tensorflow-cpu", "tensorflow-tpu"),
        ("install", "-q", "tensorflow-tpu==2.20.0", "-f", tpu.LIBTPU_INDEX))
    elsewhere = plan(colab=False, installed=both)
    assert elsewhere.action == "explain" and elsewhere.commands == ()
    assert "pip uninstall -y tensorflow tensorflow-cpu tensorflow-tpu && pip install" in (
        elsewhere.message)


def test_a_ready_tpu_runtime_needs_nothing():
    result = plan(installed={**NONE, "tensorflow-tpu": "2.20.0"})
    assert result.action == "nothing" and "ready" in result.message


def test_an_unsupported_python_is_explained_not_installed():
    result = plan(python=(3, 14))
    assert result.action == "explain" and result.commands == ()
    assert "3.14" in result.message and "GPU" in result.message


def test_a_tpu_outside_colab_is_explained_with_the_command():
    result = plan(colab=False)
    assert result.action == "explain" and result.commands == ()
    assert "pip install tensorflow-tpu==2.20.0" in result.message


def test_prepare_runs_pip_only_where_the_plan_says(monkeypatch, capsys):
    from course_utils import devices

    calls = []
    monkeypatch.setattr(devices, "is_colab", lambda: True)
    monkeypatch.setattr(devices, "tpu_available", lambda: False)
    assert tpu.prepare_tpu_runtime(run=calls.append).action == "nothing"
    assert calls == [] and "No TPU" in capsys.readouterr().out

    monkeypatch.setattr(devices, "tpu_available", lambda: True)
    monkeypatch.setattr(tpu, "installed_versions", lambda names=(): dict(NONE))
    monkeypatch.setattr(sys, "version_info", (3, 12, 0))
    result = tpu.prepare_tpu_runtime(run=lambda command: calls.append(command) or 0)
    assert result.action == "install" and calls == list(result.commands)


def test_prepare_says_what_to_choose_when_pip_fails(monkeypatch, capsys):
    from course_utils import devices

    monkeypatch.setattr(devices, "is_colab", lambda: True)
    monkeypatch.setattr(devices, "tpu_available", lambda: True)
    monkeypatch.setattr(tpu, "installed_versions", lambda names=(): dict(NONE))
    monkeypatch.setattr(sys, "version_info", (3, 12, 0))
    assert tpu.prepare_tpu_runtime(run=lambda command: 1).action == "explain"
    assert "choose a GPU runtime" in capsys.readouterr().out


COURSE = ["tensorflow<3,>=2.20", "keras<4,>=3.13", "tf-keras<3,>=2.20", "numpy<3,>=2.0",
          'pytest<10,>=9.2; extra == "dev"', 'tomli>=2; python_version < "3.11"']


def test_course_requirements_leave_out_extras_and_on_tpu_plain_tensorflow():
    assert tpu.course_requirements(requires=COURSE) == [
        "tensorflow<3,>=2.20", "keras<4,>=3.13", "tf-keras<3,>=2.20", "numpy<3,>=2.0",
        'tomli>=2; python_version < "3.11"']
    assert tpu.course_requirements(tpu_build=True, requires=COURSE) == [
        "keras<4,>=3.13", "numpy<3,>=2.0", 'tomli>=2; python_version < "3.11"']
    def names(requirements):
        return {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower().replace("_", "-")
                for r in requirements}

    everything = names(tpu.course_requirements())  # the course's own metadata
    assert {"tensorflow", "tf-keras", "tensorflow-datasets"} <= everything
    assert everything - names(tpu.course_requirements(tpu_build=True)) == {"tensorflow",
                                                                          "tf-keras"}


class FakeColab:
    """A Colab runtime for install_course_on_colab: pip calls recorded, packages tracked."""

    def __init__(self, monkeypatch, tmp_path, tpu_attached, installed, fail=()):
        from course_utils import devices

        self.installed, self.calls, self.fail = dict(installed), [], fail
        self.report = tmp_path / "report.json"
        monkeypatch.setattr(devices, "tpu_available", lambda: tpu_attached)
        monkeypatch.setattr(tpu, "installed_versions", lambda names=tpu._PACKAGES: {
            name: self.installed.get(name) for name in names})
        monkeypatch.setattr(tpu, "course_requirements", lambda tpu_build=False: [
            r for r in ("tensorflow>=2.20", "tf-keras>=2.20", "numpy>=2")
            if not (tpu_build and r.startswith(("tensorflow", "tf-keras")))])
        monkeypatch.setattr(sys, "version_info", (3, 12, 0))

    def pip(self, command):
        self.calls.append(tuple(command))
        if command[0] in self.fail:
            return 1
        if command[0] == "uninstall":
            for name in command[2:]:
                self.installed[name] = None
        elif any(part.startswith("tensorflow-tpu==") for part in command):
            self.installed["tensorflow-tpu"] = "2.20.0"
        elif "--report" in command:
            self.report.write_text(json.dumps({"install": [
                {"metadata": {"name": "portpicker", "version": "1.6.0"}}]}))
        return 0

    def run(self):
        return tpu.install_course_on_colab(self.report, run=self.pip)


def test_colab_tpu_install_puts_the_tpu_build_in_before_the_course(monkeypatch, tmp_path, capsys):
    colab = FakeColab(monkeypatch, tmp_path, True, {**NONE, "scaling-tensorflow-course": "0.1.0"})
    assert colab.run().action == "install"
    assert colab.calls == [
        ("install", "-q", "tensorflow-tpu==2.20.0", "-f", tpu.LIBTPU_INDEX),
        ("install", "-q", "--report", str(colab.report), "numpy>=2")]  # no plain TensorFlow
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Colab TPU runtime, but it ships no TensorFlow: installing")
    assert out[1].startswith("course_utils 0.1.0 installed;") and "left out tf-keras" in out[1]
    assert len(out) == 2

    colab.calls.clear()  # run again (the set-up cell after a restart): no loop, nothing replaced
    assert colab.run().action == "nothing"
    assert colab.calls == [("install", "-q", "--report", str(colab.report), "numpy>=2")]
    assert capsys.readouterr().out.startswith("TPU runtime with tensorflow-tpu 2.20.0: ready.")


def test_colab_install_without_a_tpu_keeps_colabs_tensorflow(monkeypatch, tmp_path, capsys):
    colab = FakeColab(monkeypatch, tmp_path, False, {**NONE, "tensorflow": "2.20.0"})
    assert colab.run().action == "nothing"
    assert colab.calls == [("install", "-q", "--report", str(colab.report), "tensorflow>=2.20",
                            "tf-keras>=2.20", "numpy>=2")]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "No TPU" not in out[0] and "added 1 other package" in out[0]


def test_colab_tpu_install_repairs_two_tensorflows(monkeypatch, tmp_path, capsys):
    colab = FakeColab(monkeypatch, tmp_path, True,
                      {**NONE, "tensorflow": "2.21.0", "tensorflow-tpu": "2.20.0"})
    colab.run()
    assert [call[0] for call in colab.calls] == ["uninstall", "install", "install"]
    assert colab.installed["tensorflow"] is None and colab.installed["tensorflow-tpu"]
    assert colab.calls[-1][-1] == "numpy>=2"


def test_colab_tpu_install_that_fails_still_installs_the_course(monkeypatch, tmp_path, capsys):
    colab = FakeColab(monkeypatch, tmp_path, True, dict(NONE), fail=("install",))
    assert colab.run().action == "explain"
    assert colab.calls[-1] == ("install", "-q", "--report", str(colab.report),
                               "tensorflow>=2.20", "tf-keras>=2.20", "numpy>=2")
    out = capsys.readouterr().out
    assert "pip could not install tensorflow-tpu" in out and "GPU runtime" in out
    assert "pip could not install the course's requirements" in out  # the report is missing


def test_tpu_failure_reason_names_plain_tensorflow_only_when_a_tpu_is_attached():
    message = "No OpKernel was registered to support Op 'ConfigureDistributedTPU' used by ..."
    assert tpu.tpu_failure_reason(message, attached=False) == "no TPU is attached here"
    assert tpu.tpu_failure_reason(message, attached=True).startswith(
        "plain TensorFlow cannot drive this TPU; install tensorflow-tpu")
    assert "could not be initialized" in tpu.tpu_failure_reason("Socket closed", attached=True)


def test_installed_versions_reads_metadata():
    versions = tpu.installed_versions(("pytest", "surely-not-installed-package"))
    assert versions["pytest"] and versions["surely-not-installed-package"] is None


@pytest.mark.parametrize(("shape", "expected"), [
    ((8, 128), 0.0), ((128, 256), 0.0), ((8, 64), 0.5), ((4, 128), 0.5), ((10,), 1 - 10 / 1024),
])
def test_padded_fraction(shape, expected):
    assert tpu.padded_fraction(shape) == pytest.approx(expected)


def test_the_tpu_module_does_not_import_tensorflow():
    import subprocess

    code = ("import sys, course_utils.tpu as t; t.plan_tpu_runtime(colab=False, tpu=False, "
            "installed={}, python=(3, 12)); t.install_course_on_colab('/nonexistent/r.json', "
            "run=lambda command: 0); print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_draw_tpu_host_loop_counts_round_trips():
    import matplotlib

    matplotlib.use("Agg")
    from course_utils import plots

    axes = plots.draw_tpu_host_loop(steps=8, steps_per_execution=4)
    assert "8 calls" in axes[0].get_title() and "2 calls" in axes[1].get_title()
    with pytest.raises(ValueError):
        plots.draw_tpu_host_loop(steps_per_execution=0)


# --- lesson 05's branch, tolerance, runtime table and drawings (the TPU only mocked) ---------


class TPUStrategy:  # stands in for tf.distribute.TPUStrategy: the name is what is read
    num_replicas_in_sync = 1


class _Extended:
    def __init__(self, devices):
        self._devices = devices

    @property
    def worker_devices(self):
        if self._devices is None:
            raise RuntimeError("worker_devices() method unsupported by default strategy")
        return self._devices


class _Strategy:
    def __init__(self, devices):
        self.extended = _Extended(devices)


class TPUStrategyV2(TPUStrategy):
    pass


def test_strategy_branch_tells_tpu_gpu_and_cpu_fallback_apart():
    assert tpu.strategy_branch(TPUStrategy())[0] == "TPU"
    assert tpu.strategy_branch(TPUStrategyV2())[0] == "TPU"  # read from the type's ancestry
    gpus = _Strategy(("/job:localhost/replica:0/task:0/device:GPU:0",))
    assert tpu.strategy_branch(gpus)[0] == "GPU"
    assert tpu.strategy_branch(_Strategy(("/device:CPU:0", "/device:CPU:1")))[0] == "CPU fallback"
    assert tpu.strategy_branch(_Strategy(None))[0] == "CPU fallback"  # the default strategy
    assert "bfloat16" in tpu.strategy_branch(TPUStrategy())[1]


def test_strategy_branch_of_real_strategies_here_is_the_cpu_fallback():
    import tensorflow as tf

    assert tpu.strategy_branch(tf.distribute.get_strategy())[0] == "CPU fallback"
    assert tpu.strategy_branch(tf.distribute.OneDeviceStrategy("/cpu:0"))[0] == "CPU fallback"


def test_comparison_tolerance_is_float32_rounding_and_looser_on_a_tpu():
    assert tpu.comparison_tolerance("CPU fallback") == tpu.comparison_tolerance("GPU") == 1e-5
    assert tpu.comparison_tolerance("TPU") == 1e-4
    with pytest.raises(ValueError, match="branch must be one of"):
        tpu.comparison_tolerance("tpu")


def test_runtime_rows_say_what_runs_here_and_what_was_installed(monkeypatch, tmp_path):
    monkeypatch.setattr("course_utils.devices.is_colab", lambda: False)
    monkeypatch.setattr("course_utils.devices.tpu_available", lambda: False)
    rows = {row[""]: row["here"] for row in tpu.runtime_rows(tmp_path / "none.json")}
    assert rows["runtime"] == "this machine, no TPU"
    assert rows["set-up cell installed"].startswith("nothing")
    monkeypatch.setattr("course_utils.devices.is_colab", lambda: True)
    monkeypatch.setattr("course_utils.devices.tpu_available", lambda: True)
    versions = {"tensorflow-tpu": "2.20.0", tpu.COURSE_DISTRIBUTION: "0.9"}
    monkeypatch.setattr(tpu, "installed_versions", lambda names=("tensorflow", "tensorflow-tpu"):
                        {name: versions.get(name) for name in names})
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"install": [{"metadata": {
        "name": "scaling-tensorflow-course", "version": "0.9"}}]}))
    rows = {row[""]: row["here"] for row in tpu.runtime_rows(report)}
    assert rows["runtime"] == "Colab, TPU attached"
    assert rows["TensorFlow build"] == "tensorflow-tpu 2.20.0"
    assert "course_utils 0.9 installed" in rows["set-up cell installed"]
    assert "left out tf-keras" in rows["set-up cell installed"]
    rows = {row[""]: row["here"] for row in tpu.runtime_rows(tmp_path / "missing.json")}
    assert "could not be installed" in rows["set-up cell installed"]


def test_replicas_per_slice_follow_megacore():
    assert tpu.slice_replicas("v5e-1") == 1  # Colab's free TPU
    assert tpu.slice_replicas("v4-8") == 4  # 8 TensorCores, 4 chips, one device each
    assert tpu.slice_replicas("v5p-8") == 4
    assert tpu.slice_replicas("v5e-8") == tpu.slice_replicas("v6e-8") == 8
    assert all(chip.mxu_size in (128, 256) for chip in tpu.TPU_CHIPS.values())
    with pytest.raises(ValueError, match="v4-8"):
        tpu.slice_replicas("v9-8")


def test_each_chip_figure_is_quoted_from_its_own_page():
    for chip in tpu.TPU_CHIPS.values():
        assert chip.source.endswith(f"/tpu/docs/{chip.name}")
        assert f"{chip.hbm_gbps:g} GBps" in chip.quoted or (
            f"(GBps): {chip.hbm_gbps:g}" in chip.quoted)
        assert f"{chip.peak_bf16_tflops:g}" in chip.quoted
    assert tpu.TPU_CHIPS["v5e"].hbm_gbps == 819  # the v5e page, not the v6e page's 800
    for chip in tpu.TPU_CHIPS.values():  # the capacity in the unit its page gives
        assert f"{chip.hbm_gb} {chip.hbm_unit}" in chip.quoted or (
            f"({chip.hbm_unit}): {chip.hbm_gb}" in chip.quoted)
    assert {c.name: c.hbm_unit for c in tpu.TPU_CHIPS.values()} == {
        "v4": "GiB", "v5e": "GB", "v5p": "GiB", "v6e": "GB"}


def test_critical_batch_is_peak_over_bandwidth():
    v5e = tpu.TPU_CHIPS["v5e"]
    assert tpu.critical_batch(v5e) == pytest.approx(197e12 / 819e9)
    assert all(100 < tpu.critical_batch(chip) < 1000 for chip in tpu.TPU_CHIPS.values())


def _lesson_cell(cell_id):
    import pathlib

    import nbformat

    path = pathlib.Path(__file__).parents[1] / "notebooks" / "05_tpus.ipynb"
    return next(c.source for c in nbformat.read(path, 4).cells if c.get("id") == cell_id)


def _exec_visible_to_autograph(source, filename, namespace):
    """exec a cell so that AutoGraph can read its source (it converts `for ... in tf.range`)."""
    import linecache

    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the lesson's own cell


def _run_connect_to_tpu(monkeypatch, initialize, attached):
    """Run lesson 05's connect_to_tpu cell with the TPU calls mocked; its namespace."""
    import tensorflow as tf

    import course_utils as cu

    class Resolver:
        def __init__(self, tpu):
            assert tpu == "local"  # the lesson asks for the TPU attached to this VM

    class FakeTPUStrategy:
        def __init__(self, resolver):
            self.num_replicas_in_sync = 1

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize)
    monkeypatch.setattr(tf.distribute, "TPUStrategy", FakeTPUStrategy)
    monkeypatch.setattr("course_utils.devices.tpu_available", lambda: attached)
    namespace = {"tf": tf, "cu": cu, "time": __import__("time")}
    exec(_lesson_cell("4e910dea"), namespace)  # noqa: S102 - the lesson's own cell
    return namespace


def test_lesson_connects_to_a_mocked_tpu(monkeypatch, capsys):
    namespace = _run_connect_to_tpu(monkeypatch, lambda resolver: None, attached=True)
    assert namespace["raw_tpu_strategy"].num_replicas_in_sync == 1
    assert namespace["connect_error"] is None
    assert "TPU with 1 replica(s)." in capsys.readouterr().out


def test_lesson_says_plain_tensorflow_cannot_drive_a_mocked_tpu(monkeypatch, capsys):
    import tensorflow as tf

    def plain_tensorflow(resolver):
        raise tf.errors.NotFoundError(None, None, "No OpKernel was registered to support Op "
                                      "'ConfigureDistributedTPU'")

    namespace = _run_connect_to_tpu(monkeypatch, plain_tensorflow, attached=True)
    assert namespace["raw_tpu_strategy"] is None
    assert "NotFoundError" in capsys.readouterr().out  # the raw error, as it came
    reason = tpu.tpu_failure_reason(str(namespace["connect_error"]), attached=True)
    assert "install tensorflow-tpu" in reason  # what the next cell prints


def test_draw_tpu_system_draws_every_mxu_of_each_core():
    import matplotlib

    matplotlib.use("Agg")
    from course_utils import plots

    for name, chip in tpu.TPU_CHIPS.items():
        ax = plots.draw_tpu_system(name)
        labels = [text.get_text() for text in ax.texts]
        assert sum(label.startswith("MXU") for label in labels) == (
            chip.tensor_cores * chip.mxus_per_core)
        assert sum(label.startswith("TensorCore") for label in labels) == chip.tensor_cores
        megacore = chip.tensor_cores > chip.devices_per_chip  # v4, v5p: one device per chip
        assert any("1 replica (megacore" in label for label in labels) == megacore
        assert any("(one replica)" in label for label in labels) == (not megacore)
    with pytest.raises(ValueError, match="chip must be one of"):
        plots.draw_tpu_system("v2")


def test_draw_tile_padding_shows_the_padded_share():
    import matplotlib

    matplotlib.use("Agg")
    from course_utils import plots

    ax = plots.draw_tile_padding((100, 200))
    assert f"{tpu.padded_fraction((100, 200)):.0%} of the work is padding" in ax.get_title()
    assert ax.get_xlim() == (0, 256) and ax.get_ylim() == (0, 104)
    with pytest.raises(ValueError, match="two positive sizes"):
        plots.draw_tile_padding((0, 128))


def test_lesson_training_cells_run_unchanged_under_a_mocked_tpu_strategy(capsys):
    """Section 9's cells under a strategy that reads as a TPUStrategy (a OneDeviceStrategy
    underneath): the same code trains, traces once and takes the TPU branch's tolerance."""
    import keras
    import numpy as np
    import tensorflow as tf

    import course_utils as cu

    class TPUStrategy(tf.distribute.OneDeviceStrategy):  # the name is what the lesson reads
        pass

    mocked = TPUStrategy("/cpu:0")
    namespace = {"tf": tf, "keras": keras, "np": np, "cu": cu, "NUM_EXAMPLES": 256,
                 "BATCH_SIZE": 16, "TRAIN_STEPS": 3, "strategy": mocked}
    namespace["branch"], _ = tpu.strategy_branch(mocked)
    for cell_id in ("3dc7cfaf", "training-function", "training-steps", "a59f7acf",
                    "fd280aaa"):
        _exec_visible_to_autograph(_lesson_cell(cell_id), f"<lesson 05 cell {cell_id}>",
                                   namespace)
    assert namespace["branch"] == "TPU" and namespace["tolerance"] == 1e-4
    assert namespace["runs"]["this strategy"][2] == 1
    assert namespace["difference"] < namespace["tolerance"]
    assert tf.config.experimental.tensor_float_32_execution_enabled()  # restored
