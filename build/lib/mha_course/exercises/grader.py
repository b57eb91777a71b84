"""The grader: execute completed notebooks and score their exercises.

For each notebook the grader

1. copies it into a temporary folder and executes the copy with nbclient, cell by cell, within a
   time limit for the whole notebook; a cell that raises does not stop the run (later exercises
   still count), a notebook that runs past its limit is interrupted, a kernel that dies is noted;
   the learner's file is never written to;
2. re-checks every exercise of the notebook's chapters itself: in the same kernel it imports the
   exercise code afresh and *probes* each answer by its name (``build_causal_mask``, ...), saving
   what the answer did to a file; its own process - which never ran any notebook code - then
   *judges* those records against the package's reference. A notebook that deletes names,
   redefines ``check``, monkeypatches the package or torch, or prints a fake pass line therefore
   cannot turn a wrong answer into a pass; what the notebook printed is only compared with the
   verdict and any disagreement is reported;
3. prints a score table (and writes JSON on request).

Command line::

    python -m mha_course grade NOTEBOOK... [--json FILE] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from tqdm import tqdm

from . import EXERCISES
from .framework import (ERROR, FAIL_MARK, FAILED, MISSING, NOT_IMPLEMENTED, PASS_MARK, PASSED, WAITING_MARK,
                        judge)

_QUIET_LOG = logging.getLogger("mha_course.grader.nbclient")
_QUIET_LOG.addHandler(logging.NullHandler())
_QUIET_LOG.propagate = False

TIMED_OUT = "timed out"
SETUP_TIMEOUT = 120.0  # seconds for the kernel to import the checks (torch included) after the notebook
NOT_CHECKED = "not checked"

_CHECK_CALL = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")
_CHAPTER_FILE = re.compile(r"^(\d+)_")
_PRINTED = re.compile(rf"^({PASS_MARK}|{WAITING_MARK}|{FAIL_MARK}) (\d+\.\d+)\b", re.MULTILINE)

# Run in the kernel after the notebook: a fresh import of the exercise code, whatever the notebook
# did to the modules it imported.
_SETUP = """\
def _mha_course_grader_setup():
    import importlib, sys
    for name in [n for n in sys.modules if n == "mha_course.exercises" or n.startswith("mha_course.exercises.")]:
        del sys.modules[name]
    return importlib.import_module("mha_course.exercises.kernel_side")
__mha_course_grader__ = _mha_course_grader_setup()
del _mha_course_grader_setup
"""


@dataclass
class ExerciseScore:
    """The grader's verdict on one exercise of one notebook."""

    id: str
    title: str
    status: str
    points: int
    checks_passed: int
    checks_total: int
    line: str
    notebook_printed: str | None = None  # the verdict line the notebook itself printed, if any


@dataclass
class NotebookReport:
    """Everything the grader found out about one notebook."""

    notebook: str
    exercises: list[ExerciseScore] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # what happened while it ran, in order
    seconds: float = 0.0

    @property
    def score(self) -> int:
        return sum(e.points for e in self.exercises)

    @property
    def max_score(self) -> int:
        return len(self.exercises)

    def to_dict(self) -> dict:
        return {"notebook": self.notebook, "score": self.score, "max_score": self.max_score,
                "events": self.events, "seconds": round(self.seconds, 1),
                "exercises": [asdict(e) for e in self.exercises]}


def exercises_for(notebook: nbformat.NotebookNode, path: Path) -> list[str]:
    """The exercises to grade: every exercise of each chapter the notebook belongs to.

    A chapter is recognised from the ``check("2.1", ...)`` calls in the notebook and from a file
    name starting with the chapter number (``02_...``), so deleting a check cell does not take
    that exercise off the score table.
    """
    chapters = set()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            chapters.update(int(found.split(".")[0]) for found in _CHECK_CALL.findall(cell.source))
    match = _CHAPTER_FILE.match(path.name)
    if match:
        chapters.add(int(match.group(1)))
    return [eid for eid, exercise in EXERCISES.items() if exercise.chapter in chapters]


