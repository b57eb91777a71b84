"""The benchmark's figures: bar charts of one metric per (mode, size), times relative to one
implementation with a panel per size (chapter 4), the time per generated token with and
without a key/value cache (chapter 6), peak memory and time with and without the score matrix
(chapter 7), the time and memory of attention under a sliding window (chapter 11), and the map of
batched over stacked time across sequence
lengths and numbers of heads (chapter 3).

Every figure is drawn in the book's house style (:func:`mha_course.plots.house_style`), at most the
book's column wide. matplotlib is imported only when a figure is drawn, so that reading results
does not need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .decode_results import DECODE_IMPLEMENTATIONS, decode_rows
from .heads_map_results import heads_map_cells
from .results import lookup, select, threads_text
from .steps import MODES


def plot_results(results: dict, metric: str = "median_s", configs: Iterable[str] | None = None):
    """Bar charts of one metric: a panel per (mode, config), one bar per implementation.

    ``metric`` is ``"median_s"`` (drawn in ms, with the spread as an error bar) or
    ``"peak_bytes"`` (drawn in MiB). Returns the matplotlib figure.

    Example:
        >>> rows = [{"config": "tiny", "implementation": name, "mode": "forward", "median_s": s,
        ...          "iqr_s": 0.0} for name, s in (("stacked", 2e-3), ("batched", 1e-3))]
        >>> results = {"configs": [{"name": "tiny"}], "implementations": {"stacked": {}, "batched": {}},
        ...            "rows": rows, "meta": {"device_name": "a CPU", "device": "cpu", "threads": 1,
        ...                                   "torch": "2", "date": "today"}}
        >>> fig = plot_results(results)
        >>> [ax.get_title() for ax in fig.axes], [t.get_text() for t in fig.axes[0].get_yticklabels()]
        (['tiny\\nforward'], ['stacked', 'batched'])
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from ..plots import COLUMN_WIDTH, HEAD_PALETTE, NEUTRAL, house_style

    if metric not in ("median_s", "peak_bytes"):
        raise ValueError(f"metric must be 'median_s' or 'peak_bytes', got {metric!r}.")
    configs = list(configs or [c["name"] for c in results["configs"]])
    modes = [m for m in MODES if select(results, mode=m)]
    names = list(results["implementations"])
    scale, unit = (1e3, "ms") if metric == "median_s" else (1 / 2**20, "MiB")
    with house_style():
        figure, axes = plt.subplots(len(modes), len(configs), squeeze=False, sharey=True, layout="constrained",
                                    figsize=(COLUMN_WIDTH, 0.3 * len(names) * len(modes) + 1.1 * len(modes) + 0.5))
        for i, mode in enumerate(modes):
            for j, config in enumerate(configs):
                ax = axes[i][j]
                for k, name in enumerate(names):
                    rows = select(results, config, mode, name, measured_only=False)
                    if rows and rows[0].get("skipped"):
                        ax.text(0, k, " n/a", va="center", color=NEUTRAL)
                    if not rows or rows[0].get(metric) is None:
                        continue
                    value = rows[0][metric] * scale
                    error = rows[0]["iqr_s"] * scale / 2 if metric == "median_s" else None
                    ax.barh(k, value, xerr=error, color=HEAD_PALETTE[k % len(HEAD_PALETTE)])
                ax.set_yticks(range(len(names)), names)
                ax.xaxis.set_major_locator(MaxNLocator(nbins=3))
                ax.set_title(f"{config}\n{mode}")
                ax.set_xlabel(unit)
                ax.grid(axis="x", alpha=0.3)
        axes[0][0].invert_yaxis()  # the axes share y: invert once, so the course's order reads top-down
        meta = results["meta"]
        what = "median time per call" if metric == "median_s" else "peak memory of one call"
        figure.suptitle(f"{what}: {meta['device_name']} ({meta['device']}, {threads_text(meta)}),\n"
                        f"torch {meta['torch']}, {meta['date']}")
    return figure


