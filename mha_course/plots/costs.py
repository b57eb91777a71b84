"""Figures of what heads cost: the cost regimes of chapter 2, the three bills and attention's share
of the work in chapter 4, and the key/value cache of chapter 6.

Quantities are drawn as multiples of their value at the fewest heads, on log axes, so that "grows
in proportion" is a diagonal and "does not grow" a flat line.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from ..attention._validation import validate_positive_int
from ..cost import REGIME_LABELS, REGIMES
from .style import COLUMN_WIDTH, NEUTRAL, OKABE_ITO, SEQUENTIAL_CMAP, book_figsize, house_style, line_style

# --- How cost grows with the number of heads -----------------------------------------------------

#: One colour and marker per regime: Okabe and Ito's blue and orange, circles and squares.
_REGIME_STYLE = {
    REGIMES[0]: {"color": OKABE_ITO[1], "marker": "o", "markersize": 8, "linewidth": 3.0},
    REGIMES[1]: {"color": OKABE_ITO[0], "marker": "s", "markersize": 4.5, "linewidth": 1.5},
}


@house_style()
def plot_cost_regimes(points):
    """Plot a head-count sweep: how parameters, multiply-adds and score memory grow with the heads.

    Each panel shows a quantity as a multiple of its value at the fewest heads, on log-log axes,
    so "grows in proportion to the heads" is the broad grey diagonal and "does not grow" is the
    horizontal line at 1. Colour and marker mark the regime (head width fixed: wide orange line,
    large circles; model width fixed: thin blue line, small squares, drawn on top, so that where
    the two coincide both stay visible; where they coincide at every point, as the score memory
    does, the wide line is drawn wider and the panel says so); line style marks the implementation
    (solid: stacked wrapper, dashed: batched module, dotted: any other). Timed points add a panel for
    the time.

    Args:
        points: the list returned by :func:`mha_course.compare.head_count_sweep`. The time panel
            is drawn only when every point was timed.

    Returns:
        The matplotlib figure, the book's column wide: one row of panels, or two rows of two when
        there are four; the legend below them, in two columns.
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
    fig, axes = plt.subplots(rows, columns, figsize=(COLUMN_WIDTH, 2.6 * rows + 0.9), squeeze=False,
                             layout="constrained")
    ordered = sorted(groups.items(), key=lambda item: REGIMES.index(item[0][0]))  # model width on top
    for ax, (field, label) in zip(axes.flat, quantities):
        lo, hi = head_counts[0], head_counts[-1]
        ax.plot([lo, hi], [1, hi / lo], "-", color=NEUTRAL, lw=7, alpha=0.25, zorder=0,  # a pale band
                solid_capstyle="round", label="in proportion to heads")
        lines = []
        for _, group in ordered:
            group = sorted(group, key=lambda p: p.num_heads)
            values = [p.time.median if field == "time" else getattr(p, field) for p in group]
            lines.append(([p.num_heads for p in group], [v / values[0] for v in values]))
        # Where every regime draws the same line (the score memory), the lines lie on top of each
        # other: the wide one is drawn wider still, and the panel says that they coincide.
        same = len({(tuple(heads), tuple(ratios)) for heads, ratios in lines}) == 1 and len(lines) > 1
        for ((regime, implementation), _), (heads, ratios) in zip(ordered, lines):
            style = dict(_REGIME_STYLE[regime])
            if same and regime == REGIMES[0]:
                style.update(linewidth=7.0, markersize=13)
            ax.plot(heads, ratios, styles.get(implementation, ":"),
                    label=f"{REGIME_LABELS[regime]}, {names.get(implementation, implementation)}", **style)
        if same:
            ax.text(0.04, 0.96, "both regimes:\nthe same line", transform=ax.transAxes, va="top", ha="left",
                    color=NEUTRAL)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(head_counts, [str(h) for h in head_counts])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_xlabel("heads $h$")
        ax.set_title(label)
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"× its value at {head_counts[0]} head{'s' if head_counts[0] > 1 else ''}")
    for ax in axes.flat[len(quantities):]:
        fig.delaxes(ax)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False)
    return fig


# --- The three bills of chapter 4: by number of heads, and by sequence length --------------------

#: Line styles of the three bills: colour (Okabe and Ito), marker and dash differ, so the lines are
#: told apart in greyscale and where they lie on top of each other.
_BILL_STYLES = {
    "parameters": dict(color=OKABE_ITO[0], marker="o", markersize=9, markerfacecolor="none",
                       linestyle="-", linewidth=2.2, label="parameters"),
    "multiply_adds": dict(color=OKABE_ITO[5], marker="s", markersize=4, linestyle="--", linewidth=1.4,
                          label="multiply-adds"),
    "score_bytes": dict(color=OKABE_ITO[2], marker="^", markersize=6, linestyle=":", linewidth=1.8,
                        label="score memory"),
}


