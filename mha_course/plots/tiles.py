"""The tiles of the score matrix under the causal mask (chapter 7): computed, cut by the diagonal, skipped.

One square per score ``(query i, key j)`` of a ``T x T`` matrix, grouped in tiles of
``block_size x block_size``. :func:`mha_course.attention.tiled.tile_kind` decides each tile's fate: below the
diagonal it is computed whole, on the diagonal it is computed and then masked where a key comes
after its query, above it the loop never computes it. With a sliding window (chapter 11) the tiles
wholly before the window are skipped too, and those its edge crosses are cut.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..attention._validation import validate_positive_int, validate_window
from ..attention.tiled import SKIPPED, tile_kind
from .style import COLUMN_WIDTH, NEUTRAL, OKABE_ITO, house_style

#: The fills of a kept score and a masked one: dark and light, so the two read in greyscale too.
_COMPUTED_FILL, _MASKED_FILL = OKABE_ITO[0], "#F2F2F2"


@house_style()
def plot_tiles(num_tokens: int = 10, block_size: int = 4, window: int | None = None):
    """Draw the causal score matrix as the tiled loop sees it, one square per score.

    Scores the loop computes and keeps are filled; scores inside a tile cut by the diagonal (or by
    the edge of a sliding ``window``) that the mask then removes are pale and hatched; tiles wholly
    above the diagonal, or wholly before the window, are left empty with a dashed edge: the loop
    never computes them. Thick lines are the tiles' edges.

    Example:
        >>> fig = plot_tiles(10, 4)
        >>> sorted({p.get_gid() for p in fig.axes[0].patches if p.get_gid()})
        ['computed', 'cut', 'skipped']
        >>> sum(p.get_gid() == "skipped" for p in fig.axes[0].patches)  # 3 blocks: 3 tiles above the diagonal
        3
        >>> fig = plot_tiles(16, 4, window=4)  # and 3 more before the window
        >>> sum(p.get_gid() == "skipped" for p in fig.axes[0].patches)
        9
    """
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    block_size = validate_positive_int("block_size", block_size)
    window = validate_window(window)
    side = min(0.62 * COLUMN_WIDTH, 4.4)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, side), layout="constrained")
    starts = range(0, num_tokens, block_size)
    for q in starts:
        for k in starts:
            kind = tile_kind(q, k, block_size, num_tokens, window)
            rows, cols = min(block_size, num_tokens - q), min(block_size, num_tokens - k)
            edge = dict(fill=False, lw=2.2, edgecolor="black" if kind != SKIPPED else NEUTRAL,
                        linestyle="-" if kind != SKIPPED else "--", zorder=3)
            ax.add_patch(Rectangle((k, q), cols, rows, gid=kind, **edge))
            if kind == SKIPPED:
                continue
            for i in range(q, q + rows):
                for j in range(k, k + cols):
                    masked = j > i or (window is not None and i - j >= window)
                    ax.add_patch(Rectangle((j, i), 1, 1, facecolor=_MASKED_FILL if masked else _COMPUTED_FILL,
                                           edgecolor="white" if not masked else "#BBBBBB", lw=0.8,
                                           hatch="////" if masked else None, zorder=1))
    ax.set_xlim(0, num_tokens)
    ax.set_ylim(num_tokens, 0)
    ax.set_aspect("equal")
    step = max(1, num_tokens // 10)
    ticks = list(range(0, num_tokens, step))
    ax.set_xticks([t + 0.5 for t in ticks], [str(t) for t in ticks])
    ax.set_yticks([t + 0.5 for t in ticks], [str(t) for t in ticks])
    ax.tick_params(length=0)
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    for spine in ax.spines.values():
        spine.set_visible(False)
    handles = [Patch(facecolor=_COMPUTED_FILL, edgecolor="black", label="computed, kept"),
               Patch(facecolor=_MASKED_FILL, edgecolor="#BBBBBB", hatch="////",
                     label="computed, masked\n(key after query)" if window is None
                     else "computed, masked\n(key after query\nor out of the window)"),
               Patch(facecolor="white", edgecolor=NEUTRAL, linestyle="--", lw=1.5,
                     label="never computed")]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.04, 0.5), frameon=False,
              title=f"T = {num_tokens}, tiles of {block_size}" + ("" if window is None else f"\nwindow {window}"))
    return fig
