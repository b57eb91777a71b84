"""The registry of the exercises: every ``chapterN`` module of this package, found by its name.

It imports nothing of the package when loaded, so that the checks' own modules (the shortcuts read
which modules hold the probes) can use it without importing the package that imports them.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

PACKAGE = __name__.rpartition(".")[0]


def chapter_modules() -> list[str]:
    """The modules that hold the chapters' exercises, in the order of the book: every
    ``chapterN`` module of this package. A new chapter's module is found by its name alone."""
    found = [(int(match.group(1)), info.name) for info in pkgutil.iter_modules([str(Path(__file__).parent)])
             if (match := re.fullmatch(r"chapter(\d+)", info.name))]
    return [f"{PACKAGE}.{name}" for _, name in sorted(found)]


def build(modules: list[str]) -> dict:
    """Exercise id -> ``Exercise``, from the ``EXERCISES`` of each module in ``modules``; an id used
    twice is refused, naming both modules."""
    registry: dict = {}
    for module_name in modules:
        for exercise in importlib.import_module(module_name).EXERCISES:
            if exercise.id in registry:
                raise ValueError(f"two exercises have the id {exercise.id!r} (in {module_name} and "
                                 f"{registry[exercise.id].probe.__module__}): give each its own.")
            registry[exercise.id] = exercise
    return registry


_EXERCISES: dict | None = None


def exercises() -> dict:
    """Every exercise of the course by id, in the order of the book, built on first use."""
    global _EXERCISES
    if _EXERCISES is None:
        _EXERCISES = build(chapter_modules())
    return _EXERCISES
