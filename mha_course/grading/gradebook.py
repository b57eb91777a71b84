"""``python -m mha_course grade``: notebooks or a class's folder in; a score table, a gradebook and an exit status out.

With ``--submissions DIR`` every notebook under each subfolder of ``DIR`` is graded, the subfolder's name
being the student's (``submitted/alice/01_....ipynb``, as nbgrader collects them). The gradebook has a row
per student and exercise of every chapter graded (or named with ``--chapters``), a missing notebook as
``not submitted``, a student's best notebook of a chapter counting; points are 1 for a pass, or the share of
the checks passed with ``--partial``. ``--require-sandbox`` refuses to grade where no sandbox starts, and
``--in-container`` starts none (Gradescope's container per submission). The exit status suits a classroom
runner: 0 when every exercise graded passed, 1 when one did not (or a notebook had none, or grading cannot
run here), 2 for a mistake on the command line or a sandbox required and missing.

Example:
    >>> from mha_course.grading.report import score
    >>> report = NotebookReport("submitted/alice/01_mine.ipynb", [score("1.1", "failed", "✗ 1.1: ...", 3)])
    >>> row = gradebook({"alice": [report]}, chapters=[1], partial=True)[0]
    >>> row.student, row.exercise, row.status, row.points, row.checks_passed, row.checks_total
    ('alice', '1.1', 'failed', 0.5, 3, 6)
    >>> [r.status for r in gradebook({"alice": [report]}, chapters=[1])]
    ['failed', 'not submitted', 'not submitted']
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import astuple, dataclass
from pathlib import Path

from .. import exercises
from ..exercises.framework import PASSED
from ..notebook_files import in_tool_folder
from .grading_setup import USAGE_ERROR, GradingUnavailableError, limit_errors, parse_chapters, platform_problem
from .report import NotebookReport, format_report

#: The status of an exercise whose chapter's notebook a student did not hand in.
NOT_SUBMITTED = "not submitted"
#: The exit statuses of ``grade``.
ALL_PASSED, NOT_ALL_PASSED = 0, 1


@dataclass
class GradebookRow:
    """One student's result on one exercise: a row of the CSV."""

    student: str
    notebook: str  # the notebook it was graded in ("" when not submitted)
    exercise: str
    status: str
    points: float
    max_points: int
    checks_passed: int
    checks_total: int

    #: The CSV's header, in the order of the fields.
    HEADER = ("student", "notebook", "exercise", "status", "points", "max points", "checks passed", "checks total")


def collect(submissions: Path) -> dict[str, list[Path]]:
    """Each student (a subfolder of ``submissions``) and the notebooks under it, at any depth (checkpoints
    left out); a notebook directly in ``submissions`` belongs to no student: named on stderr, left out."""
    for stray in sorted(submissions.glob("*.ipynb")):
        print(f"{stray} is in no student's folder: not graded (put it in {submissions}/STUDENT/)", file=sys.stderr)
    students = {}
    for folder in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        students[folder.name] = sorted(p for p in folder.rglob("*.ipynb")
                                       if not in_tool_folder(p.relative_to(folder)))
    return students


def points(status: str, checks_passed: int, checks_total: int, partial: bool = False) -> float:
    """An exercise's points out of 1: 1 for a pass; with ``partial``, the share of the checks passed."""
    if status == PASSED:
        return 1
    return round(checks_passed / checks_total, 4) if partial and checks_total and checks_passed else 0


def graded_chapters(reports: list[NotebookReport], chapters: list[int] | None = None) -> list[int]:
    """The chapters whose exercises count: those graded in ``reports``, and ``chapters``."""
    found = {exercises.EXERCISES[e.id].chapter for report in reports for e in report.exercises
             if e.id in exercises.EXERCISES}
    return sorted(found | set(chapters or []))


