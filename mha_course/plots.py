"""Figures of the course: visibility tables, attention maps, the flow of heads, cost regimes.

Every function draws on a matplotlib ``Axes`` (a new figure when none is given) and returns the
figure, so a notebook cell can end with ``plt.show()``.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import to_rgb
from matplotlib.patches import FancyBboxPatch
from matplotlib.ticker import FuncFormatter

from ._validation import check_positive_int
from .cost import REGIME_LABELS, REGIMES
from .masking import visibility


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


def _annotate_square(ax, values: torch.Tensor, labels: list[str], fmt: str, cmap: str, vmin=0.0, vmax=1.0):
    n = values.shape[0]
    image = ax.imshow(values.numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_xticks(range(n), labels, rotation=45 if max(map(len, labels)) > 2 else 0)
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("key position (attended to)")
    ax.set_ylabel("query position (attending)")
    if n <= 12:
        for i in range(n):
            for j in range(n):
                value = float(values[i, j])
                colour = "white" if value > (vmin + vmax) / 2 else "black"
                ax.text(j, i, format(value, fmt), ha="center", va="center", color=colour, fontsize=9)
    return image


def plot_visibility(num_tokens: int = 3, labels: Sequence[str] | None = None, ax=None):
    """Draw the causal visibility table: a tick where the query token may see the key token."""
    labels = _labels(labels, num_tokens)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.6 * num_tokens, 1.0 + 0.6 * num_tokens))
    table = visibility(num_tokens)
    ax.imshow(table.float().numpy(), cmap="Greens", vmin=-0.3, vmax=2.2)
    ax.set_xticks(range(num_tokens), labels)
    ax.set_yticks(range(num_tokens), labels)
    ax.set_xlabel("may see token")
    ax.set_ylabel("token")
    for i in range(num_tokens):
        for j in range(num_tokens):
            ax.text(j, i, "✓" if table[i, j] else "✗", ha="center", va="center",
                    color="black" if table[i, j] else "grey", fontsize=12)
    ax.set_title("Causal visibility")
    return ax.figure


def plot_attention(weights: torch.Tensor, labels: Sequence[str] | None = None,
                   titles: Sequence[str] | None = None, fmt: str = ".2f", cmap: str = "Blues"):
    """Heat maps of attention weights, one panel per head, side by side.

    Args:
        weights: ``(T, T)`` for one head, or ``(num_heads, T, T)`` for several (one batch row;
            index the batch first, e.g. ``module.attention_weights(x)[0]``).
        labels: one label per token (default ``1 .. T``).
        titles: one title per head (default ``Head 1 .. Head h``).
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
    size = 1.2 + 0.55 * n
    fig, axes = plt.subplots(1, num_heads, figsize=(size * num_heads, size), squeeze=False)
    for ax, head_weights, title in zip(axes[0], weights, titles):
        _annotate_square(ax, head_weights, labels, fmt, cmap)
        ax.set_title(title)
    fig.tight_layout()
    return fig


# --- The flow of multi-head attention: enter, split into heads, per-head attention, merge -------

_HEAD_COLOURS = plt.get_cmap("tab10").colors
_NEUTRAL = "#555555"


def _box(ax, x, y, width, height, text, colour, fontsize=9.5, fill_alpha=0.12):
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.02,rounding_size=0.12", linewidth=1.4,
                                edgecolor=colour, facecolor=(*to_rgb(colour), fill_alpha)))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color="black")


def _arrow(ax, start, end, colour):
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.3, shrinkA=0, shrinkB=0))


def _heads_to_draw(num_heads: int, max_heads_drawn: int) -> list[int | None]:
    """Head numbers (1-based) to draw, top to bottom; ``None`` marks the row of dots."""
    if num_heads <= max_heads_drawn:
        return list(range(1, num_heads + 1))
    return list(range(1, max_heads_drawn)) + [None, num_heads]


