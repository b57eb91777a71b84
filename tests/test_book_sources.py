"""The chapter notebooks are committed executed, so the book can show their stored outputs.

``make test`` builds the book without executing the chapters again: strict nbval has just run
each one and compared what it printed with the outputs stored in the notebook. That only holds
for cells that were run before the notebook was committed; nbval does not compare a cell that
was never executed, and the book would show it without its output.
"""

from __future__ import annotations

import json

import pytest

from book_pages import DOCNAMES, source_of

NOTEBOOKS = [name for name in DOCNAMES if source_of(name).suffix == ".ipynb"]
NOT_RUN_TAGS = {"skip-execution", "nbval-skip"}


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_chapter_is_committed_executed(docname):
    path = source_of(docname)
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert notebook["metadata"].get("kernelspec", {}).get("name") == "python3", (
        f"{path.name}: the kernelspec must be python3"
    )
    never_run = [
        index
        for index, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "code"
        and cell.get("execution_count") is None
        and "".join(cell["source"]).strip()
        and not NOT_RUN_TAGS & set(cell.get("metadata", {}).get("tags", []))
    ]
    assert not never_run, (
        f"{path.name}: code cells {never_run} were never executed; run "
        f"`.venv/bin/jupyter execute --inplace {path.relative_to(path.parents[1])}` and commit the result"
    )
