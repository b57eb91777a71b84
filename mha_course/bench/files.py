"""A benchmark run's files: JSON (everything), CSV (one row per measurement) and a PNG figure.

Writing sits above both reading (:mod:`~mha_course.bench.results`) and drawing
(:mod:`~mha_course.bench.plots`), which read results and never write them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .plots import (save_decode_plot, save_deltanet_plot, save_heads_map_plot, save_latent_plot, save_plot,
                    save_tiled_plot, save_window_plot)
from .results import (CSV_FIELDS, DECODE_CSV_FIELDS, DELTANET_CSV_FIELDS, GROUPED_CSV_FIELDS, HEADS_MAP_CSV_FIELDS,
                      LATENT_CSV_FIELDS, TILED_CSV_FIELDS, WINDOW_CSV_FIELDS,
                      results_stem)


def write_results(results: dict, out_dir, label: str | None = None, plot: bool = True) -> list[Path]:
    """Write ``results`` to ``out_dir`` as JSON, CSV and (with ``plot``) PNG; return the paths.

    A decoding run (``results["meta"]["benchmark"] == "decode"``) is written as
    ``bench-decode-DEVICE[-LABEL]``, a heads map (``"heads-map"``) as
    ``bench-heads-map-DEVICE[-LABEL]``, a tiled run (``"tiled"``) as
    ``bench-tiled-DEVICE[-LABEL]``, a latent run (``"latent"``) as ``bench-latent-DEVICE[-LABEL]`` and a
    state run (``"deltanet"``) as ``bench-deltanet-DEVICE[-LABEL]``, a window run (``"window"``) as
    ``bench-window-DEVICE[-LABEL]``, each with its own CSV columns and
    figure; a grouped run (``"grouped"``) as ``bench-grouped-DEVICE[-LABEL]``, without a figure (its table
    says it all).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    benchmark = results["meta"].get("benchmark")
    stem = results_stem(results["meta"]["device"], label, benchmark)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.csv"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    with paths[1].open("w", newline="", encoding="utf-8") as handle:
        fields = {"decode": DECODE_CSV_FIELDS, "heads-map": HEADS_MAP_CSV_FIELDS,
                  "tiled": TILED_CSV_FIELDS, "grouped": GROUPED_CSV_FIELDS,
                  "latent": LATENT_CSV_FIELDS, "deltanet": DELTANET_CSV_FIELDS,
                  "window": WINDOW_CSV_FIELDS}.get(benchmark, CSV_FIELDS)
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in results["rows"]:
            writer.writerow(row)
    if plot and benchmark != "grouped":
        save = {"decode": save_decode_plot, "heads-map": save_heads_map_plot,
                "tiled": save_tiled_plot, "latent": save_latent_plot,
                "deltanet": save_deltanet_plot,
                "window": save_window_plot}.get(benchmark, save_plot)
        paths.append(save(results, out_dir / f"{stem}.png"))
    return paths
