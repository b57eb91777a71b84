"""Grading one notebook after another starts the next notebook's kernel ahead of its turn
(mha_course.grading.grader), so that it imports torch and the checks while the notebook before it runs.

The notebooks here say what their kernel found by raising: a first cell that finds torch imported
already raises, and so would one that finds a name the warm-up left. Graded in a row after one that
cannot be read, the first notebook's kernel started at its turn (nothing imported), the second's
ahead of it (torch and the checks imported, no name left); both are scored as usual. A grading's
kernel builds figures but draws none, and PyTorch computes on one thread there. A kernel started
ahead and never run is ended with its grading.
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat

from conftest import POSIX_GRADING
from mha_course.grading.confinement import holders
from mha_course.grading.grader import NotebookGrading, new_report, grade
from mha_course.grading.package_files import PackageSnapshot
from mha_course.grading.report import PASSED

pytestmark = POSIX_GRADING

CELLS = [
    "import sys\nassert 'torch' not in sys.modules, 'torch was imported before the first cell'",
    "assert 'mha_course.exercises.chapter1' not in sys.modules, 'the checks were built before the first cell'",
    "assert '_warm' not in dir(), 'the warm-up left a name'",
    "import torch\nfrom mha_course import check",
    "def build_causal_mask(num_tokens, device=None):\n"
    "    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)",
    'check("1.1", build_causal_mask)',
]


def notebook(folder: Path, name: str) -> Path:
    path = folder / name
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS]), path)
    return path


def passed(report) -> bool:
    """Whether exercise 1.1 (the one the notebooks answer; the others of chapter 1 are missing) passed."""
    return {e.id: e.status for e in report.exercises}.get("1.1") == PASSED


def test_the_next_notebooks_kernel_imports_torch_before_its_turn_and_leaves_no_name(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text("not a notebook", encoding="utf-8")
    first, second = notebook(tmp_path, "first.ipynb"), notebook(tmp_path, "second.ipynb")
    reports = grade([broken, first, second], progress=False, timeout=600, cell_timeout=300, check_timeout=120)
    assert any("could not read the notebook" in event for event in reports[0].events)
    assert [passed(r) for r in reports[1:]] == [True, True]
    # after a notebook that could not be read, the first kernel starts at its turn
    assert not any("raised" in event for event in reports[1].events), reports[1].events
    for found in ["torch was imported", "the checks were built"]:
        assert any(f"{found} before the first cell" in event for event in reports[2].events), reports[2].events
    assert not any("left a name" in event for event in reports[2].events), reports[2].events


def test_a_kernel_started_ahead_and_never_run_is_ended_with_its_grading(tmp_path):
    path = notebook(tmp_path, "ahead.ipynb")
    grading = NotebookGrading.prepare(path, new_report(path, 1), PackageSnapshot(), None, (600, 300, 120))
    folder = grading.folder
    try:
        grading.start_kernel()
        assert grading.run.client.km is not None and grading.run.client.km.has_kernel
        deadline = time.monotonic() + 60
        while not holders(grading.token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holders(grading.token), "no process of the kernel carries the grading's token"
    finally:
        grading.close()
    assert holders(grading.token) == []
    assert not folder.exists()


def test_a_kernel_started_ahead_builds_figures_but_draws_none_on_one_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the grader's own setting would be kept
    path = tmp_path / "figure.ipynb"
    cells = [*CELLS[2:], "assert torch.get_num_threads() == 1, 'torch computes on several threads'",
             "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1, 0])\nfig",
             "ax.plot([0, 1, 0], made_up_argument=1)"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    grading = NotebookGrading.prepare(path, new_report(path, 1), PackageSnapshot(), None, (600, 300, 120))
    grading.start_kernel()
    grading.grade()
    assert passed(grading.report)
    figure, mistake = grading.run.notebook.cells[-2:]
    assert not any("image/png" in output.get("data", {}) for output in figure.outputs), figure.outputs
    assert any("Figure size" in output.get("data", {}).get("text/plain", "") for output in figure.outputs)
    # the figure's code still runs: a mistake in it is reported
    assert any("made_up_argument" in event for event in grading.report.events), grading.report.events
    assert not any("several threads" in event for event in grading.report.events), grading.report.events
