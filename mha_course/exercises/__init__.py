"""The course's exercises, and the checks that grade them.

Every exercise has an id (``"1.1"`` ... ``"8.1"``: chapter, then number), a name the learner's
answer goes by in the chapter notebook, checks that test its behaviour against the package's
reference on inputs drawn afresh for every run, and a catalogue of typical mistakes with the
feedback meant for each. One call checks an answer and prints one line::

    >>> import torch
    >>> from mha_course import check
    >>> def build_causal_mask(num_tokens, device=None):
    ...     return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).triu(1)
    >>> result = check("1.1", build_causal_mask)
    ✓ 1.1 passed (6 checks)
    >>> result.passed
    True

An answer that is, or calls, the package's own answer to the exercise does not pass::

    >>> from mha_course import causal_mask
    >>> _ = check("1.1", causal_mask)
    ✗ 1.1: written by you: expected code of your own, got mha_course's own causal_mask. This is mha_course's own causal_mask: write it yourself.

The exercises of chapter N are the list ``EXERCISES`` of the module ``chapterN`` (found by its
name: a new chapter's module needs no other line); ``EXERCISES`` here gathers them all, by id,
on first use. The tools around the checks: :mod:`mha_course.edition.student` writes the student
edition of the chapter notebooks, :mod:`mha_course.grading.grader` scores completed notebooks.
"""

from __future__ import annotations

from typing import Any

from .framework import (ERROR, FAILED, MISSING, NOT_IMPLEMENTED, PASSED, CheckResult, Exercise,
                        error_result, judge, probe)
from .shortcuts import Shortcut
from . import registry
from .registry import chapter_modules


def _registry() -> dict[str, Exercise]:
    return registry.build(chapter_modules())


def __getattr__(name: str):
    # EXERCISES is built on first use, so that importing this package (say, for the command line's
    # parser) does not import every chapter's checks.
    if name == "EXERCISES":
        globals()["EXERCISES"] = found = registry.exercises()
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Every exercise of the course by id, in the order of the book (built on first use).
EXERCISES: dict[str, Exercise]


def run_check(exercise_id: str, answer: Any) -> CheckResult:
    """Check ``answer`` for exercise ``exercise_id`` without printing; never raises."""
    registry = globals().get("EXERCISES") or __getattr__("EXERCISES")
    exercise = registry.get(str(exercise_id))
    if exercise is None:
        return error_result(exercise_id, f"no exercise has this id; the exercises are {', '.join(registry)}.")
    try:
        return judge(exercise, probe(exercise, answer))
    except Exception as error:  # a bug in a check must not take the learner's notebook down
        return error_result(exercise.id, f"the check itself failed ({type(error).__name__}: {error}); "
                            "please report this.", len(exercise.checks))


def check(exercise_id: str, answer: Any) -> CheckResult:
    """Check a learner's answer to an exercise and print one line with the verdict.

    Args:
        exercise_id: the exercise, e.g. ``"2.1"``.
        answer: the function or class the exercise asks for (``None`` counts as not done yet).

    Returns:
        a :class:`CheckResult` (``result.passed``, ``result.line``, ``result.mistake``...). The
        printed line is one of::

            ✓ 2.1 passed (11 checks)
            ○ 2.1 not implemented yet
            ✗ 2.1: <first failed check>: expected ..., got .... <what probably went wrong>

    ``check`` never raises, whatever the answer does (except when you interrupt it), and leaves
    the global random state as it found it.

    Example:
        >>> import torch
        >>> visibility_table = lambda n, device=None: torch.ones(n, n, dtype=torch.bool, device=device).tril()
        >>> result = check("1.1", visibility_table)  # doctest: +ELLIPSIS
        ✗ 1.1: mask for a short sequence: expected row 1 (index [0]) = [False, True...] for build_causal_mask(...), got [True, False...]. You returned the visibility table (True where a token MAY look). The mask is its opposite: True where attention is forbidden, the future positions j > i.
        >>> result.mistake
        'visibility-table'
    """
    result = run_check(exercise_id, answer)
    print(result.line)
    return result


__all__ = [
    "EXERCISES",
    "check",
    "run_check",
    "chapter_modules",
    "CheckResult",
    "Exercise",
    "PASSED",
    "FAILED",
    "NOT_IMPLEMENTED",
    "MISSING",
    "ERROR",
    "Shortcut",
]
