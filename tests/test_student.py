"""The student edition: solutions become stubs, nothing of a solution leaks, outputs are cleared,
the rest is unchanged, existing files are never overwritten by accident, and every chapter's
student edition runs top to bottom with each check printing "not implemented yet".
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from mha_course.__main__ import main
from mha_course.exercises import EXERCISES
from mha_course.exercises.student import (BEGIN, END, SolutionMarkerError, has_solution, is_solution_markdown,
                                          student_notebook, student_source, write_student_edition)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p for p in (ROOT / "book").glob("*.ipynb")
                  if any(has_solution(c) for c in nbformat.read(p, as_version=4).cells))
STUB = 'raise NotImplementedError("Replace this line with your solution.")'


def test_function_keeps_only_its_signature():
    source = "\n".join([
        "import torch",
        BEGIN,
        "import math  # a helper the solution needs",
        "",
        "@torch.no_grad()",
        "def transfer(wrapper,",
        "             mha) -> None:  # the header may span lines",
        '    """Copies weights."""',
        "    mha.copy_(wrapper)  # (B, T, d)",
        END,
        "print('after')",
    ])
    assert student_source(source).splitlines() == [
        "import torch",
        "def transfer(wrapper,",
        "             mha) -> None:",
        "    # YOUR CODE HERE",
        f"    {STUB}",
        "print('after')",
    ]


def test_class_keeps_its_header_and_method_signatures():
    source = "\n".join([
        BEGIN,
        "class Heads(nn.Module):",
        '    """Doc."""',
        "    scale = 2",
        "    def __init__(self, d_in, d_out):",
        "        super().__init__()",
        "",
        "    def forward(self, x): return x * self.scale",
        END,
    ])
    assert student_source(source).splitlines() == [
        "class Heads(nn.Module):",
        "    def __init__(self, d_in, d_out):",
        "        # YOUR CODE HERE",
        f"        {STUB}",
        "",
        "    def forward(self, x):",
        "        # YOUR CODE HERE",
        f"        {STUB}",
    ]


def test_regions_inside_a_body_and_plain_statements_become_a_raise():
    inside = "def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"
    assert student_source(inside) == f"def f(x):\n    # YOUR CODE HERE\n    {STUB}"
    plain = f"{BEGIN}\nanswer = 42\n{END}"
    assert student_source(plain) == f"# YOUR CODE HERE\n{STUB}"


def test_two_regions_in_one_cell():
    source = f"{BEGIN}\ndef a():\n    return 1\n{END}\nx = 1\n{BEGIN}\ndef b():\n    return 2\n{END}"
    out = student_source(source)
    assert out.count(STUB) == 2 and "x = 1" in out and "return" not in out


@pytest.mark.parametrize("source,message", [
    (f"{BEGIN}\ndef a():\n    pass", "without a matching"),
    (f"def a():\n    pass\n{END}", "without a ### BEGIN SOLUTION"),
    (f"{BEGIN}\n{BEGIN}\n{END}", "inside another solution"),
])
def test_unbalanced_markers_are_errors(source, message):
    with pytest.raises(SolutionMarkerError, match=message):
        student_source(source)


def _source_notebook() -> nbformat.NotebookNode:
    solution = new_code_cell(f"{BEGIN}\ndef double(x):\n    return 2 * x\n{END}", execution_count=3,
                             outputs=[new_output("stream", name="stdout", text="hi\n")])
    check_cell = new_code_cell('check("1.3", double)', execution_count=4,
                               outputs=[new_output("stream", name="stdout", text="✓\n")])
    check_cell.metadata["tags"] = ["keep-me"]
    return new_notebook(cells=[
        new_markdown_cell("```{exercise} Double\n:label: ex-double\n\nDouble it.\n```"),
        new_markdown_cell("```{solution-start} ex-double\n:class: dropdown\n```"),
        solution,
        new_markdown_cell("```{solution-end}\n```"),
        check_cell,
        new_markdown_cell("````{solution} ex-double\nA text answer.\n````"),
        new_markdown_cell("## Summary"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def test_notebook_drops_solution_wrappers_clears_outputs_keeps_the_rest():
    source = _source_notebook()
    student = student_notebook(source)
    kinds = [c.source.splitlines()[0] for c in student.cells]
    assert kinds == ["```{exercise} Double", "def double(x):", 'check("1.3", double)', "## Summary"]
    assert all(c.outputs == [] and c.execution_count is None for c in student.cells if c.cell_type == "code")
    assert student.cells[2].metadata["tags"] == ["keep-me"]
    assert student.metadata == source.metadata
    assert source.cells[2].outputs  # the source notebook itself is not changed


def test_refuses_to_overwrite_then_force(tmp_path):
    source = tmp_path / "src" / "chapter.ipynb"
    source.parent.mkdir()
    nbformat.write(_source_notebook(), source)
    out = tmp_path / "student"
    written = write_student_edition([source], out)
    assert written == [out / "chapter.ipynb"]
    learner_work = out / "chapter.ipynb"
    learner_work.write_text(learner_work.read_text().replace("YOUR CODE HERE", "my own work"))
    before = learner_work.read_bytes()
    with pytest.raises(FileExistsError, match="nothing was written.*--force"):
        write_student_edition([source], out)
    assert learner_work.read_bytes() == before
    assert main(["student", str(source), "--out", str(out)]) == 1
    assert learner_work.read_bytes() == before
    assert main(["student", str(source), "--out", str(out), "--force"]) == 0
    assert b"my own work" not in learner_work.read_bytes()


def test_book_option_copies_the_book_around_the_notebooks(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "student-book"
    assert main(["student", "--book", "--out", str(out)]) == 0
    for name in ("_config.yml", "_toc.yml", "book/intro.md", "book/_ext/offline_mathjax.py"):
        assert (out / name).read_bytes() == (ROOT / name).read_bytes()
    for chapter in CHAPTERS:
        text = (out / "book" / chapter.name).read_text()
        assert BEGIN not in text and "{solution-start}" not in text


def _solution_lines(cell_source: str) -> tuple[set[str], set[str]]:
    """(lines inside solution regions, lines outside them), stripped and non-empty."""
    inside, outside, in_region = set(), set(), False
    for line in cell_source.splitlines():
        if line.strip() in (BEGIN, END):
            in_region = line.strip() == BEGIN
        elif line.strip():
            (inside if in_region else outside).add(line.strip())
    return inside, outside


@pytest.mark.skipif(not CHAPTERS, reason="no chapter notebook has exercises yet")
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_solution_line_leaks(chapter):
    source = nbformat.read(chapter, as_version=4)
    student = student_notebook(source, chapter.name)
    text = "\n".join(c.source for c in student.cells)
    assert BEGIN not in text and END not in text and "{solution-start}" not in text and "{solution}" not in text
    student_lines = {line.strip() for line in text.splitlines()}
    solutions = [c for c in source.cells if has_solution(c)]
    assert solutions
    # Lines the chapter shows outside its solutions may appear in the student edition too.
    elsewhere = set().union(*(_solution_lines(c.source)[1] for c in source.cells))
    for cell in solutions:
        inside, _ = _solution_lines(cell.source)
        signatures = {line for line in inside if re.match(r"(def|class) \w+", line)}
        leaked = (inside - signatures - elsewhere) & student_lines
        assert not leaked, f"solution lines in the student edition of {chapter.name}: {sorted(leaked)}"
        assert inside - signatures - elsewhere, "a solution made only of lines shown elsewhere proves nothing"
    # Every other cell is unchanged but for its outputs.
    kept = [c for c in source.cells if not has_solution(c) and not is_solution_markdown(c)]
    others = [c for c in student.cells if STUB not in c.source]
    assert [c.source for c in kept] == [c.source for c in others]


def _execute(notebook: nbformat.NotebookNode, folder: Path) -> list[str]:
    """Execute ``notebook`` (raising on any error) and return the verdict lines its checks printed."""
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    printed = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    return re.findall(r"^○ (\d+\.\d+) not implemented yet$", printed, re.MULTILINE)


def _checked(notebook: nbformat.NotebookNode) -> list[str]:
    source = "".join(c.source for c in notebook.cells)
    return [e for e in EXERCISES if f'check("{e}",' in source]


def _exercise_section(notebook: nbformat.NotebookNode) -> list:
    start = next(i for i, c in enumerate(notebook.cells)
                 if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    return notebook.cells[start:]


@pytest.mark.skipif(not CHAPTERS, reason="no chapter notebook has exercises yet")
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_exercises_come_last_so_stubs_cannot_break_the_chapter(chapter):
    # After the Exercises heading a chapter has only exercise cells (set-up imports, stubs, checks)
    # and markdown, so a stub that raises can never break a cell that reads the chapter's results.
    student = student_notebook(nbformat.read(chapter, as_version=4), chapter.name)
    code = [c.source for c in _exercise_section(student) if c.cell_type == "code"]
    assert code[0].startswith(("from ", "import "))
    stubs = [c for c in code[1:] if STUB in c]
    checks = [c for c in code[1:] if re.fullmatch(r'check\("\d+\.\d+", \w+\)', c)]
    number = int(chapter.name.split("_")[0])
    assert len(stubs) == len(checks) == len(_checked(student)) == sum(e.chapter == number for e in EXERCISES.values())
    for cell in checks:  # the grader probes each answer by the name its exercise gives
        exercise_id, name = re.fullmatch(r'check\("(\d+\.\d+)", (\w+)\)', cell).groups()
        assert name == EXERCISES[exercise_id].answer_name
    assert len(stubs) + len(checks) == len(code) - 1


@pytest.mark.skipif(not CHAPTERS, reason="no chapter notebook has exercises yet")
def test_first_student_chapter_runs_top_to_bottom_and_every_check_waits(tmp_path):
    [path] = write_student_edition(CHAPTERS[:1], tmp_path)
    notebook = nbformat.read(path, as_version=4)
    assert _execute(notebook, CHAPTERS[0].parent) == _checked(notebook)


@pytest.mark.skipif(len(CHAPTERS) < 2, reason="only one chapter has exercises")
def test_later_chapters_exercise_sections_run_and_every_check_waits(tmp_path):
    # The whole of each later chapter already runs under nbval in its source edition; what the
    # student edition changes is its exercise section, run here after the chapter's imports, all
    # chapters in one kernel to keep the test fast.
    cells = []
    for path in write_student_edition(CHAPTERS[1:], tmp_path):
        student = nbformat.read(path, as_version=4)
        imports = next(c for c in student.cells if c.cell_type == "code")
        cells += [imports, *_exercise_section(student)]
    for number, cell in enumerate(cells):
        cell["id"] = f"cell-{number}"  # ids are unique per chapter, not across chapters
    notebook = nbformat.v4.new_notebook(cells=cells, metadata=student.metadata)
    assert _execute(notebook, CHAPTERS[0].parent) == _checked(notebook)
