"""``python -m mha_course grade`` and ``autograder``: a class's notebooks in; a score table, a gradebook (CSV),
Gradescope's ``results.json`` and an exit status out; and the zip of a Gradescope autograder.

``--submissions DIR`` grades each subfolder's notebooks as its student's. The gradebook has a row per
student and exercise of the chapters graded (or ``--chapters``): a missing notebook is ``not submitted``,
a student's best notebook counts, a pass earns 1 (``--partial``: the share of checks passed). Exit status:
0 when every exercise passed, 1 when not, 2 for a usage mistake or a sandbox required and missing. The
zip's ``setup.sh`` builds Gradescope's image (Ubuntu 24.04: a virtual environment, the pinned requirements,
the course); ``run_autograder`` grades each submission ``--in-container``, one container per submission
(``MHA_COURSE_AUTOGRADER_ROOT`` and ``_PYTHON`` replace ``/autograder`` and its Python, to try it elsewhere).

>>> from mha_course.grading.report import score
>>> report = NotebookReport("submitted/alice/01_mine.ipynb", [score("1.1", "failed", "✗ 1.1: ...", 3)])
>>> rows = gradebook({"alice": [report]}, chapters=[1], partial=True)
>>> [(r.status, r.points) for r in rows]
[('failed', 0.5), ('not submitted', 0), ('not submitted', 0)]
>>> results([report], rows)["tests"][1]["output"]
'✗ 1.2: not submitted: no notebook of chapter 1 was handed in'
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
import zipfile
from dataclasses import astuple, dataclass
from pathlib import Path

import mha_course

from .. import exercises
from ..exercises.framework import FAIL_MARK, PASSED
from ..notebook_files import in_tool_folder
from .grading_setup import USAGE_ERROR, GradingUnavailableError, limit_errors, parse_chapters, platform_problem
from .sandbox import PACKAGE, PackageSnapshot
from .report import NotebookReport, format_report

#: The status of an exercise whose chapter's notebook a student did not hand in.
NOT_SUBMITTED = "not submitted"


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
    """Each student (a subfolder of ``submissions``) and the notebooks under it (a stray one is named, left out)."""
    for stray in sorted(submissions.glob("*.ipynb")):
        print(f"{stray} is in no student's folder: not graded (put it in {submissions}/STUDENT/)", file=sys.stderr)
    students = {}
    for folder in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        students[folder.name] = sorted(p for p in folder.rglob("*.ipynb")
                                       if not in_tool_folder(p.relative_to(folder)))
    return students


def points(status: str, checks_passed: int, checks_total: int, partial: bool = False) -> float:
    """An exercise's points out of 1: 1 for a pass; with ``partial``, the share of the checks passed."""
    return 1 if status == PASSED else round(checks_passed / checks_total, 4) if partial and checks_passed else 0


