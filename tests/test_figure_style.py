"""Every figure the package draws for the book is readable as the book shows it.

For each figure the book shows (drawn here with the same calls and sizes as the chapters):

* no text is smaller than ``MIN_TEXT_PX`` (9 px) as shown: computed from the figure's size, its
  dpi, each text's size in points and the book's column width
  (:func:`mha_course.plots.figure_text_sizes`);
* every colour map reads in greyscale and with each kind of colour blindness: its lightness rises
  (or falls) steadily from one end to the other, also after simulating protanopia, deuteranopia
  and tritanopia (Machado, Oliveira and Fernandes, 2009);
* lines that the legend tells apart by colour alone stay apart for colour-blind readers.

Every figure is drawn under a reader's own matplotlib settings (small fonts, a rainbow colour map,
another dpi), which the figure functions must not depend on: each sets the house style itself.

Every public ``plot_*`` function of the package's plotting modules (a package's submodules
included) must have a figure here, so a new figure is checked as soon as it exists.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pkgutil
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.cm import ScalarMappable  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from mha_course import RUNNING_WORDS, THREE_TOKEN_LABELS  # noqa: E402
from mha_course.plots import (  # noqa: E402
    BOOK_COLUMN_PX,
    FIGURE_DPI,
    GREY_CMAP,
    HOUSE_STYLE,
    MIN_TEXT_PX,
    OKABE_ITO,
    SEQUENTIAL_CMAP,
    book_figsize,
    figure_text_sizes,
    house_style,
)
from mha_course.plots.style import saved_image_px  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "book" / "data"
PLOTTING_MODULES = ("mha_course.plots", "mha_course.bench.plots", "mha_course.experiments.specialisation.plots")


# --------------------------------------------------------------------------------------------
# The figures of the book, drawn as the chapters draw them
# --------------------------------------------------------------------------------------------

def _weights(num_heads: int, num_tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(num_heads, num_tokens, num_tokens, generator=generator)
    future = torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


def _sweep_points():
    from mha_course.compare import head_count_sweep

    points = head_count_sweep((1, 2, 4, 8, 16), d_in=16, head_dim=4, d_model=16, batch=1, num_tokens=4,
                              measure_time=False)
    # The chapter times every point; the figure's third panel needs a time, not its value.
    return [dataclasses.replace(p, time=SimpleNamespace(median=1e-4 * p.num_heads)) for p in points]


def _bench_results(name: str = "bench-cpu.json"):
    from mha_course import bench

    return bench.load_results(DATA / name)


def _bills():
    from mha_course.cost import HEAD_WIDTH_FIXED, MODEL_WIDTH_FIXED, cost_by_heads

    return {regime: cost_by_heads(regime, [1, 2, 3, 4, 6, 12], width=width, batch=8, num_tokens=1024, d_in=768)
            for regime, width in ((HEAD_WIDTH_FIXED, 64), (MODEL_WIDTH_FIXED, 768))}


def _specialisation():
    from mha_course.experiments.specialisation import load_results

    return load_results(DATA / "specialisation.json")


def _long_steps() -> int:
    results = _specialisation()
    return results["config"]["steps"] * results["long_budget_factor"]


# Each figure the book shows, by "module.function: what it shows", drawn with the chapter's
# arguments (random weights stand in for trained ones: the layout does not depend on the values).
BOOK_FIGURES = {
    "mha_course.plots.plot_visibility: 3 tokens":
        lambda: _plots().plot_visibility(3, labels=THREE_TOKEN_LABELS),
    "mha_course.plots.plot_attention: one head, 6 tokens":
        lambda: _plots().plot_attention(_weights(1, 6)[0], labels=RUNNING_WORDS, titles=["One causal head"]),
    "mha_course.plots.plot_attention: 2 panels, 6 words, shades only":
        lambda: _plots().plot_attention(_weights(2, 6), labels=RUNNING_WORDS,
                                        titles=["random weights", "weights chosen by hand"], fmt=None),
    "mha_course.plots.plot_attention: 2 heads, 3 tokens":
        lambda: _plots().plot_attention(_weights(2, 3), labels=THREE_TOKEN_LABELS, titles=["Head 1", "Head 2"]),
    "mha_course.plots.plot_attention: 3 heads, 6 tokens":
        lambda: _plots().plot_attention(_weights(3, 6), labels=RUNNING_WORDS),
    "mha_course.plots.plot_attention: 2 heads, 8 tokens, long titles":
        lambda: _plots().plot_attention(_weights(2, 8), labels=[str(t) for t in range(8)], fmt=".1f",
                                        titles=["Head 1: reads the previous token", "Head 2: reads the first token"]),
    "mha_course.plots.plot_head_flow: 1 head":
        lambda: _plots().plot_head_flow(1, num_tokens=3, d_in=3, head_dim=2),
    "mha_course.plots.plot_head_flow: 2 heads":
        lambda: _plots().plot_head_flow(2, num_tokens=3, d_in=3, head_dim=2),
    "mha_course.plots.plot_head_flow: 8 heads":
        lambda: _plots().plot_head_flow(8),
    "mha_course.plots.plot_head_flow: batched":
        lambda: _plots().plot_head_flow(2, num_tokens=6, d_in=3, head_dim=2, batched=True),
    "mha_course.plots.plot_head_reshape: 2 heads of 2, 3 tokens":
        lambda: _plots().plot_head_reshape(num_heads=2, head_dim=2, num_tokens=3, d_in=3),
    "mha_course.plots.plot_cost_regimes: timed sweep":
        lambda: _plots().plot_cost_regimes(_sweep_points()),
    "mha_course.plots.plot_bills_by_heads: GPT-2 small, both regimes":
        lambda: _plots().plot_bills_by_heads(_bills(), title_suffix=" (GPT-2-small input)"),
    "mha_course.plots.plot_attention_share: width 768":
        lambda: _plots().plot_attention_share(768, num_heads=12, batch=8),
    "mha_course.plots.plot_kv_sharing: 8 query heads, 8, 2 and 1 groups":
        lambda: _plots().plot_kv_sharing(num_heads=8, kv_groups=(8, 2, 1)),
    "mha_course.plots.plot_kv_cache_growth: two model shapes":
        lambda: _plots().plot_kv_cache_growth(bytes_per_number=2),
    "mha_course.plots.plot_todays_caches: eight published models":
        lambda: _plots().plot_todays_caches(
            _module("mha_course.todays_caches").cache_rows(lengths=[2**k for k in range(10, 18)])),
    "mha_course.plots.plot_state_updates: four tokens":
        lambda: _plots().plot_state_updates(),
    "mha_course.bench.plots.plot_deltanet: stored run":
        lambda: _module("mha_course.bench.plots").plot_deltanet(_bench_results("bench-deltanet-cpu.json")),
    "mha_course.bench.plots.plot_results: three sizes":
        lambda: _module("mha_course.bench.plots").plot_results(
            _bench_results(), configs=["small-4", "small-16", "gpt2-small"]),
    "mha_course.bench.plots.plot_relative_times: three sizes":
        lambda: _module("mha_course.bench.plots").plot_relative_times(
            _bench_results(), configs=["small-4", "small-16", "gpt2-small"],
            implementations=["stacked", "batched", "fused_qkv", "fast", "raw_sdpa", "torch_mha_weights"]),
    "mha_course.bench.plots.plot_decode: stored decoding run":
        lambda: _module("mha_course.bench.plots").plot_decode(_bench_results("bench-decode-cpu.json")),
    "mha_course.bench.plots.plot_latent: stored latent run":
        lambda: _module("mha_course.bench.plots").plot_latent(_bench_results("bench-latent-cpu.json")),
    "mha_course.bench.plots.plot_heads_map: stored heads map":
        lambda: _module("mha_course.bench.plots").plot_heads_map(_bench_results("bench-heads-map-cpu.json")),
    "mha_course.plots.plot_rotation: head of 8, rope_theta 10000":
        lambda: _plots().plot_rotation(head_dim=8, rope_theta=10000.0),
    "mha_course.plots.plot_tiles: 10 tokens in tiles of 4":
        lambda: _plots().plot_tiles(10, block_size=4),
    "mha_course.plots.plot_tiles: 24 tokens in tiles of 4, window 8":
        lambda: _plots().plot_tiles(24, block_size=4, window=8),
    "mha_course.plots.plot_window_mask: 10 tokens, window 4":
        lambda: _plots().plot_window_mask(num_tokens=10, window=4),
    "mha_course.plots.plot_ring_cache: window 4, 10 steps":
        lambda: _plots().plot_ring_cache(window=4, num_tokens=10),
    "mha_course.bench.plots.plot_window: stored window run":
        lambda: _module("mha_course.bench.plots").plot_window(_bench_results("bench-window-cpu.json")),
    "mha_course.bench.plots.plot_tiled: stored tiled run":
        lambda: _module("mha_course.bench.plots").plot_tiled(_bench_results("bench-tiled-cpu.json")),
    "mha_course.experiments.specialisation.plots.plot_accuracy_by_heads: stored runs":
        lambda: _module("mha_course.experiments.specialisation.plots").plot_accuracy_by_heads(_specialisation()),
    "mha_course.experiments.specialisation.plots.plot_first_share_by_difference: one head, long runs":
        lambda: _module("mha_course.experiments.specialisation.plots").plot_first_share_by_difference(
            _specialisation(), num_heads=1, steps=_long_steps()),
}


def _module(name: str):
    return importlib.import_module(name)


def _plots():
    return _module("mha_course.plots")


# A reader's own matplotlib settings, which a book figure must not depend on: small text, a rainbow
# colour map, red and green lines, another dpi (the inline backend's old default).
READER_SETTINGS = {
    "figure.dpi": 72, "font.size": 5, "axes.titlesize": 5, "axes.labelsize": 5, "xtick.labelsize": 5,
    "ytick.labelsize": 5, "legend.fontsize": 5, "figure.titlesize": 5, "image.cmap": "jet",
    "axes.prop_cycle": plt.cycler(color=["tab:red", "tab:green"]),
}


@pytest.fixture(scope="module")
def drawn():
    """Draw a book figure by name, once for all the tests of this file (closed at the end).

    Drawn, and drawn on a canvas as a notebook shows it, under READER_SETTINGS: the figure must set
    its own style.
    """
    figures: dict[str, object] = {}

    def draw(name: str):
        if name not in figures:
            with plt.rc_context(READER_SETTINGS):
                figures[name] = BOOK_FIGURES[name]()
                figures[name].canvas.draw()
            plt.close(figures[name])  # out of pyplot's list of open figures, drawn on a canvas of its own
            FigureCanvasAgg(figures[name])
        return figures[name]

    yield draw
    for figure in figures.values():
        plt.close(figure)


def _plot_functions() -> dict[str, object]:
    """``module.name`` -> function, for every public ``plot_*`` function the plotting modules define.

    A function defined in a submodule of a plotting package is named by the package it is imported
    from (``mha_course.plots.plot_attention``), and must be importable from there.
    """
    functions = {}
    for name in PLOTTING_MODULES:
        module = importlib.import_module(name)
        defined_in = [name] + [info.name for info in pkgutil.walk_packages(getattr(module, "__path__", []), f"{name}.")]
        for source in defined_in:
            for function_name, function in inspect.getmembers(importlib.import_module(source), inspect.isfunction):
                if function_name.startswith("plot_") and function.__module__ == source:
                    assert getattr(module, function_name, None) is function, \
                        f"{source}.{function_name} is not importable from {name}: re-export it there"
                    functions[f"{name}.{function_name}"] = function
    return functions


def test_every_plot_function_draws_a_book_figure_here():
    functions = set(_plot_functions())
    assert "mha_course.plots.plot_attention" in functions, "the search for plot functions found none"
    covered = {name.split(":")[0] for name in BOOK_FIGURES}
    missing = sorted(functions - covered)
    assert not missing, f"add a figure to BOOK_FIGURES (tests/test_figure_style.py) for: {', '.join(missing)}"
    unknown = sorted(covered - functions)
    assert not unknown, f"BOOK_FIGURES names functions that do not exist: {', '.join(unknown)}"


# --------------------------------------------------------------------------------------------
# Text size as the book shows each figure
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BOOK_FIGURES)
def test_no_text_smaller_than_9_px_as_the_book_shows_it(drawn, name):
    figure = drawn(name)
    sizes = figure_text_sizes(figure)
    width_in, height_in = figure.get_size_inches()
    small: dict[float, list[str]] = {}
    for size, text in sizes:
        if size < MIN_TEXT_PX:
            small.setdefault(round(size, 1), []).append(text)
    if small:
        lines = [
            f"{size:.1f} px: {len(texts)} texts, e.g. " + ", ".join(repr(t) for t in list(dict.fromkeys(texts))[:5])
            for size, texts in sorted(small.items())
        ]
        pytest.fail(
            f"{name}: {sum(map(len, small.values()))} texts under {MIN_TEXT_PX} px in a {width_in:.2f} x "
            f"{height_in:.2f} in figure at {figure.dpi:.0f} dpi, shown in a {BOOK_COLUMN_PX} px column:\n  "
            + "\n  ".join(lines)
            + "\n  draw it at most book_figsize() wide, inside house_style(), with fonts of 9 pt or more",
            pytrace=False,
        )


@pytest.mark.parametrize("name", BOOK_FIGURES)
def test_every_book_figure_is_drawn_in_the_house_style_within_the_column(drawn, name):
    """The figure sets its own dpi and size, whatever the reader's settings, and fills most of the column."""
    figure = drawn(name)
    assert figure.dpi == FIGURE_DPI, f"{name}: drawn at {figure.dpi:.0f} dpi, not in the house style"
    width_px = figure.get_size_inches()[0] * figure.dpi
    assert width_px <= BOOK_COLUMN_PX + 0.5, f"{name}: drawn {width_px:.0f} px wide, wider than the column"
    shown = min(saved_image_px(figure), BOOK_COLUMN_PX)
    assert shown >= 0.6 * BOOK_COLUMN_PX, (f"{name}: shown {shown:.0f} px wide, {shown / BOOK_COLUMN_PX:.0%} of the "
                                           "column (the book shows figures at least 60 % of it)")


