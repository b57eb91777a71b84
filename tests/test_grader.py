"""The grader on small hostile notebooks (tests/notebooks/): one that raises, one that tampers
(redefines check, monkeypatches the package and torch, deletes an answer, forges a record), one
whose kernel dies, and one that never ends. The grader must survive each, say what happened, score
what it can by checking the answers itself, and leave the learner's files untouched.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from mha_course.__main__ import main
from mha_course.exercises.grader import exercises_for, grade_notebook

NOTEBOOKS = Path(__file__).parent / "notebooks"
HOSTILE = ["raises.ipynb", "tampers.ipynb", "exits.ipynb"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One run of the grade command over three hostile notebooks (a kernel start each)."""
    out = tmp_path_factory.mktemp("grade") / "scores.json"
    paths = [NOTEBOOKS / name for name in HOSTILE]
    before = {path: path.read_bytes() for path in paths}
    listing = sorted(NOTEBOOKS.iterdir())
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        returncode = main(["grade", *map(str, paths), "--json", str(out), "--timeout", "300",
                           "--check-timeout", "120"])
    proc = SimpleNamespace(returncode=returncode, stdout=stdout.getvalue(), stderr=stderr.getvalue())
    scores = json.loads(out.read_text()) if out.exists() else None
    by_name = {Path(n["notebook"]).name: n for n in scores["notebooks"]} if scores else {}
    return SimpleNamespace(proc=proc, scores=scores, by_name=by_name, before=before, listing=listing)


def _statuses(notebook: dict) -> dict[str, str]:
    return {e["id"]: e["status"] for e in notebook["exercises"]}


def test_command_succeeds_with_table_json_and_progress_bar(graded):
    assert graded.proc.returncode == 0, graded.proc.stderr
    out = graded.proc.stdout
    assert "exercise result" in out and "Total: 2/9 exercises passed in 3 notebook(s)" in out
    assert "Grading" in graded.proc.stderr and "3/3" in graded.proc.stderr  # the tqdm bar
    assert graded.scores["score"] == 2 and graded.scores["max_score"] == 9
    assert [Path(n["notebook"]).name for n in graded.scores["notebooks"]] == HOSTILE


def test_learners_files_are_untouched(graded):
    for path, content in graded.before.items():
        assert path.read_bytes() == content
    assert sorted(NOTEBOOKS.iterdir()) == graded.listing  # nothing written next to them


def test_a_cell_that_raises_is_reported_and_the_rest_still_counts(graded):
    notebook = graded.by_name["raises.ipynb"]
    assert _statuses(notebook) == {"1.1": "passed", "1.2": "failed", "1.3": "not implemented"}
    assert "cell 6 raised ZeroDivisionError: division by zero" in notebook["events"]
    wrong = notebook["exercises"][1]
    assert "Nothing stops a token from attending to later tokens" in wrong["line"]
    assert wrong["checks_passed"] == 3 and wrong["checks_total"] == 8
    assert notebook["score"] == 1 and notebook["max_score"] == 3


def test_tampering_cannot_fake_a_pass(graded):
    notebook = graded.by_name["tampers.ipynb"]
    # The wrong mask fails although the notebook redefined check, printed a pass, monkeypatched
    # the package's checks and torch.allclose/torch.equal, and forged a record file.
    assert _statuses(notebook) == {"1.1": "failed", "1.2": "passed", "1.3": "missing"}
    first = notebook["exercises"][0]
    assert first["notebook_printed"] == "✓ 1.1 passed (5 checks)"
    assert "You returned the visibility table" in first["line"]
    assert "1.1: the notebook printed a pass, but the grader's own check says failed" in notebook["events"]
    # The deleted answer is reported as missing, by name.
    assert "no head_shapes is defined in the notebook" in notebook["exercises"][2]["line"]
    assert "1.3: the notebook printed a pass, but the grader's own check says missing" in notebook["events"]


def test_a_kernel_that_dies_is_reported(graded):
    notebook = graded.by_name["exits.ipynb"]
    assert set(_statuses(notebook).values()) == {"not checked"}
    assert any(event.startswith("the kernel died while running cell 3") for event in notebook["events"])
    assert notebook["score"] == 0
    assert "the kernel died while running cell 3" in graded.proc.stdout


def test_a_notebook_that_never_ends_times_out_and_is_still_graded():
    path = NOTEBOOKS / "hangs.ipynb"
    before = path.read_bytes()
    report = grade_notebook(path, timeout=3, check_timeout=3)
    assert path.read_bytes() == before
    statuses = {e.id: e.status for e in report.exercises}
    # 1.1 was defined before the endless cell; the answer to 1.2 never returns when called;
    # 1.3 would have been defined after the endless cell.
    assert statuses == {"1.1": "passed", "1.2": "timed out", "1.3": "missing"}
    assert report.events[0].startswith("timed out: still running cell 3 after 3 s for the whole notebook")
    assert "causal_attention_forward was still running after 3 s" in report.exercises[1].line
    assert report.seconds < 120


def test_exercises_are_found_by_check_calls_and_chapter_file_names(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('check( "2.3", f)')])
    assert exercises_for(notebook, tmp_path / "mine.ipynb") == ["2.1", "2.2", "2.3"]
    empty = nbformat.v4.new_notebook()
    assert exercises_for(empty, tmp_path / "03_batched.ipynb") == ["3.1", "3.2", "3.3", "3.4", "3.5"]
    assert exercises_for(empty, tmp_path / "05_why_several_heads.ipynb") == ["5.1"]
    assert exercises_for(empty, tmp_path / "notes.ipynb") == []


def test_missing_notebook_and_bad_timeout_are_usage_errors(capsys, tmp_path):
    assert main(["grade", str(tmp_path / "nope.ipynb")]) == 2
    assert "No such notebook" in capsys.readouterr().err
    assert main(["grade", str(NOTEBOOKS / "raises.ipynb"), "--timeout", "0"]) == 2
    assert "--timeout and --check-timeout must be positive" in capsys.readouterr().err


def test_an_unreadable_notebook_is_reported_not_raised(tmp_path):
    broken = tmp_path / "01_broken.ipynb"
    broken.write_text("{ this is not json")
    report = grade_notebook(broken)
    assert report.exercises == [] and report.events[0].startswith("could not read the notebook")


def test_a_chapter_5_notebook_is_graded_by_its_file_name(tmp_path):
    # No check calls at all: the file name says chapter 5, and the answer is found by name.
    cells = [
        "import copy\nimport torch\nfrom mha_course.specialise import accuracy",
        "def accuracy_drop(model, head, tokens, labels):\n    ablated = copy.deepcopy(model)\n"
        "    d_h = model.attention.head_dim\n    with torch.no_grad():\n"
        "        ablated.attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0\n"
        "    return accuracy(ablated, tokens, labels) - accuracy(model, tokens, labels)  # the wrong way round",
    ]
    path = tmp_path / "05_why_several_heads.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    report = grade_notebook(path, timeout=120, check_timeout=120)
    assert {e.id: e.status for e in report.exercises} == {"5.1": "failed"}
    assert "Your drop has the wrong sign" in report.exercises[0].line
    assert report.score == 0 and report.max_score == 1
