"""``python -m mha_course progress [FOLDER]``: where a learner stands, chapter by chapter.

Each chapter's notebook in the folder (``student/`` by default) is graded as ``grade`` does; its last
grading is kept in ``FOLDER/.mha_course_progress.json`` and reused while the notebook (SHA-256), package
and time limits are the same, unless the machine cut it short (:data:`UNSETTLED`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import mha_course

from ..exercises import EXERCISES
from ..exercises.framework import ERROR, NOT_IMPLEMENTED, PASSED
from ..notebook_files import chapter_notebooks
from ..tables import Table
from .grader import grade
from .grading_setup import CELL_TIMEOUT, CHECK_TIMEOUT, NOTEBOOK_TIMEOUT, limit_errors, platform_problem
from .sandbox import PackageSnapshot
from .report import NOT_CHECKED, TIMED_OUT, ExerciseScore, NotebookReport, score

CACHE_NAME = ".mha_course_progress.json"
NOT_STARTED = "not started"
#: The statuses that say more about the machine than about the notebook: a report with one is not cached.
UNSETTLED = (TIMED_OUT, NOT_CHECKED, ERROR)


@dataclass
class ChapterProgress:
    """One chapter's standing: its exercises' scores (:data:`NOT_STARTED` where its notebook has none yet)."""

    chapter: int
    notebook: str | None  # the file name, or None when the folder has no notebook for the chapter
    exercises: list[ExerciseScore]
    reused: bool = False  # the last grading was reused (the notebook has not changed)


def state(score: ExerciseScore) -> str:
    """An exercise's standing: ``passed``, ``failed`` or ``not started`` (no notebook, or its stub)."""
    if score.status in (NOT_STARTED, NOT_IMPLEMENTED):
        return NOT_STARTED
    return PASSED if score.status == PASSED else "failed"


def progress(folder: Path, timeout: float = NOTEBOOK_TIMEOUT, cell_timeout: float = CELL_TIMEOUT,
             check_timeout: float = CHECK_TIMEOUT, jobs: int = 2, show_bar: bool = True) -> list[ChapterProgress]:
    """Every chapter's exercises and how far the notebooks in ``folder`` are with them."""
    package = f"{mha_course.__version__}+{PackageSnapshot().digest[:16]}"
    limits = [timeout, cell_timeout, check_timeout]
    chapters = sorted({exercise.chapter for exercise in EXERCISES.values()})
    found = chapter_notebooks(folder)
    notebooks = {chapter: found[chapter] for chapter in chapters if chapter in found}
    digests = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in notebooks.values()}
    reports: dict[str, NotebookReport] = {}
    # The last gradings of the same notebooks, package and limits (from a cache it cannot read: none).
    with suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        cache = json.loads((folder / CACHE_NAME).read_text(encoding="utf-8"))
        for name, entry in cache["notebooks"].items() if cache["package"] == package else ():
            if name in digests and entry["sha256"] == digests[name] and entry["limits"] == limits:
                reports[name] = NotebookReport.from_dict(entry["report"])
    reused = set(reports)
    to_grade = [path for _, path in sorted(notebooks.items()) if path.name not in reused]
    for report in grade(to_grade, timeout, check_timeout, progress=show_bar, cell_timeout=cell_timeout, jobs=jobs):
        reports[Path(report.notebook).name] = report
    kept = {name: {"sha256": digests[name], "limits": limits, "report": report.to_dict()}
            for name, report in reports.items() if not any(e.status in UNSETTLED for e in report.exercises)}
    with suppress(OSError):  # a read-only folder: progress still works, only slower next time
        (folder / CACHE_NAME).write_text(json.dumps({"package": package, "notebooks": kept}, indent=1,
                                                    ensure_ascii=False) + "\n", encoding="utf-8")
    result = []
    for chapter in chapters:
        path = notebooks.get(chapter)
        scores = {s.id: s for s in reports[path.name].exercises} if path and path.name in reports else {}
        rows = [scores.get(eid) or score(eid, NOT_STARTED, "") for eid, e in EXERCISES.items() if e.chapter == chapter]
        result.append(ChapterProgress(chapter, path.name if path else None, rows, bool(path and path.name in reused)))
    return result


def chapter_table(chapter: ChapterProgress, folder: Path) -> Table:
    """One chapter's standing: a row per exercise, then the line of each exercise that failed.

    >>> print(chapter_table(ChapterProgress(1, None, [score("1.1", NOT_STARTED, "")]), Path("s")))
    Chapter 1: 0 of 1 passed - no notebook for it in s/
    exercise  state        checks  title
    --------  -----------  ------  ---------------------
    1.1       not started     0/6  build the causal mask
    """
    passed = sum(e.status == PASSED for e in chapter.exercises)
    where = (f"{chapter.notebook}" + (" (unchanged since it was last graded)" if chapter.reused else "")
             if chapter.notebook else f"no notebook for it in {folder}/")
    rows = [[e.id, state(e), f"{e.checks_passed}/{e.checks_total}", e.title] for e in chapter.exercises]
    return Table(["exercise", "state", "checks", "title"], rows, align={"checks": "right"},
                 title=f"Chapter {chapter.chapter}: {passed} of {len(chapter.exercises)} passed - {where}",
                 notes=[e.line for e in chapter.exercises if state(e) == "failed"])


def format_progress(chapters: list[ChapterProgress], folder: Path) -> str:
    """What ``python -m mha_course progress`` prints: a :func:`chapter_table` per chapter, then the counts."""
    every = [e for chapter in chapters for e in chapter.exercises]
    counts = {kind: sum(state(e) == kind for e in every) for kind in (PASSED, "failed", NOT_STARTED)}
    total = (f"{counts[PASSED]} of {len(every)} exercises passed, {counts['failed']} failed, "
             f"{counts[NOT_STARTED]} not started.")
    return "\n\n".join([*(str(chapter_table(chapter, folder)) for chapter in chapters), total])


def main(args: argparse.Namespace) -> int:
    problem, folder = platform_problem(), args.folder
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if not folder.is_dir():
        print(f"No such folder: {folder}. `make lab` (or `python -m mha_course student`) writes the student "
              "edition into student/; name another folder as `python -m mha_course progress FOLDER`.", file=sys.stderr)
        return 2
    if limit_errors(args):
        print(", ".join(limit_errors(args)), file=sys.stderr)
        return 2
    print(format_progress(progress(folder, args.timeout, args.cell_timeout, args.check_timeout, args.jobs), folder))
    return 0
