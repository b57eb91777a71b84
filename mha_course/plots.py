"""Figures of the course: visibility tables, attention maps, the flow of heads, cost regimes.

Every function draws on a matplotlib ``Axes`` (a new figure when none is given) and returns the
figure, so a notebook cell can end with ``plt.show()``.

The book's text column is about :data:`COLUMN_WIDTH` inches wide at 100 dpi (730 px in a 1280 px
window): the figures of chapters 1 and 2 are made no wider than that, so they are shown at their own
size and their text, at 7 pt or more, is at least 9 px on the page. The symbols in their labels are
the book's notation: ``T`` tokens, ``d_in`` input width, ``h`` heads of width ``d_h``.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.patches import FancyBboxPatch
from matplotlib.ticker import FuncFormatter

from ._validation import check_positive_int
from .cost import REGIME_LABELS, REGIMES
from .masking import visibility

#: Width in inches of the book's text column at 100 dpi (about 730 px at a 1280 px window).
COLUMN_WIDTH = 7.3


# --- The house style of the book's figures ------------------------------------------------------
#
# One style for every figure of the book: its size from the book's column, text that stays
# readable at the size the book shows it, colours that survive colour blindness and greyscale.
# A figure function draws inside ``with house_style():`` and sizes its figure with
# ``book_figsize``; ``figure_text_sizes`` measures a figure as the book shows it.

#: The width of the book's text column on a desktop (a 1280 px window) in CSS pixels: the widest a
#: figure is shown. The browser tests measure the column and check this number.
BOOK_COLUMN_PX = 688
#: Pixels per inch of the figures as a notebook saves them (matplotlib's inline backend).
FIGURE_DPI = 100
#: The smallest text a reader should meet in a figure, in CSS pixels as shown.
MIN_TEXT_PX = 9
#: Colours for lines and categories that any colour vision tells apart (Okabe and Ito's palette).
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
#: Colour maps for values, by use. Their lightness rises steadily from one end to the other, so
#: they read the same in greyscale and with any colour vision.
SEQUENTIAL_CMAP = "viridis"
GREY_CMAP = "Greys"

#: The matplotlib settings of the house style (what :func:`house_style` applies). Text sizes are
#: in points: 9.5 pt is 13 px at FIGURE_DPI, which stays above MIN_TEXT_PX for a figure drawn up to
#: 1.4 times the column's width. Lines cycle through dash patterns as well as colours, so that
#: lines stay apart where colours cannot (greyscale, print, overlapping lines).
HOUSE_STYLE = {
    "figure.dpi": FIGURE_DPI,
    "savefig.dpi": "figure",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "legend.fontsize": 9.5,
    "legend.title_fontsize": 10,
    "figure.titlesize": 11,
    "image.cmap": SEQUENTIAL_CMAP,
    "axes.prop_cycle": (plt.cycler(color=OKABE_ITO)
                        + plt.cycler(linestyle=["-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (8, 2))])),
}


def house_style():
    """The book's figure style, for drawing one figure: ``with house_style(): ...``.

    A context manager, and a decorator as well (``@house_style()``), that applies
    :data:`HOUSE_STYLE` while the figure is drawn and restores the reader's settings afterwards.
    Text takes its size when it is created, so create the figure and everything on it inside.

    Example:
        >>> with house_style():
        ...     fig, ax = plt.subplots(figsize=book_figsize(0.8, aspect=0.5))
        ...     _ = ax.plot([1, 2, 3], label="one line")
        ...     _ = ax.set_title("a title")
        >>> smallest, text = figure_text_sizes(fig)[0]
        >>> smallest >= MIN_TEXT_PX
        True
        >>> plt.close(fig)
    """
    return plt.rc_context(HOUSE_STYLE)


def book_figsize(width_fraction: float = 1.0, aspect: float = 0.6) -> tuple[float, float]:
    """The size in inches (width, height) of a figure the book shows at ``width_fraction`` of its column.

    ``aspect`` is the height over the width. The book never shows a figure wider than its column,
    so a figure drawn wider is shrunk, text and all: draw at most the column's width.

    Example:
        >>> book_figsize()
        (6.88, 4.128)
        >>> book_figsize(0.5, aspect=1.0)
        (3.44, 3.44)
    """
    if not isinstance(width_fraction, (int, float)) or not 0 < width_fraction <= 1:
        raise ValueError(f"width_fraction must be in (0, 1], a share of the book's column, got {width_fraction!r}.")
    if not isinstance(aspect, (int, float)) or not aspect > 0:
        raise ValueError(f"aspect must be a positive number (the figure's height over its width), got {aspect!r}.")
    width = round(BOOK_COLUMN_PX * width_fraction / FIGURE_DPI, 4)
    return width, round(width * aspect, 4)


def figure_text_sizes(fig, column_px: int = BOOK_COLUMN_PX) -> list[tuple[float, str]]:
    """Every text ``fig`` draws with its size in CSS pixels as the book shows it, smallest first.

    The notebook saves the figure as a PNG of its tight bounding box (0.1 in of padding) at the
    figure's dpi; the book shows that image at its own width, or shrunk to the column when it is
    wider. A text of ``s`` points is then ``s * dpi / 72 * shown_width / image_width`` pixels.
    Tick labels, titles, legends and annotations count: whatever the figure draws.

    Example:
        >>> fig, ax = plt.subplots(figsize=(6, 3), dpi=100)   # narrower than the column
        >>> _ = ax.set_title("title", fontsize=12)
        >>> [round(size, 1) for size, text in figure_text_sizes(fig) if text == "title"]  # 12 pt at 100 dpi
        [16.7]
        >>> fig.set_size_inches(20, 3)    # a 1612 px image, shrunk to the 688 px column
        >>> [round(size, 1) for size, text in figure_text_sizes(fig) if text == "title"]
        [7.1]
        >>> plt.close(fig)
    """
    from matplotlib.backends.backend_agg import RendererAgg

    drawn: list[tuple[float, str]] = []

    class Recorder(RendererAgg):
        def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
            if s.strip():
                drawn.append((prop.get_size_in_points(), s))

        def draw_tex(self, gc, x, y, s, prop, angle, *, mtext=None):
            if s.strip():
                drawn.append((prop.get_size_in_points(), s))

    width, height = fig.get_size_inches() * fig.dpi
    renderer = Recorder(int(width), int(height), fig.dpi)
    fig.draw(renderer)
    image_px = (fig.get_tightbbox(renderer).width + 2 * plt.rcParams["savefig.pad_inches"]) * fig.dpi
    scale = min(1.0, column_px / image_px)
    return sorted((float(points * fig.dpi / 72 * scale), text) for points, text in drawn)


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    if labels is None:
        return [str(i + 1) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries but there are {n} tokens; pass one label per token.")
    return list(labels)


def _square_axes(ax, n: int, labels: list[str], xlabel: str, ylabel: str, fontsize: float = 9) -> None:
    ax.set_xticks(range(n), labels, rotation=45 if max(map(len, labels)) > 2 else 0, fontsize=fontsize)
    ax.set_yticks(range(n), labels, fontsize=fontsize)
    ax.set_xlabel(xlabel, fontsize=fontsize)
    ax.set_ylabel(ylabel, fontsize=fontsize)


def _cell_points(ax, n: int) -> float:
    """The side of one cell of an ``n x n`` heat map on ``ax``, in points, as laid out now."""
    box = ax.get_window_extent()
    return min(box.width, box.height) / n * 72 / ax.figure.dpi


def _number_size(ax, n: int, texts: list[str], largest: float = 9.0, smallest: float = 7.0) -> float | None:
    """The largest font size (pt) at which every text fits in a cell with a margin, or ``None``."""
    cell = _cell_points(ax, n)
    longest = max(map(len, texts))
    size = largest
    while size >= smallest:
        # a digit of DejaVu Sans is about 0.64 em wide; keep a margin of half an em around the text
        if longest * 0.64 * size + 0.5 * size <= cell and 1.4 * size <= cell:
            return size
        size -= 0.5
    return None


# --- Which token may see which ----------------------------------------------------------------

#: Visibility colours: forbidden (pale grey) and allowed (light blue): they differ in lightness too,
#: and every cell also carries its mark, so the table survives greyscale and colour-blindness.
_VISIBILITY_COLOURS = ListedColormap(["#f0f0f0", "#9ecae1"])


def plot_visibility(num_tokens: int = 3, labels: Sequence[str] | None = None, ax=None):
    """Draw the causal visibility table: ✓ where the query token may use the key token, ✗ where not.

    Rows are the tokens doing the looking (queries), columns the tokens looked at (keys); the marks
    mean the same as in the chapters' printed tables: ✓ allowed, ✗ forbidden.

    Example:
        >>> fig = plot_visibility(3)
        >>> "".join(t.get_text() for t in fig.axes[0].texts)
        '✓✗✗✓✓✗✓✓✓'
    """
    num_tokens = check_positive_int("num_tokens", num_tokens)
    labels = _labels(labels, num_tokens)
    if ax is None:
        side = min(1.3 + 0.55 * num_tokens, COLUMN_WIDTH / 2)
        _, ax = plt.subplots(figsize=(side, side))
    table = visibility(num_tokens)
    ax.imshow(table.float().numpy(), cmap=_VISIBILITY_COLOURS, vmin=0, vmax=1)
    _square_axes(ax, num_tokens, labels, "key token (may be used)", "query token (using)")
    ax.set_title("Causal visibility", fontsize=10)
    ax.figure.tight_layout()
    size = _number_size(ax, num_tokens, ["✓"], largest=12, smallest=7) or 7
    for i in range(num_tokens):
        for j in range(num_tokens):
            ax.text(j, i, "✓" if table[i, j] else "✗", ha="center", va="center",
                    color="black" if table[i, j] else "#555555", fontsize=size)
    return ax.figure


# --- Attention weights -------------------------------------------------------------------------

def plot_attention(weights: torch.Tensor, labels: Sequence[str] | None = None,
                   titles: Sequence[str] | None = None, fmt: str = ".2f", cmap: str = "Blues"):
    """Heat maps of attention weights, one panel per head, at most two panels per row.

    Each cell holds its weight as a number when the number fits the cell at a readable size (7 pt
    or more, with the figure at most :data:`COLUMN_WIDTH` inches wide); otherwise the panels get a
    colour bar instead. The default colour map, ``Blues``, runs from white (a weight of 0, such as
    every masked entry) to dark blue (1) with steadily falling lightness, so it reads the same in
    greyscale and to colour-blind readers.

    Args:
        weights: ``(T, T)`` for one head, or ``(h, T, T)`` for several (one batch row;
            index the batch first, e.g. ``module.attention_weights(x)[0]``).
        labels: one label per token (default ``1 .. T``).
        titles: one title per head (default ``Head 1 .. Head h``).
        fmt: the format of the numbers in the cells.
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
    side = min(1.3 + 0.55 * n, COLUMN_WIDTH / columns, 4.6)
    fig, axes = plt.subplots(rows, columns, figsize=(side * columns, side * rows), squeeze=False)
    for ax in axes.flat[num_heads:]:
        fig.delaxes(ax)  # an odd number of heads leaves the last cell of the grid empty
    panels = list(axes.flat[:num_heads])
    image = None
    for ax, head_weights, title in zip(panels, weights, titles):
        image = ax.imshow(head_weights.numpy(), cmap=cmap, vmin=0.0, vmax=1.0)
        _square_axes(ax, n, labels, "key token (attended to)", "query token (attending)")
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    texts = [format(float(v), fmt) for v in weights.flatten()]
    size = _number_size(panels[0], n, texts)
    if size is None:  # numbers would be unreadable: show the scale instead
        fig.colorbar(image, ax=panels, shrink=0.8, label="attention weight")
        return fig
    for ax, head_weights in zip(panels, weights):
        for i in range(n):
            for j in range(n):
                value = float(head_weights[i, j])
                colour = "white" if value > 0.5 else "black"
                ax.text(j, i, format(value, fmt), ha="center", va="center", color=colour, fontsize=size)
    return fig


