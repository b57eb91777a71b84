"""Reading a library's own code on the page: an excerpt of a function's source, and the operators a call runs.

Chapter 8 reads transformers' attention layers beside the course's. Printing their source with
:mod:`inspect` keeps the page true to the installed (pinned) version; :func:`source_excerpt` cuts
the part a chapter reads and fits it to the book's code column. Which of PyTorch's kernels a call
ends up in is not in any source a page can print: :func:`operators_run` asks PyTorch's profiler.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import sys
import textwrap
import tokenize
from collections.abc import Callable, Iterator


def source_excerpt(obj, start_at: str | None = None, end_at: str | None = None, width: int = 80) -> str:
    """The source of ``obj`` from the first line holding ``start_at`` to the next holding ``end_at``.

    The excerpt is dedented, and every line of it fits ``width`` as valid Python: a long comment
    goes on over more comment lines, each starting with ``#``; a long line's trailing comment moves,
    so wrapped, to just above its code; and long code is broken at a space and continued on the next
    line, indented four more and marked with ``\\`` at the break (Python's line continuation, which
    inside a comment would be just a character).

    Raises:
        ValueError: if ``start_at`` or ``end_at`` is not in the source (the library changed: read the
            source again and pick lines that are there).

    Example:
        >>> def f(x):
        ...     y = x + 1
        ...     return y * 2
        >>> print(source_excerpt(f, start_at="y =", end_at="return"))
        y = x + 1
        return y * 2
    """
    lines = inspect.getsource(obj).splitlines()
    name = getattr(obj, "__qualname__", repr(obj))
    first, last = 0, len(lines) - 1
    if start_at is not None:
        first = next((i for i, line in enumerate(lines) if start_at in line), None)
        if first is None:
            raise ValueError(f"start_at={start_at!r} is not in the source of {name}: pick a line that is.")
    if end_at is not None:
        last = next((i for i in range(first, len(lines)) if end_at in lines[i]), None)
        if last is None:
            raise ValueError(f"end_at={end_at!r} is not in the source of {name} after start_at: pick a line "
                             "that is.")
    shown = []
    for line in textwrap.dedent("\n".join(lines[first:last + 1])).splitlines():
        shown += _fit(line, width)
    return "\n".join(shown)


def _tokens(line: str) -> list[tokenize.TokenInfo]:
    """The tokens of one source line, as far as they can be read alone (a bracket left open is fine)."""
    read = []
    try:
        read.extend(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    except (tokenize.TokenError, SyntaxError):  # a bracket or string left open: the tokens so far
        pass
    return read


def _fit(line: str, width: int) -> list[str]:
    """One source line as lines of at most ``width`` characters (but for a single word that is longer)."""
    if len(line) <= width:
        return [line]
    margin = line[:len(line) - len(line.lstrip())]
    tokens = _tokens(line)
    at = next((t.start[1] for t in tokens if t.type == tokenize.COMMENT), None)  # a "#" in a string is not
    if at is not None:  # the comment's words go on comment lines, at the code's margin
        words = line[at:].lstrip("#").strip()
        comment = textwrap.wrap(words, width=width, initial_indent=margin + "# ",
                                subsequent_indent=margin + "# ", break_long_words=False)
        code = line[:at].rstrip()
        return comment + (_fit(code, width) if code.strip() else [])
    # Code: broken at a space outside any string, so that the pieces join into the same statement.
    strings = [(t.start[1], t.end[1]) for t in tokens if t.type == tokenize.STRING]
    spaces = [i for i, c in enumerate(line) if c == " " and i > len(margin)
              and not any(a <= i < b for a, b in strings)]
    pieces, begin, prefix = [], 0, ""
    while len(prefix) + len(line) - begin > width:
        room = width - 2 - len(prefix)  # what fits before the " \\"
        fitting = [i for i in spaces if begin < i <= begin + room]
        later = [i for i in spaces if i > begin]
        if not fitting and not later:
            break
        cut = fitting[-1] if fitting else later[0]
        pieces.append(prefix + line[begin:cut].rstrip() + " \\")
        begin = len(line) - len(line[cut:].lstrip(" "))
        prefix = margin + "    "
    return pieces + [prefix + line[begin:]]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send what C code writes to file descriptor 2 to the null device, and restore it after."""
    sys.stderr.flush()
    saved, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)


def operators_run(call: Callable, backward: bool = False) -> set[str]:
    """The names of the ATen operators that ``call()`` runs, read by ``torch.profiler``.

    With ``backward=True`` the call runs with gradients on and ``call().sum().backward()`` follows,
    so the operators of the backward pass are in the set too; otherwise it runs under
    ``torch.no_grad()``, as in inference. The profiler's own start and stop lines, which PyTorch
    writes to the process's standard error from C++, are dropped.

    Example:
        >>> import torch
        >>> x = torch.ones(2, 2)
        >>> "aten::mm" in operators_run(lambda: x @ x)
        True
    """
    import torch
    from torch.profiler import profile

    with _quiet_stderr(), torch.set_grad_enabled(backward), profile() as profiler:
        out = call()
        if backward:
            out.sum().backward()
    return {event.name for event in profiler.events()}
