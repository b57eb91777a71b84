"""Timing calls the course's one way: interleaved rounds, the median over rounds, the spread.

:func:`measure` times one call with ``torch.utils.benchmark``, which warms up, synchronises CUDA
and runs the call in blocks until enough time has passed. :func:`time_interleaved` is the policy
that every comparison in the package uses (chapters 2 and 3's tables and sweeps, and the
benchmark command of chapter 4):

* **Interleaved, rotated rounds.** The calls take turns, a little each round, and each round
  starts one call later than the last. On a shared machine the speed drifts as other work comes
  and goes; taking turns lets every call see the same drift, and rotating the order keeps any
  call from always running first (on a cold cache) or last.
* **The median over rounds.** Each round gives one median time per call; the reported time is
  the median of those, and the spread is their interquartile range. A burst of outside load can
  slow one round down but moves the median of several rounds little, and the spread says how
  much the machine moved. (The fastest round, the other common choice, hides that drift and is
  biased low by a lucky round; the median is what ``torch.utils.benchmark`` reports within a
  round too.)
* **Slow calls** (one call at least :data:`SLOW_CALL_S`) are timed once per round, in at most
  :data:`SLOW_ROUNDS` rounds, so that a large size finishes in minutes.

Wall-clock numbers differ between machines; the book therefore reports ratios measured in the
same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .attention._validation import validate_positive_int

#: A call at least this slow (seconds) is timed once per round instead of in blocks.
SLOW_CALL_S = 1.0

#: How many rounds time a slow call.
SLOW_ROUNDS = 2


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median, its spread, and how many measurements they are over."""

    median: float  # seconds
    iqr: float  # interquartile range, seconds: the spread between measurements
    runs: int  # how many measurements (timed blocks, or rounds) the median is over


def measure(fn: Callable, *args, min_run_time: float = 0.2, num_threads: int | None = None) -> Timing:
    """Time ``fn(*args)`` and return its median seconds per call, with the spread.

    Args:
        fn: the callable to time, e.g. a module or ``lambda: module(x).sum().backward()``.
        *args: arguments passed to ``fn`` on every call.
        min_run_time: seconds to keep measuring for; more gives steadier medians.
        num_threads: torch threads for the measurement (default: torch's current setting).

    Example:
        >>> t = measure(torch.mm, torch.ones(8, 8), torch.ones(8, 8), min_run_time=0.01)
        >>> t.median > 0
        True
    """
    if min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive seconds, got {min_run_time}. Try 0.2.")
    # Imported here, not with the module: torch.utils.benchmark loads torch's C++ extension builder, which
    # warns on stderr where a CUDA build of torch finds a CUDA toolkit but no GPU; a chapter that only
    # reads stored timings should print nothing of that.
    from torch.utils import benchmark

    timer = benchmark.Timer(
        stmt="fn(*args)",
        globals={"fn": fn, "args": args},
        num_threads=num_threads or torch.get_num_threads(),
    )
    with torch.inference_mode(False):
        result = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(median=result.median, iqr=result.iqr, runs=len(result.times))


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_once(fn: Callable[[], object]) -> tuple[float, object]:
    """Run ``fn()`` once; return ``(seconds, its result)``, waiting for CUDA work around it."""
    _synchronize()
    start = time.perf_counter()
    result = fn()
    _synchronize()
    return time.perf_counter() - start, result


def _time_once_on_threads(fn: Callable[[], object], num_threads: int | None) -> float:
    """Seconds of one ``fn()`` with ``num_threads`` torch threads, as :func:`measure` times the others."""
    if num_threads is None:
        return time_once(fn)[0]
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        return time_once(fn)[0]
    finally:
        torch.set_num_threads(previous)


def summarise_samples(samples: list[float]) -> Timing:
    """The median and interquartile range of per-round times.

    Example:
        >>> summarise_samples([3.0, 1.0, 2.0, 10.0])
        Timing(median=2.5, iqr=3.0, runs=4)
    """
    if not samples:
        raise ValueError("samples is empty: time at least one round.")
    if len(samples) == 1:
        return Timing(median=samples[0], iqr=0.0, runs=1)
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return Timing(median=median, iqr=q3 - q1, runs=len(samples))


def time_interleaved(calls: Mapping[str, Callable[[], object]], *, rounds: int = 3, min_run_time: float = 0.2,
                     num_threads: int | None = None, call_seconds: Mapping[str, float] | None = None,
                     on_call: Callable[[int, str], None] | None = None) -> dict[str, Timing]:
    """Time every call in interleaved, rotated rounds; return name -> median over the rounds.

    Args:
        calls: name -> a callable with no arguments.
        rounds: how many times every call is timed, in turns.
        min_run_time: seconds spent timing each call, shared among the rounds.
        num_threads: torch threads while timing, slow calls included (default: torch's current
            setting).
        call_seconds: name -> an estimate of one call's seconds (e.g. from a warm-up call); a call
            of at least :data:`SLOW_CALL_S` is timed once in each of the first
            :data:`SLOW_ROUNDS` rounds only.
        on_call: called as ``on_call(round_index, name)`` before each measurement (progress).

    Returns:
        name -> :class:`Timing` over the rounds (``runs`` is the number of rounds the call was timed
        in: ``rounds``, or at most :data:`SLOW_ROUNDS` for a slow call).

    Example:
        >>> timings = time_interleaved({"a": lambda: sum(range(10)), "b": lambda: sum(range(100))},
        ...                            rounds=2, min_run_time=0.02)
        >>> sorted(timings), timings["a"].runs
        (['a', 'b'], 2)
    """
    rounds = validate_positive_int("rounds", rounds)
    if not calls:
        raise ValueError("calls is empty; pass name -> callable, e.g. {'batched': lambda: module(x)}.")
    names = list(calls)
    estimates = call_seconds or {}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            slow = estimates.get(name, 0.0) >= SLOW_CALL_S
            if slow and round_index >= SLOW_ROUNDS:
                continue
            if on_call is not None:
                on_call(round_index, name)
            if slow:
                samples[name].append(_time_once_on_threads(calls[name], num_threads))
            else:
                samples[name].append(measure(calls[name], min_run_time=min_run_time / rounds,
                                             num_threads=num_threads).median)
    return {name: summarise_samples(samples[name]) for name in names}
