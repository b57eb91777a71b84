"""The course's one table: plain text for terminals and nbval, HTML for the book.

Every table the package prints or shows is a :class:`Table`: the matrices of chapter 1, the
module comparisons and head-count sweeps, the benchmark's timings, the experiment's accuracies.
A table keeps its raw values (``table.column("parameters")`` gives numbers back, so a hidden
cell can assert on them) and formats them only when shown:

* key columns first (the caller's order), the first ``key_columns`` of them row headings;
* numbers right-aligned, text left-aligned;
* human units: times as µs, ms or s and sizes as B, KiB, MiB or GiB, three significant digits,
  never ``2.92e+03 ms``;
* ``None`` as ``-``.

``str(table)`` is aligned plain text, which is what nbval compares and what a terminal shows. In a
notebook the table renders as HTML (``_repr_html_``): its title and notes wrap at the page's width,
and the table itself sits in a box that scrolls sideways by itself when the table is wider than
the page (the ``mha-table`` classes of ``book/_static/book.css``); the box can take keyboard focus
and is labelled, so that it can be scrolled without a mouse.
"""

from __future__ import annotations

import html
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

#: A column's format: a format spec such as ``".2f"``, a name from :data:`FORMATS`, or a callable.
Format = str | Callable[[Any], str]


def _significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits in plain decimal notation (no exponent)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(digits - 1 - math.floor(math.log10(abs(value))), 0)
    text = f"{value:.{decimals}f}"
    if decimals and len(text.lstrip("-").replace(".", "").lstrip("0")) > digits:
        text = f"{value:.{decimals - 1}f}"  # rounding carried into a new digit: 9.996 -> 10.0
    return text


def _scaled(value: float, units: Sequence[tuple[float, str]], digits: int = 3) -> str:
    """``value`` in the largest unit it reaches (after rounding to ``digits`` significant digits)."""
    for scale, unit in reversed(units):
        if abs(value) >= scale * (1 - 0.5 * 10**-digits) or scale == units[0][0]:
            return f"{_significant(value / scale, digits)} {unit}"
    raise AssertionError("unreachable")