def _printed_verdicts(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """The last verdict line the executed notebook printed for each exercise."""
    printed = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                for line in output.get("text", "").splitlines():
                    match = _PRINTED.match(line)
                    if match:
                        printed[match.group(2)] = line
    return printed


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _seconds(value: float) -> str:
    return f"{value:g} s"


class _Run:
    """One notebook's kernel: execute cells with deadlines, note what happens."""

    def __init__(self, notebook: nbformat.NotebookNode, folder: Path, report: NotebookReport):
        self.notebook = notebook
        self.report = report
        self.client = NotebookClient(
            notebook, timeout=None, allow_errors=True, interrupt_on_timeout=False, record_timing=False,
            kernel_name=notebook.metadata.get("kernelspec", {}).get("name", "python3"),
            resources={"metadata": {"path": str(folder)}},
            log=_QUIET_LOG,  # time-outs and errors are reported in the score table instead
        )
        self.dead = False

    def execute(self, cell, index: int, timeout: float):
        """Execute one cell within ``timeout`` seconds; return "ok", "timeout" or "dead"."""
        self.client.timeout = max(1, int(math.ceil(timeout)))
        try:
            self.client.execute_cell(cell, index)
        except CellTimeoutError:
            try:
                run_sync(self.client.km.interrupt_kernel)()  # the manager is asynchronous
            except Exception:  # the kernel may be gone already
                pass
            return "timeout"
        except DeadKernelError:
            self.dead = True
            return "dead"
        return "ok"

    def run_notebook(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        code_cells = [(i, c) for i, c in enumerate(self.notebook.cells) if c.cell_type == "code"]
        for position, (index, cell) in enumerate(code_cells):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.report.events.append(f"ran out of time ({_seconds(timeout)}) before cell {index}; "
                                          "the cells from there on did not run")
                return
            outcome = self.execute(cell, index, remaining)
            if outcome == "timeout":
                self.report.events.append(
                    f"timed out: still running cell {index} after {_seconds(timeout)} for the whole notebook; "
                    f"interrupted it, and the {len(code_cells) - position - 1} code cell(s) after it did not run")
                return
            if outcome == "dead":
                self.report.events.append(f"the kernel died while running cell {index} (did the notebook "
                                          "exit or crash Python?); nothing after it ran")
                return
            for output in cell.outputs:
                if output.get("output_type") == "error":
                    self.report.events.append(f"cell {index} raised {output.get('ename')}: "
                                              f"{_first_line(output.get('evalue', ''))}")

    def record(self, code: str, timeout: float) -> tuple[str, nbformat.NotebookNode]:
        """Execute grader code in the kernel, after the notebook's own cells."""
        cell = nbformat.v4.new_code_cell(code)
        self.notebook.cells.append(cell)  # nbclient files outputs by the cell's index
        return self.execute(cell, len(self.notebook.cells) - 1, timeout), cell


def _score(exercise_id: str, result_status: str, line: str, checks_passed: int = 0) -> ExerciseScore:
    exercise = EXERCISES[exercise_id]
    return ExerciseScore(exercise_id, exercise.title, result_status, int(result_status == PASSED), checks_passed,
                         len(exercise.checks), line)


def grade_notebook(path: Path, timeout: float = 600.0, check_timeout: float = 60.0) -> NotebookReport:
    """Execute a copy of the notebook at ``path`` and score its exercises. Never raises for a
    broken or hostile notebook: what went wrong is in the report's ``events``."""
    report = NotebookReport(str(path))
    started = time.monotonic()
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as error:
        report.events.append(f"could not read the notebook: {type(error).__name__}: {_first_line(str(error))}")
        return report
    exercise_ids = exercises_for(notebook, path)
    if not exercise_ids:
        report.events.append("no exercises found: the notebook calls no check(...) and its name does not "
                             "start with a chapter number")
    with tempfile.TemporaryDirectory(prefix="mha-course-grade-") as folder:
        folder = Path(folder)
        # Work on a copy in a folder of its own: files the notebook writes land there, and the
        # learner's notebook is never touched.
        shutil.copyfile(path, folder / path.name)
        notebook = nbformat.read(folder / path.name, as_version=4)
        run = _Run(notebook, folder, report)
        printed: dict[str, str] = {}
        try:
            # The kernel's own log lines (e.g. its warning about TCP transport) would clutter the table.
            with run.client.setup_kernel(stderr=subprocess.DEVNULL):
                run.run_notebook(timeout)
                printed = _printed_verdicts(notebook)  # before the grader's own cells are added
                _grade_in_kernel(run, exercise_ids, folder, check_timeout, report)
        except Exception as error:  # the kernel would not start, or died on shutdown
            report.events.append(f"the notebook could not be run: {type(error).__name__}: "
                                 f"{_first_line(str(error))}")
        graded = {score.id for score in report.exercises}
        for exercise_id in exercise_ids:
            if exercise_id not in graded:
                report.exercises.append(_score(exercise_id, NOT_CHECKED, f"{FAIL_MARK} {exercise_id}: not checked: the "
                                               "notebook's kernel was not available"))
        report.exercises.sort(key=lambda score: exercise_ids.index(score.id))
    for score in report.exercises:
        score.notebook_printed = printed.get(score.id)
        if (score.notebook_printed and score.notebook_printed.startswith(PASS_MARK)
                and score.status in (FAILED, MISSING, NOT_IMPLEMENTED)):
            report.events.append(f"{score.id}: the notebook printed a pass, but the grader's own check "
                                 f"says {score.status}")
    report.seconds = time.monotonic() - started
    return report


def _grade_in_kernel(run: _Run, exercise_ids: list[str], folder: Path, check_timeout: float,
                     report: NotebookReport) -> None:
    if run.dead or not exercise_ids:
        return
    outcome, cell = run.record(_SETUP, max(check_timeout, SETUP_TIMEOUT))
    errors = [o for o in cell.outputs if o.get("output_type") == "error"]
    if outcome != "ok" or errors:
        why = (f"{errors[0].get('ename')}: {_first_line(errors[0].get('evalue', ''))}" if errors else
               "the kernel did not answer" if outcome != "dead" else "the kernel died")
        report.events.append(f"could not load the checks into the notebook's kernel ({why})")
        return
    for exercise_id in exercise_ids:
        exercise = EXERCISES[exercise_id]
        # A name the notebook cannot guess, so it cannot leave a forged record waiting there.
        record_path = folder / f"record-{exercise_id}-{secrets.token_hex(8)}.pt"
        code = (f"__mha_course_grader__.record_answer({exercise_id!r}, {exercise.answer_name!r}, "
                f"{str(record_path)!r})")
        outcome, cell = run.record(code, check_timeout)
        if outcome == "dead":
            report.exercises.append(_score(exercise_id, ERROR, f"{FAIL_MARK} {exercise_id}: the kernel died while "
                                           f"{exercise.answer_name} was being checked"))
            report.events.append(f"the kernel died while checking {exercise_id}")
            return
        if outcome == "timeout":
            report.exercises.append(_score(exercise_id, TIMED_OUT, f"{FAIL_MARK} {exercise_id}: {exercise.answer_name} "
                                           f"was still running after {_seconds(check_timeout)}"))
            continue
        try:
            record = torch.load(record_path, weights_only=True)
        except Exception as error:
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            why = (f"{errors[0].get('ename')}: {_first_line(errors[0].get('evalue', ''))}" if errors
                   else f"{type(error).__name__}")
            report.exercises.append(_score(exercise_id, ERROR, f"{FAIL_MARK} {exercise_id}: could not be checked ({why})"))
            continue
        result = judge(exercise, record) if isinstance(record, dict) else None
        if result is None:
            report.exercises.append(_score(exercise_id, ERROR, f"{FAIL_MARK} {exercise_id}: could not be checked"))
            continue
        report.exercises.append(_score(exercise_id, result.status, result.line, result.checks_passed))


def grade(paths: list[Path], timeout: float = 600.0, check_timeout: float = 60.0,
          progress: bool = True) -> list[NotebookReport]:
    """Grade several notebooks, one after the other, with a progress bar on stderr."""
    reports = []
    with tqdm(paths, desc="Grading", unit="notebook", file=sys.stderr, disable=not progress) as bar:
        for path in bar:
            bar.set_postfix_str(Path(path).name)
            reports.append(grade_notebook(Path(path), timeout, check_timeout))
    return reports


def format_report(reports: list[NotebookReport]) -> str:
    """The score table printed by ``python -m mha_course grade``."""
    lines = []
    for report in reports:
        lines.append(f"{report.notebook}: {report.score}/{report.max_score}")
        if report.exercises:
            lines.append(f"  {'exercise':<9}{'result':<18}{'checks':>7}  title")
            for score in report.exercises:
                checks = f"{score.checks_passed}/{score.checks_total}"
                lines.append(f"  {score.id:<9}{score.status:<18}{checks:>7}  {score.title}")
            for score in report.exercises:
                if score.status != PASSED:
                    lines.append(f"    {score.line}")
        for event in report.events:
            lines.append(f"  ! {event}")
        lines.append("")
    total = sum(r.score for r in reports)
    maximum = sum(r.max_score for r in reports)
    lines.append(f"Total: {total}/{maximum} exercises passed in {len(reports)} notebook(s)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        print(f"No such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.timeout <= 0 or args.check_timeout <= 0:
        print(f"--timeout and --check-timeout must be positive numbers of seconds, got {args.timeout:g} "
              f"and {args.check_timeout:g}.", file=sys.stderr)
        return 2
    reports = grade(args.notebooks, args.timeout, args.check_timeout)
    print(format_report(reports))
    if args.json:
        payload = {"score": sum(r.score for r in reports), "max_score": sum(r.max_score for r in reports),
                   "notebooks": [r.to_dict() for r in reports]}
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"Scores written to {args.json}")
    return 0


__all__ = ["grade", "grade_notebook", "format_report", "NotebookReport", "ExerciseScore", "MISSING"]
