"""course_utils.tpu: what each runtime needs (simulated, nothing installed) and tile padding."""

from __future__ import annotations

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


def test_colab_tpu_with_plain_tensorflow_replaces_it_and_asks_for_a_restart():
    result = plan(installed={**NONE, "tensorflow": "2.21.0"})
    assert result.action == "install"
    assert result.commands[0] == ("uninstall", "-y", "tensorflow", "tensorflow-cpu")
    assert "ConfigureDistributedTPU" in result.message and "Restart" in result.message


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
            "installed={}, python=(3, 12)); print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_draw_tpu_host_loop_counts_round_trips():
    import matplotlib

    matplotlib.use("Agg")
    from course_utils import plots

    axes = plots.draw_tpu_host_loop(steps=8, steps_per_execution=4)
    assert "8 round-trips" in axes[0].get_title() and "2 round-trips" in axes[1].get_title()
    with pytest.raises(ValueError):
        plots.draw_tpu_host_loop(steps_per_execution=0)
