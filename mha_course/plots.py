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
    fig, ax = plt.subplots(figsize=(7.3, 7.3 * height_units / width_units))
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
            _arrow(ax, (gap_start, top - num_tokens / 2), (panel_left - 0.15, top - num_tokens / 2), _NEUTRAL)
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
    fig, axes = plt.subplots(1, len(costs), figsize=(7.3, 3.3), sharey=True, squeeze=False)
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
    fig, axes = plt.subplots(1, 2, figsize=(7.3, 3.3))
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
