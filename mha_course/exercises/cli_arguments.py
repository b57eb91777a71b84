"""The command-line arguments of ``python -m mha_course student``, ``grade``, ``progress`` and ``lab``.

Kept apart from the tools themselves so that building the parser imports neither nbformat nor
nbclient.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .grading_setup import CELL_TIMEOUT, CHECK_TIMEOUT, NOTEBOOK_TIMEOUT


def add_student_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK",
                        help="source notebooks (default: every notebook in book/)")
    parser.add_argument("--out", type=Path, default=Path("student"),
                        help="folder to write the student edition into (default: student/)")
    parser.add_argument("--force", action="store_true", help="overwrite notebooks that already exist")
    parser.add_argument("--book", action="store_true",
                        help="also copy _config.yml, _toc.yml and book/ so that `jupyter-book build OUT` "
                             "builds the HTML book without solutions")


def add_grade_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK",
                        help="completed notebooks to grade (each runs on a copy; the file is not changed)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the scores as JSON to FILE")
    add_limit_arguments(parser, jobs=1)


def add_limit_arguments(parser: argparse.ArgumentParser, jobs: int) -> None:
    """The grader's time limits and parallelism (``grade`` and ``progress``)."""
    parser.add_argument("--timeout", type=float, default=NOTEBOOK_TIMEOUT, metavar="SECONDS",
                        help=f"how long each notebook may run before it is stopped (default: {NOTEBOOK_TIMEOUT:g})")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, metavar="SECONDS",
                        help=f"how long one cell may run before it is interrupted (default: {CELL_TIMEOUT:g})")
    parser.add_argument("--check-timeout", type=float, default=CHECK_TIMEOUT, metavar="SECONDS",
                        help=f"how long the answer to one exercise may run while being checked (default: "
                             f"{CHECK_TIMEOUT:g})")
    parser.add_argument("--jobs", type=int, default=jobs, metavar="N",
                        help=f"notebooks graded at the same time (default: {jobs}); with more than one, an edit to "
                             "the package's files withholds the score of every notebook running when it is found")


def add_progress_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", type=Path, default=Path("student"),
                        help="the folder with your chapter notebooks (default: student/)")
    add_limit_arguments(parser, jobs=2)


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("student"),
                        help="the folder of the student edition to open (default: student/)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser (print the address)")
    parser.add_argument("--port", type=int, default=None, help="the port JupyterLab listens on")
    parser.add_argument("jupyter_args", nargs=argparse.REMAINDER, metavar="-- ARGUMENTS",
                        help="anything after -- is passed on to jupyter lab")