def plot_relative_times(results: dict, configs: Iterable[str] | None = None, reference: str = "batched",
                        implementations: Iterable[str] | None = None):
    """Every implementation's median time (or those in ``implementations``) as a multiple of
    ``reference``'s, a panel per size.

    Two bars per implementation, forward (filled) and training step (hatched), drawn from the
    line at 1 on a log axis: a bar that goes left is faster than ``reference``, one that goes right
    slower, both measured in the same run. Skipped implementations are marked ``n/a``.

    Returns:
        The matplotlib figure.

    Example:
        >>> rows = [{"config": "tiny", "implementation": name, "mode": mode, "median_s": s, "iqr_s": 0.0}
        ...         for name, s in (("stacked", 2e-3), ("batched", 1e-3))
        ...         for mode in ("forward", "forward+backward")]
        >>> fig = plot_relative_times({"configs": [{"name": "tiny"}], "rows": rows,
        ...                            "implementations": {"stacked": {}, "batched": {}}})
        >>> [round(float(bar.get_width()), 2) for bar in fig.axes[0].patches]  # ratio - 1, from the line at 1
        [1.0, 1.0, 0.0, 0.0]
        >>> fig = plot_relative_times({"configs": [{"name": "tiny"}], "rows": rows,
        ...                            "implementations": {"stacked": {}, "batched": {}}},
        ...                           implementations=["batched"])
        >>> [label.get_text() for label in fig.axes[0].get_yticklabels()]
        ['batched']
    """
    import matplotlib.pyplot as plt

    from ..plots import COLUMN_WIDTH, HEAD_PALETTE, NEUTRAL, house_style

    configs = list(configs or [c["name"] for c in results["configs"]])
    names = [name for name in results["implementations"]
             if implementations is None or name in set(implementations)]
    modes = [m for m in MODES if select(results, mode=m)]
    styles = {"forward": dict(color=HEAD_PALETTE[0], hatch=None, label="forward"),
              "forward+backward": dict(color=HEAD_PALETTE[1], hatch="///", label="training step")}
    height = 0.8 / len(modes)
    with house_style():
        figure, axes = plt.subplots(1, len(configs), figsize=(COLUMN_WIDTH, 0.42 * len(names) + 1.6),
                                    sharey=True, squeeze=False, layout="constrained")
        for ax, config in zip(axes[0], configs):
            for k, name in enumerate(names):
                for m, mode in enumerate(modes):
                    rows = select(results, config, mode, name)
                    y = k - 0.4 + height * (m + 0.5)
                    if not rows:
                        ax.text(1.0, y, " n/a", va="center", color=NEUTRAL)
                        continue
                    ratio = rows[0]["median_s"] / lookup(results, config, mode, reference)["median_s"]
                    style = styles[mode]
                    ax.barh(y, ratio - 1.0, left=1.0, height=height, color=style["color"], hatch=style["hatch"],
                            edgecolor="white" if style["hatch"] else style["color"],
                            label=style["label"] if k == 0 else None)
            ax.axvline(1.0, color=NEUTRAL, linewidth=1)
            ax.set_xscale("log")
            ax.set_xlim(0.2, 3.0)
            ax.set_xticks([0.25, 0.5, 1, 2], ["0.25", "0.5", "1", "2"])
            ax.minorticks_off()
            ax.set_title(config)
            ax.set_xlabel(f"time ÷ {reference}")
            ax.grid(axis="x", alpha=0.3)
        axes[0][0].set_yticks(range(len(names)), names)
        axes[0][0].invert_yaxis()  # the axes share y: invert once, so the course's order reads top-down
        handles, labels = axes[0][0].get_legend_handles_labels()
        figure.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False)
    return figure


