"""Grading one notebook after another starts the next notebook's kernel and answer process ahead of its
turn (mha_course.grading.grader), so that they import torch and the checks while the notebook before it runs.

The notebooks here say what their kernel found by raising: a first cell that finds torch not imported
yet raises, and so would one that finds the meta device unprepared or a name the warm-up left. A
grading's kernel builds figures but draws none, and PyTorch computes on one thread there. A kernel and
an answer process started ahead and never used are ended with their grading, sandbox and all.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from conftest import POSIX_GRADING, all_ended
from mha_course.grading.grader import GradingRun, grade, prepared
from mha_course.grading.report import PASSED

pytestmark = [POSIX_GRADING, pytest.mark.kernel]

CELLS = [
    "import sys\nassert 'torch' in sys.modules, 'torch was not imported before the first cell'",
    "assert 'mha_course.exercises.chapter1' in sys.modules, 'the checks were not built before the first cell'",
    "from mha_course.exercises.probes import prepare_meta\n"
    "assert prepare_meta.cache_info().currsize == 1, 'the meta device was not prepared before the first cell'",
    "assert '_warm' not in dir(), 'the warm-up left a name'",
    "import torch\nfrom mha_course import check",
    "def build_causal_mask(num_tokens, device=None):\n"
    "    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)",
    'check("1.1", build_causal_mask)',
]


def notebook(folder: Path, name: str, cells: list[str] = CELLS) -> Path:
    path = folder / name
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    return path


def passed(report) -> bool:
    """Whether exercise 1.1 (the one the notebooks answer; the others of chapter 1 are missing) passed."""
    return {e.id: e.status for e in report.exercises}.get("1.1") == PASSED


def test_each_kernel_imports_torch_and_the_checks_before_its_first_cell_and_leaves_no_name(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text("not a notebook", encoding="utf-8")
    first, second = notebook(tmp_path, "first.ipynb"), notebook(tmp_path, "second.ipynb")
    reports = grade([broken, first, second], progress=False, timeout=600, cell_timeout=300, check_timeout=120)
    assert any("could not read the notebook" in event for event in reports[0].events)
    for report in reports[1:]:
        assert passed(report) and report.events == [], report.events


def _processes_with(marker: str) -> dict[str, bytes]:
    """The processes whose environment holds ``marker`` (the sandboxes' own among them), with their command lines."""
    found = {}
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
    return found


def _pythons_running(processes: dict[str, bytes], what: bytes) -> bool:
    return any(command.startswith(sys.executable.encode() + b"\0") and what in command
               for command in processes.values())


def test_a_kernel_and_an_answer_process_started_ahead_and_never_used_end_with_their_grading(tmp_path, monkeypatch):
    marker = f"ahead-{uuid.uuid4().hex}"
    monkeypatch.setenv("MHA_COURSE_TEST_MARKER", marker)  # the processes of this grading inherit it
    path = notebook(tmp_path, "01_ahead.ipynb")
    grading = GradingRun()
    try:
        _, ahead = prepared(grading, path, 1, (600, 300, 120))
        ahead.start()
        deadline = time.monotonic() + 120
        while not (_pythons_running(_processes_with(marker), b"ipykernel_launcher") and _pythons_running(
                _processes_with(marker), b"answer_process")) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = _processes_with(marker)
        assert _pythons_running(started, b"ipykernel_launcher") and _pythons_running(started, b"answer_process")
        ahead.close()
        assert all_ended(started)
        assert not ahead.box.exists() and not ahead.answers.exists()
    finally:
        grading.close()
    assert not grading.folder.exists()


def test_a_kernel_builds_figures_but_draws_none_on_one_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the grader's own setting would be kept
    cells = [*CELLS[2:], "assert torch.get_num_threads() == 1, 'torch computes on several threads'",
             "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1, 0])\nfig",
             "ax.plot([0, 1, 0], made_up_argument=1)"]
    path = notebook(tmp_path, "figure.ipynb", cells)
    grading = GradingRun()
    try:
        report, one = prepared(grading, path, 1, (600, 300, 120))
        one.start()
        one.run_kernel()
        one.judge()
    finally:
        grading.close()
    assert passed(report)
    figure, mistake = one.run.notebook.cells[-2:]
    assert not any("image/png" in output.get("data", {}) for output in figure.outputs), figure.outputs
    assert any("Figure size" in output.get("data", {}).get("text/plain", "") for output in figure.outputs)
    # the figure's code still runs: a mistake in it is reported
    assert any("made_up_argument" in event for event in report.events), report.events
    assert not any("several threads" in event for event in report.events), report.events
