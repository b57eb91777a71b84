"""Timing a call the reliable way, with ``torch.utils.benchmark``.

``torch.utils.benchmark`` warms up, synchronises CUDA, runs the call in blocks until enough time
has passed, and reports the median and spread, which is what the book quotes. Wall-clock numbers
differ between machines; the book therefore reports ratios measured in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils import benchmark


@dataclass(frozen=True)
class Timing:
    """The result of :func:`measure`: seconds per call."""

    median: float  # seconds
    iqr: float  # interquartile range, seconds: the spread between runs
    runs: int  # how many timed blocks the median is over

    @property
    def median_ms(self) -> float:
        return self.median * 1e3


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
    timer = benchmark.Timer(
        stmt="fn(*args)",
        globals={"fn": fn, "args": args},
        num_threads=num_threads or torch.get_num_threads(),
    )
    with torch.inference_mode(False):
        result = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(median=result.median, iqr=result.iqr, runs=len(result.times))