def _drawn_texts(figure) -> list[tuple[str, object]]:
    """(text, window extent) of every text the figure draws, at right angles (a tilted text's box is
    not its outline)."""
    drawn = []
    draw_text = Text.draw

    def record(text, renderer):
        draw_text(text, renderer)
        if text.get_visible() and text.get_text().strip() and text.get_rotation() % 90 == 0:
            drawn.append((text.get_text(), text.get_window_extent(renderer)))

    with mock.patch.object(Text, "draw", record):
        figure.draw(figure.canvas.get_renderer())
    return drawn


@pytest.mark.parametrize("name", BOOK_FIGURES)
def test_no_text_runs_into_another(drawn, name):
    texts = _drawn_texts(drawn(name))
    assert texts, f"{name}: no text found"
    clashes = []
    for i, (first, one) in enumerate(texts):
        for second, other in texts[i + 1:]:
            width = min(one.x1, other.x1) - max(one.x0, other.x0)
            height = min(one.y1, other.y1) - max(one.y0, other.y0)
            if width > 1 and height > 1:
                clashes.append(f"{first!r} and {second!r} ({width:.0f} x {height:.0f} px)")
    assert not clashes, f"{name}: texts drawn over each other: " + "; ".join(clashes)


def test_figure_text_sizes_matches_the_image_a_notebook_saves():
    """The measurement uses the width of the PNG the inline backend writes (tight bounding box)."""
    import io

    from PIL import Image

    figure, ax = plt.subplots(figsize=(14, 3), dpi=100)
    ax.set_title("a title", fontsize=10)
    ax.plot([0, 1], [0, 1])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    image_px = Image.open(io.BytesIO(buffer.getvalue())).width
    sizes = dict((text, size) for size, text in figure_text_sizes(figure))
    plt.close(figure)
    assert sizes["a title"] == pytest.approx(10 * 100 / 72 * BOOK_COLUMN_PX / image_px, rel=0.01)


