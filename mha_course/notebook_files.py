"""Where the chapters' notebooks and data are: the files the student edition, the grader and the
progress view look for.

* A chapter's notebook is named by its number: ``01_one_causal_head.ipynb`` is chapter 1.
* The book's notebooks are ``book/**/*.ipynb``; folders that tools write (``.ipynb_checkpoints``,
  ``__pycache__``, ``_build``) are never part of the course.
* The ``data/`` folder next to the chapters holds the files they read (benchmark results, ...);
  hidden files and ``__pycache__`` in it are not the course's. The package keeps a copy of its JSON
  files (``mha_course/book_data/``, package data; ``book/data`` is the source, and a test checks the
  copy): a chapter collected without its ``data/`` folder still finds them (:func:`find_data`).

Example:
    >>> chapter_number("03_batched.ipynb"), chapter_number("notes.ipynb")
    (3, None)
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

#: The folder next to the chapters that holds the data they read.
DATA_FOLDER = "data"

#: The package's copy of the JSON files of the book's ``data/`` folder (a folder of package data).
PACKAGED_DATA = "book_data"

#: Folders written by tools (Jupyter, Python, the book build), never part of the course.
TOOL_FOLDERS = frozenset({".ipynb_checkpoints", "__pycache__", "_build"})

_CHAPTER_FILE = re.compile(r"^(\d+)_")

#: The line that opens a solution in the book's notebooks (the student edition replaces each solution by a stub).
SOLUTION_BEGIN = "### BEGIN SOLUTION"


def chapter_number(name: str) -> int | None:
    """The chapter a file name belongs to (the number it starts with, before ``_``), or ``None``."""
    match = _CHAPTER_FILE.match(name)
    return int(match.group(1)) if match else None


def in_tool_folder(path: Path) -> bool:
    """True for a path inside a folder that a tool wrote (see :data:`TOOL_FOLDERS`)."""
    return any(part in TOOL_FOLDERS for part in path.parts)


def chapter_notebooks(folder: Path) -> dict[int, Path]:
    """The folder's notebook for each chapter, by the number its name starts with (first one wins)."""
    found: dict[int, Path] = {}
    for path in sorted(folder.glob("*.ipynb")):
        chapter = chapter_number(path.name)
        if chapter is not None:
            found.setdefault(chapter, path)
    return found


def default_notebooks(root: Path = Path(".")) -> list[Path]:
    """Every notebook of the book: ``root/book/**/*.ipynb``."""
    book = root / "book"
    return sorted(p for p in book.rglob("*.ipynb") if not in_tool_folder(p.relative_to(book)))


def course_root(start: Path = Path(".")) -> Path:
    """The folder whose ``book/`` holds the chapters: ``start`` when it has them, else the course's repository
    that the package was installed from (``pip install -e .``), so the tools work from any folder."""
    for root in (start, Path(__file__).resolve().parents[1]):
        if default_notebooks(root):
            return root
    return start


def data_files(folder: Path) -> dict[Path, Path]:
    """The files of the ``data/`` folder in ``folder``, each by its path relative to ``data/``."""
    data = folder / DATA_FOLDER
    if not data.is_dir():
        return {}
    files = {}
    for path in sorted(data.rglob("*")):
        relative = path.relative_to(data)
        if path.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            files[relative] = path
    return files


def find_data(path: str | Path) -> Path:
    """Where to read ``path``, a file of the book's ``data/`` folder as a chapter names it.

    ``path`` itself when it exists, or is not under ``data/``; otherwise the package's copy of that
    file (:data:`PACKAGED_DATA`), when it has one. So a chapter notebook downloaded or collected
    without the ``data/`` folder beside it reads the stored results all the same.

    Example:
        >>> find_data("data/bench-cpu.json").parts[-2:]  # from a folder without data/
        ('book_data', 'bench-cpu.json')
        >>> find_data("results/mine.json").as_posix()
        'results/mine.json'
    """
    path = Path(path)
    if path.exists() or path.is_absolute() or len(path.parts) < 2 or path.parts[0] != DATA_FOLDER:
        return path
    packaged = files(__package__).joinpath(PACKAGED_DATA, *path.parts[1:])
    return Path(str(packaged)) if packaged.is_file() else path


__all__ = ["DATA_FOLDER", "PACKAGED_DATA", "find_data", "TOOL_FOLDERS", "chapter_number", "in_tool_folder", "chapter_notebooks",
           "default_notebooks", "course_root", "data_files", "SOLUTION_BEGIN"]
