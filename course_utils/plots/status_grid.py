"""A grid of coloured cells: what works where (rows: APIs, columns: strategies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from course_utils.plots.style import axes_for

__all__ = ["STATUS_COLORS", "draw_works_where"]

#: Status -> colour (Okabe-Ito: green, orange, vermillion; grey for "n/a").
STATUS_COLORS = {"works": "#009E73", "wrong": "#E69F00", "fails": "#D55E00", "n/a": "#BBBBBB"}


def draw_works_where(
    statuses: Mapping[str, Mapping[str, str]],
    rows: Mapping[str, str] | None = None,
    columns: Mapping[str, str] | None = None,
    title: str = "What works where",
    ax: Any = None,
) -> Any:
    """One coloured cell per ``statuses[row][column]`` ("works", "wrong", "fails", "n/a").

    ``rows`` and ``columns`` map keys to labels (default: the keys, in ``statuses``' order).
    """
    if not statuses:
        raise ValueError("nothing to draw")
    rows = rows or {row: row for row in statuses}
    columns = columns or {column: column for column in next(iter(statuses.values()))}
    ax = axes_for(ax, (1.5 + 1.6 * len(columns), 0.9 + 0.5 * len(rows)))
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            status = statuses[row][column]
            if status not in STATUS_COLORS:
                raise ValueError(f"unknown status {status!r} at {row} × {column}")
            ax.add_patch(_box(j, i, STATUS_COLORS[status]))
            ax.text(j + 0.5, i + 0.5, status, ha="center", va="center", fontsize=8,
                    color="white" if status != "n/a" else "black")
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))])
    ax.set_xticklabels([_wrap(label) for label in columns.values()], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(rows))])
    ax.set_yticklabels([label.replace("`", "") for label in rows.values()], fontsize=8)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, pad=28)
    return ax


def _box(x: float, y: float, color: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.03, y + 0.05), 0.94, 0.9, facecolor=color, edgecolor="none")


def _wrap(label: str) -> str:
    return label.replace(" (", "\n(")