# --------------------------------------------------------------------------------------------
# Colours that survive colour blindness and greyscale
# --------------------------------------------------------------------------------------------

# Machado, Oliveira and Fernandes (2009), severity 1.0, applied to linear RGB.
COLOUR_BLINDNESS = {
    "protanopia": np.array([[0.152286, 1.052583, -0.204868],
                            [0.114503, 0.786281, 0.099216],
                            [-0.003882, -0.048116, 1.051998]]),
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968],
                              [0.280085, 0.672501, 0.047413],
                              [-0.011820, 0.042940, 0.968881]]),
    "tritanopia": np.array([[1.255528, -0.076749, -0.178779],
                            [-0.078411, 0.930809, 0.147602],
                            [0.004733, 0.691367, 0.303900]]),
}


def _linear(rgb: np.ndarray) -> np.ndarray:
    rgb = np.asarray(rgb, dtype=float)
    return np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)


def _lab(linear_rgb: np.ndarray) -> np.ndarray:
    """CIE L*a*b* (D65) of linear sRGB colours, shape (n, 3)."""
    to_xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = np.clip(linear_rgb, 0, 1) @ to_xyz.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def _seen_as(rgb: np.ndarray) -> dict[str, np.ndarray]:
    """L*a*b* of ``rgb`` (n, 3) for normal vision and each colour blindness."""
    linear = _linear(rgb)
    seen = {"normal vision": _lab(linear)}
    for kind, matrix in COLOUR_BLINDNESS.items():
        seen[kind] = _lab(linear @ matrix.T)
    return seen