# --- The flow of multi-head attention: enter, fan out to heads, process per head, merge ---------

#: One colour per drawn head (Okabe and Ito's palette, told apart by colour-blind readers).
_HEAD_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
_NEUTRAL = "#555555"


class _Canvas:
    """An axes in layout units, with every font size multiplied by the figure's scale."""

    def __init__(self, ax, scale: float):
        self.ax, self.scale = ax, scale

    def text(self, x, y, text, fontsize, **kwargs):
        return self.ax.text(x, y, text, fontsize=fontsize * self.scale, **kwargs)

    def box(self, x, y, width, height, text, colour, fontsize=9.5, fill_alpha=0.12):
        self.ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                         boxstyle="round,pad=0.02,rounding_size=0.12", linewidth=1.4,
                                         edgecolor=colour, facecolor=(*to_rgb(colour), fill_alpha)))
        self.text(x, y, text, fontsize, ha="center", va="center", color="black")

    def arrow(self, start, end, colour):
        self.ax.annotate("", xy=end, xytext=start,
                         arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.3, shrinkA=0, shrinkB=0))


def _heads_to_draw(num_heads: int, max_heads_drawn: int) -> list[int | None]:
    """Head numbers (1-based) to draw, top to bottom; ``None`` marks the row of dots."""
    if num_heads <= max_heads_drawn:
        return list(range(1, num_heads + 1))
    return list(range(1, max_heads_drawn)) + [None, num_heads]


