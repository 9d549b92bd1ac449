"""The lessons' widgets: pure functions behind them, and each widget driven like a learner would.

Runs on ipywidgets 8 (``make test``) and 7.7 (``make test-colab-stack``'s ``.venv-colab``): the
widgets use only the APIs both share and set an ``HTML`` view's value, so no kernel is needed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from course_utils import widgets

ipywidgets = pytest.importorskip("ipywidgets")


def _shown(box) -> str:
    """The plain-text form of what the widget's HTML view shows (its value is the HTML form)."""
    view = box.children[-1]
    assert isinstance(view, ipywidgets.HTML) and view.value.startswith("<")
    return view.plain_text


def _controls(box) -> dict[str, object]:
    return {child.description: child for child in box.children[:-1]}


def test_show_html_replaces_what_the_view_shows():
    view = ipywidgets.HTML()
    widgets.show_html(view, "<b>1</b>", "1")
    widgets.show_html(view, "<b>2</b>", "2")
    assert (view.value, view.plain_text) == ("<b>2</b>", "2")


def test_pipeline_throughput_orders_the_knobs():
    sequential = widgets.pipeline_throughput(1, prefetch=False, cache=False)
    prefetched = widgets.pipeline_throughput(1, prefetch=True, cache=False)
    cached = widgets.pipeline_throughput(1, prefetch=False, cache=True)
    parallel = widgets.pipeline_throughput(4, prefetch=True, cache=False)
    assert sequential["mode"] == "sequential" and prefetched["mode"] == "prefetch"
    assert parallel["mode"] == "parallel map"
    rates = [r["elements_per_s"] for r in (sequential, prefetched, parallel)]
    assert rates == sorted(rates) and len(set(rates)) == 3
    assert cached["elements_per_s"] > sequential["elements_per_s"]
    assert all(r <= parallel["ideal_elements_per_s"] + 1e-9 for r in rates)
    # sequential: every element costs a read and a step, two epochs of 16
    assert sequential["seconds"] == pytest.approx(2 * 16 * (0.04 + 0.01))
    with pytest.raises(ValueError):
        widgets.pipeline_throughput(0)


def test_pipeline_widget_follows_its_knobs():
    box = widgets.pipeline_widget()
    controls = _controls(box)
    first = _shown(box)
    assert "schedule: sequential" in first and "modelled" in box.children[-1].value
    controls["parallel calls"].value = 4
    assert "schedule: parallel map" in _shown(box)
    rate = widgets.pipeline_throughput(4, False, False)["elements_per_s"]
    assert f"throughput: {rate:.0f} elements/s" in _shown(box)
    controls["parallel calls"].value = 1
    controls["prefetch"].value = True
    assert "schedule: prefetch" in _shown(box)


def test_data_parallel_numbers():
    n = widgets.data_parallel_numbers(4, 64, 1e-3, examples=1000)
    assert n["global_batch"] == 256 and n["steps_per_epoch"] == 3  # 1000 // 256: drop_remainder
    assert n["lr_linear"] == pytest.approx(4e-3) and n["lr_sqrt"] == pytest.approx(2e-3)
    with pytest.raises(ValueError):
        widgets.data_parallel_numbers(0, 64)


def test_data_parallel_widget_shows_the_new_product():
    box = widgets.data_parallel_widget(examples=60_000)
    controls = _controls(box)
    assert "global batch: 128\n" in _shown(box)
    controls["replicas"].value = 8
    controls["batch/replica"].value = 32
    shown = _shown(box)
    assert "global batch: 256\n" in shown  # 60,000 // 256 steps: the short batch dropped
    assert "steps per epoch (60,000 examples, drop_remainder=True): 234" in shown
    assert "linear scaling: 8.00e-03" in shown  # base 1e-3 times 8
    controls["base LR"].value = 1e-2
    assert "linear scaling: 8.00e-02" in _shown(box)


def test_gpipe_numbers_match_the_schedule_and_the_formula():
    n = widgets.gpipe_numbers(4, 4)
    assert n["slots"] == 14 and n["busy_cells"] == 32
    assert n["bubble"] == pytest.approx(3 / 7) and n["counted_bubble"] == pytest.approx(3 / 7)
    assert n["grid"][0][:4] == ["F0", "F1", "F2", "F3"] and n["grid"][3][:3] == ["", "", ""]
    assert n["grid"][3][3:8] == ["F0", "F1", "F2", "F3", "B0"]  # backward right after its forwards
    assert widgets.gpipe_numbers(1, 3)["bubble"] == 0.0
    with pytest.raises(ValueError):
        widgets.gpipe_numbers(0, 2)