def colour_map_problems(cmap) -> list[str]:
    """Why ``cmap`` does not read in greyscale or for colour-blind readers (empty: it does).

    Its lightness must change steadily in one direction along the map, by at least 40 L* units
    end to end, for normal vision (which is also what greyscale keeps) and after each simulation.
    """
    samples = np.asarray(cmap(np.linspace(0, 1, 33)))[:, :3]
    problems = []
    for vision, lab in _seen_as(samples).items():
        lightness = lab[:, 0]
        steps = np.diff(lightness)
        direction = np.sign(lightness[-1] - lightness[0])
        if abs(lightness[-1] - lightness[0]) < 40:
            problems.append(f"{vision}: lightness spans only {abs(lightness[-1] - lightness[0]):.0f} L* units")
        elif np.any(steps * direction < -0.5):
            worst = int(np.argmin(steps * direction))
            problems.append(f"{vision}: lightness turns back at {worst / 32:.2f} of the map "
                            f"({lightness[worst]:.0f} -> {lightness[worst + 1]:.0f} L*)")
    return problems


def _colour_maps(figure) -> dict[str, object]:
    maps = {}
    for artist in figure.findobj(lambda a: isinstance(a, ScalarMappable)):
        if getattr(artist, "get_array", lambda: None)() is not None:
            maps[artist.get_cmap().name] = artist.get_cmap()
    return maps


