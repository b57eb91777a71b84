"""The command-line arguments of ``python -m mha_course student`` and ``... grade``.

Kept apart from the tools themselves so that building the parser imports neither nbformat nor
nbclient.
"""

from __future__ import annotations

import argparse
from pathlib import Path


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
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long each notebook may run before it is stopped (default: 600)")
    parser.add_argument("--check-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long the answers to one exercise may run while being checked (default: 60)")
