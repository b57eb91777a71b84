"""What grading needs before it starts: its time limits, and a platform that can run it.

``python -m mha_course grade`` and ``progress`` share the limits below (their defaults and the
check of the values given on the command line) and the platform check. This module imports nothing
heavy, so the command line's parser can read the defaults without loading nbformat or nbclient.

The grader talks to the fresh process that checks the answers over a socket pair: it hands one
end to that process with ``subprocess``'s ``pass_fds``, in a session of its own that it kills as a
whole, and reads the frames with a ``multiprocessing`` connection over its own end, which waits on
it with ``select`` (through :mod:`selectors`). All of it works on POSIX systems (Linux,
macOS), where processes fork; Windows has none of it (``pass_fds`` is refused there, ``os.killpg``
is missing, ``select`` waits on sockets only, and ``multiprocessing``'s connections there are
sockets and message-mode named pipes, with no length before each message), so grading needs Linux
or macOS, or WSL on Windows.

Example:
    >>> from types import SimpleNamespace
    >>> limit_errors(SimpleNamespace(timeout=120.0, cell_timeout=0.0, check_timeout=30.0, jobs=1))
    ['--cell-timeout must be a positive number of seconds, got 0']
"""

from __future__ import annotations

import argparse
import os
import sys

#: Default limits, in seconds. Every chapter runs in well under a minute on a two-core machine and
#: its slowest cell in a few seconds, so these leave a wide margin and still stop a runaway loop soon.
NOTEBOOK_TIMEOUT = 120.0
CELL_TIMEOUT = 30.0
CHECK_TIMEOUT = 30.0
#: The environment every process of a grading starts with, unless the grader's own environment says
#: otherwise: PyTorch computes on one thread. Grading runs several processes at once (a kernel, the
#: next notebook's, an answer process), and threads of one waiting for those of another cost more
#: processor time than the small tensors of the notebooks gain.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def raise_it(flag: str) -> str:
    """How a report that something ran out of time says which limit to raise: ``raise it with
    --cell-timeout SECONDS``. A verdict of "timed out" says nothing about the answer: on a slow or
    busy machine, grade again with a higher limit."""
    return f"raise it with {flag} SECONDS"


def limit_errors(args: argparse.Namespace) -> list[str]:
    """What is wrong with the limits and ``--jobs`` given on the command line (``[]`` if nothing)."""
    limits = {"--timeout": args.timeout, "--cell-timeout": args.cell_timeout, "--check-timeout": args.check_timeout}
    errors = [f"{flag} must be a positive number of seconds, got {value:g}"
              for flag, value in limits.items() if not value > 0]
    if args.jobs < 1:
        errors.append(f"--jobs must be at least 1, got {args.jobs}")
    return errors


def missing_platform_pieces() -> list[str]:
    """What this platform lacks of what the grader's answer process needs (``[]`` on Linux and macOS)."""
    if hasattr(os, "fork"):
        return []
    return ["os.fork: processes here do not fork, so subprocess's pass_fds cannot hand the answer process its "
            "pipe, and select cannot wait on that pipe"]


def platform_problem() -> str | None:
    """Why grading cannot run on this platform, as a message for the learner; ``None`` when it can."""
    missing = missing_platform_pieces()
    if not missing:
        return None
    return (f"grading cannot run on this platform ({sys.platform}): it lacks {'; '.join(missing)}. The grader "
            "needs a POSIX system: grade on Linux or macOS, or on Windows in WSL (the Windows Subsystem for "
            "Linux). The checks themselves, check(\"1.1\", answer) in a notebook, work everywhere.")


class GradingUnavailableError(RuntimeError):
    """Grading was asked for where it cannot run: a platform that lacks what it needs (see
    :func:`platform_problem`), or a package whose compiled files are not its source."""


def require_grading_platform() -> None:
    """Raise :class:`GradingUnavailableError`, with the reason, where grading cannot run."""
    problem = platform_problem()
    if problem:
        raise GradingUnavailableError(problem)


__all__ = ["NOTEBOOK_TIMEOUT", "CELL_TIMEOUT", "CHECK_TIMEOUT", "ONE_THREAD", "raise_it", "limit_errors",
           "missing_platform_pieces",
           "platform_problem", "GradingUnavailableError", "require_grading_platform"]
