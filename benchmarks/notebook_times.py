"""Execute every notebook in a fresh kernel and compare its wall time with its budget.

Budgets (docs/course_design.md, section 5, on a 2-core CPU): a lesson or solution notebook 90 s
(the capstone and its solution 120 s, appendix A 180 s), an unsolved exercise notebook 45 s,
kernel start included. Tighter goals (60 s and 30 s) are reported beside them. Writes
benchmarks/results/notebook_times.json.

    python benchmarks/notebook_times.py [NOTEBOOK ...]
"""

from __future__ import annotations

import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from course_utils import bench, tables  # noqa: E402

BUDGET_S = {"notebooks": 90, "solutions": 90, "exercises": 45}
GOAL_S = {"notebooks": 60, "solutions": 60, "exercises": 30}
#: Notebooks with a budget of their own: the capstone, its solution and appendix A.
BUDGET_BY_NOTEBOOK_S = {"09_capstone": 120, "09_capstone_solutions": 120,
                        "A_what_works_where": 180}


def time_notebook(path: pathlib.Path) -> dict[str, object]:
    """Run one notebook top to bottom in a fresh kernel; return its time and outcome."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    error = None
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
    seconds = time.perf_counter() - start
    folder = path.parent.name
    budget = BUDGET_BY_NOTEBOOK_S.get(path.stem, BUDGET_S[folder])
    return {"notebook": f"{folder}/{path.name}", "seconds": round(seconds, 1),
            "budget_s": budget, "goal_s": GOAL_S[folder],
            "within_budget": error is None and seconds <= budget,
            "error": error}


def main(argv: list[str]) -> int:
    paths = [pathlib.Path(p).resolve() for p in argv] or sorted(
        p for folder in BUDGET_S for p in (REPO / folder).glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file() or p.parent.name not in BUDGET_S]
    if missing:
        print("not a notebook of notebooks/, solutions/ or exercises/: " + ", ".join(missing),
              file=sys.stderr)
        return 2
    rows = []
    for path in paths:
        row = time_notebook(path)
        rows.append(row)
        print(f"{row['notebook']:<50}{row['seconds']:>7.1f} s  (budget {row['budget_s']} s)"
              + (f"  ERROR {row['error']}" if row["error"] else ""), flush=True)
    print(tables.result_table(rows, ["notebook", "seconds", "budget_s", "goal_s",
                                     "within_budget"]))
    output = bench.write_results({"notebooks": rows}, REPO / "benchmarks/results/"
                                 "notebook_times.json")
    print(f"wrote {output.relative_to(REPO)}")
    return 0 if all(row["within_budget"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