def gradebook(students: dict[str, list[NotebookReport]], chapters: list[int] | None = None,
              partial: bool = False) -> list[GradebookRow]:
    """A row per student and exercise of the chapters graded or named, in the course's order."""
    graded = {exercises.EXERCISES[e.id].chapter for reports in students.values() for report in reports
              for e in report.exercises if e.id in exercises.EXERCISES} | set(chapters or [])
    wanted = [eid for eid, e in exercises.EXERCISES.items() if e.chapter in graded]
    rows = []
    for student, reports in students.items():
        best: dict[str, GradebookRow] = {}
        for notebook, e in [(report.notebook, e) for report in reports for e in report.exercises]:
            row = GradebookRow(student, notebook, e.id, e.status,
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
    """0 when every row passed and each of ``reports`` scored an exercise, else 1."""
    return int(any(not report.exercises for report in reports) or not all(row.status == PASSED for row in rows))


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

    if platform_problem():
        print(f"error: {platform_problem()}", file=sys.stderr)
        return 1
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


# Gradescope

#: Who sees each test: Gradescope's ``visible`` shows it to the student at once.
VISIBILITY = "visible"


def _line(reports: list[NotebookReport], notebook: str, exercise_id: str) -> str:
    return next((e.line for r in reports if r.notebook == notebook for e in r.exercises if e.id == exercise_id),
                f"{FAIL_MARK} {exercise_id}: not submitted: no notebook of chapter "
                f"{exercises.EXERCISES[exercise_id].chapter} was handed in")


def _output(reports: list[NotebookReport]) -> str:
    lines = [line for r in reports for line in [
        f"{Path(r.notebook).name}: graded by mha_course {r.package_version} with seed {r.seed} (sha256 "
        f"{str(r.sha256)[:12]}...; sandbox: {r.sandbox})", *(f"  ! {event}" for event in r.events)]]
    return "\n".join(lines) if lines else "No notebook was handed in."


def results(reports: list[NotebookReport], rows: list) -> dict:
    """Gradescope's results for one submission: its reports and its gradebook rows."""
    tests = [{"name": f"{row.exercise} {exercises.EXERCISES[row.exercise].title}", "number": row.exercise,
              "score": row.points, "max_score": row.max_points,
              "status": "passed" if row.status == PASSED else "failed",
              "output": _line(reports, row.notebook, row.exercise), "visibility": VISIBILITY} for row in rows]
    return {"score": round(sum(row.points for row in rows), 4), "output": _output(reports),
            "visibility": VISIBILITY, "tests": tests}


def write_results(reports: list[NotebookReport], rows: list, path: Path) -> None:
    """Write :func:`results` as JSON to ``path`` (its folder is made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results(reports, rows), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


#: The files of the course's repository the bundle needs beside the package.
REPOSITORY_FILES = ("pyproject.toml", "README.md", "requirements.txt")

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (see run_autograder).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=""
for candidate in python3.13 python3.12 python3.11; do
  if command -v "$candidate" >/dev/null; then PYTHON="$candidate"; break; fi
done
if [ -z "$PYTHON" ]; then  # Ubuntu 22.04's Python is 3.10: the course needs 3.11 or later
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3.11 python3.11-venv
  PYTHON=python3.11
fi
if ! "$PYTHON" -m venv /autograder/venv; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "$PYTHON-venv"
  "$PYTHON" -m venv /autograder/venv
fi
# PyTorch's CPU build: the default Linux wheel brings gigabytes of CUDA that grading never uses.
export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
/autograder/venv/bin/python -m pip install --disable-pip-version-check -r requirements.txt
/autograder/venv/bin/python -m pip install --disable-pip-version-check --no-deps ./course
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: it grades the notebooks in $ROOT/submission and writes
# $ROOT/results/results.json. MHA_COURSE_AUTOGRADER_ROOT and MHA_COURSE_AUTOGRADER_PYTHON replace
# /autograder and the Python that setup.sh installed (to try it outside Gradescope).
set -uo pipefail
ROOT="${{MHA_COURSE_AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{MHA_COURSE_AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}"
mkdir -p "$ROOT/results"
notebooks=()
while IFS= read -r -d '' notebook; do notebooks+=("$notebook"); done < <(
  find "$ROOT/submission" -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' -print0 | sort -z)
"$PYTHON" -m mha_course grade --gradescope "$ROOT/results/results.json" {options} "${{notebooks[@]}}"
status=$?
# 1 says only that an exercise did not pass: the results are written.
if [ "$status" -le 1 ]; then exit 0; fi
exit "$status"
"""


def run_script(chapters: str | None, partial: bool, timeout: float) -> str:
    """``run_autograder``, with the options of ``grade`` it uses."""
    options = [*(["--chapters", chapters] if chapters else []), *(["--partial"] if partial else []),
               "--timeout", f"{timeout:g}", "--in-container"]
    return RUN.format(options=" ".join(shlex.quote(option) for option in options))


def _add(bundle: zipfile.ZipFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16  # a regular file with these permissions
    info.compress_type = zipfile.ZIP_DEFLATED
    bundle.writestr(info, data)


def write_bundle(out: Path, chapters: str | None = None, partial: bool = False, timeout: float = 120.0,
                 root: Path | None = None) -> list[str]:
    """Write the autograder's zip to ``out`` from the repository ``root``; return the names in it."""
    root = root or Path(mha_course.__file__).resolve().parents[1]  # the repository (an editable install)
    missing = [name for name in REPOSITORY_FILES if not (root / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not found in {root}: build the autograder from the course's "
                                "repository (where `pip install -e .` installed the package)")
    snapshot = PackageSnapshot()
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as bundle:
        _add(bundle, "setup.sh", SETUP.encode(), 0o755)
        _add(bundle, "run_autograder", run_script(chapters, partial, timeout).encode(), 0o755)
        _add(bundle, "requirements.txt", (root / "requirements.txt").read_bytes())
        for name in ("pyproject.toml", "README.md"):
            _add(bundle, f"course/{name}", (root / name).read_bytes())
        for name, data in snapshot.files.items():
            _add(bundle, f"course/{PACKAGE}/{name}", data)
        return bundle.namelist()


def autograder(args: argparse.Namespace) -> int:
    """``python -m mha_course autograder``."""
    _, problem = parse_chapters(args.chapters)
    if problem or not args.timeout > 0:
        print(problem or f"--timeout must be a positive number of seconds, got {args.timeout:g}", file=sys.stderr)
        return USAGE_ERROR
    if args.out.suffix != ".zip" or args.out.is_dir():
        print(f"--out {args.out}: give the name of a zip file to write, e.g. --out autograder.zip", file=sys.stderr)
        return USAGE_ERROR
    try:
        names = write_bundle(args.out, args.chapters, args.partial, args.timeout)
    except FileNotFoundError as error:
        print(f"python -m mha_course autograder: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    print(f"Wrote {args.out} ({len(names)} files): upload it as the assignment's autograder on Gradescope "
          "(base image Ubuntu 24.04).")
    return 0
