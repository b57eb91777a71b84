"""``python -m mha_course grade`` and ``autograder``: a class's notebooks in; a score table, a gradebook (CSV),
totals, feedback files, Gradescope's ``results.json`` and an exit status out; and the zip of an autograder.

``--submissions DIR`` grades each subfolder's notebooks as its student's. The gradebook has a row per
student and exercise of the chapters graded (or ``--chapters``): its status (``not submitted`` when no
notebook of its chapter came in), points (a student's best notebook counts; a pass earns 1, ``--partial``
the share of its checks of behaviour passed), ``notes`` (the verdict, what the notebook printed against it,
the cells that failed) and ``flags``, for the instructor to look at, never a verdict: a notebook with the
book's solutions in it, or the same code as another student's. Exit status: 0 when every exercise passed, 1
when not, 2 for a usage mistake or a sandbox required and missing. The zip's ``setup.sh`` builds Gradescope's
image (a virtual environment, the course with its ``grading`` extra at the pinned versions); ``run_autograder``
grades each submission ``--in-container`` (``MHA_COURSE_AUTOGRADER_ROOT`` and ``_PYTHON`` replace
``/autograder`` and its Python, to try it elsewhere).

>>> from mha_course.grading.report import score
>>> report = NotebookReport("submitted/alice/01_mine.ipynb", [score("1.1", "failed", "✗ 1.1: ...", 4)])
>>> rows = gradebook({"alice": [report]}, chapters=[1], partial=True)
>>> for row in rows[:2]: print(row.status, row.points, row.notes, sep=" | ")
failed | 0.5 | ✗ 1.1: ...
not submitted | 0 | ✗ 1.2: not submitted: no notebook of chapter 1 was handed in
>>> results([report], rows)["score"], results([report], rows)["tests"][0]["output"]
(0.5, '✗ 1.1: ...')
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import shlex
import sys
import tomllib
import zipfile
from dataclasses import astuple, dataclass, fields
from importlib import metadata
from pathlib import Path

import mha_course

from .. import exercises
from ..exercises.framework import FAIL_MARK, PASSED
from ..notebook_files import SOLUTION_BEGIN, course_root, default_notebooks, in_tool_folder
from .grading_setup import USAGE_ERROR, GradingUnavailableError, limit_errors, parse_chapters, platform_problem
from .sandbox import PACKAGE, PackageSnapshot
from .report import NotebookReport, format_report

#: The status of an exercise whose chapter's notebook a student did not hand in.
NOT_SUBMITTED = "not submitted"


@dataclass
class GradebookRow:
    """One student's result on one exercise: a row of the CSV (its header: the fields' names)."""

    student: str
    notebook: str  # the notebook it was graded in ("" when not submitted)
    exercise: str
    status: str
    points: float
    max_points: int
    checks_passed: int
    checks_total: int
    notes: str = ""  # what the instructor may want to read: the verdict, the notebook's events
    flags: str = ""  # integrity flags of the notebook (integrity_flags), not verdicts


def collect(submissions: Path) -> dict[str, list[Path]]:
    """Each student (a subfolder of ``submissions``) and the notebooks under it (a stray one is named, left out)."""
    for stray in sorted(submissions.glob("*.ipynb")):
        print(f"{stray} is in no student's folder: not graded (put it in {submissions}/STUDENT/)", file=sys.stderr)
    return {folder.name: sorted(p for p in folder.rglob("*.ipynb") if not in_tool_folder(p.relative_to(folder)))
            for folder in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))}


def _notes(report: NotebookReport, exercise) -> str:
    """An exercise's line, its events, then the notebook's events not about one exercise."""
    ids = tuple(f"{e.id}: " for e in report.exercises)
    mine = [event for event in report.events if event.startswith(f"{exercise.id}: ")]
    wide = [event for event in report.events if not event.startswith(ids) and event not in exercise.line]
    return " | ".join([exercise.line, *mine, *wide])


def gradebook(students: dict[str, list[NotebookReport]], chapters: list[int] | None = None, partial: bool = False,
              flags: dict[str, list[str]] | None = None) -> list[GradebookRow]:
    """A row per student and exercise of the chapters graded or named, in the course's order (``flags``: by
    notebook, as :func:`integrity_flags` gives them)."""
    graded = {exercises.EXERCISES[e.id].chapter for reports in students.values() for report in reports
              for e in report.exercises if e.id in exercises.EXERCISES} | set(chapters or [])
    rows, flags = [], flags or {}
    for student, reports in students.items():
        best: dict[str, GradebookRow] = {}
        for report, e in [(r, e) for r in reports for e in r.exercises]:
            row = GradebookRow(student, report.notebook, e.id, e.status,
                               1 if e.status == PASSED else (e.share or 0) if partial else 0, 1, e.checks_passed,
                               e.checks_total, _notes(report, e), "; ".join(flags.get(report.notebook, [])))
            if e.id not in best or row.points > best[e.id].points:
                best[e.id] = row
        unread = [f"{Path(r.notebook).name}: {event}" for r in reports if not r.exercises for event in r.events]
        rows += [best.get(eid) or GradebookRow(student, "", eid, NOT_SUBMITTED, 0, 1, 0, len(e.checks), " | ".join(
            [f"{FAIL_MARK} {eid}: {NOT_SUBMITTED}: no notebook of chapter {e.chapter} was handed in", *unread]))
            for eid, e in exercises.EXERCISES.items() if e.chapter in graded]
    return rows


def _code(path: Path) -> list[str] | None:
    """The sources of a notebook's code cells (None if it cannot be read)."""
    try:
        return ["".join(c.get("source", "")).strip() for c in json.loads(path.read_bytes())["cells"]
                if c.get("cell_type") == "code"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def integrity_flags(students: dict[str, list[Path]], reports: dict[Path, NotebookReport]) -> dict[str, list[str]]:
    """Flags, by notebook: solution markers still in it or the code of the book's own notebook (the instructor's
    solutions), and the same code as another student's notebook where it earned points. Not verdicts."""
    digest = lambda code: hashlib.sha256("\0".join(code).encode()).hexdigest()  # noqa: E731
    book = {digest(code): path.name for path in default_notebooks(course_root()) if (code := _code(path))}
    codes = {(student, path): code for student, paths in students.items() for path in paths if (code := _code(path))}
    found: dict[str, list[str]] = {}
    for (student, path), code in codes.items():
        notes = [f"solution markers ({SOLUTION_BEGIN}) in it"] if any(SOLUTION_BEGIN in c for c in code) else []
        notes += [f"the code of the book's own {book[digest(code)]}"] if digest(code) in book else []
        earned = any(e.status == PASSED or e.share for e in reports[path].exercises)
        notes += [f"the same code as {other}'s {p.name}" for (other, p), theirs in codes.items()
                  if other != student and earned and theirs == code]
        if notes:
            found[str(path)] = notes
    return found


def write_csv(rows: list, path: Path, header: list[str] | None = None) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header or [f.name.replace("_", " ") for f in fields(GradebookRow)])
        writer.writerows(astuple(row) if isinstance(row, GradebookRow) else row for row in rows)