def plot_head_flow(num_heads: int = 2, *, num_tokens: int | None = None, d_in: int | None = None,
                   head_dim: int | None = None, batched: bool = False, max_heads_drawn: int = 4):
    """Draw the flow of multi-head attention for any number of heads.

    Read it left to right: the input ``X`` enters once and fans out, unchanged, to every head;
    each head turns it into its own context vectors ``Z_i`` with its own weights; and the merge
    joins the ``Z_i`` into one matrix ``Z``, the only place the heads' paths meet. With one head
    there is nothing to merge and ``Z = Z_1``.

    Args:
        num_heads: how many heads, ``h`` (1 draws single-head attention).
        num_tokens, d_in, head_dim: sizes to print the shapes with; the book's symbols (``T``,
            ``d_in``, ``d_h``) are printed for any left as ``None``.
        batched: draw the batched module of chapter 3 instead of stacked heads: one query, key and
            value projection of width ``d_out = h * d_h``, split into ``h`` slices, merged by
            concatenation and then mixed by the output projection.
        max_heads_drawn: above this many heads the middle heads are drawn as a row of dots.

    Returns:
        The matplotlib figure, at most :data:`COLUMN_WIDTH` inches wide.

    Example:
        >>> fig = plot_head_flow(2, num_tokens=3, d_in=3, head_dim=2)
        >>> sorted(t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("$Z"))
        ['$Z$', '$Z_{1}$', '$Z_{2}$']
    """
    num_heads = check_positive_int("num_heads", num_heads)
    max_heads_drawn = check_positive_int("max_heads_drawn", max_heads_drawn)
    if max_heads_drawn < 2:
        raise ValueError(f"max_heads_drawn must be at least 2 (the first and the last head), got {max_heads_drawn}.")
    T = str(num_tokens) if num_tokens is not None else "$T$"
    d = str(d_in) if d_in is not None else r"$d_\mathrm{in}$"
    hd = str(head_dim) if head_dim is not None else "$d_h$"
    if head_dim is not None:
        width = str(num_heads * head_dim)
    else:
        width = "$d_h$" if num_heads == 1 else rf"${num_heads}\,d_h$"
    rows = _heads_to_draw(num_heads, max_heads_drawn)
    height = max(2.4, 1.15 * len(rows) + 1.1)
    row_y = [height - 1.5 - 1.15 * i for i in range(len(rows))]
    centre = (row_y[0] + row_y[-1]) / 2
    merges = num_heads > 1 or batched

    # Column positions, left to right: each box's centre, from the widths and the gaps between boxes.
    w_in, w_proj, w_z, w_merge, w_final, gap = 1.3, 1.6, 0.85, 1.45, 0.85, 0.45
    w_head = 1.6 if batched else 1.95
    x_in = 0.1 + w_in / 2
    x_proj = x_in + w_in / 2 + gap + w_proj / 2
    x_head = (x_proj + w_proj / 2 + 1.6 * gap if batched else x_in + w_in / 2 + 2.6 * gap) + w_head / 2
    x_z = x_head + w_head / 2 + gap + w_z / 2
    x_merge = x_z + w_z / 2 + 1.5 * gap + w_merge / 2
    x_final = x_merge + w_merge / 2 + gap + w_final / 2
    fig_width = (x_final + w_final / 2 if merges else x_z + w_z / 2 + 0.6) + 0.1
    # 0.85 inch per layout unit, shrunk (fonts too) to fit the book's column.
    scale = min(1.0, COLUMN_WIDTH / (0.85 * fig_width))
    fig, ax = plt.subplots(figsize=(0.85 * fig_width * scale, 0.85 * height * scale))
    ax.set_xlim(0, fig_width)
    ax.set_ylim(0, height)
    ax.axis("off")
    draw = _Canvas(ax, scale)

    tokens = (f"tokens 1..{num_tokens}" if num_tokens and num_tokens > 3
              else "tokens " + ", ".join(str(i + 1) for i in range(num_tokens)) if num_tokens else "tokens")
    draw.box(x_in, centre, w_in, 1.0, f"$X$\n{tokens}\n({T}, {d})", _NEUTRAL, fontsize=9.5)
    top = height - 0.75

    def stage(x, text):
        draw.text(x, top, text, 10, ha="center", va="bottom", weight="bold")

    stage(x_in, "enter")
    if batched:
        draw.box(x_proj, centre, w_proj, 1.3, f"one $W_q$, $W_k$, $W_v$\n{d} → {width}", _NEUTRAL, fontsize=9.5)
        draw.arrow((x_in + w_in / 2, centre), (x_proj - w_proj / 2, centre), _NEUTRAL)
        stage(x_proj, "project, then\nsplit into heads")
        fan_from = (x_proj + w_proj / 2, centre)
    else:
        fan_from = (x_in + w_in / 2, centre)
        stage((fan_from[0] + x_head - w_head / 2) / 2, "fan out\nto heads" if merges else "one\nweight set")
    stage((x_head + x_z) / 2, "process per head" if merges else "attention")

    for row, (y, head) in enumerate(zip(row_y, rows)):
        if head is None:
            draw.text(x_head, y, r"$\vdots$", 16, ha="center", va="center")
            draw.text(x_z, y, r"$\vdots$", 16, ha="center", va="center")
            continue
        colour = _HEAD_COLOURS[row % len(_HEAD_COLOURS)]  # by row, so the drawn heads never share a colour
        weights = (f"slice {head} of $Q, K, V$\n({hd} columns)" if batched
                   else "its own $W_q, W_k, W_v$\ncausal attention")
        draw.box(x_head, y, w_head, 0.9, f"Head {head}\n{weights}", colour, fontsize=9)
        draw.arrow(fan_from, (x_head - w_head / 2, y), colour if not batched else _NEUTRAL)
        draw.box(x_z, y, w_z, 0.75, f"$Z_{{{head}}}$", colour, fontsize=12)
        draw.text(x_z, y - 0.52, f"({T}, {hd})", 9, ha="center", va="center")
        draw.arrow((x_head + w_head / 2, y), (x_z - w_z / 2, y), colour)
        if merges:
            draw.arrow((x_z + w_z / 2, y), (x_merge - w_merge / 2, centre), colour)

    if merges:
        stage(x_merge, "merge")
        merge_text = "concatenate,\nthen out_proj\n($W_O$)" if batched else "concatenate\nside by side"
        draw.box(x_merge, centre, w_merge, 1.0, merge_text, _NEUTRAL, fontsize=9.5)
        draw.arrow((x_merge + w_merge / 2, centre), (x_final - w_final / 2, centre), _NEUTRAL)
        draw.box(x_final, centre, w_final, 0.75, "$Z$", _NEUTRAL, fontsize=12)
        draw.text(x_final, centre - 0.55, f"({T}, {width})", 9, ha="center", va="center")
    else:
        draw.text(x_z, row_y[0] - 0.8, "nothing to merge:\n$Z = Z_1$", 9.5, ha="center", va="top")
    if batched:
        title = f"{num_heads} head{'s' if num_heads > 1 else ''}, batched in one module"
    else:
        title = f"{num_heads} heads, stacked" if num_heads > 1 else "1 head: single-head attention"
    ax.set_title(title, fontsize=11 * scale)
    fig.tight_layout()
    return fig


