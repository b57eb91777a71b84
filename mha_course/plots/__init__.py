"""Figures of the course: visibility tables, attention maps, diagrams of the heads, cost regimes.

Every function draws a new figure and returns it (:func:`plot_visibility` can also draw on an
``Axes`` it is given), so a notebook cell can end with ``plt.show()``. Every one draws in the book's house style
(:func:`house_style`), at most the book's column wide, so its text is at least
:data:`MIN_TEXT_PX` pixels as the book shows it.

The package, one concern per module; import any name from here:

* :mod:`~mha_course.plots.style` - the house style: sizes from the book's column, font sizes,
  colour-blind-safe palettes and colour maps, and the measure of a figure's text as shown;
* :mod:`~mha_course.plots.attention` - the causal visibility table and attention maps;
* :mod:`~mha_course.plots.diagrams` - the flow of heads, the batched module's reshape, and which
  key/value head each query head reads;
* :mod:`~mha_course.plots.costs` - the cost regimes, the three bills, attention's share of the
  work, the growth of the key/value cache, and the caches of today's models;
* :mod:`~mha_course.plots.tiles` - the tiles of the causal score matrix: computed, cut, skipped;
* :mod:`~mha_course.plots.positions` - the rotary position embedding;
* :mod:`~mha_course.plots.windows` - the sliding window's mask and the ring of its cache;
* :mod:`~mha_course.plots.state` - the state of the gated delta rule being written and read.
"""

from .attention import plot_attention, plot_visibility
from .costs import (plot_attention_share, plot_bills_by_heads, plot_cost_regimes, plot_kv_cache_growth,
                    plot_todays_caches)
from .diagrams import plot_head_flow, plot_head_reshape, plot_kv_sharing
from .tiles import plot_tiles
from .windows import plot_ring_cache, plot_window_mask
from .positions import plot_rotation
from .state import plot_state_updates
from .style import (BOOK_COLUMN_PX, COLUMN_WIDTH, DASHES, FIGURE_DPI, GREY_CMAP, HEAD_PALETTE, HOUSE_STYLE,
                    MARKERS, MIN_TEXT_PX, NEUTRAL, OKABE_ITO, SEQUENTIAL_CMAP, SMALLEST_PT, book_figsize,
                    figure_text_sizes, house_style, line_style)

__all__ = [
    "plot_visibility", "plot_attention", "plot_head_flow", "plot_head_reshape", "plot_kv_sharing",
    "plot_cost_regimes", "plot_bills_by_heads", "plot_attention_share", "plot_kv_cache_growth", "plot_tiles", "plot_rotation",
    "plot_todays_caches", "plot_window_mask", "plot_ring_cache",
    "plot_state_updates",
    "house_style", "book_figsize", "figure_text_sizes", "line_style", "HOUSE_STYLE", "BOOK_COLUMN_PX",
    "COLUMN_WIDTH", "FIGURE_DPI", "MIN_TEXT_PX", "SMALLEST_PT", "OKABE_ITO", "HEAD_PALETTE", "MARKERS",
    "DASHES", "NEUTRAL", "SEQUENTIAL_CMAP", "GREY_CMAP",
]