def test_gpipe_widget_follows_its_knobs():
    box = widgets.gpipe_widget()
    controls = _controls(box)
    first = _shown(box)
    assert "stage 3: . . . F0" in first and "bubble (K−1)/(M+K−1): 0.429 = 3/7" in first
    controls["micro-batches M"].value = 8
    shown = _shown(box)
    assert "bubble (K−1)/(M+K−1): 0.273 = 3/11" in shown and "slots: 22" in shown
    controls["stages K"].value = 1
    shown = _shown(box)
    assert "bubble (K−1)/(M+K−1): 0.000 = 0/8" in shown and "stage 1:" not in shown


def test_accumulation_numbers():
    n = widgets.accumulation_numbers(32, 4, activation_bytes_per_example=1000, examples=1000)
    assert n == {"effective_batch": 128, "activation_bytes": 32_000,
                 "micro_steps_per_epoch": 32, "updates_per_epoch": 8}
    # 1000 / 48 -> 21 micro-steps, 5 full groups of 4: the trailing one makes no update
    assert widgets.accumulation_numbers(48, 4, 1, 1000)["updates_per_epoch"] == 5


def test_accumulation_widget_follows_its_knobs():
    with pytest.raises(ValueError):
        widgets.accumulation_widget()
    box = widgets.accumulation_widget(activation_bytes_per_example=2**20 // 64,
                                      examples=1024)
    controls = _controls(box)
    assert "effective batch: 256\n" in _shown(box)  # 64 x 4
    assert "activations alive at once: 1.00 MiB" in _shown(box)
    controls["k (steps)"].value = 8
    shown = _shown(box)
    assert "effective batch: 512\n" in shown and "activations alive at once: 1.00 MiB" in shown
    assert "updates per epoch (1,024 examples): 2" in shown  # 16 micro-steps // 8
    controls["micro-batch"].value = 128
    assert "activations alive at once: 2.00 MiB" in _shown(box)


def test_accumulation_widget_counts_a_models_activations():
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                              keras.layers.Dense(4)])
    box = widgets.accumulation_widget(model)  # (8 + 16 + 4) float32 values per example
    assert f"activations alive at once: {64 * 112 / 2**20:.2f} MiB" in _shown(box)


@pytest.mark.parametrize("x", [0.1, -3.0, 1e-6, 12345.678, 0.0, 1e-30])
def test_precision_neighbours_bracket_and_match_numpy(x):
    import ml_dtypes

    table = widgets.precision_neighbours(x)
    assert list(table) == ["float32", "float16", "bfloat16"]
    for name, dtype in (("float32", np.float32), ("float16", np.float16),
                        ("bfloat16", ml_dtypes.bfloat16)):
        row = table[name]
        assert row["value"] == float(np.array(x).astype(dtype))
        assert row["below"] < row["value"] < row["above"]
        if name != "bfloat16":  # numpy's nextafter knows the IEEE formats
            assert row["above"] == float(np.nextafter(dtype(row["value"]), dtype(np.inf)))
            assert row["below"] == float(np.nextafter(dtype(row["value"]), dtype(-np.inf)))
        expected = 0.0 if x == 0 else abs(row["value"] - x) / abs(x)
        assert row["relative_error"] == pytest.approx(expected)


def test_precision_neighbours_of_known_numbers():
    table = widgets.precision_neighbours(1.0)
    assert table["bfloat16"]["above"] == 1 + 2**-7 and table["float16"]["above"] == 1 + 2**-10
    assert table["float32"]["above"] == 1 + 2**-23
    over = widgets.precision_neighbours(1e5)["float16"]  # past float16's 65504
    assert math.isinf(over["value"]) and math.isnan(over["above"])
    assert widgets.precision_neighbours(1e-30)["float16"]["value"] == 0.0  # underflow
    assert widgets.precision_neighbours(1e-30)["float16"]["relative_error"] == 1.0


def test_precision_widget_follows_its_number():
    box = widgets.precision_widget()
    first = _shown(box)
    assert first.splitlines()[1].startswith("float16  0.0999755859375")
    box.children[0].value = 1.0
    lines = _shown(box).splitlines()
    assert lines[2] == "bfloat16  1.0  0.99609375  1.0078125  0.00e+00"