# --- How cost grows with the number of heads -----------------------------------------------------

#: One colour and marker per regime: Okabe and Ito's blue and orange, circles and squares.
_REGIME_STYLE = {
    REGIMES[0]: {"color": "#E69F00", "marker": "o", "markersize": 8, "linewidth": 3.0},
    REGIMES[1]: {"color": "#0072B2", "marker": "s", "markersize": 4.5, "linewidth": 1.5},
}


def plot_cost_regimes(points):
    """Plot a head-count sweep: how parameters, multiply-adds and score memory grow with the heads.

    Each panel shows a quantity as a multiple of its value at the fewest heads, on log-log axes,
    so "grows in proportion to the heads" is the broad grey diagonal and "does not grow" is the
    horizontal line at 1. Colour and marker mark the regime (head width fixed: wide orange line,
    large circles; model width fixed: thin blue line, small squares, drawn on top, so that where
    the two coincide both stay visible); line style marks the implementation (solid: stacked
    wrapper, dashed: batched module, dotted: any other). Timed points add a panel for the time.

    Args:
        points: the list returned by :func:`mha_course.compare.head_count_sweep`. The time panel
            is drawn only when every point was timed.

    Returns:
        The matplotlib figure, :data:`COLUMN_WIDTH` inches wide: one row of panels, or two rows of
        two when there are four.
    """
    points = list(points)
    if not points:
        raise ValueError("points is empty; pass the result of mha_course.compare.head_count_sweep(...).")
    quantities = [("parameters", "parameters"), ("multiply_adds", "multiply-adds"),
                  ("score_bytes", "score memory")]
    if all(p.time is not None for p in points):
        quantities.append(("time", "forward time (measured)"))
    groups: dict[tuple[str, str], list] = {}
    for p in points:
        groups.setdefault((p.regime, p.implementation), []).append(p)
    styles = {"stacked": "-", "batched": "--"}  # any other implementation: dotted
    names = {"stacked": "stacked heads", "batched": "batched module"}
    head_counts = sorted({p.num_heads for p in points})
    columns = 2 if len(quantities) == 4 else len(quantities)
    rows = math.ceil(len(quantities) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(COLUMN_WIDTH, 2.55 * rows + 0.45), squeeze=False)
    ordered = sorted(groups.items(), key=lambda item: REGIMES.index(item[0][0]))  # model width on top
    for ax, (field, label) in zip(axes.flat, quantities):
        lo, hi = head_counts[0], head_counts[-1]
        ax.plot([lo, hi], [1, hi / lo], "-", color="#bbbbbb", lw=7, alpha=0.6, zorder=0,
                solid_capstyle="round", label="in proportion to heads")
        for (regime, implementation), group in ordered:
            group = sorted(group, key=lambda p: p.num_heads)
            values = [p.time.median if field == "time" else getattr(p, field) for p in group]
            ratios = [v / values[0] for v in values]
            ax.plot([p.num_heads for p in group], ratios, styles.get(implementation, ":"),
                    label=f"{REGIME_LABELS[regime]}, {names.get(implementation, implementation)}",
                    **_REGIME_STYLE[regime])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(head_counts, [str(h) for h in head_counts])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.tick_params(labelsize=8.5)
        ax.set_xlabel("heads $h$", fontsize=9)
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"× its value at {head_counts[0]} head{'s' if head_counts[0] > 1 else ''}", fontsize=9)
    for ax in axes.flat[len(quantities):]:
        fig.delaxes(ax)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / (2.55 * rows + 0.45) * (1 + (len(labels) > 3)), 1, 1))
    return fig


