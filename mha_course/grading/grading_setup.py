"""What grading needs before it starts: time limits, the command line's checks, a POSIX
platform (the answer process gets its socket through ``pass_fds``). Imports nothing heavy: the command
line's parser reads the defaults here.
"""

from __future__ import annotations

import argparse
import sys

#: Default limits, in seconds. Every chapter runs in well under a minute on a two-core machine and
#: its slowest cell in a few seconds, so these leave a wide margin and still stop a runaway loop soon.
NOTEBOOK_TIMEOUT, CELL_TIMEOUT, CHECK_TIMEOUT = 120.0, 30.0, 30.0
#: The environment every process of a grading starts with unless the grader's says otherwise: PyTorch on
#: one thread, since a grading runs several processes at once and small tensors gain nothing from more.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
#: The exit status of ``grade`` and ``autograder`` for a mistake on the command line.
USAGE_ERROR = 2


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of ``text``, cut to ``limit`` characters (``...`` marks a cut)."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def limit_errors(args: argparse.Namespace) -> list[str]:
    """What is wrong with the limits and ``--jobs`` given on the command line (``[]`` if nothing)."""
    limits = {"--timeout": args.timeout, "--cell-timeout": args.cell_timeout, "--check-timeout": args.check_timeout}
    errors = [f"{flag} must be a positive number of seconds, got {value:g}" for flag, value in limits.items()
              if not value > 0]
    return errors + ([f"--jobs must be at least 1, got {args.jobs}"] if args.jobs < 1 else [])


def parse_chapters(text: str | None) -> tuple[list[int], str | None]:
    """The chapters of ``--chapters 1,2`` and what is wrong with them, if anything."""
    from ..exercises.registry import chapter_modules  # the chapters with exercises, without loading their checks

    known = sorted(int(name.rpartition("chapter")[2]) for name in chapter_modules())
    try:
        chapters = [int(part) for part in (text or "").split(",") if part.strip()]
    except ValueError:
        return [], f"--chapters takes chapter numbers separated by commas, e.g. 1,2; got {text!r}"
    unknown = [c for c in chapters if c not in known]
    if unknown:
        return [], (f"--chapters {text}: no exercises in chapter {', '.join(map(str, unknown))}; the chapters with "
                    f"exercises are {', '.join(map(str, known))}")
    return chapters, None


def platform_problem() -> str | None:
    """Why grading cannot run on this platform, as a message for the learner; ``None`` when it can."""
    if sys.platform != "win32":
        return None
    return (f"grading cannot run on this platform ({sys.platform}): the grader hands the process that checks "
            "the answers its socket (subprocess's pass_fds), which only POSIX systems offer. Grade on Linux or "
            "macOS, or on Windows in WSL (the Windows Subsystem for Linux). The checks themselves, "
            "check(\"1.1\", answer) in a notebook, work everywhere.")


class GradingUnavailableError(RuntimeError):
    """Grading was asked for where it cannot run, or without the sandbox it was required to have."""

