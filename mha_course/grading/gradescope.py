"""Gradescope's ``results.json`` for one submission: ``grade --gradescope FILE``.

Gradescope's autograder reads ``/autograder/results/results.json``: a ``score`` and a list of
``tests``, each with a ``name``, a ``score`` out of its ``max_score``, an ``output`` shown to the
student and a ``visibility``. Here each exercise of the gradebook (see
:mod:`mha_course.grading.gradebook`) is a test worth one point, or its share of the checks passed
with ``--partial``; its output is the verdict line the learner's own ``check`` prints. The
submission's ``output`` says what happened while its notebooks ran, and with which package, seed
and notebook the grading can be replayed (``grade --seed``).

Example:
    >>> from mha_course.grading.gradebook import GradebookRow
    >>> row = GradebookRow("", "", "1.1", "not submitted", 0, 1, 0, 5)
    >>> results([], [row])["tests"][0]["output"]
    '✗ 1.1: not submitted: no notebook of chapter 1 was handed in'
"""

from __future__ import annotations

import json
from pathlib import Path

from ..exercises import EXERCISES
from ..exercises.framework import FAIL_MARK, PASSED
from .report import NotebookReport

#: Who sees each test: Gradescope's ``visible`` shows it to the student at once.
VISIBILITY = "visible"


def _line(reports: list[NotebookReport], notebook: str, exercise_id: str) -> str:
    for report in reports:
        if report.notebook == notebook:
            for score in report.exercises:
                if score.id == exercise_id:
                    return score.line
    return (f"{FAIL_MARK} {exercise_id}: not submitted: no notebook of chapter {EXERCISES[exercise_id].chapter} "
            "was handed in")


def _output(reports: list[NotebookReport]) -> str:
    """What happened while the notebooks ran, and how to replay each grading."""
    lines = []
    for report in reports:
        lines.append(f"{Path(report.notebook).name}: graded by mha_course {report.package_version} with seed "
                     f"{report.seed} (sha256 {str(report.sha256)[:12]}...)")
        lines += [f"  ! {event}" for event in report.events]
    return "\n".join(lines) if lines else "No notebook was handed in."


def results(reports: list[NotebookReport], rows: list) -> dict:
    """Gradescope's results for one submission: its reports and its gradebook rows."""
    tests = [{"name": f"{row.exercise} {EXERCISES[row.exercise].title}", "number": row.exercise,
              "score": row.points, "max_score": row.max_points,
              "status": "passed" if row.status == PASSED else "failed",
              "output": _line(reports, row.notebook, row.exercise), "visibility": VISIBILITY} for row in rows]
    return {"score": round(sum(row.points for row in rows), 4), "output": _output(reports),
            "visibility": VISIBILITY, "tests": tests}


def write_results(reports: list[NotebookReport], rows: list, path: Path) -> None:
    """Write :func:`results` as JSON to ``path`` (its folder is made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results(reports, rows), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


__all__ = ["results", "write_results", "VISIBILITY"]
