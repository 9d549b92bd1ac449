"""The ipywidgets the course relies on work on ipywidgets 7.7 (Colab) and 8 (its JupyterLab).

Here: the notebook progress bar of the training loop (``tqdm.auto`` picks ``tqdm.notebook`` inside
Jupyter, which draws an ipywidgets ``FloatProgress`` and two ``HTML`` labels in an ``HBox``) and
the building blocks of the lessons' own widgets. Those widgets (``course_utils.widgets``) are
driven in ``test_widget_frontends.py``; ``test_widget_lessons.py`` checks the lessons show them.
``make test-colab-stack`` runs this file on ipywidgets 7.7.1, ``make test`` on ipywidgets 8.
"""

from __future__ import annotations

import importlib.metadata

import pytest

ipywidgets = pytest.importorskip("ipywidgets")


def test_ipywidgets_is_a_major_version_the_course_supports():
    major = int(importlib.metadata.version("ipywidgets").split(".")[0])
    assert major in (7, 8)


def test_notebook_progress_bar_drives_its_widgets():
    from tqdm.notebook import tqdm

    bar = tqdm(total=4, desc="epoch 1/1", unit="step", leave=True, display=False)
    container = bar.container
    label, progress, text = container.children
    assert isinstance(container, ipywidgets.HBox)
    assert isinstance(progress, ipywidgets.FloatProgress) and progress.max == 4
    for step in range(4):
        bar.update(1)
        bar.refresh()  # tqdm redraws at most every 0.1 s on its own
        assert progress.value == step + 1
    bar.set_postfix(loss=0.5)
    bar.close()
    assert progress.value == 4 and progress.bar_style == "success"
    assert label.value.replace("\u2007", " ") == "epoch 1/1: 100%"  # tqdm uses figure spaces
    assert "4/4" in text.value and "loss=0.5" in text.value


def test_widgets_the_lessons_use_build_and_link():
    slider = ipywidgets.IntSlider(value=2, min=1, max=8, description="replicas")
    shown = ipywidgets.IntText()
    link = ipywidgets.jslink((slider, "value"), (shown, "value"))
    output = ipywidgets.Output()
    box = ipywidgets.VBox([slider, shown, output])
    slider.value = 4
    assert box.children[0].value == 4 and link.source == (slider, "value")
    with output:
        print("inside an Output widget")
    for widget in (slider, shown, output, box):
        widget.close()
