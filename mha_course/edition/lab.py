"""``python -m mha_course lab``: write what is missing of the student edition, then open JupyterLab on it.

``make lab`` runs this command. It

1. writes the student edition of the chapters into ``student/`` (or ``--out``), but only the
   notebooks that are not there yet, and the ``data/`` files they read: a notebook already in the
   folder is the learner's work and is never overwritten;
2. replaces itself with ``jupyter lab`` serving that folder (``--no-browser`` and ``--port`` are
   passed on, as is everything after ``--``); on Windows, where a process cannot replace itself,
   it runs ``jupyter lab`` and waits for it.

The notebooks in ``book/`` hold the solutions: they are the instructor's copy.

Command line::

    python -m mha_course lab [--out DIR] [--no-browser] [--port N] [-- JUPYTER_LAB_ARGUMENTS...]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from ..notebook_files import course_root, default_notebooks
from .student import SolutionMarkerError, write_student_edition

#: The JupyterLab the course pins in requirements.txt.
JUPYTERLAB_PIN = "jupyterlab==4.6.6"


def prepare(out: Path, root: Path = Path(".")) -> list[Path]:
    """Write the notebooks (and data files) of the student edition that ``out`` lacks; return them."""
    notebooks = default_notebooks(root)
    if not notebooks:
        raise FileNotFoundError(f"no chapter notebooks under {root.resolve() / 'book'}: run this from the "
                                "course's repository root (where the Makefile is)")
    return write_student_edition(notebooks, out, keep_existing=True, root=root)


def jupyter_command(out: Path, no_browser: bool = False, port: int | None = None,
                    extra: list[str] | None = None) -> list[str]:
    """The ``jupyter lab`` command line that serves ``out``.

    Example:
        >>> jupyter_command(Path("student"), no_browser=True, port=8890)[1:6]
        ['-m', 'jupyterlab', '--ServerApp.root_dir=student', '--no-browser', '--port=8890']
    """
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={out}"]
    if no_browser:
        command.append("--no-browser")
    if port is not None:
        command.append(f"--port={port}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # containers often run as root; JupyterLab refuses it unless told
    return command + list(extra or [])


def main(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("jupyterlab") is None:
        print(f"JupyterLab is not installed in this environment ({sys.prefix}). `make lab` installs it with the "
              f"rest of requirements.txt; by hand: {sys.executable} -m pip install {JUPYTERLAB_PIN}", file=sys.stderr)
        return 2
    try:
        written = prepare(args.out, course_root())
    except (FileNotFoundError, SolutionMarkerError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    pages = {page.with_suffix(".ipynb").name for page in Path("book").glob("*.md")}
    notebooks = [p for p in written if p.suffix == ".ipynb" and p.name not in pages]
    kept = sorted(p.name for p in args.out.glob("*.ipynb") if p not in written and p.name not in pages)
    if notebooks:
        print(f"Wrote {len(notebooks)} chapter notebook(s) without solutions to {args.out}/.")
    if kept:
        print(f"Kept your {len(kept)} notebook(s) already in {args.out}/ as they are.")
    extra = args.jupyter_args[1:] if args.jupyter_args[:1] == ["--"] else args.jupyter_args
    command = jupyter_command(args.out, args.no_browser, args.port, extra)
    print(f"Starting JupyterLab on {args.out}/ (stop it with Ctrl+C) ...", flush=True)
    if os.name != "posix":  # Windows' execv starts a new process and ends this one, detached from the console
        return subprocess.call(command)
    os.execv(command[0], command)
    return 0  # not reached: exec replaces this process


__all__ = ["prepare", "jupyter_command", "JUPYTERLAB_PIN"]
