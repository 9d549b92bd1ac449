"""How far each timed assertion of the course's notebooks stands from its threshold.

    python benchmarks/timing_margins.py notebooks/*.ipynb [--out FILE.json]
    tests/tools/with_busy_cores.sh .venv/bin/python .venv/bin/python \
        benchmarks/timing_margins.py notebooks/*.ipynb          # the same, both cores busy

A timed assertion is a top-level ``assert`` of a notebook cell whose text names a time, a speed or
a ratio of them (``speedup``, ``seconds``, ``step_time``, ...). After each such cell the script
inserts a probe cell that evaluates both sides of every comparison in the assertion and prints
them; it then runs the notebook in a fresh kernel (nbclient) and prints, per assertion, the
measured value, the threshold and the margin (how many times the threshold the value clears:
value / threshold for ``>``, threshold / value for ``<``). The notebooks on disk are not changed.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import time
from pathlib import Path

TIMED = re.compile(r"speed|throughput|second|elapsed|faster|slower|_time\b|time_|_s\b|ratio|"
                   r"overhead|latency", re.IGNORECASE)
MARK = "TIMING-MARGIN "
_OPS = {ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<="}


def _code(source: str) -> str:
    """A cell's source without IPython magics and shell lines (so that ``ast`` can parse it)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def timed_comparisons(source: str) -> list[dict[str, object]]:
    """Every comparison in the cell's top-level timed assertions: text, sides and operator."""
    try:
        tree = ast.parse(_code(source))
    except SyntaxError:
        return []
    found = []
    for node in _module_scope(tree):
        if not isinstance(node, ast.Assert):
            continue
        test_text = ast.get_source_segment(_code(source), node.test) or ""
        if not TIMED.search(test_text):
            continue
        tests = node.test.values if isinstance(node.test, ast.BoolOp) else [node.test]
        for test in tests:
            if not isinstance(test, ast.Compare):
                continue
            sides = [test.left, *test.comparators]
            for left, op, right in zip(sides, test.ops, sides[1:], strict=False):
                if type(op) not in _OPS:
                    continue
                found.append({"line": node.lineno, "assert": test_text,
                              "value": ast.unparse(left), "op": _OPS[type(op)],
                              "threshold": ast.unparse(right)})
    return found


def _module_scope(tree: ast.Module) -> list[ast.stmt]:
    """The cell's statements whose names live in the notebook's namespace (not in functions)."""
    statements, stack = [], list(tree.body)
    while stack:
        node = stack.pop(0)
        statements.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(node, field, []) or [])
    return statements


def probe_source(cell_index: int, comparisons: list[dict[str, object]]) -> str:
    """A cell that prints each comparison's two sides as one JSON line."""
    lines = ["import json as _margin_json"]
    for comparison in comparisons:
        record = {k: comparison[k] for k in ("line", "assert", "op")}
        lines.append(
            f"print({MARK!r} + _margin_json.dumps({{**{record!r}, 'cell': {cell_index}, "
            f"'value': float({comparison['value']}), "
            f"'threshold': float({comparison['threshold']})}}))")
    return "\n".join(lines)


def margin(record: dict[str, float | str]) -> float:
    """How many times its threshold a measured value clears (below 1: the assertion failed)."""
    value, threshold = float(record["value"]), float(record["threshold"])
    if str(record["op"]).startswith(">"):
        return value / threshold if threshold else float("inf")
    return threshold / value if value else float("inf")


def measure(path: Path, timeout: int) -> tuple[list[dict], float, str | None]:
    """Run ``path`` with probe cells; the records, the seconds it took and any error."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    cells = []
    for index, cell in enumerate(notebook.cells):
        cells.append(cell)
        comparisons = timed_comparisons(cell.source) if cell.cell_type == "code" else []
        if comparisons:
            cells.append(nbformat.v4.new_code_cell(probe_source(index, comparisons)))
    notebook.cells = cells
    started, error = time.monotonic(), None
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - report the failing cell, keep what was measured
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
    records = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            for line in output.get("text", "").splitlines():
                if line.startswith(MARK):
                    records.append(json.loads(line[len(MARK):]))
    return records, time.monotonic() - started, error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write every record as JSON here too")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    results, failed = [], False
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            print(f"{path}: not a notebook", file=sys.stderr)
            return 2
        records, seconds, error = measure(path, args.timeout)
        print(f"{path} ({seconds:.0f} s){': ' + error if error else ''}")
        failed |= error is not None
        for record in records:
            record["notebook"], record["margin"] = str(path), margin(record)
            print(f"  cell {record['cell']:>3}  {record['value']:>10.4g} {record['op']:>2} "
                  f"{record['threshold']:<8.4g} margin x{record['margin']:.2f}  "
                  f"{record['assert'][:60]}")
            results.append(record)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
