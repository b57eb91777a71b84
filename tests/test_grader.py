"""The grader on small hostile notebooks (tests/notebooks/): one that raises, one that tampers
(redefines check, monkeypatches the package and torch, deletes an answer, forges a record), one that
patches torch.save when its answer is checked, one that edits the package's files on disk, one
whose kernel dies, one that calls exit(), one that never ends, one whose answers walk around the
check "written by you", one whose answers read constants computed by a call, one whose class body
swaps an exercise's probe, one whose kernel is not installed, one whose replayed code tries to
choose the seed of the checks' inputs, one whose right answers are bound by calls
(``functools.partial``, ``lru_cache``, a decorator applied by hand) or are lambdas reading a constant,
and one whose right answer to 9.2 reads its tensors' numbers (``nonzero``), which PyTorch's meta device cannot. The grader must survive each, say what happened and in which
cell, score only what the answers themselves earn, and never write into the learner's files or the
package's.

The hostile notebooks are graded by the grade command in a process of its own, from temporary
copies of the notebooks and of the package (``PYTHONPATH``), never against the repository: all of
them in one shared run (a kernel and an answer process each, three at a time), but the notebook that
never ends, which is graded at the same time in a run of its own with short limits (it only waits
for them). The tests below read both runs. The time limits leave room for a machine whose cores are
all busy with other work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

from conftest import POSIX_GRADING
from mha_course.__main__ import main
from mha_course.exercises.definitions import defined_names, definitions
from mha_course.grading.grader import grade, grade_notebook
from mha_course.grading.grading_setup import GradingUnavailableError
from mha_course.grading.answer_process import from_message, to_message
from mha_course.grading.sandbox import PackageSnapshot
from mha_course.grading.sandbox import BUBBLEWRAP
from mha_course.grading.report import NotebookReport, chapters_of, format_report, score

#: The tests that start kernels (the grade command's runs): make test runs them, make check does not.
KERNEL = pytest.mark.kernel
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = Path(__file__).parent / "notebooks"
SHARED = ["raises.ipynb", "tampers.ipynb", "exits.ipynb", "patches_save.ipynb", "calls_exit.ipynb",
          "edits_package.ipynb", "walks_around_the_watch.ipynb", "constants_computed_by_a_call.ipynb",
          "swaps_a_probe.ipynb", "01_names_another_kernel.ipynb"]
CHAPTER_5 = [
    "import copy\nimport torch\nfrom mha_course import check\nfrom mha_course.experiments.specialisation import accuracy",
    "def accuracy_drop(model, head, tokens, labels):\n    ablated = copy.deepcopy(model)\n"
    "    d_h = model.attention.head_dim\n    with torch.no_grad():\n"
    "        ablated.attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0\n"
    "    return accuracy(ablated, tokens, labels) - accuracy(model, tokens, labels)  # the wrong way round",
    'check("5.1", accuracy_drop)',
    "def accuracy_drop(model, head, tokens, labels):  # fixed, but its check was not run again\n"
    "    ablated = copy.deepcopy(model)\n    d_h = model.attention.head_dim\n    with torch.no_grad():\n"
    "        ablated.attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0\n"
    "    return accuracy(model, tokens, labels) - accuracy(ablated, tokens, labels)",
]


def package_copy(folder: Path) -> dict[str, str]:
    """Copy the package into ``folder``; return the environment under which ``python -m mha_course``
    imports that copy (it comes before the repository's editable install on ``sys.path``)."""
    shutil.copytree(ROOT / "mha_course", folder / "mha_course", ignore=shutil.ignore_patterns("__pycache__"))
    return {**os.environ, "PYTHONPATH": str(folder), "PYTHONDONTWRITEBYTECODE": "1"}


def sources(package: Path) -> dict[str, bytes]:
    return {p.relative_to(package).as_posix(): p.read_bytes() for p in sorted(package.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def grade_command(args: list[str], cwd: Path, env: dict[str, str], **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mha_course", "grade", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


# Limits for the shared run. Every answer and cell of these notebooks takes well under a second on
# an idle machine, but a first cell imports torch and the package: on one core shared with other
# work that took more than 20 s, and a cell that runs out of time leaves its imports out of the
# replay. So the limits are wide; no notebook of the shared run reaches them.
CELL_LIMIT, CHECK_LIMIT = 90, 60
#: The notebook that never ends, and its own run's limits, which it waits for. Its cells import
#: nothing as they run, and the check limit starts once the answer process has imported torch and
#: replayed the definitions (within --timeout): each cell and answer that ends takes milliseconds.
HANGS = "01_hangs.ipynb"
HANGS_CELL_LIMIT, HANGS_CHECK_LIMIT = 10, 10


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One run of the grade command over copies of the hostile notebooks, a chapter 5 notebook and a
    notebook that tries to fix the seed, against a copy of the package; and, at the same time, a run
    of its own over a copy of the notebook that never ends, against another copy."""
    folder = tmp_path_factory.mktemp("grade")
    hangs_folder = tmp_path_factory.mktemp("grade-hangs")
    hangs_env = package_copy(hangs_folder / "installed")
    hangs_env.pop("MHA_COURSE_CHECK_SEED", None)
    hangs_path = hangs_folder / "notebooks" / HANGS
    hangs_path.parent.mkdir()
    shutil.copy(NOTEBOOKS / HANGS, hangs_path)
    hangs_out = hangs_folder / "scores.json"
    env = package_copy(folder / "installed")
    env.pop("MHA_COURSE_CHECK_SEED", None)  # every check draws its seed, as for a learner
    notebooks = folder / "notebooks"
    shutil.copytree(NOTEBOOKS, notebooks)
    written = {"05_why_several_heads.ipynb": CHAPTER_5, "honest_bindings.ipynb": HONEST_BINDINGS, **_fixes_the_seed(),
               "09_padded_by_nonzero.ipynb": PADDED_BY_NONZERO}
    for name, cells in written.items():
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), notebooks / name)
    out = folder / "scores.json"
    paths = [notebooks / name for name in [*SHARED, *written]]
    before = {path: path.read_bytes() for path in paths}
    before[hangs_path] = hangs_path.read_bytes()
    listing = sorted(notebooks.iterdir())
    package_before = sources(folder / "installed" / "mha_course")
    hangs_package_before = sources(hangs_folder / "installed" / "mha_course")
    hangs = grade_command([str(hangs_path), "--json", str(hangs_out), "--timeout", "600", "--cell-timeout",
                           str(HANGS_CELL_LIMIT), "--check-timeout", str(HANGS_CHECK_LIMIT)], hangs_folder, hangs_env)
    try:
        process = grade_command([*map(str, paths), "--json", str(out), "--timeout", "600", "--cell-timeout",
                                 str(CELL_LIMIT), "--check-timeout", str(CHECK_LIMIT), "--jobs", "3"], folder, env)
        try:
            stdout, stderr = process.communicate(timeout=900)
        finally:
            if process.poll() is None:
                process.kill()
        hangs_stdout, hangs_stderr = hangs.communicate(timeout=900)
    finally:
        if hangs.poll() is None:
            hangs.kill()
    proc = SimpleNamespace(returncode=process.returncode, stdout=stdout, stderr=stderr)
    hangs_proc = SimpleNamespace(returncode=hangs.returncode, stdout=hangs_stdout, stderr=hangs_stderr)
    scores = json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
    hangs_scores = json.loads(hangs_out.read_text(encoding="utf-8")) if hangs_out.exists() else None
    by_name = {Path(n["notebook"]).name: n for n in [*(scores or {}).get("notebooks", []),
                                                     *(hangs_scores or {}).get("notebooks", [])]}
    return SimpleNamespace(proc=proc, scores=scores, by_name=by_name, before=before, listing=listing, out=out,
                           notebooks=notebooks, names=[p.name for p in paths], hangs_proc=hangs_proc,
                           hangs_scores=hangs_scores, hangs_notebooks=hangs_path.parent,
                           package_unchanged=sources(folder / "installed" / "mha_course") == package_before,
                           hangs_package_unchanged=sources(hangs_folder / "installed" / "mha_course")
                           == hangs_package_before)


def _statuses(notebook: dict) -> dict[str, str]:
    return {e["id"]: e["status"] for e in notebook["exercises"]}


def _line(notebook: dict, exercise_id: str) -> str:
    return next(e["line"] for e in notebook["exercises"] if e["id"] == exercise_id)


@POSIX_GRADING
@KERNEL
def test_command_succeeds_with_table_json_and_progress_bar(graded):
    assert graded.proc.returncode == 1, graded.proc.stderr  # it ran to its end; not every exercise passed
    out = graded.proc.stdout
    # The table printed is the one the JSON's reports make, then where the JSON went.
    reports = [NotebookReport.from_dict(n) for n in graded.scores["notebooks"]]
    assert out == format_report(reports) + f"\nScores written to {graded.out}\n"
    walks = _statuses(graded.by_name["walks_around_the_watch.ipynb"])["1.1"] == "passed"  # out of scope: either
    assert f"Total: {15 + walks}/51 exercises passed in 14 notebook(s)" in out
    assert "Grading" in graded.proc.stderr and "14/14" in graded.proc.stderr  # the progress line
    assert "Task exception" not in graded.proc.stderr
    assert graded.scores["score"] == 15 + walks and graded.scores["max_score"] == 51
    assert [Path(n["notebook"]).name for n in graded.scores["notebooks"]] == graded.names
    # The notebook that never ends, in its run of its own: the same table and JSON, to its end.
    hangs = graded.hangs_proc
    assert hangs.returncode == 1, hangs.stderr
    reports = [NotebookReport.from_dict(n) for n in graded.hangs_scores["notebooks"]]
    assert [r.notebook for r in reports] == [str(graded.hangs_notebooks / HANGS)]
    assert "Total: 2/3 exercises passed in 1 notebook(s)" in hangs.stdout
    assert hangs.stdout == format_report(reports) + f"\nScores written to {graded.hangs_notebooks.parent / 'scores.json'}\n"
    assert "Task exception" not in hangs.stderr  # nbclient's reader of an interrupted cell stays quiet


@POSIX_GRADING
@KERNEL
def test_learners_files_and_the_package_are_untouched(graded):
    for path, content in graded.before.items():
        assert path.read_bytes() == content
    assert sorted(graded.notebooks.iterdir()) == graded.listing  # nothing written next to them
    assert sorted(graded.hangs_notebooks.iterdir()) == [graded.hangs_notebooks / HANGS]
    assert graded.package_unchanged  # the copy it graded with (the repository's is never involved)
    assert graded.hangs_package_unchanged


@POSIX_GRADING
@KERNEL
def test_a_cell_that_raises_is_reported_by_its_first_line_and_the_rest_still_counts(graded):
    notebook = graded.by_name["raises.ipynb"]
    assert _statuses(notebook) == {"1.1": "passed", "1.2": "failed", "1.3": "not implemented"}
    # Cells are named by their number counting every cell, and by their first line.
    assert notebook["events"] == ["cell 7 (`ratio = 1 / 0  # an error halfway through`) raised ZeroDivisionError: "
                                  "division by zero"]
    wrong = notebook["exercises"][1]
    assert "Nothing stops a token from attending to later tokens" in wrong["line"]
    assert wrong["checks_passed"] == 3 and wrong["checks_total"] == 8
    assert notebook["score"] == 1 and notebook["max_score"] == 3


@POSIX_GRADING
@KERNEL
def test_tampering_cannot_fake_a_pass(graded):
    notebook = graded.by_name["tampers.ipynb"]
    # The wrong mask fails although the notebook redefined check, printed a pass, monkeypatched
    # the package's checks and torch.allclose/torch.equal, and forged a record file.
    assert _statuses(notebook) == {"1.1": "failed", "1.2": "passed", "1.3": "missing"}
    first = notebook["exercises"][0]
    assert first["notebook_printed"] == "✓ 1.1 passed (5 checks)"
    assert "You returned the visibility table" in first["line"]
    assert ("1.1: the notebook printed a pass (✓ 1.1 passed (5 checks)), but the grader's own check says failed"
            in notebook["events"])
    # The deleted answer is reported as missing, by name.
    assert "no head_shapes is defined in the notebook" in _line(notebook, "1.3")
    assert any(e.startswith("1.3: the notebook printed a pass") and e.endswith("says missing")
               for e in notebook["events"])


@POSIX_GRADING
@KERNEL
def test_an_answer_that_patches_torch_while_it_is_checked_is_judged_on_what_it_does(graded):
    notebook = graded.by_name["patches_save.ipynb"]
    # The grader saves nothing with torch.save: the stub that patches it when it is called is a
    # stub still, as are the others.
    assert _statuses(notebook) == {"1.1": "not implemented", "1.2": "not implemented", "1.3": "not implemented"}
    assert notebook["score"] == 0
    assert not any("printed" in event for event in notebook["events"])  # it printed ○ and was told ○


@POSIX_GRADING
@KERNEL
def test_a_kernel_that_dies_is_blamed_on_its_cell_and_answers_before_it_count(graded):
    notebook = graded.by_name["exits.ipynb"]
    assert _statuses(notebook) == {"1.1": "passed", "1.2": "missing", "1.3": "missing"}
    assert notebook["events"] == ["the kernel died while running cell 4 (`import os`) (did it exit or crash Python?)"]
    assert "the kernel died while running cell 4 (`import os`)" in graded.proc.stdout


@POSIX_GRADING
@KERNEL
def test_exit_is_blamed_on_the_cell_that_called_it(graded):
    notebook = graded.by_name["calls_exit.ipynb"]
    # The right answer before exit() passes; the one after it never ran, and says why.
    assert _statuses(notebook) == {"1.1": "passed", "1.2": "not run", "1.3": "missing"}
    assert notebook["events"][0].startswith("cell 5 (`def broken(:`) raised SyntaxError")
    assert notebook["events"][1] == ("cell 6 (`exit()  # the kernel stops a moment after this cell ends`) called "
                                     "exit(): the kernel stopped; the 2 code cell(s) after it did not run")
    assert _line(notebook, "1.2") == (
        "✗ 1.2: not run: cell 6 (`exit()  # the kernel stops a moment after this cell ends`) called exit(), which "
        "stopped the kernel; causal_attention_forward is defined in cell 7 (`def causal_attention_forward(x, "
        "W_query, W_key, W_value):`), which did not run to its end")
    assert notebook["score"] == 1


@POSIX_GRADING
@KERNEL
def test_a_cell_that_never_ends_is_interrupted_and_the_notebook_goes_on(graded):
    notebook = graded.by_name[HANGS]
    # 1.1 was defined before the endless cell; the answer to 1.2 never returns when called;
    # 1.3 is defined after the endless cell, which was interrupted after its limit.
    assert _statuses(notebook) == {"1.1": "passed", "1.2": "timed out", "1.3": "passed"}
    assert notebook["events"] == [f"timed out: cell 4 (`while True:  # a notebook that never ends`) was still running "
                                  f"after {HANGS_CELL_LIMIT} s (the limit for one cell; raise it with --cell-timeout "
                                  "SECONDS); it was interrupted"]
    assert _line(notebook, "1.2") == (
        f"✗ 1.2: timed out: causal_attention_forward was still running after {HANGS_CHECK_LIMIT} s (the limit for "
        "checking one answer; raise it with --check-timeout SECONDS)")


@POSIX_GRADING
@KERNEL
def test_a_chapter_5_notebook_is_graded_by_name_and_a_stale_verdict_is_reported(graded):
    notebook = graded.by_name["05_why_several_heads.ipynb"]
    assert _statuses(notebook) == {"5.1": "passed"}
    # The notebook printed ✗ for its first attempt; the answer it ends with passes.
    [event] = notebook["events"]
    assert event.startswith("5.1: the notebook printed no pass (✗ 5.1") and event.endswith("says passed")


@POSIX_GRADING
@KERNEL
def test_a_notebook_that_edits_the_package_is_refused_or_not_scored_and_the_others_are_unaffected(graded):
    # The kernel imports the grading's copy of the package, so the notebook's edit reaches that copy,
    # never the installed files (test_learners_files_and_the_package_are_untouched) nor the notebooks
    # graded beside it, whose verdicts the tests above check. In a sandbox the copy is read-only, and
    # the edit is refused outright.
    notebook = graded.by_name["edits_package.ipynb"]
    assert notebook["score"] == 0
    if notebook["sandbox"] == BUBBLEWRAP:
        assert set(_statuses(notebook).values()) == {"not implemented"}
        [event] = notebook["events"]
        assert event.startswith("cell 3 (`FORGERY = ") and "raised OSError: [Errno 30] Read-only file system" in event
    else:
        assert set(_statuses(notebook).values()) == {"not scored"}
        assert notebook["events"] == ["not scored: the notebook changed the package's files (grading/answer_process.py)"]


#: A right answer to 9.2 that reads its tensors' numbers, one sequence at a time.
PADDED_BY_NONZERO = [
    "import torch\nfrom mha_course import check",
    "def padded_attention(queries, keys, values, attention_mask):\n    out = torch.zeros_like(queries)\n"
    "    for b in range(len(queries)):\n        real = attention_mask[b].nonzero().flatten()\n"
    "        q, k, v = queries[b][:, real], keys[b][:, real], values[b][:, real]\n"
    "        future = torch.ones(len(real), len(real), dtype=torch.bool, device=q.device).triu(1)\n"
    "        scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(future, float('-inf'))\n"
    "        out[b][:, real] = torch.softmax(scores, dim=-1) @ v\n    return out",
    'check("9.2", padded_attention)',
]


@POSIX_GRADING
@KERNEL
def test_a_right_answer_that_reads_its_tensors_numbers_passes_in_the_grader_as_in_the_notebook(graded):
    report = graded.by_name["09_padded_by_nonzero.ipynb"]
    assert _statuses(report) == {"9.1": "missing", "9.2": "passed"}, report
    assert report["exercises"][1]["notebook_printed"].startswith("✓ 9.2 passed")


WAITS_FOR_AN_EDIT = [
    "import pathlib, time\npathlib.Path('running').touch()  # in its own folder, where the test looks\n"
    "while not pathlib.Path('saved').exists():\n    time.sleep(0.05)",
    "import importlib.util, mha_course\nfrom mha_course.attention import heads\n"
    "assert 'A contributor' not in pathlib.Path(heads.__file__).read_text(), 'the kernel imported the edit'\n"
    "assert importlib.util.find_spec('mha_course.new_module') is None, 'the kernel found the new module'",
    "def build_causal_mask(num_tokens, device=None):\n    import torch\n"
    "    return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).triu(1)",
]


@POSIX_GRADING
@KERNEL
def test_an_edit_and_a_new_module_saved_while_grading_runs_are_kept_and_change_no_grade(tmp_path):
    """A contributor saves a module and adds one while a notebook is graded: both are there afterwards, and
    the notebook that ran meanwhile was graded with the package as grading found it."""
    env = package_copy(tmp_path / "installed")
    package = tmp_path / "installed" / "mha_course"
    notebook = tmp_path / "01_mine.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in WAITS_FOR_AN_EDIT]), notebook)
    out = tmp_path / "scores.json"
    grading_folders = Path(tempfile.mkdtemp())  # the grader's temporary folders go there, the notebook's among them
    process = grade_command([str(notebook), "--json", str(out), "--timeout", "600"], tmp_path,
                            {**env, "TMPDIR": str(grading_folders)})
    edited = (package / "attention" / "heads.py").read_text(encoding="utf-8") + "\n# A contributor's edit, saved while grading.\n"
    try:
        deadline = time.monotonic() + 600
        while not (running := list(grading_folders.glob("mha-grading-*/*/running"))) and (
                process.poll() is None and time.monotonic() < deadline):
            time.sleep(0.1)
        assert running, process.communicate()[1]
        (package / "attention" / "heads.py").write_text(edited, encoding="utf-8")
        (package / "new_module.py").write_text("NEW = True\n", encoding="utf-8")
        (running[0].parent / "saved").touch()
        _, stderr = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
        shutil.rmtree(grading_folders, ignore_errors=True)
    assert (package / "attention" / "heads.py").read_text(encoding="utf-8") == edited
    assert (package / "new_module.py").read_text(encoding="utf-8") == "NEW = True\n"
    [report] = json.loads(out.read_text(encoding="utf-8"))["notebooks"]
    assert _statuses(report)["1.1"] == "passed" and report["events"] == [], (report, stderr)


@POSIX_GRADING
@KERNEL
def test_the_grader_refuses_an_answer_that_walks_around_the_watch(graded):
    report = graded.by_name["walks_around_the_watch.ipynb"]
    # 1.2 calls torch's fused attention from a thread it starts: refused. 1.1 switches the check's
    # profile function off before it calls the package's mask: deliberate sabotage of its own check,
    # which the threat model leaves out of scope (grading/__init__.py); its verdict is not asserted.
    statuses = _statuses(report)
    assert statuses["1.2"] == "failed" and statuses["1.3"] == "missing", report
    assert _line(report, "1.2").startswith("✗ 1.2: written by you: ")
    assert "scaled_dot_product_attention" in _line(report, "1.2")


@POSIX_GRADING
@KERNEL
def test_answers_that_read_a_constant_computed_by_a_call_pass_in_the_grader_as_in_the_notebook(graded):
    report = graded.by_name["constants_computed_by_a_call.ipynb"]
    statuses = {e["id"]: e["status"] for e in report["exercises"] if e["id"] in ("1.1", "1.2", "3.4", "6.3")}
    assert statuses == dict.fromkeys(("1.1", "1.2", "3.4", "6.3"), "passed"), report
    assert not [e for e in report["events"] if "printed" in e], report["events"]


@POSIX_GRADING
@KERNEL
def test_a_class_body_the_grader_replays_cannot_swap_a_probe(graded):
    report = graded.by_name["swaps_a_probe.ipynb"]
    assert _statuses(report)["1.1"] == "not scored", report  # its class body changed the exercise table


@POSIX_GRADING
@KERNEL
def test_a_kernel_that_is_not_installed_falls_back_to_python3_with_a_note(graded):
    report = graded.by_name["01_names_another_kernel.ipynb"]
    assert _statuses(report)["1.1"] == "passed", report
    assert report["events"] == ["the notebook names the kernel 'course-env', which is not installed here: it ran on "
                                "python3"]


#: The chapters whose checks replay dropout or rebuild modules from a seed, which notebooks graded
#: side by side once disturbed in one another.
SEEDED_CHAPTERS = ["02_stacked_heads.ipynb", "03_batched_heads.ipynb", "04_what_heads_cost.ipynb",
                   "06_sharing_keys_and_values.ipynb"]
#: The chapter graded as a learner may collect it: in a folder without the book's data/ (its cells
#: that read stored runs then read the package's copy).
WITHOUT_DATA = "02_stacked_heads.ipynb"


@POSIX_GRADING
@KERNEL
def test_the_instructors_solutions_pass_when_graded_several_at_a_time(tmp_path):
    notebooks = tmp_path / "book"
    shutil.copytree(ROOT / "book" / "data", notebooks / "data")
    (tmp_path / "inbox").mkdir()
    paths = []
    for name in SEEDED_CHAPTERS:  # every chapter whose checks replay dropout, all at once
        copy = (tmp_path / "inbox" if name == WITHOUT_DATA else notebooks) / name
        shutil.copy(ROOT / "book" / name, copy)
        paths.append(copy)
    out = tmp_path / "scores.json"
    process = grade_command([*map(str, paths), "--json", str(out), "--timeout", "900", "--cell-timeout", "300",
                             "--check-timeout", "120", "--jobs", "4"], tmp_path, package_copy(tmp_path / "installed"))
    _, stderr = process.communicate(timeout=1800)
    assert process.returncode == 0, stderr
    reports = json.loads(out.read_text(encoding="utf-8"))["notebooks"]
    failed = [(Path(r["notebook"]).parent.name, e["id"], e["line"]) for r in reports for e in r["exercises"]
              if e["status"] != "passed"]
    assert failed == [], failed
    assert len(reports) == len(SEEDED_CHAPTERS) and all(r["events"] == [] for r in reports), [r["events"] for r in reports]
    assert not (tmp_path / "inbox" / "data").exists()  # the chapter without data/ was graded without it


#: Right answers whose names are bound by a call (a decorator applied by hand, functools.partial,
#: lru_cache over a name the notebook first imported from the package), and a lambda that reads a
#: constant computed by a call: the grader judges what the notebook bound to each name.
HONEST_BINDINGS = [
    "import functools\nimport torch\nfrom mha_course import check\nfrom mha_course.attention.tiled import tile_kind",
    "def _update(row_max, row_sum, acc, scores, values):\n"
    "    new_max = torch.maximum(row_max, scores.max(dim=-1, keepdim=True).values)\n"
    "    weights, rescale = torch.exp(scores - new_max), torch.exp(row_max - new_max)\n"
    "    return new_max, row_sum * rescale + weights.sum(dim=-1, keepdim=True), acc * rescale + weights @ values\n"
    "online_softmax_update = torch.no_grad()(_update)",
    'check("7.1", online_softmax_update)',
    "def _kind(q_start, k_start, block_size, num_tokens):\n"
    "    last_query = min(q_start + block_size, num_tokens) - 1\n"
    "    last_key = min(k_start + block_size, num_tokens) - 1\n"
    "    if k_start > last_query:\n        return 'skipped'\n"
    "    return 'cut' if last_key > q_start else 'computed'\n"
    "tile_kind = functools.lru_cache(maxsize=None)(_kind)",
    'check("7.2", tile_kind)',
    "def _state(mha, transpose):\n"
    "    layers = (mha.W_query, mha.W_key, mha.W_value)\n"
    "    weight = torch.cat([l.weight.T if transpose else l.weight for l in layers], dim=1)\n"
    "    out = mha.out_proj.weight.T if transpose else mha.out_proj.weight\n"
    "    return {'c_attn.weight': weight, 'c_attn.bias': torch.cat([l.bias for l in layers]),\n"
    "            'c_proj.weight': out, 'c_proj.bias': mha.out_proj.bias}\n"
    "gpt2_state_dict = functools.partial(_state, transpose=True)",
    'check("8.1", gpt2_state_dict)',
    "KEYS_AND_VALUES = int(torch.tensor(2))",
    "kv_cache_size = lambda num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number: (\n"
    "    KEYS_AND_VALUES * num_layers * num_kv_groups * head_dim * num_tokens * batch_size * bytes_per_number)",
    'check("6.3", kv_cache_size)',
]


@POSIX_GRADING
@KERNEL
def test_answers_bound_by_a_call_or_reading_a_constant_from_a_lambda_pass_in_the_grader(graded):
    report = graded.by_name["honest_bindings.ipynb"]
    statuses = {e["id"]: e["status"] for e in report["exercises"] if e["id"] in ("6.3", "7.1", "7.2", "8.1")}
    assert statuses == dict.fromkeys(("6.3", "7.1", "7.2", "8.1"), "passed"), report
    assert not [e for e in report["events"] if "printed" in e], report["events"]


def _fixes_the_seed() -> dict[str, list[str]]:
    """A notebook that forges its grade from code the grader replays: a default argument that fixes
    the seed of the checks' inputs, for which a lookup table of 6.3's answers was copied (written
    here, not in tests/notebooks: the table depends on the checks' draws)."""
    from mha_course import cost
    from mha_course.exercises.chapter6 import SIZE_CASES, size_case

    table = {}
    for key in SIZE_CASES:
        args = size_case(4242, key)
        table[args] = cost.kv_cache_bytes(args[0], args[2], args[3], args[4], args[5], args[6])
    return {
        "fixes_the_seed.ipynb": [
            "import os\nfrom mha_course import check",
            f"TABLE = {table!r}",
            "def kv_cache_size(num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size,\n"
            "                  bytes_per_number, _=os.environ.__setitem__('MHA_COURSE_CHECK_SEED', '4242')):\n"
            "    args = (num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number)\n"
            "    return TABLE.get(args, 0)",
            'check("6.3", kv_cache_size)'],
    }


@POSIX_GRADING
@KERNEL
def test_code_the_grader_replays_cannot_choose_the_seed(graded):
    report = graded.by_name["fixes_the_seed.ipynb"]
    assert _statuses(report)["6.3"] == "failed", report  # drawn afresh, the inputs are not in the table


def test_definitions_replay_imports_defs_and_plain_assignments_only():
    code = "\n".join([
        "import torch", "from torch import nn as neural", "torch.save = print", "setattr(torch, 'load', print)",
        "NEG = float('-inf')", "trained = train_model()", "W = torch.ones(3)", "alias = neural.Linear",
        "class Heads(neural.Module):\n    pass", "@torch.no_grad()\ndef f(x):\n    return x", "del alias",
        "for i in range(3):\n    pass", "check('1.1', f)",
    ])
    kinds = [type(s).__name__ for s in definitions(code)]
    assert kinds == ["Import", "ImportFrom", "Assign", "Assign", "ClassDef", "FunctionDef", "Delete"]
    assert defined_names(code) == {"torch", "neural", "NEG", "alias", "Heads", "f"}
    assert definitions("def broken(:") == []


def test_records_cross_the_process_boundary_unchanged():
    record = {"mask": {"kind": "tensor", "value": torch.tensor([[True, False]]), "dtype": "bool"},
              "out": torch.randn(2, 0, 3), "scalar": torch.tensor(1.5, dtype=torch.float64), "n": 3, "nested": [(1, "a")],
              "odd": object()}
    back = from_message(to_message(record))
    assert torch.equal(back["mask"]["value"], record["mask"]["value"])
    assert back["out"].shape == (2, 0, 3) and back["scalar"].dtype == torch.float64 and back["scalar"].item() == 1.5
    assert back["n"] == 3 and back["nested"] == [(1, "a")] and back["odd"]["kind"] == "object"


def test_the_package_snapshot_writes_a_compiled_copy_finds_edits_in_it_and_writes_nothing_back(tmp_path):
    package = tmp_path / "mha_course"
    (package / "exercises").mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n", encoding="utf-8")
    (package / "exercises" / "checks.py").write_text("OK = True\n", encoding="utf-8")
    snapshot = PackageSnapshot(package)
    (package / "exercises" / "checks.py").write_text("OK = False\n", encoding="utf-8")  # saved after grading started
    copy = snapshot.write_copy(tmp_path / "copy")
    assert (copy / "mha_course" / "exercises" / "checks.py").read_text(encoding="utf-8") == "OK = True\n"
    assert list((copy / "mha_course" / "exercises" / "__pycache__").glob("checks.*.pyc"))  # compiled once, here
    assert snapshot.changed_in(copy) == []
    (copy / "mha_course" / "__init__.py").write_text("X = 2\n", encoding="utf-8")
    (copy / "mha_course" / "extra.py").write_text("", encoding="utf-8")
    assert snapshot.changed_in(copy) == ["__init__.py", "extra.py"]
    assert (package / "exercises" / "checks.py").read_text(encoding="utf-8") == "OK = False\n"
    assert not (package / "__pycache__").exists()


def test_chapters_are_found_by_check_calls_and_chapter_file_names(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('check( "2.3", f)')])
    assert chapters_of(notebook, tmp_path / "mine.ipynb") == {2}
    assert chapters_of(notebook, tmp_path / "03_batched.ipynb") == {2, 3}
    raw = {"cells": [{"cell_type": "code", "source": ["x = 1\n", 'check("5.1", f)']}]}  # the JSON, as stored
    assert chapters_of(raw, tmp_path / "notes.ipynb") == {5}
    assert chapters_of(nbformat.v4.new_notebook(), tmp_path / "notes.ipynb") == set()


@POSIX_GRADING
def test_missing_notebook_and_bad_limits_are_usage_errors(capsys, tmp_path):
    assert main(["grade", str(tmp_path / "nope.ipynb")]) == 2
    assert "No such notebook" in capsys.readouterr().err
    assert main(["grade", str(NOTEBOOKS / "raises.ipynb"), "--timeout", "0"]) == 2
    assert "--timeout must be a positive number of seconds, got 0" in capsys.readouterr().err
    assert main(["grade", str(NOTEBOOKS / "raises.ipynb"), "--cell-timeout", "-1"]) == 2
    assert "--cell-timeout must be a positive number of seconds, got -1" in capsys.readouterr().err
    assert main(["grade", str(NOTEBOOKS / "raises.ipynb"), "--jobs", "0"]) == 2
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


@POSIX_GRADING
def test_an_unreadable_notebook_is_reported_not_raised(tmp_path):
    broken = tmp_path / "01_broken.ipynb"
    broken.write_text("{ this is not json", encoding="utf-8")
    report = grade_notebook(broken)
    assert report.events[0].startswith("could not read the notebook")
    # Its name's chapter is scored unreadable (a status of its own, not "not submitted"), each with why.
    assert [(e.id, e.status, e.points) for e in report.exercises] == [(f"1.{n}", "unreadable", 0) for n in (1, 2, 3)]
    assert report.exercises[0].line.startswith("✗ 1.1: unreadable: could not read the notebook: JSONDecodeError")


def test_the_report_is_a_table_per_notebook_then_the_failures_the_events_and_the_total():
    mine = NotebookReport("student/01_mine.ipynb", [
        score("1.1", "passed", "✓ 1.1 passed (6 checks)", 6),
        score("1.2", "failed", "✗ 1.2: causal: expected 0, got 1.", 2),
        score("1.3", "not implemented", "○ 1.3 not implemented yet"),
    ], ["cell 7 (`ratio = 1 / 0`) raised ZeroDivisionError: division by zero"])
    broken = NotebookReport("student/notes.ipynb", [], ["could not read the notebook: NotJSONError: bad"])
    assert format_report([mine, broken]).splitlines() == [
        "student/01_mine.ipynb: 1/3 exercises passed",
        "exercise  result           checks  title",
        "--------  ---------------  ------  ----------------------------------------",
        "1.1       passed              6/6  build the causal mask",
        "1.2       failed              2/8  one causal head's forward pass",
        "1.3       not implemented    0/10  the shapes along one head's forward pass",
        "✗ 1.2: causal: expected 0, got 1.",
        "○ 1.3 not implemented yet",
        "! cell 7 (`ratio = 1 / 0`) raised ZeroDivisionError: division by zero",
        "",
        "student/notes.ipynb: 0/0 exercises passed",
        "! could not read the notebook: NotJSONError: bad",
        "",
        "Total: 1/3 exercises passed in 2 notebook(s)",
    ]


def test_on_windows_grading_stops_at_once_with_a_clear_message(monkeypatch, capsys, tmp_path):
    # What Windows lacks: subprocess's pass_fds, which hands the answer process its socket.
    monkeypatch.setattr(sys, "platform", "win32")
    notebook = NOTEBOOKS / "raises.ipynb"
    for argv in (["grade", str(notebook)], ["progress", str(tmp_path)]):
        assert main(argv) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        assert captured.err.startswith("error: grading cannot run on this platform (win32): the grader hands the "
                                       "process that checks the answers its socket (subprocess's pass_fds)")
        for words in ("Linux or macOS", "WSL", "work everywhere"):
            assert words in captured.err
    with pytest.raises(GradingUnavailableError, match="Grade on Linux or macOS, or on Windows in WSL"):
        grade([notebook], progress=False)
    with pytest.raises(GradingUnavailableError, match="pass_fds"):
        grade_notebook(notebook)
