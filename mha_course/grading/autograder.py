"""``python -m mha_course autograder --out FILE.zip``: the zip of a Gradescope autograder.

Gradescope unpacks the zip into ``/autograder/source``, runs ``setup.sh`` once as root when it
builds the autograder's image, then ``run_autograder`` for each submission, whose files are in
``/autograder/submission``; it reads the scores from ``/autograder/results/results.json``. The zip
holds:

* ``setup.sh``: a virtual environment in ``/autograder/venv`` (Python 3.11 or later: choose
  Gradescope's Ubuntu 24.04 base image, or it installs ``python3.11``), the course's pinned
  ``requirements.txt`` (PyTorch's CPU build) and the course itself, from ``course/``;
* ``run_autograder``: ``python -m mha_course grade --gradescope`` on every notebook of the
  submission, with the chapters, points and time limit chosen here;
* ``course/``: the package as this command finds it (its source files and data, as the grader
  snapshots them), with ``pyproject.toml`` and ``README.md``.

Each submission runs in a container of its own: that, not the grader, keeps one student's code from
another's results. ``run_autograder`` reads ``MHA_COURSE_AUTOGRADER_ROOT`` (instead of
``/autograder``) and ``MHA_COURSE_AUTOGRADER_PYTHON`` (instead of the environment ``setup.sh``
made), so that it can be tried outside Gradescope.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import zipfile
from pathlib import Path

import mha_course

from .gradebook import USAGE_ERROR, parse_chapters
from .package_files import PACKAGE, PackageSnapshot

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
               "--timeout", f"{timeout:g}"]
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


__all__ = ["write_bundle", "run_script", "repository", "main", "SETUP", "RUN", "REPOSITORY_FILES"]
