"""Matrices as tables for notebooks: rounded numbers with row and column labels.

Printing a raw tensor shows eight digits and a ``tensor(...)`` wrapper; a labelled table of rounded
numbers reads better and stays identical across machines and thread counts. The table is a
:class:`mha_course.tables.Table`: ``print`` shows it as aligned text (a terminal), and in a notebook
it renders as an HTML table when it is the cell's last expression or is passed to ``display``, its
plain text being what nbval compares. The book shows every matrix that way, never printed.
"""

from __future__ import annotations

import re
from typing import Sequence

import torch

from .tables import Table

_NUMBER = re.compile(r"^[-+]?(\d[\d,]*(\.\d*)?|\.\d+)$")


def matrix_table(values, row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
                 decimals: int = 3, corner: str = "", marks: tuple[str, str] = ("✓", "·"),
                 title: str | None = None) -> Table:
    """Show a 2-D tensor (or nested list) as a table of rounded numbers with labelled rows.

    ``-inf`` prints as ``-inf``; booleans print as ``marks[0]`` for ``True`` and ``marks[1]`` for
    ``False``. Each column is as wide as its widest entry. ``corner`` heads the column of row
    labels (``"query \\ key"``); ``title``, when given, names the table above it (and, in HTML,
    to a screen reader).

    Example:
        >>> print(matrix_table(torch.tensor([[1.0, 0.0], [0.25, 0.75]]), ["a", "b"], ["a", "b"], decimals=2))
              a     b
        a  1.00  0.00
        b  0.25  0.75
        >>> print(matrix_table(torch.eye(2, dtype=torch.bool), ["a", "b"], ["a", "b"], title="seen"))
        seen
           a  b
        a  ✓  ·
        b  ·  ✓
    """
    values = torch.as_tensor(values).detach().cpu()
    if values.dim() != 2:
        raise ValueError(f"values must be 2-D (rows, columns), got shape {tuple(values.shape)}. "
                         "For a batch, pick one row first: values[0].")
    rows, cols = values.shape
    row_labels = [str(i) for i in range(rows)] if row_labels is None else [str(r) for r in row_labels]
    col_labels = [str(j) for j in range(cols)] if col_labels is None else [str(c) for c in col_labels]
    if len(row_labels) != rows or len(col_labels) != cols:
        raise ValueError(f"got {len(row_labels)} row labels and {len(col_labels)} column labels for a "
                         f"{rows} x {cols} table; pass one label per row and per column.")

    def cell(v) -> str:
        if values.dtype == torch.bool:
            return marks[0] if v else marks[1]
        v = float(v)
        if v == float("-inf"):
            return "-inf"
        text = f"{v:.{decimals}f}"
        return "0." + "0" * decimals if text == "-0." + "0" * decimals else text  # no "-0.000"

    cells = [[label] + [cell(v) for v in row] for label, row in zip(row_labels, values.tolist())]
    align = {c: "right" for c in col_labels}
    # Row labels that are numbers (token positions, head widths) line up on the right, like numbers.
    align[corner] = "right" if all(_NUMBER.match(label) for label in row_labels) else "left"
    return Table([corner] + col_labels, cells, align=align, rule=False, title=title)