def format_time(seconds: float | None, digits: int = 3) -> str:
    """Seconds as µs, ms or s with ``digits`` significant digits (``-`` for ``None``).

    Example:
        >>> format_time(0.0000123), format_time(0.25), format_time(2.9204), format_time(None)
        ('12.3 µs', '250 ms', '2.92 s', '-')
        >>> format_time(0.0015346, digits=4), format_time(0.99996, digits=4)
        ('1.535 ms', '1.000 s')
    """
    if seconds is None:
        return "-"
    if seconds == 0:
        return "0 s"
    return _scaled(seconds, ((1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s")), digits)


def format_bytes(n: float | None) -> str:
    """Bytes as B, KiB, MiB or GiB with three significant digits (``-`` for ``None``).

    Example:
        >>> format_bytes(512), format_bytes(3 * 2**20), format_bytes(1.5 * 2**30), format_bytes(None)
        ('512 B', '3.00 MiB', '1.50 GiB', '-')
    """
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n:.0f} B"
    return _scaled(n, ((2**10, "KiB"), (2**20, "MiB"), (2**30, "GiB")))


def format_count(n: float | None) -> str:
    """A whole number with thousands separators (``-`` for ``None``): ``2,360,064``."""
    return "-" if n is None else f"{n:,.0f}"


def format_number(value: Any) -> str:
    """How a cell prints without a column format: integers with separators, floats to 3 digits."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "nan"
    return f"{value:,.0f}" if abs(value) >= 1e4 else _significant(value)


#: The named column formats.
FORMATS: dict[str, Callable[[Any], str]] = {
    "time": format_time,
    "bytes": format_bytes,
    "count": format_count,
    "number": format_number,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Table:
    """A table of raw values that prints as aligned text and renders as HTML in a notebook.

    Args:
        columns: the column headings, key columns first.
        rows: one sequence of cells per row, in column order (numbers, strings or ``None``).
        title: an optional caption, shown above the table.
        formats: how to show some columns, by heading: a format spec (``".2f"``), a name from
            :data:`FORMATS` (``"time"`` for seconds, ``"bytes"``, ``"count"``), or a callable;
            a spec or a name formats the column's numbers and leaves its strings as they are.
            Other numbers print with thousands separators (integers) or three significant
            digits (floats); strings print as they are.
        align: ``"left"`` or ``"right"`` for some columns, by heading. By default a column whose
            cells are numbers, or that has a format, is right-aligned; any other is left-aligned.
        key_columns: how many leading columns name the row (row headings in HTML).
        notes: lines printed under the table (in HTML, paragraphs under it).
        rule: draw a line of dashes under the headings in the text form.

    Example:
        >>> table = Table(["heads", "parameters", "time"], [[1, 18, 0.0012], [2, 36, 0.0031]],
        ...               formats={"time": "time"})
        >>> print(table)
        heads  parameters     time
        -----  ----------  -------
            1          18  1.20 ms
            2          36  3.10 ms
        >>> table.column("parameters")
        [18, 36]
    """

    def __init__(self, columns: Sequence[str], rows: Iterable[Sequence], *, title: str | None = None,
                 formats: Mapping[str, Format] | None = None, align: Mapping[str, str] | None = None,
                 key_columns: int = 1, notes: Sequence[str] = (), rule: bool = True):
        self.columns = [str(c) for c in columns]
        self.rows = [list(row) for row in rows]
        self.title = title
        self.notes = list(notes)
        self.rule = rule
        self.key_columns = key_columns
        for number, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"row {number} has {len(row)} cells but the table has {len(self.columns)} columns "
                    f"({', '.join(self.columns)}); give one cell per column."
                )
        for what, mapping in (("formats", formats), ("align", align)):
            unknown = [name for name in (mapping or {}) if name not in self.columns]
            if unknown:
                raise KeyError(f"{what} names {unknown}, which are not columns; the columns are "
                               f"{', '.join(map(repr, self.columns))}.")
        self._formatters = [self._formatter((formats or {}).get(name)) for name in self.columns]
        self._right = []
        for index, name in enumerate(self.columns):
            side = (align or {}).get(name)
            if side not in (None, "left", "right"):
                raise ValueError(f"align[{name!r}] must be 'left' or 'right', got {side!r}.")
            if side is None:
                cells = [row[index] for row in self.rows if row[index] is not None]
                numeric = all(_is_number(c) for c in cells) and bool(cells)
                formatted = name in (formats or {})  # formats are for numbers
                side = "right" if numeric or formatted else "left"
            self._right.append(side == "right")

    @staticmethod
    def _formatter(spec: Format | None) -> Callable[[Any], str]:
        if spec is None:
            return format_number
        if callable(spec):
            return spec
        if spec in FORMATS:
            named = FORMATS[spec]
            return lambda value: named(value) if _is_number(value) else format_number(value)
        format(1.0, spec)  # an invalid spec fails here, when the table is made, not when it is shown
        return lambda value: format(value, spec) if _is_number(value) else format_number(value)

    def column(self, name: str) -> list:
        """The raw cells of the column headed ``name``, top to bottom."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r}; the columns are {', '.join(map(repr, self.columns))}.")
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def cells(self) -> list[list[str]]:
        """Every cell as the text it shows, row by row."""
        return [[fmt(value) if value is not None else "-" for value, fmt in zip(row, self._formatters)]
                for row in self.rows]

    def __str__(self) -> str:
        cells = self.cells()
        widths = [max([len(heading)] + [len(row[i]) for row in cells]) for i, heading in enumerate(self.columns)]

        def line(values):
            return "  ".join(v.rjust(w) if right else v.ljust(w)
                             for v, w, right in zip(values, widths, self._right)).rstrip()

        out = [self.title] if self.title else []
        out.append(line(self.columns))
        if self.rule:
            out.append(line(["-" * w for w in widths]))
        out += [line(row) for row in cells]
        return "\n".join(out + self.notes)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        def heading(text: str, attributes: str) -> str:
            # An empty heading cell (a matrix's corner) is a plain cell: screen readers skip it.
            return f"<th {attributes}>{html.escape(text)}</th>" if text else "<td></td>"

        def number_class(index: int) -> str:
            return ' class="num"' if self._right[index] else ""

        head = "".join(heading(name, f'scope="col"{number_class(i)}') for i, name in enumerate(self.columns))
        body = []
        for row in self.cells():
            cells = [heading(text, f'scope="row"{number_class(i)}') if i < self.key_columns
                     else f"<td{number_class(i)}>{html.escape(text)}</td>" for i, text in enumerate(row)]
            body.append("<tr>" + "".join(cells) + "</tr>")
        title = f'<p class="mha-table-title">{html.escape(self.title)}</p>' if self.title else ""
        notes = "".join(f'<p class="mha-table-note">{html.escape(note)}</p>' for note in self.notes)
        label = html.escape(self.title or "table: " + ", ".join(self.columns), quote=True)
        # The title and notes wrap at the page's width; the table alone scrolls sideways, in a box of
        # its own that the keyboard can reach (tabindex) and a screen reader can name (role, label).
        return (f'<div class="mha-table-block">{title}'
                f'<div class="mha-table" role="region" aria-label="{label}" tabindex="0" style="overflow-x:auto">'
                f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
                f"{notes}</div>")
