"""The benchmark's figure: bar charts of one metric, a panel per (mode, size)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .results import select, threads_text
from .steps import MODES


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
    colours = plt.get_cmap("tab10")
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
                ax.barh(k, value, xerr=error, color=colours(k % 10))
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


def save_plot(results: dict, path) -> Path:
    """Draw :func:`plot_results` off screen and save it as ``path`` (PNG); return the path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figure = plot_results(results)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return Path(path)
