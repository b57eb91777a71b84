"""Diagrams of how multi-head attention is built: the flow of heads (chapters 2-3), the batched
module's reshape (chapter 3), and which key/value head each query head reads (chapter 6).

Diagrams are drawn in layout units on an axes without ticks; each function fits its layout to the
book's column. The symbols are the book's notation: ``T`` tokens, ``d_in`` input width, ``h``
heads of width ``d_h``.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.patches import FancyBboxPatch

from ..attention._validation import validate_kv_groups, validate_positive_int
from .style import COLUMN_WIDTH, HEAD_PALETTE, NEUTRAL, SEQUENTIAL_CMAP, house_style

# --- The flow of multi-head attention: enter, fan out to heads, process per head, merge ---------

#: One colour per drawn head (Okabe and Ito's palette, told apart by colour-blind readers; its
#: yellow left out, too pale for a box's edge).
_HEAD_COLOURS = HEAD_PALETTE[:6]


class _Canvas:
    """An axes in layout units, with every font size multiplied by the figure's scale."""

    def __init__(self, ax, scale: float):
        self.ax, self.scale = ax, scale

    def text(self, x, y, text, fontsize, **kwargs):
        return self.ax.text(x, y, text, fontsize=fontsize * self.scale, **kwargs)

    def box(self, x, y, width, height, text, colour, fontsize=9.5, fill_alpha=0.12, rounding=0.12,
            linewidth=1.4):
        """A rounded box centred on ``(x, y)``, edged in ``colour`` and filled with a tint of it, and its text."""
        self.ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                         boxstyle=f"round,pad=0.02,rounding_size={rounding}", linewidth=linewidth,
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