@house_style()
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
    fig, axes = plt.subplots(1, len(costs), figsize=book_figsize(1.0, aspect=0.48), sharey=True, squeeze=False)
    for ax, (regime, rows) in zip(axes[0], costs.items()):
        heads = [r["num_heads"] for r in rows]
        for key, style in _BILL_STYLES.items():
            ax.plot(heads, [r[key] / rows[0][key] for r in rows], **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(heads, [str(h) for h in heads])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_xlabel("number of heads h")
        ax.set_title(REGIME_LABELS.get(regime, regime) + title_suffix)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("× its value at one head")
    axes[0][0].legend()
    fig.tight_layout()
    return fig


@house_style()
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
    from ..cost import multiply_adds, score_memory_bytes

    d_model = validate_positive_int("d_model", d_model)
    lengths = [validate_positive_int("lengths", t) for t in lengths]
    share = []
    for length in lengths:
        macs = multiply_adds("batched", 1, length, d_model, d_model, num_heads)
        share.append((macs.scores + macs.weighted_sum) / macs.total)
    crossover = (3 * d_model + d_model) / 2
    fig, axes = plt.subplots(1, 2, figsize=book_figsize(1.0, aspect=0.48))
    axes[0].plot(lengths, share, **line_style(0))
    axes[0].axvline(crossover, color=NEUTRAL, linestyle=":", label=f"T* = {crossover:.0f}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("tokens T")
    axes[0].set_ylabel("share of forward multiply-adds")
    axes[0].set_title(f"attention products, width {d_model}")
    axes[0].legend()
    for index, heads in enumerate(head_counts):
        axes[1].plot(lengths, [score_memory_bytes(batch, heads, t) / 2**20 for t in lengths],
                     label=f"{heads} head{'s' if heads > 1 else ''}", **line_style(index))
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("tokens T")
    axes[1].set_ylabel(f"MiB (float32, batch {batch})")
    axes[1].set_title("score tensor of all heads")
    axes[1].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# --- The key/value cache of chapter 6 -----------------------------------------------------------

#: Colour (viridis, dark to light, so greyscale keeps the order), marker and dashes of each kind.
_KIND_STYLES = {
    "multi-head": (plt.get_cmap(SEQUENTIAL_CMAP)(0.0), "o", "-"),
    "grouped-query": (plt.get_cmap(SEQUENTIAL_CMAP)(0.45), "s", "--"),
    "multi-query": (plt.get_cmap(SEQUENTIAL_CMAP)(0.8), "^", ":"),
}


@house_style()
def plot_kv_cache_growth(shapes=None, bytes_per_number: int = 2, smallest: int = 16):
    """Cache size against context length for multi-head, grouped-query and multi-query attention.

    One panel per model shape (default: :data:`mha_course.cost.MODEL_SHAPES`, GPT-2 small and a
    Llama-style shape), log-log axes from ``smallest`` tokens to the shape's context length,
    one line per kind (colour, marker and line style all differ), labelled at the right end with
    the cache at the full context; each panel's title gives the key/value heads of the three
    kinds. The sizes are :func:`mha_course.cost.kv_cache_bytes` of one sequence at ``bytes_per_number`` bytes per number (2: float16 or bfloat16).

    Example:
        >>> fig = plot_kv_cache_growth()
        >>> [line.get_label() for line in fig.axes[0].lines]
        ['multi-head', 'grouped-query', 'multi-query']
        >>> fig.axes[0].texts[-1].get_text()  # multi-query, GPT-2 small, 1024 tokens
        '3.00 MiB'
    """
    from ..cost import MODEL_SHAPES, kv_cache_bytes
    from ..tables import format_bytes

    shapes = MODEL_SHAPES if shapes is None else shapes
    shapes = list(shapes.values()) if isinstance(shapes, dict) else list(shapes)
    if not shapes:
        raise ValueError("shapes is empty: pass model shapes, e.g. mha_course.cost.MODEL_SHAPES.")
    smallest = validate_positive_int("smallest", smallest)
    fig, axes = plt.subplots(1, len(shapes), figsize=book_figsize(1.0, aspect=0.55), squeeze=False,
                             layout="constrained")
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
                        textcoords="offset points", va="center", ha="left")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value)))
        ticks = lengths[:: max(1, -(-(len(lengths) - 1) // 3))]  # about four ticks, the context last
        ticks += [] if ticks[-1] == lengths[-1] else [lengths[-1]]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("tokens in the cache")
        heads = ", ".join(str(n) for n in shape.kv_heads().values())
        ax.set_title(f"{shape.name}: {shape.num_layers} layers, $d_h$ = {shape.head_dim}\n"
                     f"{shape.num_heads} query heads; key/value heads {heads}",
                     fontsize="medium")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlim(lengths[0] / 1.4, shape.context_length * 6)  # room for the labels at the right end
    axes[0][0].set_ylabel(f"cache, one sequence ({bytes_per_number} bytes per number)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False, handlelength=2.6)
    return fig



@house_style()
def plot_todays_caches(rows):
    """The cache of one sequence against its length, one line per model of today (chapter 10).

    ``rows``: dicts with ``name`` and ``bytes`` (length -> bytes of the whole cache), as
    :func:`mha_course.todays_caches.cache_rows` returns them at several lengths (a bfloat16 model, a
    recurrent state in float32). Log-log axes; each model's line differs in colour, marker and dashes,
    named in the legend below.

    Example:
        >>> rows = [{"name": "a", "bytes": {1024: 2**20, 4096: 2**22}},
        ...         {"name": "b", "bytes": {1024: 2**19, 4096: 2**19}}]
        >>> [line.get_label() for line in plot_todays_caches(rows).axes[0].lines]
        ['a', 'b']
    """
    from ..tables import format_bytes

    if not rows:
        raise ValueError("rows is empty: pass mha_course.todays_caches.cache_rows(lengths=...).")
    fig, ax = plt.subplots(figsize=book_figsize(1.0, aspect=0.62), layout="constrained")
    for index, row in enumerate(rows):
        lengths = sorted(row["bytes"])
        ax.plot(lengths, [row["bytes"][t] for t in lengths], label=row["name"], markersize=4.5, lw=1.8,
                **line_style(index))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value)))
    ticks = sorted(rows[0]["bytes"])[::2]
    ax.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("tokens of the sequence")
    ax.set_ylabel("cache, every layer")  # bfloat16, a recurrent state in float32
    ax.grid(True, which="major", alpha=0.3)
    fig.legend(loc="outside lower center", ncol=3, frameon=False, handlelength=2.6)
    return fig
