"""The benchmark's results: written as JSON and CSV, read back, looked up, compared and tabulated.

Nothing here measures or needs a POSIX system: chapter 4 reads the stored files through these
functions on any operating system.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..tables import Table
from .steps import MODES

#: Version of the results format; bumped when a field changes meaning. (Runs since the stability
#: check also hold ``meta.load`` and ``meta.stability_warnings``; older files lack them.)
FORMAT_VERSION = 1

#: The references that every time is divided by: column of the results -> implementation.
BASELINES = {"vs_batched": "batched", "vs_raw_sdpa": "raw_sdpa"}

CSV_FIELDS = ["config", "implementation", "mode", "median_s", "iqr_s", "runs", "vs_batched", "vs_raw_sdpa",
              "peak_bytes", "memory_vs_raw_sdpa", "minor_faults_per_call", "multiply_adds", "flops_per_s",
              "ceiling_fraction", "max_abs_diff", "skipped"]


def add_ratios(rows: list[dict]) -> list[dict]:
    """Add ``vs_batched``, ``vs_raw_sdpa`` and ``memory_vs_raw_sdpa`` to measured rows, in place.

    Each ratio divides a row's median time (or peak memory) by that of the reference
    implementation measured for the same config and mode in the same run; it is ``None`` when the
    reference was not measured (or used no memory at all).

    Example:
        >>> rows = [{"config": "c", "mode": "forward", "implementation": "batched", "median_s": 2.0},
        ...         {"config": "c", "mode": "forward", "implementation": "fast", "median_s": 1.0}]
        >>> [r["vs_batched"] for r in add_ratios(rows)]
        [1.0, 0.5]
    """
    measured = [r for r in rows if not r.get("skipped")]
    index = {(r["config"], r["mode"], r["implementation"]): r for r in measured}
    for row in measured:
        for key, base in BASELINES.items():
            reference = index.get((row["config"], row["mode"], base))
            row[key] = row["median_s"] / reference["median_s"] if reference else None
        reference = index.get((row["config"], row["mode"], "raw_sdpa"))
        if "peak_bytes" in row:
            row["memory_vs_raw_sdpa"] = (row["peak_bytes"] / reference["peak_bytes"]
                                         if reference and reference.get("peak_bytes") else None)
    return rows


#: The CSV columns of a decoding run (``bench --decode``, ``meta.benchmark == "decode"``).
DECODE_CSV_FIELDS = ["config", "implementation", "mode", "num_tokens", "median_s", "iqr_s", "runs", "vs_recompute",
                     "multiply_adds", "flops_per_s", "ceiling_fraction", "max_abs_diff", "cache_bytes"]


def results_stem(device: str, label: str | None = None, benchmark: str | None = None) -> str:
    """File name stem of a results file: ``bench-cpu``, ``bench-cuda-quick``, ``bench-decode-cpu``, ..."""
    return "bench-" + (f"{benchmark}-" if benchmark else "") + device + (f"-{label}" if label else "")


def write_results(results: dict, out_dir, label: str | None = None, plot: bool = True) -> list[Path]:
    """Write ``results`` to ``out_dir`` as JSON, CSV and (with ``plot``) PNG; return the paths.

    A decoding run (``results["meta"]["benchmark"] == "decode"``) is written as
    ``bench-decode-DEVICE[-LABEL]``, with its own CSV columns and figure.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    benchmark = results["meta"].get("benchmark")
    stem = results_stem(results["meta"]["device"], label, benchmark)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.csv"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    with paths[1].open("w", newline="", encoding="utf-8") as handle:
        fields = DECODE_CSV_FIELDS if benchmark == "decode" else CSV_FIELDS
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in results["rows"]:
            writer.writerow(row)
    if plot:
        if benchmark == "decode":
            from .decode import save_decode_plot as save_plot
        else:
            from .plots import save_plot

        paths.append(save_plot(results, out_dir / f"{stem}.png"))
    return paths


def load_results(path) -> dict:
    """Read a results file written by :func:`write_results`, checking its format version."""
    path = Path(path)
    results = json.loads(path.read_text(encoding="utf-8"))
    version = results.get("meta", {}).get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} has results format {version!r}; this package reads format "
                         f"{FORMAT_VERSION}. Rerun `python -m mha_course bench` to regenerate it.")
    return results


