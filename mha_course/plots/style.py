"""The house style of the book's figures, set in one place.

One style for every figure of the book: its size from the book's column, text that stays readable
at the size the book shows it, colours and colour maps that survive colour blindness and
greyscale. Every figure function of the package draws inside :func:`house_style` (as a decorator,
``@house_style()``) and sizes its figure with :func:`book_figsize`; :func:`figure_text_sizes`
measures a figure as the book shows it, which is what the tests check.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

#: The width of the book's text column on a desktop (a 1280 px window) in CSS pixels: the widest a
#: figure is shown. The browser tests measure the column and check this number.
BOOK_COLUMN_PX = 688
#: Pixels per inch of the figures as a notebook saves them (matplotlib's inline backend).
FIGURE_DPI = 100
#: Width in inches of the book's text column at :data:`FIGURE_DPI`: the widest a figure is drawn.
COLUMN_WIDTH = BOOK_COLUMN_PX / FIGURE_DPI
#: The smallest text a reader should meet in a figure, in CSS pixels as shown.
MIN_TEXT_PX = 9
#: The smallest font size (pt) a figure uses, for numbers that must fit inside a cell: 9.7 px at
#: FIGURE_DPI, above MIN_TEXT_PX for a figure drawn no wider than the column.
SMALLEST_PT = 7.0
#: Colours for lines and categories that any colour vision tells apart (Okabe and Ito's palette).
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
#: Okabe and Ito's palette for categories such as heads (its black left out, its yellow in).
HEAD_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
#: Markers and dash patterns for lines, so that lines stay apart where colours cannot (greyscale,
#: print, overlapping lines): the n-th line takes the n-th colour, marker and dashes.
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
DASHES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (8, 2)))
#: Grey for arrows, notes and "not applicable".
NEUTRAL = "#555555"
#: Colour maps for values, by use. Their lightness rises steadily from one end to the other, so
#: they read the same in greyscale and with any colour vision.
SEQUENTIAL_CMAP = "viridis"
GREY_CMAP = "Greys"

#: The matplotlib settings of the house style (what :func:`house_style` applies). Text sizes are
#: in points: 9.5 pt is 13 px at FIGURE_DPI, which stays above MIN_TEXT_PX for a figure drawn up to
#: 1.4 times the column's width. Lines cycle through dash patterns as well as colours.
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
    "axes.prop_cycle": plt.cycler(color=OKABE_ITO) + plt.cycler(linestyle=DASHES),
}


#: The format of a notebook's inline figures in the house style: PNGs of twice the figure's pixels,
#: which the notebook shows at the figure's own size (the PNG's metadata halves it). The book then
#: shows each figure at its size on a desktop and scaled to the column on a phone, sharp at both,
#: and links it to its full-size file (Sphinx links every image whose size is given).
INLINE_FIGURE_FORMAT = "retina"


def sharp_inline_figures() -> bool:
    """In a notebook that draws figures inline as plain PNGs (the default), draw them as
    :data:`INLINE_FIGURE_FORMAT` PNGs instead; return whether the notebook now does.

    :func:`house_style` calls it, so every notebook that draws a figure of the package gets sharp
    figures by being executed again. A format the reader chose (``%config InlineBackend.figure_formats``,
    e.g. ``{"svg"}``) is left as it is, and outside a notebook's inline backend nothing changes.

    Example:
        >>> sharp_inline_figures()   # plain Python: no notebook, nothing to change
        False
    """
    import matplotlib

    if "inline" not in matplotlib.get_backend():
        return False
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
        from matplotlib_inline.config import InlineBackend
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    config = InlineBackend.instance()
    if set(config.figure_formats) == {"png"}:
        config.figure_formats = {INLINE_FIGURE_FORMAT}
        select_figure_formats(shell, config.figure_formats, **config.print_figure_kwargs)
    return INLINE_FIGURE_FORMAT in config.figure_formats


def house_style():
    """The book's figure style, for drawing one figure: ``with house_style(): ...``.

    A context manager, and a decorator as well (``@house_style()``), that applies
    :data:`HOUSE_STYLE` while the figure is drawn and restores the reader's settings afterwards.
    Text takes its size when it is created, so create the figure and everything on it inside. In a
    notebook it also makes the inline figures sharp (:func:`sharp_inline_figures`).

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
    sharp_inline_figures()
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


def line_style(index: int) -> dict:
    """Colour, marker and dashes of the ``index``-th of several lines (from 0): all three differ.

    Example:
        >>> line_style(1)
        {'color': '#E69F00', 'marker': 's', 'linestyle': '--'}
    """
    # past the seventh line the markers shift by one a round, so no two lines repeat all three
    marker = MARKERS[(index + index // len(MARKERS)) % len(MARKERS)]
    return {"color": OKABE_ITO[index % len(OKABE_ITO)], "marker": marker,
            "linestyle": DASHES[index % len(DASHES)]}


def saved_image_px(fig, renderer=None) -> float:
    """The width in pixels of the PNG a notebook saves of ``fig``: its tight bounding box, padded
    by ``savefig.pad_inches`` on each side, at the figure's dpi.

    Example:
        >>> fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
        >>> 500 < saved_image_px(fig) < 600   # the tight box trims the figure's empty margins
        True
        >>> plt.close(fig)
    """
    renderer = renderer if renderer is not None else fig.canvas.get_renderer()
    return float((fig.get_tightbbox(renderer).width + 2 * plt.rcParams["savefig.pad_inches"]) * fig.dpi)


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
    scale = min(1.0, column_px / saved_image_px(fig, renderer))
    return sorted((float(points * fig.dpi / 72 * scale), text) for points, text in drawn)
