"""``python -m mha_course progress``: where a learner stands, chapter by chapter.

For every chapter of the course it finds the learner's notebook in the folder (``student/`` by
default: the notebook whose name starts with the chapter's number, ``01_...``), grades it as
``python -m mha_course grade`` does, and prints which exercises pass, fail or are not started yet,
with the checks passed out of the total.

Grading a chapter takes seconds, so the last grading of each notebook is kept in
``FOLDER/.mha_course_progress.json``, keyed by the notebook's content (SHA-256), by the package (its
version and the hash of its files) and by the three time limits: a notebook that has not changed since
is not run again with the same limits. A grading that the machine cut short (an exercise timed out, not
checked or in error, e.g. the answers' process did not start in time) is not kept: the next run grades
the notebook again, so that a longer ``--check-timeout`` or a quieter machine gives a fresh verdict.

Command line::

    python -m mha_course progress [FOLDER] [--timeout SECONDS] [--cell-timeout SECONDS] ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import mha_course

from ..tables import Table
from ..exercises import EXERCISES
from .answer_process import TIMED_OUT
from ..exercises.framework import ERROR, NOT_IMPLEMENTED, PASSED
from .grader import grade
from .grading_setup import CELL_TIMEOUT, CHECK_TIMEOUT, NOTEBOOK_TIMEOUT, limit_errors, platform_problem
from ..notebook_files import chapter_notebooks
from .package_files import PackageSnapshot
from .report import NOT_CHECKED, NotebookReport

CACHE_NAME = ".mha_course_progress.json"
NOT_STARTED = "not started"
#: The statuses that say more about the machine than about the notebook: a report with one is not cached.
UNSETTLED = (TIMED_OUT, NOT_CHECKED, ERROR)


@dataclass
class ExerciseProgress:
    """One exercise's standing: ``passed``, ``failed`` or ``not started``."""

    id: str
    title: str
    state: str
    checks_passed: int
    checks_total: int
    line: str = ""


@dataclass
class ChapterProgress:
    chapter: int
    notebook: str | None  # the file name, or None when the folder has no notebook for the chapter
    exercises: list[ExerciseProgress]
    reused: bool = False  # the last grading was reused (the notebook has not changed)


def _state(status: str) -> str:
    return PASSED if status == PASSED else NOT_STARTED if status == NOT_IMPLEMENTED else "failed"


def _load(cache_path: Path, package: str) -> dict:
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(cache, dict) or cache.get("package") != package or not isinstance(cache.get("notebooks"), dict):
        return {}
    return cache["notebooks"]


def _settled(report: NotebookReport) -> bool:
    """Whether ``report`` is the notebook's verdict, not a grading the machine cut short."""
    return not any(score.status in UNSETTLED for score in report.exercises)