def select(results: dict, config: str | None = None, mode: str | None = None,
           implementation: str | None = None, measured_only: bool = True) -> list[dict]:
    """The rows of ``results`` matching the given config, mode and implementation."""
    return [r for r in results["rows"]
            if (config is None or r["config"] == config) and (mode is None or r["mode"] == mode)
            and (implementation is None or r["implementation"] == implementation)
            and not (measured_only and r.get("skipped"))]


def lookup(results: dict, config: str, mode: str, implementation: str) -> dict:
    """The one measured row for (config, mode, implementation); a clear error if absent."""
    rows = select(results, config, mode, implementation)
    if len(rows) != 1:
        raise KeyError(f"no measured row for config={config!r}, mode={mode!r}, "
                       f"implementation={implementation!r} in these results.")
    return rows[0]


def compare_times(results: dict, config: str, mode: str, numerator: str, denominator: str) -> dict:
    """Compare two implementations' times: the ratio of medians, and whether it beats the spread.

    ``verdict`` is ``"tie"`` when the medians differ by no more than the mean of the two
    interquartile ranges (the difference is within the run's own noise), else the name of the
    faster implementation.

    Example:
        >>> rows = [{"config": "c", "mode": "forward", "implementation": n, "median_s": m, "iqr_s": 0.1}
        ...         for n, m in (("batched", 1.0), ("stacked", 2.0))]
        >>> compare_times({"rows": rows}, "c", "forward", "batched", "stacked")
        {'ratio': 0.5, 'verdict': 'batched'}
    """
    a, b = lookup(results, config, mode, numerator), lookup(results, config, mode, denominator)
    if abs(a["median_s"] - b["median_s"]) <= (a["iqr_s"] + b["iqr_s"]) / 2:
        verdict = "tie"
    else:
        verdict = numerator if a["median_s"] < b["median_s"] else denominator
    return {"ratio": a["median_s"] / b["median_s"], "verdict": verdict}


def results_table(results: dict, config: str, mode: str) -> Table:
    """One size in one mode: times, ratios, FLOP/s, memory and faults, one row per implementation.

    The table's title names the size (with its description) and the mode.
    """
    memory = results["meta"].get("memory_measured", True)
    columns = ["implementation", "median", "IQR", "× batched", "× raw SDPA", "GFLOP/s", "% of ceiling"]
    if memory:
        columns += ["peak memory", "faults/call"]
    rows, notes = [], []
    for row in select(results, config, mode, measured_only=False):
        if row.get("skipped"):
            rows.append([row["implementation"], "skipped"] + [None] * (len(columns) - 2))
            if f"skipped: {row['skipped']}" not in notes:
                notes.append(f"skipped: {row['skipped']}")
            continue
        cells = [row["implementation"], row["median_s"], row["iqr_s"], row.get("vs_batched"),
                 row.get("vs_raw_sdpa"), row["flops_per_s"] / 1e9, 100 * row["ceiling_fraction"]]
        if memory:
            cells += [row.get("peak_bytes"), row.get("minor_faults_per_call")]
        rows.append(cells)
    formats = {"median": "time", "IQR": "time", "× batched": ".2f", "× raw SDPA": ".2f", "% of ceiling": ".0f"}
    if memory:
        formats.update({"peak memory": "bytes", "faults/call": "count"})
    described = {c["name"]: c["description"] for c in results.get("configs", [])}
    title = f"{config} ({described[config]}), {mode}" if config in described else f"{config}, {mode}"
    return Table(columns, rows, title=title, formats=formats, notes=notes)


def threads_text(meta: dict) -> str:
    """``1 thread`` or ``2 threads``."""
    return f"{meta['threads']} thread" + ("" if meta["threads"] == 1 else "s")


def summary(results: dict) -> str:
    """A plain-text summary of a run: the machine, then one table per (config, mode)."""
    meta = results["meta"]
    parts = [f"{meta['device_name']} ({meta['device']}, {threads_text(meta)}), torch {meta['torch']}, "
             f"{meta['date']}; matmul ceiling {meta['matmul_ceiling']['flops_per_s'] / 1e9:.1f} GFLOP/s; "
             f"run took {meta['wall_time_s']:.0f} s"]
    for config in results["configs"]:
        for mode in MODES:
            if select(results, config["name"], mode, measured_only=False):
                parts.append("\n" + str(results_table(results, config["name"], mode)))
    return "\n".join(parts)