def totals(rows: list[GradebookRow], flags: dict[str, list[str]]) -> list[list]:
    """A row per student (student, points, max points, exercises passed, flags): what a platform imports."""
    students = dict.fromkeys(row.student for row in rows)
    return [[s, round(sum(r.points for r in rows if r.student == s), 4), sum(r.max_points for r in rows if r.student == s),
             sum(r.status == PASSED for r in rows if r.student == s), "; ".join(flags.get(s, []))] for s in students]


def feedback(student: str, rows: list[GradebookRow], reports: list[NotebookReport]) -> str:
    """A student's short feedback: the total, a line per exercise with its notes, and what graded it."""
    lines = [f"{student}: {round(sum(r.points for r in rows), 4):g} of {sum(r.max_points for r in rows)} points", ""]
    for row in rows:
        lines += [f"{row.exercise} {exercises.EXERCISES[row.exercise].title}: {row.status}, {row.points:g} of "
                  f"{row.max_points}", *(f"    {note}" for note in row.notes.split(" | ") if note)]
    return "\n".join([*lines, "", _output(reports)]) + "\n"


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
    if args.submissions is not None and args.gradescope:
        errors.append("--gradescope writes the results of one submission: give its notebooks, not --submissions")
    if args.submissions is None and args.feedback:
        errors.append("--feedback writes a file per student: give --submissions DIR (a subfolder per student)")
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
    flags = integrity_flags(students, by_path)
    rows = gradebook(graded, chapters, args.partial, flags)
    print(format_report(reports))
    written = []
    if args.json:
        payload = {"score": sum(r.score for r in reports), "max_score": sum(r.max_score for r in reports),
                   "notebooks": [r.to_dict() for r in reports]}
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(f"Scores written to {args.json}")
    if args.csv:
        write_csv(rows, args.csv)
        written.append(f"Gradebook written to {args.csv} ({len(students)} student(s), {len(rows)} rows)")
    if args.totals:
        by_student = {s: sorted({f for p in notebooks for f in flags.get(str(p), [])}) for s, notebooks in students.items()}
        write_csv(totals(rows, by_student), args.totals, ["student", "points", "max points", "exercises passed", "flags"])
        written.append(f"Totals written to {args.totals}")
    if args.feedback:
        args.feedback.mkdir(parents=True, exist_ok=True)
        for student in students:
            text = feedback(student, [r for r in rows if r.student == student], graded[student])
            (args.feedback / f"{student}.txt").write_text(text, encoding="utf-8")
        written.append(f"Feedback written to {args.feedback}/ (a file per student)")
    if args.gradescope:
        write_results(reports, rows, args.gradescope)
        written.append(f"Gradescope results written to {args.gradescope}")
    print("\n".join(written + [f"Flagged for a look (not verdicts): {', '.join(flags)}"] * bool(flags)))
    return exit_status(rows, reports)


