"""The benchmark's figures: bar charts of one metric per (mode, size), and times relative to one
implementation, a panel per size (chapter 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .results import lookup, select, threads_text
from .steps import MODES

#: Okabe and Ito's colour-blind-safe palette (black left out), for bars told apart by colour.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")


def plot_results(results: dict, metric: str = "median_s", configs: Iterable[str] | None = None):
    """Bar charts of one metric: a panel per (mode, config), one bar per implementation.

    ``metric`` is ``"median_s"`` (drawn in ms, with the spread as an error bar) or
    ``"peak_bytes"`` (drawn in MiB). Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    if metric not in ("median_s", "peak_bytes"):
        raise ValueError(f"metric must be 'median_s' or 'peak_bytes', got {metric!r}.")
    configs = list(configs or [c["name"] for c in results["configs"]])
    modes = [m for m in MODES if select(results, mode=m)]
    names = list(results["implementations"])
    figure, axes = plt.subplots(len(modes), len(configs), figsize=(3.4 * len(configs), 0.45 * len(names) * len(modes) + 1.2),
                                squeeze=False, sharey=True)
    scale, unit = (1e3, "ms") if metric == "median_s" else (1 / 2**20, "MiB")
    for i, mode in enumerate(modes):
        for j, config in enumerate(configs):
            ax = axes[i][j]
            for k, name in enumerate(names):
                rows = select(results, config, mode, name, measured_only=False)
                if rows and rows[0].get("skipped"):
                    ax.text(0, k, " n/a", va="center", fontsize=8, color="grey")
                if not rows or rows[0].get(metric) is None:
                    continue
                value = rows[0][metric] * scale
                error = rows[0]["iqr_s"] * scale / 2 if metric == "median_s" else None
                ax.barh(k, value, xerr=error, color=PALETTE[k % len(PALETTE)])
            ax.set_yticks(range(len(names)), names)
            ax.set_title(f"{config}, {mode}", fontsize=9)
            ax.set_xlabel(unit)
            ax.grid(axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()  # the axes share y: invert once, so the course's order reads top-down
    meta = results["meta"]
    what = "median time per call" if metric == "median_s" else "peak memory of one call"
    figure.suptitle(f"{what}: {meta['device_name']} ({meta['device']}, {threads_text(meta)}), "
                    f"torch {meta['torch']}, {meta['date']}", fontsize=10)
    figure.tight_layout()
    return figure


def plot_relative_times(results: dict, configs: Iterable[str] | None = None, reference: str = "batched"):
    """Every implementation's median time as a multiple of ``reference``'s, a panel per size.

    Two bars per implementation, forward (filled) and training step (hatched), drawn from the
    line at 1 on a log axis: a bar that goes left is faster than ``reference``, one that goes right
    slower, both measured in the same run. Skipped implementations are marked ``n/a``.

    Returns:
        The matplotlib figure.
    """
    import matplotlib.pyplot as plt

    configs = list(configs or [c["name"] for c in results["configs"]])
    names = list(results["implementations"])
    modes = [m for m in MODES if select(results, mode=m)]
    styles = {"forward": dict(color=PALETTE[0], hatch=None, label="forward"),
              "forward+backward": dict(color=PALETTE[1], hatch="///", label="training step")}
    figure, axes = plt.subplots(1, len(configs), figsize=(7.3, 0.42 * len(names) + 1.6),
                                sharey=True, squeeze=False)
    height = 0.8 / len(modes)
    for ax, config in zip(axes[0], configs):
        for k, name in enumerate(names):
            for m, mode in enumerate(modes):
                rows = select(results, config, mode, name)
                y = k - 0.4 + height * (m + 0.5)
                if not rows:
                    ax.text(1.0, y, " n/a", va="center", fontsize=9, color="#555555")
                    continue
                ratio = rows[0]["median_s"] / lookup(results, config, mode, reference)["median_s"]
                style = styles[mode]
                ax.barh(y, ratio - 1.0, left=1.0, height=height, color=style["color"], hatch=style["hatch"],
                        edgecolor="white" if style["hatch"] else style["color"],
                        label=style["label"] if k == 0 else None)
        ax.axvline(1.0, color="#555555", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlim(0.2, 3.0)
        ax.set_xticks([0.25, 0.5, 1, 2], ["0.25", "0.5", "1", "2"])
        ax.minorticks_off()
        ax.set_title(config, fontsize=10)
        ax.set_xlabel(f"time ÷ {reference}")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(names)), names)
    axes[0][0].invert_yaxis()  # the axes share y: invert once, so the course's order reads top-down
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    return figure


def save_plot(results: dict, path) -> Path:
    """Draw :func:`plot_results` off screen and save it as ``path`` (PNG); return the path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figure = plot_results(results)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return Path(path)