def gradebook(students: dict[str, list[NotebookReport]], chapters: list[int] | None = None,
              partial: bool = False) -> list[GradebookRow]:
    """A row per student and exercise of the graded chapters, in the course's order (``not submitted``
    where no notebook of the student was graded on it)."""
    every = [report for reports in students.values() for report in reports]
    wanted = [eid for eid, e in exercises.EXERCISES.items() if e.chapter in graded_chapters(every, chapters)]
    rows = []
    for student, reports in students.items():
        best: dict[str, GradebookRow] = {}
        for report in reports:
            for e in report.exercises:
                row = GradebookRow(student, report.notebook, e.id, e.status,
                                   points(e.status, e.checks_passed, e.checks_total, partial), 1, e.checks_passed,
                                   e.checks_total)
                if e.id not in best or row.points > best[e.id].points:
                    best[e.id] = row
        for eid in wanted:
            rows.append(best.get(eid) or GradebookRow(student, "", eid, NOT_SUBMITTED, 0, 1, 0,
                                                      len(exercises.EXERCISES[eid].checks)))
    return rows


def write_csv(rows: list[GradebookRow], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(GradebookRow.HEADER)
        writer.writerows(astuple(row) for row in rows)


def exit_status(rows: list[GradebookRow], reports: list[NotebookReport] = ()) -> int:
    """:data:`ALL_PASSED` when every row passed and each of ``reports`` scored an exercise."""
    if any(not report.exercises for report in reports):
        return NOT_ALL_PASSED
    return ALL_PASSED if all(row.status == PASSED for row in rows) else NOT_ALL_PASSED


def _usage_errors(args: argparse.Namespace) -> list[str]:
    errors = limit_errors(args)
    if args.submissions is not None and args.notebooks:
        errors.append("give notebooks or --submissions DIR, not both")
    elif args.submissions is not None and not args.submissions.is_dir():
        errors.append(f"--submissions {args.submissions} is not a folder: give the folder that holds a subfolder "
                      "per student")
    elif args.submissions is None and not args.notebooks and not (args.gradescope and args.chapters):
        errors.append("give the notebooks to grade, or --submissions DIR (a subfolder per student)")
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        errors.append(f"No such notebook: {', '.join(missing)}")
    if args.gradescope and args.submissions is not None:
        errors.append("--gradescope writes the results of one submission: give its notebooks, not --submissions")
    if args.seed is not None and args.seed < 0:
        errors.append(f"--seed must be a whole number from 0, got {args.seed} (the report's \"seed\" of a notebook)")
    return errors


def main(args: argparse.Namespace) -> int:
    from .grader import grade
    from .gradescope import write_results

    problem = platform_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return NOT_ALL_PASSED
    chapters, problem = parse_chapters(args.chapters)
    errors = _usage_errors(args) + ([problem] if problem else [])
    if errors:
        print(", ".join(errors), file=sys.stderr)
        return USAGE_ERROR
    students = collect(args.submissions) if args.submissions is not None else {"": list(args.notebooks)}
    paths = [path for notebooks in students.values() for path in notebooks]
    try:
        reports = grade(paths, args.timeout, args.check_timeout, cell_timeout=args.cell_timeout, jobs=args.jobs,
                        seed=args.seed, in_container=args.in_container, require_sandbox=args.require_sandbox)
    except GradingUnavailableError as error:  # --require-sandbox, and no sandbox starts here
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    by_path = dict(zip(paths, reports))
    graded = {student: [by_path[path] for path in notebooks] for student, notebooks in students.items()}
    rows = gradebook(graded, chapters, args.partial)
    print(format_report(reports))
    if args.json:
        payload = {"score": sum(r.score for r in reports), "max_score": sum(r.max_score for r in reports),
                   "notebooks": [r.to_dict() for r in reports]}
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"Scores written to {args.json}")
    if args.csv:
        write_csv(rows, args.csv)
        print(f"Gradebook written to {args.csv} ({len(students)} student(s), {len(rows)} rows)")
    if args.gradescope:
        write_results(reports, rows, args.gradescope)
        print(f"Gradescope results written to {args.gradescope}")
    return exit_status(rows, reports)
