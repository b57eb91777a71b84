"""A progress line for the course's long-running commands: bench, grade, specialise.

One line on standard error, ``bench  12/40 [######..............]  30%  0:41, ~1:35 left  small-4 forward``:
redrawn in place on a terminal; in a log (not a terminal) printed as a new line only every tenth of
the work, so CI logs stay short. It has the few methods the commands need, and no dependency.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> with ProgressBar(4, "demo", file=out) as bar:
    ...     for _ in range(4):
    ...         bar.update()
    >>> "demo  4/4" in out.getvalue()
    True
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Iterable, Iterator, TextIO, TypeVar

T = TypeVar("T")

BAR_WIDTH = 20  # characters of the bar itself


def _clock(seconds: float) -> str:
    """``75.2`` -> ``"1:15"``; hours when needed: ``"1:02:03"``."""
    seconds = int(round(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBar:
    """Counts steps of known total and shows how far along the work is, and how long is left.

    Args:
        total: how many steps the work has (``update`` adds to the count).
        desc: a few words naming the work, shown first.
        file: where to write (default: standard error, so standard output stays clean).
        enabled: ``False`` writes nothing, for ``--no-progress`` and for notebooks.

    Raises:
        ValueError: if ``total`` is negative.
    """

    def __init__(self, total: int, desc: str, *, file: TextIO | None = None, enabled: bool = True):
        if total < 0:
            raise ValueError(f"total must be the number of steps (0 or more), got {total}.")
        self.total, self.desc, self.enabled = total, desc, enabled
        self.file = file if file is not None else sys.stderr
        self.done = 0
        self.note = ""
        self._started = time.monotonic()
        self._live = bool(getattr(self.file, "isatty", lambda: False)())
        self._last_tenth = -1
        self._width = 0
        self._lock = threading.Lock()  # the grader counts notebooks from several threads
        self._draw()

    def update(self, steps: int = 1) -> None:
        """Count ``steps`` more steps as done."""
        with self._lock:
            self.done = min(self.total, self.done + steps)
            self._draw()

    def set_note(self, text: str) -> None:
        """Say what is being done now (shown after the times, on a terminal)."""
        with self._lock:  # the grader's worker threads set notes while others count steps
            self.note = text
            if self._live:
                self._draw()

    def close(self) -> None:
        """End the line (on a terminal) after the last step."""
        with self._lock:
            if self.enabled and self._live:
                self.file.write("\n")
                self.file.flush()
            self.enabled = False

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def line(self) -> str:
        """The progress line as it is now."""
        fraction = self.done / self.total if self.total else 1.0
        filled = int(round(fraction * BAR_WIDTH))
        elapsed = time.monotonic() - self._started
        times = _clock(elapsed)
        if 0 < self.done < self.total:
            times += f", ~{_clock(elapsed / self.done * (self.total - self.done))} left"
        count = f"{self.done:>{len(str(self.total))}}/{self.total}"
        text = f"{self.desc}  {count} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction:4.0%}  {times}"
        return f"{text}  {self.note}" if self.note else text

    def _draw(self) -> None:
        if not self.enabled:
            return
        if self._live:
            text = self.line()
            self.file.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            tenth = int(10 * self.done / self.total) if self.total else 10
            if tenth == self._last_tenth:
                return
            self._last_tenth = tenth
            self.file.write(self.line() + "\n")
        self.file.flush()


def progress(items: Iterable[T], desc: str, *, total: int | None = None, enabled: bool = True,
             file: TextIO | None = None) -> Iterator[T]:
    """Yield ``items`` one by one under a :class:`ProgressBar` line.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> list(progress(range(3), "count", file=out))
        [0, 1, 2]
        >>> out.getvalue().splitlines()[-1].startswith("count  3/3")
        True
    """
    items = list(items) if total is None else items
    bar = ProgressBar(len(items) if total is None else total, desc, file=file, enabled=enabled)
    try:
        for item in items:
            yield item
            bar.update()
    finally:
        bar.close()
