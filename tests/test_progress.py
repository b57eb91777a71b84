"""``python -m mha_course progress``: every chapter's exercises as passed, failed or not started,
graded once per notebook content and package, and read back from the cache while nothing changed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from conftest import POSIX_GRADING
from mha_course.__main__ import main
from mha_course.exercises import EXERCISES
from mha_course.grading.report import ExerciseScore, NotebookReport
from mha_course.grading import progress as progress_module
from mha_course.grading.progress import CACHE_NAME, chapter_notebooks, progress, state

NOTEBOOKS = Path(__file__).parent / "notebooks"
CHAPTERS = sorted({e.chapter for e in EXERCISES.values()})


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A learner's folder: chapter 1 half done (raises.ipynb: one pass, one failure, one stub)."""
    folder = tmp_path_factory.mktemp("student")
    shutil.copyfile(NOTEBOOKS / "raises.ipynb", folder / "01_one_causal_head.ipynb")
    (folder / "notes.ipynb").write_text("not a chapter", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def first(folder):
    return progress(folder, show_bar=False)


def _states(chapter) -> dict[str, str]:
    return {e.id: state(e) for e in chapter.exercises}


@POSIX_GRADING
@pytest.mark.kernel
def test_every_chapter_is_listed_with_its_exercises(first):
    assert [c.chapter for c in first] == CHAPTERS
    one = first[0]
    assert one.notebook == "01_one_causal_head.ipynb" and not one.reused
    assert _states(one) == {"1.1": "passed", "1.2": "failed", "1.3": "not started"}
    assert [(e.checks_passed, e.checks_total) for e in one.exercises] == [(6, 6), (3, 8), (0, 10)]
    assert "Nothing stops a token from attending to later tokens" in one.exercises[1].line
    for chapter in first[1:]:  # no notebook for them yet
        assert chapter.notebook is None and set(_states(chapter).values()) == {"not started"}


@POSIX_GRADING
@pytest.mark.kernel
def test_an_unchanged_notebook_is_not_graded_again(folder, first, monkeypatch, capsys):
    graded = []
    monkeypatch.setattr(progress_module, "grade", lambda paths, *args, **kwargs: graded.extend(paths) or [])
    assert main(["progress", str(folder)]) == 0
    assert graded == []
    out = capsys.readouterr().out
    assert "Chapter 1: 1 of 3 passed - 01_one_causal_head.ipynb (unchanged since it was last graded)" in out
    chapter_1 = out.split("\n\n")[0].splitlines()
    assert chapter_1[1:6] == ["exercise  state        checks  title",
                              "--------  -----------  ------  ----------------------------------------",
                              "1.1       passed          6/6  build the causal mask",
                              "1.2       failed          3/8  one causal head's forward pass",
                              "1.3       not started    0/10  the shapes along one head's forward pass"]
    assert chapter_1[6].startswith("✗ 1.2: ") and len(chapter_1) == 7  # the failure, under the table
    assert f"Chapter 2: 0 of 3 passed - no notebook for it in {folder}/" in out
    total = len(EXERCISES)
    assert out.rstrip().endswith(f"1 of {total} exercises passed, 1 failed, {total - 2} not started.")


@POSIX_GRADING
@pytest.mark.kernel
def test_a_changed_notebook_or_package_is_graded_again(folder, first, monkeypatch):
    cache = json.loads((folder / CACHE_NAME).read_text(encoding="utf-8"))
    assert set(cache["notebooks"]) == {"01_one_causal_head.ipynb"}
    graded = []

    def fake_grade(paths, *args, **kwargs):
        graded.extend(Path(p).name for p in paths)
        return [NotebookReport(str(p)) for p in paths]

    monkeypatch.setattr(progress_module, "grade", fake_grade)
    path = folder / "01_one_causal_head.ipynb"
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("print('one more cell')"))
    nbformat.write(notebook, path)
    progress(folder, show_bar=False)
    assert graded == ["01_one_causal_head.ipynb"]
    # A cache written by another version of the package is ignored.
    cache["package"] = "0.0.0+other"
    (folder / CACHE_NAME).write_text(json.dumps(cache), encoding="utf-8")
    graded.clear()
    progress(folder, show_bar=False)
    assert graded == ["01_one_causal_head.ipynb"]


def _fake_grading(monkeypatch, status: str) -> list[str]:
    """Replace grading by one that records the notebooks it grades and gives each exercise ``status``."""
    graded = []

    def fake_grade(paths, *args, **kwargs):
        graded.extend(Path(p).name for p in paths)
        return [NotebookReport(str(p), [ExerciseScore("1.1", "t", status, 0, 0, 6, f"✗ 1.1: {status}")])
                for p in paths]

    monkeypatch.setattr(progress_module, "grade", fake_grade)
    return graded


def test_other_time_limits_grade_the_notebook_again(tmp_path, monkeypatch):
    shutil.copyfile(NOTEBOOKS / "raises.ipynb", tmp_path / "01_one_causal_head.ipynb")
    graded = _fake_grading(monkeypatch, "failed")
    progress(tmp_path, show_bar=False)
    progress(tmp_path, show_bar=False)
    assert graded == ["01_one_causal_head.ipynb"]  # the same limits: the verdict is reused
    for limits in ({"timeout": 900.0}, {"cell_timeout": 200.0}, {"check_timeout": 300.0}):
        graded.clear()
        progress(tmp_path, show_bar=False, **limits)
        assert graded == ["01_one_causal_head.ipynb"], limits


@pytest.mark.parametrize("status", progress_module.UNSETTLED)
def test_a_grading_the_machine_cut_short_is_not_kept(tmp_path, monkeypatch, status):
    shutil.copyfile(NOTEBOOKS / "raises.ipynb", tmp_path / "01_one_causal_head.ipynb")
    graded = _fake_grading(monkeypatch, status)
    first = progress(tmp_path, show_bar=False)
    assert first[0].exercises[0].line == f"✗ 1.1: {status}"  # shown, but not cached
    progress(tmp_path, show_bar=False)
    assert graded == ["01_one_causal_head.ipynb"] * 2
    assert json.loads((tmp_path / CACHE_NAME).read_text(encoding="utf-8"))["notebooks"] == {}


def test_chapter_notebooks_are_found_by_number(tmp_path):
    for name in ("02_mine.ipynb", "01_a.ipynb", "1_b.ipynb", "notes.ipynb", "10_later.ipynb"):
        (tmp_path / name).write_text("{}", encoding="utf-8")
    assert {n: p.name for n, p in chapter_notebooks(tmp_path).items()} == {1: "01_a.ipynb", 2: "02_mine.ipynb",
                                                                           10: "10_later.ipynb"}


@POSIX_GRADING
def test_a_missing_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["progress", str(tmp_path / "nope")]) == 2
    assert "No such folder" in capsys.readouterr().err