@pytest.mark.parametrize("name", BOOK_FIGURES)
def test_colour_maps_read_in_greyscale_and_for_colour_blind_readers(drawn, name):
    figure = drawn(name)
    problems = [f"colour map {cmap_name!r}: {problem}"
                for cmap_name, cmap in _colour_maps(figure).items() for problem in colour_map_problems(cmap)]
    assert not problems, f"{name}: " + "; ".join(problems) + f" (use {SEQUENTIAL_CMAP!r} or {GREY_CMAP!r})"


def _delta_e(first: np.ndarray, second: np.ndarray) -> float:
    return float(np.linalg.norm(first - second))


def line_problems(figure) -> list[str]:
    """Legend lines drawn alike (same dashes, same markers) whose colours some reader cannot tell apart."""
    problems = []
    for ax in figure.axes:
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_") and len(line.get_xdata()) > 1]
        for i, first in enumerate(lines):
            for second in lines[i + 1:]:
                if (first.get_linestyle(), first.get_marker()) != (second.get_linestyle(), second.get_marker()):
                    continue
                rgb = np.array([to_rgb(first.get_color()), to_rgb(second.get_color())])
                for vision, lab in _seen_as(rgb).items():
                    if _delta_e(lab[0], lab[1]) < 15:
                        problems.append(f"{first.get_label()!r} and {second.get_label()!r} look alike "
                                        f"({vision}, ΔE {_delta_e(lab[0], lab[1]):.0f})")
    return list(dict.fromkeys(problems))