# --- Sharing keys and values (chapter 6): who reads which key/value head, and what the cache holds ---

#: Sizes of the chapter 6 figures: the book's text column at 1280 px is about 730 px, so a figure
#: 7.3 in wide at 100 dpi is shown at its own size and 9 pt text is 12.5 px on screen.
_COLUMN_INCHES = 7.3
_KIND_STYLES = {  # colour (viridis, dark to light, so greyscale keeps the order), marker, line style
    "multi-head": (plt.get_cmap("viridis")(0.0), "o", "-"),
    "grouped-query": (plt.get_cmap("viridis")(0.45), "s", "--"),
    "multi-query": (plt.get_cmap("viridis")(0.8), "^", ":"),
}


def _kv_box(ax, x, y, width, height, text, colour, fontsize=9.5):
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.02,rounding_size=0.08", linewidth=1.3,
                                edgecolor=colour, facecolor=(*to_rgb(colour), 0.18)))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color="black")


def plot_kv_sharing(num_heads: int = 8, kv_groups: Sequence[int] = (8, 2, 1)):
    """Draw which key/value head each query head reads, one row per number of key/value groups.

    Query heads are numbered 1 to ``num_heads`` on top; below them sit the ``num_kv_groups``
    key/value heads, each under the consecutive query heads of its group (query head ``i`` reads
    key/value head ``i // (num_heads // num_kv_groups)``, counting from 0), joined to them by a
    line in the group's colour. ``num_kv_groups == num_heads`` is multi-head attention, ``1`` is
    multi-query attention, anything between is grouped-query attention. Each row also says what
    fraction of the multi-head cache its key/value heads need.

    Example:
        >>> fig = plot_kv_sharing(4, kv_groups=(4, 2, 1))
        >>> [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("KV")][:3]
        ['KV1', 'KV2', 'KV3']
        >>> [line.get_gid() for line in fig.axes[1].lines]  # query head -> key/value head
        ['Q1-KV1', 'Q2-KV1', 'Q3-KV2', 'Q4-KV2']
    """
    num_heads = check_positive_int("num_heads", num_heads)
    kv_groups = [check_positive_int("kv_groups", g) for g in kv_groups]
    if not kv_groups:
        raise ValueError("kv_groups is empty: pass the numbers of key/value heads to draw, e.g. (8, 2, 1).")
    for groups in kv_groups:
        if num_heads % groups:
            divisors = ", ".join(str(n) for n in range(1, num_heads + 1) if num_heads % n == 0)
            raise ValueError(f"kv_groups holds {groups}, which does not divide num_heads ({num_heads}): each "
                             f"key/value head serves the same number of query heads. Choose among {divisors}.")
    fig, axes = plt.subplots(len(kv_groups), 1, figsize=(_COLUMN_INCHES, 1.75 * len(kv_groups) + 0.1),
                             squeeze=False)
    step = 1.0
    width, height = 0.72, 0.42
    label_x = -0.9
    for ax, groups in zip(axes[:, 0], kv_groups):
        size = num_heads // groups
        ax.set_xlim(label_x - 1.25, num_heads * step - 0.3)
        ax.set_ylim(-0.45, 1.75)
        ax.axis("off")
        colours = [plt.get_cmap("viridis")(0.9 * g / max(groups - 1, 1)) for g in range(groups)]
        if groups == num_heads:
            kind = f"multi-head: {groups} key/value heads, one per query head"
        elif groups == 1:
            kind = f"multi-query: 1 key/value head for all {num_heads} query heads"
        else:
            kind = f"grouped-query: {groups} key/value heads, each read by {size} query heads"
        ax.text(label_x - 1.2, 1.58, kind, ha="left", va="center", fontsize=10, weight="bold")
        ax.text(num_heads * step - 0.32, 1.58, f"cache: {groups}/{num_heads} of multi-head", ha="right",
                va="center", fontsize=9.5)
        ax.text(label_x, 1.0, "query\nheads", ha="center", va="center", fontsize=9)
        ax.text(label_x, 0.0, "key/value\nheads", ha="center", va="center", fontsize=9)
        for g in range(groups):
            centre = (g * size + (size - 1) / 2) * step
            box_width = (size - 1) * step + width
            _kv_box(ax, centre, 0.0, box_width, height, f"KV{g + 1}", colours[g])
        for q in range(num_heads):
            g = q // size
            _kv_box(ax, q * step, 1.0, width, height, f"Q{q + 1}", colours[g])
            ax.plot([q * step, q * step], [1.0 - height / 2, height / 2], color=colours[g], lw=1.8,
                    gid=f"Q{q + 1}-KV{g + 1}")
    fig.tight_layout(h_pad=0.4)
    return fig