# Gradescope

#: Who sees each test: Gradescope's ``visible`` shows it to the student at once.
VISIBILITY = "visible"


def _output(reports: list[NotebookReport]) -> str:
    lines = [line for r in reports for line in [
        f"{Path(r.notebook).name}: graded by mha_course {r.package_version} (checks {str(r.checks_sha256)[:12]}, torch "
        f"{r.torch_version}) with seed {r.seed} (sha256 {str(r.sha256)[:12]}...; sandbox: {r.sandbox})",
        *(f"  ! {event}" for event in r.events)]]
    return "\n".join(lines) if lines else "No notebook was handed in."


def results(reports: list[NotebookReport], rows: list) -> dict:
    """Gradescope's results for one submission: its reports and its gradebook rows."""
    tests = [{"name": f"{row.exercise} {exercises.EXERCISES[row.exercise].title}", "number": row.exercise,
              "score": row.points, "max_score": row.max_points,
              "status": "passed" if row.status == PASSED else "failed",
              "output": row.notes.replace(" | ", "\n"), "visibility": VISIBILITY} for row in rows]
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
VENV="${MHA_COURSE_AUTOGRADER_ROOT:-/autograder}/venv"
PYTHON=""
for candidate in python3.13 python3.12 python3.11 python3; do  # the first that runs and is 3.11 or later
  if "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then PYTHON="$candidate"; break; fi
done
PYTHON="${PYTHON:-python3.11}"  # none: Ubuntu 22.04, whose Python is 3.10; install 3.11 (and venv where missing)
"$PYTHON" -m venv "$VENV" 2>/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
  "$PYTHON" "$PYTHON-venv" && "$PYTHON" -m venv "$VENV"; }
# The course with what grading needs (its grading extra), at the versions requirements.txt pins. PyTorch's CPU
# index is added to this one command, after the indexes the image sets: from the usual index, torch on Linux is
# the CUDA build, gigabytes that grading, on the CPU, never uses.
"$VENV/bin/python" -m pip install --disable-pip-version-check \\
  --extra-index-url https://download.pytorch.org/whl/cpu -c requirements.txt "./course[grading]"
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


def _name(requirement: str) -> str:
    """A requirement's project name, normalised (``Jupyter_Client>=7`` -> ``jupyter-client``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]*)", requirement).group(1)).lower()


def grading_pins(root: Path) -> str:
    """The lines of ``root/requirements.txt`` that pin what the bundle installs: the package's dependencies and
    its ``grading`` extra's, and theirs (as the packages installed here name them)."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    todo, wanted = [*project["dependencies"], *project["optional-dependencies"]["grading"]], set()
    while todo:
        name = _name(todo.pop())
        if name not in wanted:
            wanted.add(name)
            try:
                todo += [r for r in metadata.requires(name) or [] if "extra ==" not in r]
            except metadata.PackageNotFoundError:
                pass
    lines = (root / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return "".join(f"{line}\n" for line in lines if line.strip() and not line.startswith("#") and _name(line) in wanted)


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
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as bundle:
        _add(bundle, "setup.sh", SETUP.encode(), 0o755)
        _add(bundle, "run_autograder", run_script(chapters, partial, timeout).encode(), 0o755)
        _add(bundle, "requirements.txt", grading_pins(root).encode())
        for name in ("pyproject.toml", "README.md"):
            _add(bundle, f"course/{name}", (root / name).read_bytes())
        for name, data in PackageSnapshot().files.items():
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
