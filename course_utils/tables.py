"""Result tables as a learner sees them: an HTML table in JupyterLab, Colab and the book, text
in a terminal.

Every lesson shows its measurements with :func:`show_table`. Numbers are rounded to a few
significant digits (a median of a handful of timings supports no more); a column can take its
own format (``formats={"share": ".0%", "time": "{:.1f} ms"}``).
"""

from __future__ import annotations

import dataclasses
import html
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["ResultTable", "format_number", "result_table", "show_table"]

Format = str | Callable[[Any], str]


def format_number(value: float, digits: int = 3) -> str:
    """``value`` rounded to ``digits`` significant digits, without an exponent where readable."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if -3 <= magnitude < 7:
        decimals = digits - 1 - magnitude
        return f"{round(value, decimals):,.{max(decimals, 0)}f}"
    return f"{value:.{max(digits - 1, 0)}e}"


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ResultTable:
    """Rows of results with their columns; displays as HTML in a notebook, as text elsewhere."""

    rows: tuple[Mapping[str, Any], ...]
    columns: tuple[str, ...]
    caption: str | None = None
    formats: Mapping[str, Format] = dataclasses.field(default_factory=dict)
    digits: int = 3

    def cell(self, column: str, value: Any) -> str:
        """The text of one cell: the column's format, else numbers rounded, else ``str``."""
        if value is None:
            return ""
        form = self.formats.get(column)
        if callable(form):
            return form(value)
        if form is not None:
            return form.format(value) if "{" in form else format(value, form)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return f"{int(value):,}"
        if _is_number(value):
            return format_number(float(value), self.digits)
        return str(value)

    def numeric(self, column: str) -> bool:
        """True when every value of ``column`` is a number (it is then aligned right)."""
        values = [row.get(column) for row in self.rows if row.get(column) is not None]
        return bool(values) and all(_is_number(value) for value in values)

    def text_rows(self) -> list[list[str]]:
        """Every row as the texts of its cells, in column order."""
        return [[self.cell(column, row.get(column)) for column in self.columns]
                for row in self.rows]

    def _repr_html_(self) -> str:
        right = {column: self.numeric(column) for column in self.columns}

        def style(column: str) -> str:
            return ' style="text-align: right"' if right[column] else ' style="text-align: left"'

        head = "".join(f"<th{style(c)}>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td{style(c)}>{html.escape(text)}</td>"
                             for c, text in zip(self.columns, texts, strict=True)) + "</tr>"
            for texts in self.text_rows())
        caption = (f"<caption style=\"caption-side: top; text-align: left\">"
                   f"{html.escape(self.caption)}</caption>" if self.caption else "")
        return (f'<table class="course-table" style="font-variant-numeric: tabular-nums">'
                f"{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def __str__(self) -> str:
        texts = self.text_rows()
        if not texts:
            return "(no rows)"
        widths = [max(len(column), *(len(line[i]) for line in texts))
                  for i, column in enumerate(self.columns)]
        right = [self.numeric(column) for column in self.columns]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.rjust(w) if r else c.ljust(w)
                             for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

        lines = [self.caption] if self.caption else []
        lines += [line(self.columns), "  ".join("-" * w for w in widths)]
        return "\n".join(lines + [line(cells) for cells in texts])

    def __repr__(self) -> str:
        return str(self)


def result_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None, *,
                 caption: str | None = None, formats: Mapping[str, Format] | None = None,
                 digits: int = 3) -> ResultTable:
    """A :class:`ResultTable` of ``rows`` (dicts); ``columns`` picks and orders them."""
    rows = tuple(dict(row) for row in rows)
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    if digits < 1:
        raise ValueError(f"digits={digits}: a table shows at least one significant digit")
    unknown = set(formats or {}) - set(columns)
    if unknown:
        raise ValueError(f"formats name columns the table does not have: {sorted(unknown)}")
    return ResultTable(rows, tuple(columns), caption, dict(formats or {}), digits)


def show_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None, *,
               caption: str | None = None, formats: Mapping[str, Format] | None = None,
               digits: int = 3) -> None:
    """Display ``rows`` as a table: HTML in a notebook (JupyterLab, Colab, the book), text in a
    terminal. Numbers keep ``digits`` significant digits unless ``formats`` says otherwise."""
    table = result_table(rows, columns, caption=caption, formats=formats, digits=digits)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython comes with the course
        print(table)
        return
    shell = get_ipython()
    if shell is not None and type(shell).__name__ != "TerminalInteractiveShell":
        display(table)
    else:
        print(table)