def plot_decode(results: dict):
    """Time per generated token against the sequence length, with and without the cache (log-log).

    Example:
        >>> rows = [{"config": f"decode-{t}", "implementation": n, "mode": "decode", "num_tokens": t,
        ...          "median_s": s, "iqr_s": 0.0} for t, a, b in ((8, 2e-4, 1e-4), (32, 8e-4, 1e-4))
        ...         for n, s in (("recompute", a), ("kv_cache", b))]
        >>> fig = plot_decode({"rows": rows})
        >>> fig.axes[0].get_legend_handles_labels()[1]
        ['no cache (recompute)', 'with a KV cache']
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..plots import SEQUENTIAL_CMAP, book_figsize, house_style

    pairs = decode_rows(results)
    tokens = [recompute["num_tokens"] for recompute, _ in pairs]
    colours = plt.get_cmap(SEQUENTIAL_CMAP)
    styles = {"recompute": ("no cache (recompute)", colours(0.0), "o", "-"),
              "kv_cache": ("with a KV cache", colours(0.6), "s", "--")}
    with house_style():
        fig, ax = plt.subplots(figsize=book_figsize(0.76, aspect=0.65))
        for index, name in enumerate(DECODE_IMPLEMENTATIONS):
            label, colour, marker, style = styles[name]
            medians = [pair[index]["median_s"] * 1e3 for pair in pairs]
            spread = [pair[index]["iqr_s"] * 1e3 / 2 for pair in pairs]
            ax.errorbar(tokens, medians, yerr=spread, label=label, color=colour, marker=marker, linestyle=style,
                        lw=1.8, capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(tokens, [str(t) for t in tokens])
        ax.minorticks_off()
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_xlabel("tokens T in the sequence, the new one included")
        ax.set_ylabel("ms per generated token (median)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(frameon=False)
        fig.tight_layout()
    return fig


def plot_heads_map(results: dict):
    """The heads map at a glance: batched ÷ stacked time in every cell of tokens ``T`` x heads ``h``.

    Each cell is coloured by the ratio (a log scale centred on 1) and shows it; a thick line runs
    between the cells where the batched module is faster beyond the run's spread and the others;
    hatched cells, marked ``tie``, are within the run's own spread (the tie band).

    Example:
        >>> rows = [{"config": f"c{t}{h}", "implementation": "batched", "mode": "forward", "num_tokens": t,
        ...          "num_heads": h, "vs_stacked": r, "verdict": v}
        ...         for t, h, r, v in ((8, 1, 1.0, "tie"), (8, 4, 0.5, "batched"), (16, 1, 1.5, "stacked"),
        ...                            (16, 4, 2.0, "stacked"))]
        >>> fig = plot_heads_map({"rows": rows, "meta": {"threads": 1}})
        >>> [t.get_text() for t in fig.axes[0].texts]
        ['1.00\\ntie', '0.50', '1.50', '2.00']
    """
    import math

    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FixedLocator, NullLocator

    from ..plots import SEQUENTIAL_CMAP, book_figsize, house_style

    cells = heads_map_cells(results)
    tokens = sorted({t for t, _ in cells})
    heads = sorted({h for _, h in cells})
    ratio = np.full((len(tokens), len(heads)), np.nan)
    for i, t in enumerate(tokens):
        for j, h in enumerate(heads):
            if (t, h) in cells:
                ratio[i, j] = cells[(t, h)]["vs_stacked"]
    reach = max(math.log2(1.5), float(np.nanmax(np.abs(np.log2(ratio)))))
    norm = LogNorm(2 ** -reach, 2 ** reach)
    cmap = plt.get_cmap(SEQUENTIAL_CMAP)
    with house_style():
        fig, ax = plt.subplots(figsize=book_figsize(1.0, aspect=0.6), layout="constrained")
        image = ax.imshow(ratio, cmap=cmap, norm=norm, origin="lower", aspect="auto")
        for i, t in enumerate(tokens):
            for j, h in enumerate(heads):
                cell = cells.get((t, h))
                if cell is None:
                    continue
                tie = cell["verdict"] == "tie"
                red, green, blue, _ = cmap(norm(cell["vs_stacked"]))
                ink = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"
                if tie:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", lw=0,
                                           edgecolor=ink, alpha=0.35))
                ax.text(j, i, f"{cell['vs_stacked']:.2f}" + ("\ntie" if tie else ""), ha="center", va="center",
                        color=ink, fontsize=9, linespacing=0.95)
        # The border of the region where batching wins: between a cell it wins and a neighbour it does not.
        wins = {key: cell["verdict"] == "batched" for key, cell in cells.items()}
        for i, t in enumerate(tokens):
            for j, h in enumerate(heads):
                here = wins.get((t, h))
                if j + 1 < len(heads) and here is not None and wins.get((t, heads[j + 1])) not in (None, here):
                    ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], color="black", linestyle="-", lw=2.5, solid_capstyle="butt")
                if i + 1 < len(tokens) and here is not None and wins.get((tokens[i + 1], h)) not in (None, here):
                    ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], color="black", linestyle="-", lw=2.5, solid_capstyle="butt")
        ax.set_xticks(range(len(heads)), [str(h) for h in heads])
        ax.set_yticks(range(len(tokens)), [str(t) for t in tokens])
        ax.set_xlabel("heads h (the model width fixed: each head 1/h of it)")
        ax.set_ylabel("tokens T per sequence")
        threads = results.get("meta", {}).get("threads")
        ax.set_title("batched ÷ stacked time, forward" + (f", {threads_text(results['meta'])}" if threads else ""))
        bar = fig.colorbar(image, ax=ax, shrink=0.9, pad=0.02)
        marks = [v for v in (0.25, 0.5, 0.67, 1.0, 1.5, 2.0, 4.0) if 2 ** -reach <= v <= 2 ** reach]
        bar.ax.yaxis.set_major_locator(FixedLocator(marks))
        bar.ax.yaxis.set_minor_locator(NullLocator())
        bar.ax.set_yticklabels([f"{v:g}" for v in marks])
        bar.set_label("below 1: batched faster; above 1: slower")
    return fig


def plot_tiled(results: dict):
    """Peak memory (left) and median time (right) against the length, for the explicit scores,
    the tiled loop and the fused kernel of a tiled run (log-log): the forward pass with filled
    markers, and, where the run holds them, the forward and backward passes with open markers of
    other shapes.

    Example:
        >>> rows = [{"config": f"tiled-{t}", "implementation": n, "mode": "tiled", "num_tokens": t,
        ...          "median_s": 1e-3 * f, "iqr_s": 0.0, "peak_bytes": int(2**20 * f * t)}
        ...         for t in (256, 512) for n, f in (("scores", 4), ("tiled", 1), ("sdpa", 0.5))]
        >>> fig = plot_tiled({"rows": rows})
        >>> fig.axes[0].get_legend_handles_labels()[1]
        ['explicit scores', 'tiled loop (Python)', 'fused kernel (SDPA)']
        >>> rows += [{**r, "mode": "tiled-training"} for r in rows]
        >>> plot_tiled({"rows": rows}).axes[0].get_legend_handles_labels()[1][3:]
        ['explicit scores, training', 'tiled loop (Python), training', 'fused kernel (SDPA), training']
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..plots import OKABE_ITO, book_figsize, house_style
    from .tiled import has_training_rows, tiled_rows
    from .tiled_steps import TILED_IMPLEMENTATIONS, TILED_MODE, TRAINING_MODE

    modes = [TILED_MODE] + ([TRAINING_MODE] if has_training_rows(results) else [])
    labels = {"scores": "explicit scores", "tiled": "tiled loop (Python)", "sdpa": "fused kernel (SDPA)"}
    markers, dashes = {"scores": "o", "tiled": "s", "sdpa": "^"}, {"scores": "-", "tiled": "--", "sdpa": ":"}
    training_markers = {"scores": "D", "tiled": "v", "sdpa": "P"}  # a shape of their own, open
    with house_style():
        fig, (memory, time) = plt.subplots(1, 2, figsize=book_figsize(1.0, aspect=0.46 + 0.06 * (len(modes) - 1)),
                                           layout="constrained")
        for mode in modes:
            by_name = tiled_rows(results, mode)
            training = mode == TRAINING_MODE
            for index, name in enumerate(TILED_IMPLEMENTATIONS):
                rows = by_name[name]
                tokens = [r["num_tokens"] for r in rows]
                style = dict(color=OKABE_ITO[index], marker=(training_markers if training else markers)[name],
                             linestyle=dashes[name],
                             lw=1.2 if training else 1.8, label=labels[name] + (", training" if training else ""),
                             markerfacecolor="white" if training else OKABE_ITO[index])
                if all("peak_bytes" in r for r in rows):
                    memory.plot(tokens, [max(r["peak_bytes"], 1) / 2**20 for r in rows], **style)
                time.plot(tokens, [r["median_s"] * 1e3 for r in rows], **style)
        ticks = [r["num_tokens"] for r in tiled_rows(results)["sdpa"]]
        for ax, ylabel in ((memory, "peak memory of one call (MiB)"), (time, "median time (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.set_xlabel("tokens T")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
        handles, names = time.get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncol=3 if len(modes) == 1 else 2, frameon=False)
    return fig


def plot_latent(results: dict):
    """Median time of one decoded token (left) and the cache held (right) against the cached tokens,
    for the four ways of a latent run (log-log).

    Example:
        >>> from mha_course.bench.latent import LATENT_IMPLEMENTATIONS
        >>> rows = [{"config": f"latent-{s}", "implementation": n, "mode": "latent-decode", "num_tokens": s,
        ...          "median_s": 1e-6 * s * (i + 1), "cache_bytes": 100 * s} for s in (256, 1024)
        ...         for i, n in enumerate(LATENT_IMPLEMENTATIONS)]
        >>> plot_latent({"rows": rows}).axes[0].get_legend_handles_labels()[1]
        ['multi-head', 'grouped-query', 'latent, expanded', 'latent, absorbed']
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..plots import book_figsize, house_style, line_style
    from ..tables import format_bytes
    from .latent import LATENT_IMPLEMENTATIONS, latent_rows

    labels = dict(zip(LATENT_IMPLEMENTATIONS, ["multi-head", "grouped-query", "latent, expanded", "latent, absorbed"]))
    by_name = latent_rows(results)
    with house_style():
        fig, (time, cache) = plt.subplots(1, 2, figsize=book_figsize(1.0, aspect=0.5), layout="constrained")
        for index, name in enumerate(LATENT_IMPLEMENTATIONS):
            rows = by_name[name]
            tokens = [r["num_tokens"] for r in rows]
            style = dict(label=labels[name], lw=1.8, markersize=4.5, **line_style(index))
            time.plot(tokens, [r["median_s"] * 1e3 for r in rows], **style)
            cache.plot(tokens, [r["cache_bytes"] for r in rows], **style)
        ticks = [r["num_tokens"] for r in by_name["latent"]]
        for ax, ylabel in ((time, "median time of one token (ms)"), (cache, "cache held")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("cached tokens S")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
        time.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        cache.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value)))
        handles, names = time.get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncol=4, frameon=False, handlelength=2.6)
    return fig


def plot_deltanet(results: dict):
    """A state run, log-log: a prompt's median time against its length for the chunked and recurrent forms
    of the gated delta rule and for softmax attention's fused kernel (left), and one decoded token's
    median time against the tokens before it, with a key/value cache and with Gated DeltaNet's state
    (right).

    Example:
        >>> rows = [{"implementation": n, "mode": "deltanet-prompt", "num_tokens": t, "median_s": f * t}
        ...         for t in (256, 1024) for n, f in (("chunked", 1), ("recurrent", 4), ("sdpa", 2))]
        >>> rows += [{"implementation": n, "mode": "deltanet-decode", "num_tokens": t, "median_s": f}
        ...          for t in (16, 64) for n, f in (("kv_cache", t), ("state", 30))]
        >>> fig = plot_deltanet({"rows": rows})
        >>> [ax.get_legend_handles_labels()[1] for ax in fig.axes]
        [['chunked form', 'recurrent form', 'softmax attention (SDPA)'], ['key/value cache', 'fixed state']]
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..plots import OKABE_ITO, book_figsize, house_style
    from .deltanet import deltanet_rows
    from .deltanet_steps import DECODE_MODE, PROMPT_MODE

    panels = ((PROMPT_MODE, {"chunked": "chunked form", "recurrent": "recurrent form",
                             "sdpa": "softmax attention (SDPA)"}, "prompt of T tokens", "median time (ms)"),
              (DECODE_MODE, {"kv_cache": "key/value cache", "state": "fixed state"}, "token T decoded",
               "median time per token (ms)"))
    markers, dashes = ("o", "s", "^"), ("-", "--", ":")
    with house_style():
        fig, axes = plt.subplots(1, 2, figsize=book_figsize(1.0, aspect=0.5), layout="constrained")
        for ax, (mode, labels, xlabel, ylabel) in zip(axes, panels):
            by_name = deltanet_rows(results, mode)
            for index, (name, label) in enumerate(labels.items()):
                rows = by_name[name]
                colour = OKABE_ITO[index if mode == PROMPT_MODE else index + 3]
                ax.plot([r["num_tokens"] for r in rows], [r["median_s"] * 1e3 for r in rows], color=colour,
                        marker=markers[index], linestyle=dashes[index], lw=1.8, label=label)
            ticks = [r["num_tokens"] for r in next(iter(by_name.values()))]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
            ax.minorticks_off()
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(loc="upper left", frameon=False)
    return fig


def plot_window(results: dict):
    """Median time (left) and peak memory (right) of one call against the window, for the tiled loop
    and the fused kernel given the window's mask, at each length of a window run (forward pass;
    log-log). The causal mask alone is drawn at its length, where the window covers everything.

    Example:
        >>> rows = [{"mode": "window", "num_tokens": t, "window": w, "implementation": n,
        ...          "median_s": 1e-3 * (w or t) / t * (1 if n == "tiled" else 3), "peak_bytes": 2**20 * t}
        ...         for t in (64, 128) for w in (8, 32, None) for n in ("tiled", "sdpa")]
        >>> plot_window({"rows": rows}).axes[0].get_legend_handles_labels()[1]
        ['tiled loop, T = 64', 'tiled loop, T = 128', 'SDPA with the mask, T = 64', 'SDPA with the mask, T = 128']
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..plots import OKABE_ITO, book_figsize, house_style
    from ..tables import format_bytes
    from .tiled_steps import WINDOW_IMPLEMENTATIONS, WINDOW_MODE
    from .window import window_rows

    rows = window_rows(results, WINDOW_MODE)
    lengths = sorted({r["num_tokens"] for r in rows})
    labels = {"tiled": "tiled loop", "sdpa": "SDPA with the mask"}
    markers = ("s", "o", "^", "D")
    with house_style():
        fig, (time, memory) = plt.subplots(1, 2, figsize=book_figsize(1.0, aspect=0.5), layout="constrained")
        has_memory = all("peak_bytes" in r for r in rows)
        for index, name in enumerate(WINDOW_IMPLEMENTATIONS):
            for k, t in enumerate(lengths):
                mine = [r for r in rows if r["implementation"] == name and r["num_tokens"] == t]
                windows = [r["window"] or t for r in mine]
                style = dict(color=OKABE_ITO[index], marker=markers[k % len(markers)],
                             linestyle=("-", "--", ":", "-.")[k % 4], lw=1.8, label=f"{labels[name]}, T = {t}")
                time.plot(windows, [r["median_s"] * 1e3 for r in mine], **style)
                if has_memory:
                    memory.plot(windows, [max(r["peak_bytes"], 1) for r in mine], **style)
        ticks = sorted({r["window"] or r["num_tokens"] for r in rows})
        for ax, ylabel in ((time, "median time (ms)"), (memory, "peak memory of one call")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=10 if ax is time else 4)  # bytes: a tick every factor of 4
            ax.set_xticks(ticks, [f"{w // 1024}k" if w >= 1024 else str(w) for w in ticks])
            ax.minorticks_off()
            ax.set_xlabel("window (T: the causal mask alone)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
        time.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        memory.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value)))
        handles, names = time.get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncol=2, frameon=False)
    return fig


def _save(figure, path) -> Path:
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return Path(path)


def save_plot(results: dict, path) -> Path:
    """Draw :func:`plot_results`, save it as ``path`` (PNG) and close it; return the path.

    The backend is left as it is (a notebook keeps its inline figures): the figure is never shown.
    """
    return _save(plot_results(results), path)


def save_decode_plot(results: dict, path) -> Path:
    """Draw :func:`plot_decode`, save it as ``path`` (PNG) and close it; return the path."""
    return _save(plot_decode(results), path)


def save_heads_map_plot(results: dict, path) -> Path:
    """Draw :func:`plot_heads_map`, save it as ``path`` (PNG) and close it; return the path."""
    return _save(plot_heads_map(results), path)


def save_tiled_plot(results: dict, path) -> Path:
    """Draw :func:`plot_tiled`, save it as ``path`` (PNG) and close it; return the path."""
    return _save(plot_tiled(results), path)


def save_latent_plot(results: dict, path) -> Path:
    """Draw :func:`plot_latent`, save it as ``path`` (PNG) and close it; return the path."""
    return _save(plot_latent(results), path)


def save_deltanet_plot(results: dict, path) -> Path:
    """Draw :func:`plot_deltanet`, save it as ``path`` (PNG) and close it; return the path."""
    return _save(plot_deltanet(results), path)


def save_window_plot(results: dict, path) -> Path:
    """Draw :func:`plot_window`, save it as ``path`` (PNG) and close it; return the path."""
    return _save(plot_window(results), path)
