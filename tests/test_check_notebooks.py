"""The notebook check behind the pre-commit hook (.ci/check_notebooks.py), and every chapter passing it.

Strict nbval needs each chapter stored as one clean run; the check refuses a notebook saved without
outputs, run out of order, or holding an error from a failed run. Its cases are small synthetic
notebooks; the last tests run it over the real chapters, so ``make test`` enforces it too.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / ".ci" / "check_notebooks.py"
CHAPTERS = sorted((REPO / "book").glob("*.ipynb"))

_spec = importlib.util.spec_from_file_location("check_notebooks", SCRIPT)
check_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_notebooks)


def executed(*sources: str, tags: dict[int, list[str]] | None = None):
    """A notebook whose code cells ran once each, in order, from a fresh kernel."""
    cells = [new_markdown_cell("# A chapter")]
    for count, source in enumerate(sources, start=1):
        cell = new_code_cell(source, execution_count=count)
        cell.outputs = [new_output("stream", name="stdout", text=f"output {count}\n")]
        cell.metadata["tags"] = (tags or {}).get(count - 1, [])
        cells.append(cell)
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def error_output(name="ValueError", value="d_out must be divisible by num_heads"):
    return new_output("error", ename=name, evalue=value, traceback=[f"{name}: {value}"])


def test_a_clean_run_passes():
    assert check_notebooks.problems_in(executed("x = 1", "print(x)", "x + 1")) == []


def test_a_notebook_saved_without_outputs_is_refused():
    notebook = executed("x = 1", "print(x)")
    for cell in code_cells(notebook):
        cell.execution_count = None
        cell.outputs = []
    problems = check_notebooks.problems_in(notebook)
    assert problems == ["cell 2 (`x = 1`) and 1 later code cell have no execution count: they never ran"]
    notebook.cells.append(new_code_cell("y = 2"))
    assert check_notebooks.problems_in(notebook) == [
        "cell 2 (`x = 1`) and 2 later code cells have no execution count: they never ran"
    ]


def test_a_run_that_stopped_at_an_error_is_refused():
    notebook = executed("import torch", "attention(bad_input)", "print('after')")
    failing, after = code_cells(notebook)[1:]
    failing.outputs = [error_output()]
    after.execution_count, after.outputs = None, []
    problems = check_notebooks.problems_in(notebook)
    assert len(problems) == 2
    assert problems[0].startswith("cell 3 (`attention(bad_input)`) has an error output (ValueError: d_out must")
    assert "the run failed there" in problems[0] and "raises-exception" in problems[0]
    assert problems[1] == "cell 4 (`print('after')`) has no execution count: it never ran"


def test_an_error_in_a_cell_tagged_raises_exception_is_accepted():
    notebook = executed("x = 1", "attention(bad_input)", "print(x)", tags={1: ["raises-exception"]})
    code_cells(notebook)[1].outputs = [error_output()]
    assert check_notebooks.problems_in(notebook) == []
    code_cells(notebook)[1].metadata["tags"] = ["hide-input"]  # the same error without the tag
    assert len(check_notebooks.problems_in(notebook)) == 1


def test_cells_run_out_of_order_or_twice_are_refused_once():
    notebook = executed("a = 1", "b = 2", "c = 3", "d = 4")
    for cell, count in zip(code_cells(notebook), [1, 3, 4, 5]):  # the second cell ran twice
        cell.execution_count = count
    problems = check_notebooks.problems_in(notebook)
    assert problems == [
        "cell 3 (`b = 2`) has execution count 3 where a run from the top gives 2: cells ran out of order, or twice"
    ]


def test_a_kernel_that_had_run_something_else_first_is_refused():
    notebook = executed("a = 1", "b = 2")
    for cell in code_cells(notebook):
        cell.execution_count += 4
    assert "has execution count 5 where a run from the top gives 1" in check_notebooks.problems_in(notebook)[0]


def test_cells_the_executor_skips_need_no_count():
    notebook = executed("a = 1", "b = 2", "c = 3")
    notebook.cells.insert(2, new_code_cell("   \n", execution_count=None))  # an empty cell is never run
    skipped = new_code_cell("slow_training()", execution_count=None)
    skipped.metadata["tags"] = ["skip-execution", "nbval-skip"]
    notebook.cells.insert(4, skipped)
    assert check_notebooks.problems_in(notebook) == []


def test_a_notebook_that_names_another_kernel_is_refused():
    notebook = executed("x = 1")
    notebook.metadata.kernelspec.name = "mha-course-venv"  # a kernel only one machine has
    assert check_notebooks.problems_in(notebook) == [
        "the notebook's kernel is 'mha-course-venv', not 'python3': choose the Python 3 kernel "
        "(Kernel > Change Kernel) and save"
    ]
    del notebook.metadata["kernelspec"]
    assert check_notebooks.problems_in(notebook)[0].startswith("the notebook's kernel is None, not 'python3'")


def test_main_reports_each_problem_with_its_file_and_how_to_fix_it(tmp_path, capsys):
    good, bad, broken = tmp_path / "good.ipynb", tmp_path / "bad.ipynb", tmp_path / "broken.ipynb"
    nbformat.write(executed("x = 1"), good)
    unexecuted = executed("x = 1")
    code_cells(unexecuted)[0].execution_count = None
    nbformat.write(unexecuted, bad)
    broken.write_text("{ not json", encoding="utf-8")

    assert check_notebooks.main([str(good)]) == 0
    assert capsys.readouterr().out == ""

    assert check_notebooks.main([str(good), str(bad), str(broken)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{bad}: cell 2 (`x = 1`) has no execution count: it never ran"
    assert lines[1].startswith(f"{broken}: cannot be read as a notebook")
    assert "jupyter execute --inplace" in lines[2]
    assert len(lines) == 3


def test_the_examples_in_the_script_hold():
    failures, tried = doctest.testmod(check_notebooks)
    assert tried > 0 and failures == 0


def test_every_chapter_is_stored_as_one_clean_run():
    assert CHAPTERS, "no chapter notebooks found in book/"
    assert check_notebooks.check(CHAPTERS) == []


@pytest.mark.parametrize("chapter", CHAPTERS[:1], ids=lambda path: path.name)
def test_a_chapter_with_one_cell_rerun_would_be_refused(chapter):
    """The check over the real chapters can fail: rerunning one of their cells is caught."""
    notebook = json.loads(chapter.read_text(encoding="utf-8"))
    cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code" and cell["execution_count"]]
    cells[0]["execution_count"] = len(cells) + 1
    problems = check_notebooks.problems_in(notebook)
    assert len(problems) == 1 and "ran out of order, or twice" in problems[0]