@pytest.mark.parametrize("name", BOOK_FIGURES)
def test_lines_told_apart_by_colour_alone_stay_apart_for_colour_blind_readers(drawn, name):
    """Legend lines drawn alike (same dashes, same markers) must differ in colour for every reader."""
    problems = line_problems(drawn(name))
    assert not problems, f"{name}: " + "; ".join(problems) + " (vary the dashes or markers too)"


# --------------------------------------------------------------------------------------------
# The house style itself
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmap_name", [SEQUENTIAL_CMAP, GREY_CMAP, "cividis"])
def test_house_colour_maps_read_in_greyscale_and_for_colour_blind_readers(cmap_name):
    assert colour_map_problems(plt.get_cmap(cmap_name)) == []


@pytest.mark.parametrize("cmap_name", ["jet", "RdYlGn", "hsv"])
def test_the_colour_map_check_rejects_rainbows_and_red_green_maps(cmap_name):
    assert colour_map_problems(plt.get_cmap(cmap_name)), f"{cmap_name} passed the colour-map check"


def test_house_palette_colours_stay_apart_for_colour_blind_readers():
    rgb = np.array([to_rgb(colour) for colour in OKABE_ITO])
    for vision, lab in _seen_as(rgb).items():
        closest = min(_delta_e(lab[i], lab[j]) for i in range(len(rgb)) for j in range(i + 1, len(rgb)))
        assert closest >= 10, f"two house colours look alike with {vision} (ΔE {closest:.0f})"


def test_the_line_check_catches_red_and_green():
    figure, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], color="tab:red", label="red")
    ax.plot([0, 1], [1, 0], color="tab:green", label="green")
    rgb = np.array([to_rgb("tab:red"), to_rgb("tab:green")])
    problems = line_problems(figure)
    ax.lines[1].set_linestyle("--")  # dashes tell them apart: no longer a problem
    told_apart = line_problems(figure)
    plt.close(figure)
    assert _delta_e(*_seen_as(rgb)["deuteranopia"]) < 15
    assert any(p.startswith("'red' and 'green' look alike (deuteranopia") for p in problems), problems
    assert told_apart == []


def test_a_figure_drawn_in_the_house_style_at_column_width_has_readable_text():
    with house_style():
        figure, axes = plt.subplots(1, 2, figsize=book_figsize(1.0, aspect=0.45))
        for ax in axes:
            for k in range(3):
                ax.plot(range(5), [k * x for x in range(5)], label=f"line {k}")
            ax.set(title="a panel", xlabel="x", ylabel="y")
            ax.legend()
        image = axes[0].imshow([[0, 1], [1, 0]])
    sizes = figure_text_sizes(figure)
    styles = {line.get_linestyle() for line in axes[0].get_lines()}
    plt.close(figure)
    assert min(size for size, _ in sizes) >= MIN_TEXT_PX
    assert len(styles) == 3, "lines of the house style differ in dashes, not only in colour"
    assert image.get_cmap().name == SEQUENTIAL_CMAP


def test_house_style_restores_the_readers_settings():
    before = plt.rcParams["font.size"]
    with house_style():
        assert plt.rcParams["font.size"] == HOUSE_STYLE["font.size"]
    assert plt.rcParams["font.size"] == before


@pytest.mark.parametrize("width_fraction, aspect, fragment", [
    (0, 0.5, "width_fraction must be in (0, 1]"),
    (1.5, 0.5, "width_fraction must be in (0, 1]"),
    (1.0, 0, "aspect must be a positive number"),
    (1.0, "wide", "aspect must be a positive number"),
])
def test_book_figsize_rejects_sizes_the_book_cannot_show(width_fraction, aspect, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace("]", r"\]")):
        book_figsize(width_fraction, aspect)


def test_book_figsize_fills_the_column_at_the_figure_dpi():
    width, height = book_figsize(1.0, aspect=0.5)
    assert math.isclose(width * HOUSE_STYLE["figure.dpi"], BOOK_COLUMN_PX)
    assert math.isclose(height, width / 2)