@house_style()
def plot_head_flow(num_heads: int = 2, *, num_tokens: int | None = None, d_in: int | None = None,
                   head_dim: int | None = None, batched: bool = False, max_heads_drawn: int = 4):
    """Draw the flow of multi-head attention for any number of heads.

    Read it left to right: the input ``X`` enters once and fans out, unchanged, to every head;
    each head turns it into its own context vectors ``Z_m`` with its own weights; and the merge
    joins the ``Z_m`` into one matrix ``Z``, the only place the heads' paths meet. With one head
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
    num_heads = validate_positive_int("num_heads", num_heads)
    max_heads_drawn = validate_positive_int("max_heads_drawn", max_heads_drawn)
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
    w_in, w_proj, w_z, w_merge, w_final = 1.3, 1.6, 0.85, 1.45, 0.85
    gap = 0.35 if batched else 0.45  # the batched module has one column more: closer, to keep its text large
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
    draw.box(x_in, centre, w_in, 1.0, f"$X$\n{tokens}\n({T}, {d})", NEUTRAL, fontsize=9.5)
    top = height - 0.75

    def stage(x, text):
        draw.text(x, top, text, 10, ha="center", va="bottom", weight="bold")

    stage(x_in, "enter")
    if batched:
        draw.box(x_proj, centre, w_proj, 1.3, f"one $W_q$, $W_k$, $W_v$\n{d} → {width}", NEUTRAL, fontsize=9.5)
        draw.arrow((x_in + w_in / 2, centre), (x_proj - w_proj / 2, centre), NEUTRAL)
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
        draw.arrow(fan_from, (x_head - w_head / 2, y), colour if not batched else NEUTRAL)
        draw.box(x_z, y, w_z, 0.75, f"$Z_{{{head}}}$", colour, fontsize=12)
        draw.text(x_z, y - 0.52, f"({T}, {hd})", 9, ha="center", va="center")
        draw.arrow((x_head + w_head / 2, y), (x_z - w_z / 2, y), colour)
        if merges:
            draw.arrow((x_z + w_z / 2, y), (x_merge - w_merge / 2, centre), colour)

    if merges:
        stage(x_merge, "merge")
        merge_text = "concatenate,\nthen out_proj\n($W_O$)" if batched else "concatenate\nside by side"
        draw.box(x_merge, centre, w_merge, 1.0, merge_text, NEUTRAL, fontsize=9.5)
        draw.arrow((x_merge + w_merge / 2, centre), (x_final - w_final / 2, centre), NEUTRAL)
        draw.box(x_final, centre, w_final, 0.75, "$Z$", NEUTRAL, fontsize=12)
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


# --- The reshape of the batched module: split into heads, attend per head, merge ---------------

# Each head's columns take one colour of HEAD_PALETTE; the numbers in the cells tell them apart in
# greyscale too.
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


@house_style()
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
    num_heads = validate_positive_int("num_heads", num_heads)
    head_dim = validate_positive_int("head_dim", head_dim)
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    d_in = validate_positive_int("d_in", d_in)
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
    panels.append((left, d_out, "merge", "(B, T, d_out)", "one copy, by\ncontiguous()"))

    label_y = top + 0.9
    for index, (panel_left, width, code, shape, note) in enumerate(panels):
        centre = panel_left + width / 2
        ax.text(centre, label_y + 0.9, code, ha="center", va="bottom", fontsize=fontsize,
                family="monospace")
        ax.text(centre, label_y, shape, ha="center", va="bottom", fontsize=fontsize)
        bottom = top - (stacked_height if code == ".transpose(1, 2)" else num_tokens)
        if note:
            ax.text(centre, bottom - 0.3, note, ha="center", va="top", fontsize=fontsize, color=NEUTRAL)
        if index:
            previous_left, previous_width = panels[index - 1][:2]
            gap_start = previous_left + previous_width + (label_room + 0.15 if index == 4 else 0.15)
            _Canvas(ax, 1.0).arrow((gap_start, top - num_tokens / 2), (panel_left - 0.15, top - num_tokens / 2),
                                   NEUTRAL)
    ax.set_xlim(0, width_units)
    ax.set_ylim(-2.7, label_y + 1.9)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout(pad=0.2)
    return fig


# --- Sharing keys and values (chapter 6): who reads which key/value head, and what the cache holds ---

@house_style()
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
    num_heads = validate_positive_int("num_heads", num_heads)
    kv_groups = [validate_positive_int("kv_groups", g) for g in kv_groups]
    if not kv_groups:
        raise ValueError("kv_groups is empty: pass the numbers of key/value heads to draw, e.g. (8, 2, 1).")
    for groups in kv_groups:
        validate_kv_groups(groups, num_heads, name="kv_groups")
    fig, axes = plt.subplots(len(kv_groups), 1, figsize=(COLUMN_WIDTH, 1.75 * len(kv_groups) + 0.1),
                             squeeze=False)
    step = 1.0
    width, height = 0.72, 0.42
    label_x = -0.9
    for ax, groups in zip(axes[:, 0], kv_groups):
        size = num_heads // groups
        draw = _Canvas(ax, 1.0)
        kv_box = dict(fill_alpha=0.18, rounding=0.08, linewidth=1.3)  # smaller boxes than the head flow's
        ax.set_xlim(label_x - 1.25, num_heads * step - 0.3)
        ax.set_ylim(-0.45, 1.75)
        ax.axis("off")
        colours = [plt.get_cmap(SEQUENTIAL_CMAP)(0.9 * g / max(groups - 1, 1)) for g in range(groups)]
        if groups == num_heads:
            kind = f"multi-head: {groups} key/value heads, one per query head"
        elif groups == 1:
            kind = f"multi-query: 1 key/value head for all {num_heads} query heads"
        else:
            kind = f"grouped-query: {groups} key/value heads, each read by {size} query heads"
        ax.text(label_x - 1.2, 1.58, kind, ha="left", va="center", fontsize=9.5, weight="bold")
        ax.text(num_heads * step - 0.32, 1.58, f"cache: {groups}/{num_heads} of multi-head", ha="right",
                va="center", fontsize=9.5)
        ax.text(label_x, 1.0, "query\nheads", ha="center", va="center", fontsize=9)
        ax.text(label_x, 0.0, "key/value\nheads", ha="center", va="center", fontsize=9)
        for g in range(groups):
            centre = (g * size + (size - 1) / 2) * step
            box_width = (size - 1) * step + width
            draw.box(centre, 0.0, box_width, height, f"KV{g + 1}", colours[g], **kv_box)
        for q in range(num_heads):
            g = q // size
            draw.box(q * step, 1.0, width, height, f"Q{q + 1}", colours[g], **kv_box)
            ax.plot([q * step, q * step], [1.0 - height / 2, height / 2], color=colours[g], lw=1.8,
                    linestyle="-", gid=f"Q{q + 1}-KV{g + 1}")
    fig.tight_layout(h_pad=0.4)
    return fig