def plot_head_flow(num_heads: int = 2, *, num_tokens: int | None = None, d_in: int | None = None,
                   head_dim: int | None = None, batched: bool = False, max_heads_drawn: int = 4):
    """Draw the flow of multi-head attention for any number of heads.

    Read it left to right: the input ``X`` enters once, reaches every head unchanged, each head
    turns it into its own context vectors ``Z_i`` with its own weights, and the merge joins the
    ``Z_i`` into one matrix ``Z``, the only place the heads' paths meet. With one head there is
    nothing to merge and ``Z = Z_1``.

    Args:
        num_heads: how many heads (1 draws single-head attention).
        num_tokens, d_in, head_dim: sizes to print the shapes with; symbols (``T``, ``d_in``,
            ``head_dim``) are printed for any left as ``None``.
        batched: draw the batched module of chapter 3 instead of stacked heads: one query, key and
            value projection of width ``d_out = num_heads * head_dim``, viewed as ``num_heads``
            slices, merged by concatenation and then mixed by the output projection.
        max_heads_drawn: above this many heads the middle heads are drawn as a row of dots.

    Returns:
        The matplotlib figure.

    Example:
        >>> fig = plot_head_flow(2, num_tokens=3, d_in=3, head_dim=2)
        >>> sorted(t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("$Z"))
        ['$Z$', '$Z_{1}$', '$Z_{2}$']
    """
    num_heads = check_positive_int("num_heads", num_heads)
    max_heads_drawn = check_positive_int("max_heads_drawn", max_heads_drawn)
    if max_heads_drawn < 2:
        raise ValueError(f"max_heads_drawn must be at least 2 (the first and the last head), got {max_heads_drawn}.")
    T = str(num_tokens) if num_tokens is not None else "T"
    d = str(d_in) if d_in is not None else "d_in"
    hd = str(head_dim) if head_dim is not None else "head_dim"
    if head_dim is not None:
        width = str(num_heads * head_dim)
    else:
        width = "head_dim" if num_heads == 1 else f"{num_heads}·head_dim"
    rows = _heads_to_draw(num_heads, max_heads_drawn)
    height = max(2.4, 1.15 * len(rows) + 1.1)
    row_y = [height - 1.5 - 1.15 * i for i in range(len(rows))]
    centre = (row_y[0] + row_y[-1]) / 2
    merges = num_heads > 1 or batched

    # Column positions, left to right: each box's centre, from the widths and one gap between boxes.
    w_in, w_proj, w_head, w_z, w_merge, w_out, w_final, gap = 1.3, 1.75, 1.95, 0.85, 1.3, 1.15, 0.85, 0.5
    x_in = 0.15 + w_in / 2
    x_proj = x_in + w_in / 2 + gap + w_proj / 2
    x_head = (x_proj + w_proj / 2 if batched else x_in + w_in / 2) + 2.4 * gap + w_head / 2
    x_z = x_head + w_head / 2 + gap + w_z / 2
    x_merge = x_z + w_z / 2 + 1.6 * gap + w_merge / 2
    x_out = x_merge + w_merge / 2 + gap + w_out / 2
    x_final = (x_out + w_out / 2 if batched else x_merge + w_merge / 2) + gap + w_final / 2
    fig_width = (x_final + w_final / 2 if merges else x_z + w_z / 2 + 0.6) + 0.25
    fig, ax = plt.subplots(figsize=(0.85 * fig_width, 0.85 * height))
    ax.set_xlim(0, fig_width)
    ax.set_ylim(0, height)
    ax.axis("off")

    tokens = (f"tokens 1..{num_tokens}" if num_tokens and num_tokens > 3
              else "tokens " + ", ".join(str(i + 1) for i in range(num_tokens)) if num_tokens else "tokens")
    _box(ax, x_in, centre, w_in, 1.0, f"$X$\n{tokens}\n({T}, {d})", _NEUTRAL, fontsize=9)
    top = height - 0.75
    ax.text(x_in, top, "enter", ha="center", va="bottom", fontsize=10, weight="bold")

    if batched:
        _box(ax, x_proj, centre, w_proj, 1.3,
             f"one $W_q$, $W_k$, $W_v$\n{d} → {width}\nview as {num_heads}\nslices of {hd}", _NEUTRAL, fontsize=8.5)
        _arrow(ax, (x_in + w_in / 2, centre), (x_proj - w_proj / 2, centre), _NEUTRAL)
        fan_from = (x_proj + w_proj / 2, centre)
    else:
        fan_from = (x_in + w_in / 2, centre)
    stage = "split\ninto heads" if num_heads > 1 or batched else "one\nweight set"
    ax.text((fan_from[0] + x_head - w_head / 2) / 2, top, stage, ha="center", va="bottom", fontsize=10,
            weight="bold")
    stage = "per-head attention" if merges else "attention"
    ax.text((x_head + x_z) / 2, top, stage, ha="center", va="bottom", fontsize=10, weight="bold")

    for row, (y, head) in enumerate(zip(row_y, rows)):
        if head is None:
            ax.text(x_head, y, r"$\vdots$", ha="center", va="center", fontsize=16)
            ax.text(x_z, y, r"$\vdots$", ha="center", va="center", fontsize=16)
            continue
        colour = _HEAD_COLOURS[row % len(_HEAD_COLOURS)]  # by row, so the drawn heads never share a colour
        weights = (f"slice {head} of Q, K, V" if batched
                   else f"own $W_q^{{({head})}}, W_k^{{({head})}}, W_v^{{({head})}}$")
        _box(ax, x_head, y, w_head, 0.9, f"Head {head}\n{weights}\ncausal attention", colour, fontsize=8.5)
        _arrow(ax, fan_from, (x_head - w_head / 2, y), colour if not batched else _NEUTRAL)
        _box(ax, x_z, y, w_z, 0.75, f"$Z_{{{head}}}$", colour, fontsize=11)
        ax.text(x_z, y - 0.52, f"({T}, {hd})", ha="center", va="center", fontsize=8)
        _arrow(ax, (x_head + w_head / 2, y), (x_z - w_z / 2, y), colour)
        if merges:
            _arrow(ax, (x_z + w_z / 2, y), (x_merge - w_merge / 2, centre), colour)

    if merges:
        ax.text((x_merge + x_final) / 2, top, "merge", ha="center", va="bottom", fontsize=10, weight="bold")
        _box(ax, x_merge, centre, w_merge, 1.0, "concatenate\nside by side", _NEUTRAL, fontsize=9)
        if batched:
            _arrow(ax, (x_merge + w_merge / 2, centre), (x_out - w_out / 2, centre), _NEUTRAL)
            _box(ax, x_out, centre, w_out, 0.9, "out_proj\nmixes heads", _NEUTRAL, fontsize=9)
            _arrow(ax, (x_out + w_out / 2, centre), (x_final - w_final / 2, centre), _NEUTRAL)
        else:
            _arrow(ax, (x_merge + w_merge / 2, centre), (x_final - w_final / 2, centre), _NEUTRAL)
        _box(ax, x_final, centre, w_final, 0.75, "$Z$", _NEUTRAL, fontsize=12)
        ax.text(x_final, centre - 0.55, f"({T}, {width})", ha="center", va="center", fontsize=8)
    else:
        ax.text(x_z, row_y[0] - 0.8, "nothing to merge:\n$Z = Z_1$", ha="center", va="top", fontsize=9)
    if batched:
        title = f"{num_heads} head{'s' if num_heads > 1 else ''}, batched in one module"
    else:
        title = f"{num_heads} heads, stacked" if num_heads > 1 else "1 head: single-head attention"
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_cost_regimes(points):
    """Plot a head-count sweep: how parameters, multiply-adds and time grow with the heads.

    Each panel shows a quantity as a multiple of its value at the fewest heads, on log-log axes,
    so "grows in proportion to the heads" is the dotted diagonal and "does not grow" is the
    horizontal line at 1. Colour marks the regime (head width fixed, model width fixed); line
    style marks the implementation (solid: stacked wrapper, dashed: batched module).

    Args:
        points: the list returned by :func:`mha_course.compare.head_count_sweep`. The time panel
            is drawn only when every point was timed.

    Returns:
        The matplotlib figure.
    """
    points = list(points)
    if not points:
        raise ValueError("points is empty; pass the result of mha_course.compare.head_count_sweep(...).")
    quantities = [("parameters", "parameters"), ("multiply_adds", "multiply-adds")]
    if all(p.time is not None for p in points):
        quantities.append(("time", "forward time (measured)"))
    groups: dict[tuple[str, str], list] = {}
    for p in points:
        groups.setdefault((p.regime, p.implementation), []).append(p)
    colours = dict(zip(REGIMES, ("tab:red", "tab:blue")))
    styles = {"stacked": "-", "batched": "--"}  # any other implementation: dotted
    names = {"stacked": "stacked heads", "batched": "batched module"}
    head_counts = sorted({p.num_heads for p in points})
    fig, axes = plt.subplots(1, len(quantities), figsize=(4.2 * len(quantities), 3.6), squeeze=False)
    for ax, (field, label) in zip(axes[0], quantities):
        top = 1.0
        for (regime, implementation), group in groups.items():
            group = sorted(group, key=lambda p: p.num_heads)

            values = [p.time.median if field == "time" else getattr(p, field) for p in group]
            ratios = [v / values[0] for v in values]
            top = max(top, *ratios)
            ax.plot([p.num_heads for p in group], ratios, styles.get(implementation, ":"), marker="o",
                    color=colours[regime],
                    label=f"{REGIME_LABELS[regime]}, {names.get(implementation, implementation)}")
        lo, hi = head_counts[0], head_counts[-1]
        ax.plot([lo, hi], [1, hi / lo], ":", color="grey", lw=2.5, zorder=0, label="in proportion to heads")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(head_counts, [str(h) for h in head_counts])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_xlabel("number of heads")
        ax.set_ylabel(f"× its value at {lo} head{'s' if lo > 1 else ''}")
        ax.set_title(label)
        ax.grid(True, which="major", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, 0.09 + 0.04 * (len(labels) > 3), 1, 1))
    return fig
