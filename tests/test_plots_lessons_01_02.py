"""The chart helpers lessons 01 and 02 call: panels of curves side by side."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import pytest

from course_utils import plots

matplotlib.use("Agg")


def test_line_charts_draw_one_panel_per_title_and_keep_each_curves_colour():
    axes = plots.line_charts({"no warm-up": {"a": [1, 2, 3], "b": [3, 2, 1]},
                              "warm-up": {"b": [2, 2, 2]}}, xlabel="step", ylabel="loss")
    assert [ax.get_title() for ax in axes] == ["no warm-up", "warm-up"]
    assert [len(ax.lines) for ax in axes] == [2, 1]
    assert axes[1].lines[0].get_color() == axes[0].lines[1].get_color()  # "b" in both
    assert list(axes[0].lines[0].get_ydata()) == [1, 2, 3]
    assert axes[0].get_ylabel() == "loss" and axes[1].get_xlabel() == "step"
    plt.close("all")


@pytest.mark.parametrize("panels", [{}, {"empty": {}}])
def test_line_charts_refuse_nothing_to_plot(panels):
    with pytest.raises(ValueError, match="nothing to plot"):
        plots.line_charts(panels)
