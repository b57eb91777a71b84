"""Figures of which token sees which: the causal visibility table and attention maps (chapters 1, 2, 5).

Rows are the tokens doing the looking (queries), columns the tokens looked at (keys), as in the
chapters' printed tables. Labels use the book's notation: ``T`` tokens, ``h`` heads.
"""

from __future__ import annotations

import math
import textwrap
from typing import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap

from ..attention._validation import validate_positive_int
from ..attention.masking import visibility
from .style import COLUMN_WIDTH, HEAD_PALETTE, NEUTRAL, SMALLEST_PT, house_style

#: The share of the column a figure of one square panel takes: the book shows figures at least
#: 60 % of the column wide, so that none looks like a thumbnail.
_SINGLE_PANEL = 0.72


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    if labels is None:
        return [str(i + 1) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries but there are {n} tokens; pass one label per token.")
    return list(labels)


def _square_axes(ax, n: int, labels: list[str], xlabel: str, ylabel: str) -> None:
    ax.set_xticks(range(n), labels, rotation=45 if max(map(len, labels)) > 2 else 0)
    ax.set_yticks(range(n), labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _cell_points(ax, n: int) -> float:
    """The side of one cell of an ``n x n`` heat map on ``ax``, in points, as laid out now."""
    box = ax.get_window_extent()
    return min(box.width, box.height) / n * 72 / ax.figure.dpi


def _number_size(ax, n: int, texts: list[str], largest: float = 10.0) -> float | None:
    """The largest font size (pt) at which every text fits in a cell with a margin, or ``None``.

    Never below :data:`~mha_course.plots.style.SMALLEST_PT`: a number that small would not be read.
    """
    cell = _cell_points(ax, n)
    longest = max(map(len, texts))
    size = largest
    while size >= SMALLEST_PT:
        # a digit of DejaVu Sans is about 0.64 em wide; keep a margin of half an em around the text
        if longest * 0.64 * size + 0.5 * size <= cell and 1.4 * size <= cell:
            return size
        size -= 0.5
    return None


#: Visibility colours: forbidden (pale grey) and allowed (the house blue). They differ in lightness
#: by about 50 L* units for every colour vision, so the table reads in greyscale too, and every cell
#: also carries its mark.
_VISIBILITY_COLOURS = ListedColormap(["#f0f0f0", HEAD_PALETTE[0]], name="visibility")


@house_style()
def plot_visibility(num_tokens: int = 3, labels: Sequence[str] | None = None, ax=None):
    """Draw the causal visibility table: ✓ where the query token may use the key token, ✗ where not.

    Rows are the tokens doing the looking (queries), columns the tokens looked at (keys); the marks
    mean the same as in the chapters' printed tables: ✓ allowed (on the shaded cells), ✗ forbidden
    (on the pale ones).

    Example:
        >>> fig = plot_visibility(3)
        >>> "".join(t.get_text() for t in fig.axes[0].texts)
        '✓✗✗✓✓✗✓✓✓'
    """
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    labels = _labels(labels, num_tokens)
    if ax is None:
        _, ax = plt.subplots(figsize=(_SINGLE_PANEL * COLUMN_WIDTH, _SINGLE_PANEL * COLUMN_WIDTH))
    table = visibility(num_tokens)
    ax.imshow(table.float().numpy(), cmap=_VISIBILITY_COLOURS, vmin=0, vmax=1)
    _square_axes(ax, num_tokens, labels, "key token (may be used)", "query token (using)")
    edges = [k - 0.5 for k in range(num_tokens + 1)]  # white lines between the cells, so they can be counted
    ax.set_xticks(edges, minor=True)
    ax.set_yticks(edges, minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.set_title("Causal visibility")
    ax.figure.tight_layout()
    size = _number_size(ax, num_tokens, ["✓"], largest=20) or SMALLEST_PT
    for i in range(num_tokens):
        for j in range(num_tokens):
            ax.text(j, i, "✓" if table[i, j] else "✗", ha="center", va="center",
                    color="white" if table[i, j] else NEUTRAL, fontsize=size)
    return ax.figure


@house_style()
def plot_attention(weights: torch.Tensor, labels: Sequence[str] | None = None,
                   titles: Sequence[str] | None = None, fmt: str = ".2f", cmap: str = "Blues"):
    """Heat maps of attention weights, one panel per head, at most two panels per row.

    Each cell holds its weight as a number when the number fits the cell at a readable size (7 pt
    or more, with the figure at most the book's column wide); otherwise the panels get a colour bar
    instead. A weight above the diagonal that is exactly 0, the causal mask's, is left empty: no
    number, a white cell. The default colour map, ``Blues``, runs from white (a weight of 0, such as
    every masked entry) to dark blue (1) with steadily falling lightness, so it reads the same in
    greyscale and to colour-blind readers. A title too long for its panel is wrapped onto two lines.

    Args:
        weights: ``(T, T)`` for one head, or ``(h, T, T)`` for several (one batch row;
            index the batch first, e.g. ``module.attention_weights(x)[0]``).
        labels: one label per token (default ``1 .. T``).
        titles: one title per head (default ``Head 1 .. Head h``).
        fmt: the format of the numbers in the cells; ``None`` draws no numbers, only the colours and
            a colour bar (for a figure beside a table that already gives the numbers).
        cmap: a matplotlib colour map.

    Example:
        >>> fig = plot_attention(torch.softmax(torch.rand(3, 4, 4), dim=-1))
        >>> len(fig.axes), [ax.get_title() for ax in fig.axes]
        (3, ['Head 1', 'Head 2', 'Head 3'])
    """
    weights = torch.as_tensor(weights).detach().float().cpu()
    if weights.dim() == 2:
        weights = weights.unsqueeze(0)
    if weights.dim() != 3 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            f"weights must have shape (T, T) or (num_heads, T, T), got {tuple(weights.shape)}. "
            "For a batch, pick one row first: weights[0]."
        )
    num_heads, n, _ = weights.shape
    labels = _labels(labels, n)
    titles = list(titles) if titles is not None else [f"Head {h + 1}" for h in range(num_heads)]
    if len(titles) != num_heads:
        raise ValueError(f"titles has {len(titles)} entries but there are {num_heads} heads.")
    columns = min(num_heads, 2)
    rows = math.ceil(num_heads / columns)
    side = COLUMN_WIDTH * (_SINGLE_PANEL if columns == 1 else 1 / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(side * columns, side * rows), squeeze=False)
    for ax in axes.flat[num_heads:]:
        fig.delaxes(ax)  # an odd number of heads leaves the last cell of the grid empty
    panels = list(axes.flat[:num_heads])
    # about 0.55 em per character: wrap a title that would run past its panel into the next one
    title_chars = int(side * 72 / (0.55 * plt.rcParams["axes.titlesize"]))
    image = None
    for number, (ax, head_weights, title) in enumerate(zip(panels, weights, titles)):
        image = ax.imshow(head_weights.numpy(), cmap=cmap, vmin=0.0, vmax=1.0)
        # the rows' name once, at the left of each row of panels: beside a second panel it would run
        # into the first panel's last column when the tokens are words
        ylabel = "query token (attending)" if number % columns == 0 else ""
        _square_axes(ax, n, labels, "key token (attended to)", ylabel)
        ax.set_title(textwrap.fill(title, title_chars))
    fig.tight_layout()
    texts = [format(float(v), fmt) for v in weights.flatten()] if fmt is not None else []
    size = _number_size(panels[0], n, texts) if fmt is not None else None
    if size is None:  # numbers would be unreadable: show the scale instead
        fig.colorbar(image, ax=panels, shrink=0.8, label="attention weight")
        return fig
    for ax, head_weights in zip(panels, weights):
        for i in range(n):
            for j in range(n):
                value = float(head_weights[i, j])
                if j > i and value == 0.0:
                    continue  # the causal mask's: left empty
                colour = "white" if value > 0.5 else "black"
                ax.text(j, i, format(value, fmt), ha="center", va="center", color=colour, fontsize=size)
    return fig