def progress(folder: Path, timeout: float = NOTEBOOK_TIMEOUT, cell_timeout: float = CELL_TIMEOUT,
             check_timeout: float = CHECK_TIMEOUT, jobs: int = 2, show_bar: bool = True) -> list[ChapterProgress]:
    """Every chapter's exercises and how far the notebooks in ``folder`` are with them.

    Notebooks whose content, package and time limits are those of the last grading are not run
    again; the others are graded, and the cache in ``folder`` is updated with every report but those
    the machine cut short (see :data:`UNSETTLED`).
    """
    package = f"{mha_course.__version__}+{PackageSnapshot().digest[:16]}"
    limits = [timeout, cell_timeout, check_timeout]
    cache_path = folder / CACHE_NAME
    cached = _load(cache_path, package)
    notebooks = chapter_notebooks(folder)
    chapters = sorted({exercise.chapter for exercise in EXERCISES.values()})
    digests = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in notebooks.values()}
    reports: dict[str, NotebookReport] = {}
    to_grade = []
    for chapter in chapters:
        path = notebooks.get(chapter)
        if path is None:
            continue
        entry = cached.get(path.name)
        if isinstance(entry, dict) and entry.get("sha256") == digests[path.name] and entry.get("limits") == limits:
            try:
                reports[path.name] = NotebookReport.from_dict(entry["report"])
                continue
            except (KeyError, TypeError):
                pass
        to_grade.append(path)
    reused = set(reports)
    for report in grade(to_grade, timeout, check_timeout, progress=show_bar, cell_timeout=cell_timeout, jobs=jobs):
        reports[Path(report.notebook).name] = report
    kept = {name: {"sha256": digests[name], "limits": limits, "report": report.to_dict()}
            for name, report in reports.items() if _settled(report)}
    try:
        cache_path.write_text(json.dumps({"package": package, "notebooks": kept}, indent=1, ensure_ascii=False) + "\n",
                              encoding="utf-8")
    except OSError:  # a read-only folder: progress still works, only slower next time
        pass
    result = []
    for chapter in chapters:
        path = notebooks.get(chapter)
        report = reports.get(path.name) if path else None
        scores = {score.id: score for score in report.exercises} if report else {}
        rows = []
        for exercise in (e for e in EXERCISES.values() if e.chapter == chapter):
            score = scores.get(exercise.id)
            if score is None:
                rows.append(ExerciseProgress(exercise.id, exercise.title, NOT_STARTED, 0, len(exercise.checks)))
            else:
                rows.append(ExerciseProgress(exercise.id, exercise.title, _state(score.status), score.checks_passed,
                                             score.checks_total, "" if score.status in (PASSED, NOT_IMPLEMENTED)
                                             else score.line))
        result.append(ChapterProgress(chapter, path.name if path else None, rows, bool(path and path.name in reused)))
    return result


def chapter_table(chapter: ChapterProgress, folder: Path) -> Table:
    """One chapter's standing: a row per exercise, then the line of each exercise that failed.

    Example:
        >>> chapter = ChapterProgress(1, None, [ExerciseProgress("1.1", "build the causal mask", NOT_STARTED, 0, 5)])
        >>> print(chapter_table(chapter, Path("student")))
        Chapter 1: 0 of 1 passed - no notebook for it in student/
        exercise  state        checks  title
        --------  -----------  ------  ---------------------
        1.1       not started     0/5  build the causal mask
    """
    passed = sum(e.state == PASSED for e in chapter.exercises)
    where = (f"{chapter.notebook}" + (" (unchanged since it was last graded)" if chapter.reused else "")
             if chapter.notebook else f"no notebook for it in {folder}/")
    rows = [[e.id, e.state, f"{e.checks_passed}/{e.checks_total}", e.title] for e in chapter.exercises]
    return Table(["exercise", "state", "checks", "title"], rows, align={"checks": "right"},
                 title=f"Chapter {chapter.chapter}: {passed} of {len(chapter.exercises)} passed - {where}",
                 notes=[e.line for e in chapter.exercises if e.line])


def format_progress(chapters: list[ChapterProgress], folder: Path) -> str:
    """What ``python -m mha_course progress`` prints: a :func:`chapter_table` per chapter, then the counts."""
    every = [e for chapter in chapters for e in chapter.exercises]
    counts = {state: sum(e.state == state for e in every) for state in (PASSED, "failed", NOT_STARTED)}
    total = (f"{counts[PASSED]} of {len(every)} exercises passed, {counts['failed']} failed, "
             f"{counts[NOT_STARTED]} not started.")
    return "\n\n".join([*(str(chapter_table(chapter, folder)) for chapter in chapters), total])


def main(args: argparse.Namespace) -> int:
    problem = platform_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    folder = args.folder
    if not folder.is_dir():
        print(f"No such folder: {folder}. `make lab` (or `python -m mha_course student`) writes the student "
              "edition into student/; name another folder as `python -m mha_course progress FOLDER`.", file=sys.stderr)
        return 2
    errors = limit_errors(args)
    if errors:
        print(", ".join(errors), file=sys.stderr)
        return 2
    chapters = progress(folder, args.timeout, args.cell_timeout, args.check_timeout, args.jobs)
    print(format_progress(chapters, folder))
    return 0


__all__ = ["progress", "format_progress", "chapter_table", "chapter_notebooks", "ChapterProgress", "ExerciseProgress",
           "CACHE_NAME", "NOT_STARTED", "UNSETTLED"]
