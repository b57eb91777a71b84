"""Refuse a chapter notebook that is not stored as one clean, complete run: the pre-commit hook's check.

Strict nbval compares every code cell's stored output with a fresh run of the chapter, so a chapter is
committed with the outputs of one run from the top, in a fresh kernel, that did not fail. This script
reads the notebooks' JSON (it starts no kernel, and needs nothing beyond Python) and reports:

- a code cell with no execution count: it never ran (the notebook was saved with its outputs cleared,
  or the run stopped before reaching it);
- execution counts other than 1, 2, 3, ... from the top: cells were run out of order, twice, or in a
  kernel that had already run something else;
- an error output: the run failed there. A cell tagged ``raises-exception`` is meant to raise (the
  executor and nbval both expect its error), so its error is accepted;
- a kernel other than ``python3``: nbval and the grader start the kernel the notebook names, and
  ``python3`` is the one every environment with ipykernel has (a kernel named after one machine's
  virtual environment is missing everywhere else).

Cells that Jupyter's executor does not run are expected to have no count: code cells with no code, and
cells tagged ``skip-execution``.

Usage, from the repository's root: ``python .ci/check_notebooks.py [NOTEBOOK ...]`` (default: every
``book/*.ipynb``). It prints one line per problem and how to fix it, and exits with status 1 when there
is any problem.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPECTED_ERROR_TAG = "raises-exception"
KERNEL = "python3"
NOT_EXECUTED_TAG = "skip-execution"
FIX = (
    "Run each notebook listed from the top in a fresh kernel and save it, from the repository's root: "
    "`.venv/bin/jupyter execute --inplace NOTEBOOK` (a cell whose error is the point of the lesson "
    "is tagged `raises-exception`)."
)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _where(index: int, cell: dict) -> str:
    """``cell 7 (`first line of code`)``: the cell's position among all cells, counted from 1."""
    first_line = next((line.strip() for line in _source(cell).splitlines() if line.strip()), "")
    if len(first_line) > 50:
        first_line = first_line[:47] + "..."
    return f"cell {index + 1} (`{first_line}`)" if first_line else f"cell {index + 1}"


def problems_in(notebook: dict) -> list[str]:
    """Every reason this notebook (its parsed JSON) is not stored as one clean run, in cell order.

    >>> def code(source, count):
    ...     return {"cell_type": "code", "source": source, "execution_count": count, "outputs": []}
    >>> def chapter(*cells, kernel="python3"):
    ...     return {"metadata": {"kernelspec": {"name": kernel}}, "cells": list(cells)}
    >>> problems_in(chapter(code("x = 1", 1), code("print(x)", 2)))
    []
    >>> for problem in problems_in(chapter(code("x = 1", None), code("print(x)", None))):
    ...     print(problem)
    cell 1 (`x = 1`) and 1 later code cell have no execution count: they never ran
    >>> for problem in problems_in(chapter(code("x = 1", 2), code("print(x)", 1))):
    ...     print(problem)
    cell 1 (`x = 1`) has execution count 2 where a run from the top gives 1: cells ran out of order, or twice
    >>> problems_in(chapter(code("x = 1", 1), kernel="my-venv"))
    ["the notebook's kernel is 'my-venv', not 'python3': choose the Python 3 kernel (Kernel > Change Kernel) and save"]
    """
    problems = []
    kernel = notebook.get("metadata", {}).get("kernelspec", {}).get("name")
    if kernel != KERNEL:
        problems.append(
            f"the notebook's kernel is {kernel!r}, not {KERNEL!r}: choose the Python 3 kernel "
            "(Kernel > Change Kernel) and save"
        )
    never_ran: list[str] = []  # reported once, in the place of the first such cell, with how many follow
    first_missing = 0
    expected_count = 1
    counts_in_order = True
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        tags = _tags(cell)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and EXPECTED_ERROR_TAG not in tags:
                error = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}".strip()
                if len(error) > 80:
                    error = error[:77] + "..."
                problems.append(
                    f"{_where(index, cell)} has an error output ({error}): the run failed there "
                    f"(tag the cell `{EXPECTED_ERROR_TAG}` if the error is the point)"
                )
        if not _source(cell).strip() or NOT_EXECUTED_TAG in tags:
            continue  # the executor does not run these
        count = cell.get("execution_count")
        if count is None:
            if not never_ran:
                first_missing = len(problems)
                problems.append("")  # written below, once the cells that never ran are counted
            never_ran.append(_where(index, cell))
        elif counts_in_order and count != expected_count:
            problems.append(
                f"{_where(index, cell)} has execution count {count} where a run from the top gives "
                f"{expected_count}: cells ran out of order, or twice"
            )
            counts_in_order = False  # one such report is enough: the later counts are off by the same cause
        expected_count += 1
    if len(never_ran) == 1:
        problems[first_missing] = f"{never_ran[0]} has no execution count: it never ran"
    elif never_ran:
        later = len(never_ran) - 1
        problems[first_missing] = (
            f"{never_ran[0]} and {later} later code cell{'s' if later > 1 else ''} have no execution count: "
            "they never ran"
        )
    return problems


def check(paths: list[Path]) -> list[str]:
    """``path: problem`` for every problem in the notebooks at ``paths``."""
    report = []
    for path in paths:
        shown = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
        try:
            notebook = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            report.append(f"{shown}: cannot be read as a notebook ({error})")
            continue
        report.extend(f"{shown}: {problem}" for problem in problems_in(notebook))
    return report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(arg) for arg in args] or sorted((REPO / "book").glob("*.ipynb"))
    report = check(paths)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # a cell's first line may not fit a Windows console
    for line in report:
        print(line)
    if report:
        print(FIX)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
