"""Gradescope: ``grade --gradescope FILE`` writes a submission's ``results.json``; ``python -m mha_course
autograder --out FILE.zip`` writes the autograder's zip.

Gradescope unpacks the zip into ``/autograder/source`` and runs ``setup.sh`` once, as root, to build its
image: a virtual environment in ``/autograder/venv`` (Python 3.11 or later: choose the Ubuntu 24.04 base
image), the pinned ``requirements.txt`` (PyTorch's CPU build) and the course from ``course/``. For each
submission (in ``/autograder/submission``) it runs ``run_autograder``: ``grade --gradescope --in-container``
with the chapters, points and time limit chosen here; a container per submission keeps one student's code
from another's results. Each exercise of the gradebook is a test worth a point (or its share of the checks
with ``--partial``), its output the learner's own verdict line; the submission's output names the package,
seed and notebook that replay it. ``MHA_COURSE_AUTOGRADER_ROOT`` and ``MHA_COURSE_AUTOGRADER_PYTHON``
replace ``/autograder`` and its Python, to try it elsewhere.

Example:
    >>> from mha_course.grading.gradebook import GradebookRow
    >>> row = GradebookRow("", "", "1.1", "not submitted", 0, 1, 0, 5)
    >>> results([], [row])["tests"][0]["output"]
    '✗ 1.1: not submitted: no notebook of chapter 1 was handed in'
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import zipfile
from pathlib import Path

import mha_course

from .. import exercises
from ..exercises.framework import FAIL_MARK, PASSED
from .grading_setup import USAGE_ERROR, parse_chapters
from .package_files import PACKAGE, PackageSnapshot
from .report import NotebookReport


#: Who sees each test: Gradescope's ``visible`` shows it to the student at once.
VISIBILITY = "visible"


def _line(reports: list[NotebookReport], notebook: str, exercise_id: str) -> str:
    for report in reports:
        if report.notebook == notebook:
            for score in report.exercises:
                if score.id == exercise_id:
                    return score.line
    return (f"{FAIL_MARK} {exercise_id}: not submitted: no notebook of chapter {exercises.EXERCISES[exercise_id].chapter} "
            "was handed in")


def _output(reports: list[NotebookReport]) -> str:
    lines = []
    for report in reports:
        lines.append(f"{Path(report.notebook).name}: graded by mha_course {report.package_version} with seed "
                     f"{report.seed} (sha256 {str(report.sha256)[:12]}...; sandbox: {report.sandbox})")
        lines += [f"  ! {event}" for event in report.events]
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


def repository() -> Path:
    """The course's repository: the folder above the package (an editable install, or a checkout)."""
    return Path(mha_course.__file__).resolve().parents[1]


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
    """Write the autograder's zip to ``out``; return the names in it.

    Raises:
        FileNotFoundError: when ``root`` (the course's repository) lacks one of :data:`REPOSITORY_FILES`.
    """
    root = root or repository()
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


def main(args: argparse.Namespace) -> int:
    """Run ``python -m mha_course autograder``."""
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