def plot_kv_cache_growth(shapes=None, bytes_per_number: int = 2, smallest: int = 16):
    """Cache size against context length for multi-head, grouped-query and multi-query attention.

    One panel per model shape (default: :data:`mha_course.cost.MODEL_SHAPES`, GPT-2 small and a
    Llama-style shape), log-log axes from ``smallest`` tokens to the shape's context length,
    one line per kind (colour, marker and line style all differ), labelled at the right end with
    the cache at the full context; each panel's title gives the key/value heads of the three kinds. The sizes are :func:`mha_course.cost.kv_cache_bytes` of one
    sequence at ``bytes_per_number`` bytes per number (2: float16 or bfloat16).

    Example:
        >>> fig = plot_kv_cache_growth()
        >>> [line.get_label() for line in fig.axes[0].lines]
        ['multi-head', 'grouped-query', 'multi-query']
        >>> fig.axes[0].texts[-1].get_text()  # multi-query, GPT-2 small, 1024 tokens
        '3.00 MiB'
    """
    from .cost import MODEL_SHAPES, kv_cache_bytes
    from .tables import format_bytes

    shapes = list((shapes or MODEL_SHAPES).values()) if isinstance(shapes or MODEL_SHAPES, dict) else list(shapes)
    if not shapes:
        raise ValueError("shapes is empty: pass model shapes, e.g. mha_course.cost.MODEL_SHAPES.")
    smallest = check_positive_int("smallest", smallest)
    fig, axes = plt.subplots(1, len(shapes), figsize=(_COLUMN_INCHES, 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        if smallest >= shape.context_length:
            raise ValueError(f"smallest ({smallest}) must be below {shape.name}'s context length "
                             f"({shape.context_length}).")
        lengths = [smallest]
        while lengths[-1] * 2 < shape.context_length:
            lengths.append(lengths[-1] * 2)
        lengths.append(shape.context_length)
        for kind, kv_heads in shape.kv_heads().items():
            colour, marker, style = _KIND_STYLES[kind]
            sizes = [kv_cache_bytes(shape.num_layers, kv_heads, shape.head_dim, t, 1, bytes_per_number)
                     for t in lengths]
            ax.plot(lengths, sizes, linestyle=style, marker=marker, markersize=4.5, color=colour, lw=1.8,
                    label=kind)
            ax.annotate(format_bytes(sizes[-1]), (lengths[-1], sizes[-1]), xytext=(4, 0),
                        textcoords="offset points", va="center", ha="left", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value)))
        ticks = lengths[:: max(1, -(-(len(lengths) - 1) // 3))]  # about four ticks, the context last
        ticks += [] if ticks[-1] == lengths[-1] else [lengths[-1]]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.tick_params(labelsize=9)
        ax.set_xlabel("tokens in the cache", fontsize=9.5)
        heads = ", ".join(str(n) for n in shape.kv_heads().values())
        ax.set_title(f"{shape.name}: {shape.num_layers} layers, $d_h$ = {shape.head_dim}\n"
                     f"{shape.num_heads} query heads; key/value heads {heads}", fontsize=9.5)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlim(lengths[0] / 1.4, shape.context_length * 3.5)  # room for the labels at the right end
    axes[0][0].set_ylabel(f"cache, one sequence ({bytes_per_number} bytes per number)", fontsize=9.5)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9.5, frameon=False,
               handlelength=2.6)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


# --- The reshape of the batched module: split into heads, attend per head, merge ---------------

#: Okabe and Ito's palette for categories that colour-blind readers tell apart (its black left out).
#: Each head's columns take one colour; the numbers in the cells tell them apart in greyscale too.
HEAD_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
_RESHAPE_MAX_COLUMNS = 12
_RESHAPE_MAX_TOKENS = 6


def _cell_grid(ax, left, top, columns, num_tokens, head_dim, fontsize):
    """Draw ``num_tokens`` rows of cells, one per entry of ``columns``, hanging from ``top``.

    An entry is the number of a projection's output column, drawn in its head's colour with the
    number inside; ``None`` is a grey cell without a number (an input feature).
    """
    for row in range(num_tokens):
        for position, column in enumerate(columns):
            if column is None:
                face = (0.85, 0.85, 0.85, 1.0)
            else:
                face = (*to_rgb(HEAD_PALETTE[column // head_dim]), 0.45)
            ax.add_patch(plt.Rectangle((left + position, top - row - 1), 1, 1, facecolor=face,
                                       edgecolor="white", linewidth=1.5))
            if column is not None:
                ax.text(left + position + 0.5, top - row - 0.5, str(column), ha="center",
                        va="center", fontsize=fontsize)


def plot_head_reshape(num_heads: int = 2, head_dim: int = 2, num_tokens: int = 3, d_in: int = 3):
    """Draw how the batched module lays its tensors out: split into heads, then merge.

    One sequence of the batch, left to right: the input ``x``, ``(T, d_in)``; one projection's
    output, ``(B, T, d_out)``; ``view`` to ``(B, T, h, d_h)``; ``transpose(1, 2)`` to
    ``(B, h, T, d_h)``, where every head is its own ``(T, d_h)`` matrix and attention runs per
    head; and the merge back to ``(B, T, d_out)``. Each cell holds the number of the projection
    column it came from, and each head's columns have their own colour (Okabe and Ito's palette,
    :data:`HEAD_PALETTE`), so a column can be followed through every step. The input is grey:
    every projection column reads all ``d_in`` features, so the heads split the projections,
    not the input.

    Args:
        num_heads: how many heads, ``h`` (at most 7, one colour each).
        head_dim: the width of one head, ``d_h``; ``d_out = num_heads * head_dim`` (at most 12).
        num_tokens: tokens in the sequence drawn, ``T`` (at most 6).
        d_in: width of the input tokens (at most 12).

    Returns:
        The matplotlib figure.

    Example:
        >>> fig = plot_head_reshape(num_heads=2, head_dim=2, num_tokens=3)
        >>> [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("(")]
        ['(B, T, d_in)', '(B, T, d_out)', '(B, T, h, d_h)', '(B, h, T, d_h)', '(B, T, d_out)']
    """
    num_heads = check_positive_int("num_heads", num_heads)
    head_dim = check_positive_int("head_dim", head_dim)
    num_tokens = check_positive_int("num_tokens", num_tokens)
    d_in = check_positive_int("d_in", d_in)
    if num_heads > len(HEAD_PALETTE):
        raise ValueError(
            f"num_heads must be at most {len(HEAD_PALETTE)} to give every head its own colour, got "
            f"{num_heads}. Draw a smaller example; the layout is the same at any size."
        )
    d_out = num_heads * head_dim
    if max(d_out, d_in) > _RESHAPE_MAX_COLUMNS or num_tokens > _RESHAPE_MAX_TOKENS:
        raise ValueError(
            f"the figure draws one cell per number, so d_out = num_heads * head_dim (here {d_out}) "
            f"and d_in (here {d_in}) must be at most {_RESHAPE_MAX_COLUMNS}, and num_tokens (here "
            f"{num_tokens}) at most {_RESHAPE_MAX_TOKENS}. Draw a smaller example; the layout is the "
            "same at any size."
        )
    fontsize, head_gap, arrow, label_room = 9.5, 0.35, 2.2, 1.0
    stacked_height = num_heads * num_tokens + (num_heads - 1) * head_gap
    top = stacked_height  # every grid hangs from the same top line
    width_units = 1.0 + d_in + 3 * d_out + (num_heads - 1) * head_gap + head_dim + label_room + 4 * arrow
    height_units = stacked_height + 5.4
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, COLUMN_WIDTH * height_units / width_units))
    panels = []  # (left edge, width, code, shape, what the step copies)

    left = 1.0  # room for the token labels
    _cell_grid(ax, left, top, [None] * d_in, num_tokens, head_dim, fontsize)
    for row in range(num_tokens):
        ax.text(left - 0.2, top - row - 0.5, f"t{row + 1}", ha="right", va="center", fontsize=fontsize)
    panels.append((left, d_in, "x", "(B, T, d_in)", f"every column\nreads all {d_in}\ninput features"))
    left += d_in + arrow

    _cell_grid(ax, left, top, list(range(d_out)), num_tokens, head_dim, fontsize)
    panels.append((left, d_out, "W_query(x)", "(B, T, d_out)", None))
    left += d_out + arrow

    view_left = left  # the same memory, read as (h, d_h) per token: drawn with gaps between heads
    for head in range(num_heads):
        _cell_grid(ax, left, top, list(range(head * head_dim, (head + 1) * head_dim)), num_tokens,
                   head_dim, fontsize)
        ax.text(left + head_dim / 2, top + 0.1, f"h{head + 1}", ha="center", va="bottom",
                fontsize=fontsize, weight="bold")
        left += head_dim + head_gap
    left -= head_gap
    panels.append((view_left, left - view_left, ".view", "(B, T, h, d_h)", "no copy"))
    left += arrow

    for head in range(num_heads):  # each head its own (T, d_h) matrix, one above the other
        head_top = top - head * (num_tokens + head_gap)
        _cell_grid(ax, left, head_top, list(range(head * head_dim, (head + 1) * head_dim)),
                   num_tokens, head_dim, fontsize)
        ax.text(left + head_dim + 0.15, head_top - num_tokens / 2, f"h{head + 1}", ha="left",
                va="center", fontsize=fontsize, weight="bold")
    panels.append((left, head_dim, ".transpose(1, 2)", "(B, h, T, d_h)",
                   "no copy: strides\nswap; attention\nruns per head"))
    left += head_dim + label_room + arrow  # room for the head labels

    _cell_grid(ax, left, top, list(range(d_out)), num_tokens, head_dim, fontsize)
    panels.append((left, d_out, "merge_heads", "(B, T, d_out)", "one copy, by\ncontiguous()"))

    label_y = top + 0.9
    for index, (panel_left, width, code, shape, note) in enumerate(panels):
        centre = panel_left + width / 2
        ax.text(centre, label_y + 0.9, code, ha="center", va="bottom", fontsize=fontsize,
                family="monospace")
        ax.text(centre, label_y, shape, ha="center", va="bottom", fontsize=fontsize)
        bottom = top - (stacked_height if code == ".transpose(1, 2)" else num_tokens)
        if note:
            ax.text(centre, bottom - 0.3, note, ha="center", va="top", fontsize=fontsize, color=_NEUTRAL)
        if index:
            previous_left, previous_width = panels[index - 1][:2]
            gap_start = previous_left + previous_width + (label_room + 0.15 if index == 4 else 0.15)
            ax.annotate("", xy=(panel_left - 0.15, top - num_tokens / 2), xytext=(gap_start, top - num_tokens / 2),
                        arrowprops=dict(arrowstyle="-|>", color=_NEUTRAL, lw=1.3, shrinkA=0, shrinkB=0))
    ax.set_xlim(0, width_units)
    ax.set_ylim(-2.7, label_y + 1.9)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout(pad=0.2)
    return fig


# --- The three bills of chapter 4: by number of heads, and by sequence length --------------------

#: Line styles of the three bills: colour (Okabe and Ito), marker and dash differ, so the lines are
#: told apart in greyscale and where they lie on top of each other.
_BILL_STYLES = {
    "parameters": dict(color="#0072B2", marker="o", markersize=9, markerfacecolor="none",
                       linestyle="-", linewidth=2.2, label="parameters"),
    "multiply_adds": dict(color="#D55E00", marker="s", markersize=4, linestyle="--", linewidth=1.4,
                          label="multiply-adds"),
    "score_bytes": dict(color="#009E73", marker="^", markersize=6, linestyle=":", linewidth=1.8,
                        label="score memory"),
}


def plot_bills_by_heads(costs, title_suffix: str = ""):
    """Parameters, multiply-adds and score memory against the number of heads, one panel per regime.

    Each bill is drawn as a multiple of its value at the fewest heads, on log-log axes, so a line
    that stays at 1 does not grow. Where two bills lie on top of each other (parameters and
    multiply-adds with the model width fixed), the hollow circles of one show around the squares
    of the other.

    Args:
        costs: regime -> the rows of :func:`mha_course.cost.cost_by_heads` for that regime.
        title_suffix: appended to each panel's title, e.g. ``" (GPT-2-small input)"``.

    Returns:
        The matplotlib figure.

    Example:
        >>> from mha_course.cost import cost_by_heads
        >>> rows = cost_by_heads("model_width_fixed", [1, 2, 4], batch=1, num_tokens=8, d_in=16,
        ...                      width=16)
        >>> fig = plot_bills_by_heads({"model_width_fixed": rows})
        >>> fig.axes[0].get_title()
        'model width fixed'
    """
    costs = dict(costs)
    if not costs or not all(costs.values()):
        raise ValueError("costs is empty; pass {regime: cost_by_heads(regime, ...)} for one or both "
                         "regimes.")
    fig, axes = plt.subplots(1, len(costs), figsize=(COLUMN_WIDTH, 3.3), sharey=True, squeeze=False)
    for ax, (regime, rows) in zip(axes[0], costs.items()):
        heads = [r["num_heads"] for r in rows]
        for key, style in _BILL_STYLES.items():
            ax.plot(heads, [r[key] / rows[0][key] for r in rows], **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(heads, [str(h) for h in heads])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_xlabel("number of heads h")
        ax.set_title(REGIME_LABELS.get(regime, regime) + title_suffix, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("× its value at one head")
    axes[0][0].legend(fontsize=9)
    fig.tight_layout()
    return fig


def plot_attention_share(d_model: int, num_heads: int = 12, batch: int = 8,
                         lengths: Sequence[int] = tuple(2**k for k in range(4, 15)),
                         head_counts: Sequence[int] = (1, 4, 12)):
    """Two panels over the sequence length ``T``: attention's share of the work, and score memory.

    Left: the share of the batched module's forward multiply-adds taken by the two attention
    products (``QK^T`` and weights × ``V``), for ``d_in = d_out = d_model``, with the crossover
    ``T* = (3 d_in + d_out) / 2`` where the share is one half. Right: the bytes of the score
    tensor of all heads, float32, for ``batch`` sequences and each head count.

    Returns:
        The matplotlib figure.

    Example:
        >>> fig = plot_attention_share(768)
        >>> fig.axes[0].get_legend_handles_labels()[1]
        ['T* = 1536']
    """
    from .cost import multiply_adds, score_memory_bytes

    d_model = check_positive_int("d_model", d_model)
    lengths = [check_positive_int("lengths", t) for t in lengths]
    share = []
    for length in lengths:
        macs = multiply_adds("batched", 1, length, d_model, d_model, num_heads)
        share.append((macs.scores + macs.weighted_sum) / macs.total)
    crossover = (3 * d_model + d_model) / 2
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH, 3.3))
    axes[0].plot(lengths, share, marker="o", color="#0072B2")
    axes[0].axvline(crossover, color="#555555", linestyle=":", label=f"T* = {crossover:.0f}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("tokens T")
    axes[0].set_ylabel("share of forward multiply-adds")
    axes[0].set_title(f"attention products, width {d_model}", fontsize=10)
    axes[0].legend(fontsize=9)
    styles = (("#0072B2", "o", "-"), ("#E69F00", "s", "--"), ("#009E73", "^", ":"))
    for (colour, marker, dash), heads in zip(styles * len(head_counts), head_counts):
        axes[1].plot(lengths, [score_memory_bytes(batch, heads, t) / 2**20 for t in lengths],
                     marker=marker, linestyle=dash, color=colour, label=f"{heads} head{'s' if heads > 1 else ''}")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("tokens T")
    axes[1].set_ylabel(f"MiB (float32, batch {batch})")
    axes[1].set_title("score tensor of all heads", fontsize=10)
    axes[1].legend(fontsize=9)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
