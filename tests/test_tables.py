"""cu.show_table: an HTML table in a notebook, aligned text in a terminal, numbers rounded."""

from __future__ import annotations

import numpy as np
import pytest

import course_utils as cu
from course_utils import tables


def test_numbers_keep_three_significant_digits_without_exponents_where_readable():
    assert tables.format_number(1.23456) == "1.23"
    assert tables.format_number(0.0123456) == "0.0123"
    assert tables.format_number(12345.6) == "12,300"
    assert tables.format_number(999.96) == "1,000"
    assert tables.format_number(0.0) == "0"
    assert tables.format_number(1.5e-7) == "1.50e-07"
    assert tables.format_number(float("nan")) == "nan"
    assert tables.format_number(3.14159, digits=2) == "3.1"


def test_the_html_is_a_table_with_escaped_cells_and_numbers_on_the_right():
    table = tables.result_table([{"pipeline": "map <parallel>", "examples/s": 1523.7},
                                 {"pipeline": "cache", "examples/s": np.float32(3001.2)}],
                                caption="Throughput")
    page = table._repr_html_()
    assert page.startswith('<table class="course-table"')
    assert "<caption" in page and "Throughput" in page
    assert "map &lt;parallel&gt;" in page and "1,520" in page and "3,000" in page
    assert page.count('<td style="text-align: right">') == 2
    assert page.count("<tr>") == 3


def test_formats_per_column_and_integers_with_separators():
    table = tables.result_table([{"share": 0.256, "time": 3.14159, "steps": 12000, "ok": True}],
                                formats={"share": ".0%", "time": "{:.1f} ms"})
    assert table.text_rows() == [["26%", "3.1 ms", "12,000", "True"]]
    assert table.cell("ok", None) == ""


def test_a_format_for_an_unknown_column_is_refused():
    with pytest.raises(ValueError, match="speed"):
        tables.result_table([{"time": 1.0}], formats={"speed": ".2f"})


def test_the_text_form_aligns_columns_and_says_when_empty():
    table = tables.result_table([{"variant": "naive", "speed": 1.0},
                                 {"variant": "prefetch", "speed": 1.53}])
    lines = str(table).splitlines()
    assert lines[0].split() == ["variant", "speed"] and lines[3].endswith("1.53")
    assert len(lines[2]) == len(lines[3])
    assert str(tables.result_table([])) == "(no rows)"


def test_columns_come_from_every_row_in_first_seen_order():
    table = tables.result_table([{"a": 1}, {"b": 2.0, "a": 3}])
    assert table.columns == ("a", "b")
    assert table.text_rows() == [["1", ""], ["3", "2.00"]]


def test_show_table_prints_text_outside_a_notebook(capsys):
    cu.show_table([{"replicas": 2, "speed-up": 1.234}])
    out = capsys.readouterr().out
    assert "replicas" in out and "1.23" in out and "<table" not in out


def test_show_table_displays_html_in_a_kernel(monkeypatch):
    shown = []

    class ZMQInteractiveShell:  # the kernel's shell, as get_ipython() returns it
        pass

    import IPython
    import IPython.display

    monkeypatch.setattr(IPython, "get_ipython", lambda: ZMQInteractiveShell())
    monkeypatch.setattr(IPython.display, "display", shown.append)
    assert cu.show_table([{"x": 1.0}]) is None
    assert len(shown) == 1 and "<table" in shown[0]._repr_html_()
