"""The benchmark's results: read back, looked up, compared and tabulated (:mod:`~mha_course.bench.files` writes them).

Nothing here measures or needs a POSIX system: chapter 4 reads the stored files through these
functions on any operating system.
"""

from __future__ import annotations

import json

from ..implementations import IMPLEMENTATIONS
from ..notebook_files import find_data
from ..tables import Table
from .steps import MODE_LABELS, MODES

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


#: The CSV columns of a heads map (``bench --heads-map``, ``meta.benchmark == "heads-map"``).
HEADS_MAP_CSV_FIELDS = ["config", "implementation", "mode", "num_tokens", "num_heads", "head_dim", "median_s", "iqr_s",
                        "runs", "vs_stacked", "verdict", "multiply_adds", "flops_per_s", "ceiling_fraction",
                        "max_abs_diff", "score_bytes_one", "score_bytes_all"]

#: The CSV columns of a tiled run (``bench --tiled``, ``meta.benchmark == "tiled"``).
TILED_CSV_FIELDS = ["config", "implementation", "mode", "num_tokens", "median_s", "iqr_s", "runs", "vs_sdpa",
                    "score_bytes", "saved_bytes", "peak_bytes", "multiply_adds", "flops_per_s", "ceiling_fraction", "max_abs_diff"]


#: The CSV columns of a grouped run (``bench --grouped``, ``meta.benchmark == "grouped"``).
GROUPED_CSV_FIELDS = ["config", "implementation", "mode", "num_tokens", "num_cached", "num_kv_groups", "reference",
                      "median_s", "iqr_s", "runs", "vs_reference", "multiply_adds", "flops_per_s", "ceiling_fraction",
                      "max_abs_diff"]

#: The CSV columns of a window run (``bench --window``, ``meta.benchmark == "window"``).
WINDOW_CSV_FIELDS = ["config", "implementation", "mode", "num_tokens", "window", "median_s", "iqr_s", "runs",
                     "vs_full", "visible", "tiles", "peak_bytes", "max_abs_diff"]

#: The CSV columns of a latent run (``bench --latent``, ``meta.benchmark == "latent"``).
LATENT_CSV_FIELDS = ["config", "implementation", "mode", "num_tokens", "median_s", "iqr_s", "runs", "vs_grouped_query",
                     "cache_bytes", "multiply_adds", "flops_per_s", "ceiling_fraction", "max_abs_diff"]

#: The CSV columns of a state run (``bench --deltanet``, ``meta.benchmark == "deltanet"``).
DELTANET_CSV_FIELDS = ["config", "implementation", "mode", "num_tokens", "median_s", "iqr_s", "runs", "vs_sdpa",
                       "vs_kv_cache", "peak_bytes", "cache_bytes", "max_abs_diff"]


def results_stem(device: str, label: str | None = None, benchmark: str | None = None) -> str:
    """File name stem of a results file: ``bench-cpu``, ``bench-cuda-quick``, ``bench-decode-cpu``, ..."""
    return "bench-" + (f"{benchmark}-" if benchmark else "") + device + (f"-{label}" if label else "")


def load_results(path) -> dict:
    """Read a results file written by :func:`~mha_course.bench.files.write_results`, checking its format version.

    A path under ``data/`` that is not there is read from the package's copy of the book's stored
    runs (:func:`mha_course.notebook_files.find_data`)."""
    path = find_data(path)
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


def run_header(meta: dict) -> str:
    """One line on the run: the machine, its threads, torch, the date, the matmul ceiling, the run's length.

    Example:
        >>> run_header({"device_name": "a CPU", "device": "cpu", "threads": 2, "torch": "2.5.1",
        ...             "date": "2026-01-01", "matmul_ceiling": {"flops_per_s": 5.04e10}, "wall_time_s": 61.2})
        'a CPU (cpu, 2 threads), torch 2.5.1, 2026-01-01; matmul ceiling 50.4 GFLOP/s; run took 61 s'
    """
    return (f"{meta['device_name']} ({meta['device']}, {threads_text(meta)}), torch {meta['torch']}, "
            f"{meta['date']}; matmul ceiling {meta['matmul_ceiling']['flops_per_s'] / 1e9:.1f} GFLOP/s; "
            f"run took {meta['wall_time_s']:.0f} s")


def summary(results: dict) -> str:
    """A plain-text summary of a run: the machine (:func:`run_header`), then one table per (config, mode)."""
    parts = [run_header(results["meta"])]
    for config in results["configs"]:
        for mode in MODES:
            if select(results, config["name"], mode, measured_only=False):
                parts.append("\n" + str(results_table(results, config["name"], mode)))
    return "\n".join(parts)


def size_table(results: dict, config: str) -> Table:
    """One size, both modes: every implementation's time and its ratio to the batched module's,
    its FLOP/s, and the peak memory of a forward call.

    The two ``× batched`` columns divide the time before them by the batched module's time in the
    same mode and run. FLOP/s are ``2 * multiply-adds / median forward time``, with the
    multiply-adds of the cost formula (the full ``T x T`` square); a note names the
    implementations that run a fused kernel that may skip masked tiles (``fused`` in
    :data:`mha_course.implementations.IMPLEMENTATIONS`), for which the figure counts work they
    may not have done.

    Example:
        >>> rows = [{"config": "c", "mode": m, "implementation": n, "median_s": t, "iqr_s": 0.0,
        ...          "flops_per_s": 2e9, "peak_bytes": 2**20, "vs_batched": t / 2.0}
        ...         for m in MODES for n, t in (("batched", 2.0), ("fast", 1.0))]
        >>> results = {"meta": {"threads": 1}, "configs": [], "rows": rows}
        >>> print(size_table(results, "c"))
        c, 1 thread
        implementation  forward  × batched  training  × batched  GFLOP/s      peak
        --------------  -------  ---------  --------  ---------  -------  --------
        batched          2.00 s       1.00    2.00 s       1.00     2.00  1.00 MiB
        fast             1.00 s       0.50    1.00 s       0.50     2.00  1.00 MiB
        × batched: the time before it over the batched module's, same mode and run.
        GFLOP/s: 2 x the formula's multiply-adds / the forward time; peak: the peak memory of a forward call.
        fast: a fused kernel that may skip masked tiles; the formula counts them.
    """
    memory = results["meta"].get("memory_measured", True)
    columns = ["implementation", "forward", "× batched", "training", "× batched", "GFLOP/s"]
    if memory:
        columns.append("peak")
    names = list(dict.fromkeys(r["implementation"] for r in select(results, config, measured_only=False)))
    rows, notes, fused = [], [], []
    for name in names:
        forward = select(results, config, "forward", name, measured_only=False)
        training = select(results, config, "forward+backward", name, measured_only=False)
        if forward and forward[0].get("skipped"):
            rows.append([name, "skipped"] + [None] * (len(columns) - 2))
            if f"skipped: {forward[0]['skipped']}" not in notes:
                notes.append(f"skipped: {forward[0]['skipped']}")
            continue
        f = forward[0] if forward else {}
        t = training[0] if training and not training[0].get("skipped") else {}
        cells = [name, f.get("median_s"), f.get("vs_batched"), t.get("median_s"), t.get("vs_batched"),
                 f["flops_per_s"] / 1e9 if f.get("flops_per_s") else None]
        if memory:
            cells.append(f.get("peak_bytes"))
        rows.append(cells)
        if name in IMPLEMENTATIONS and IMPLEMENTATIONS[name].fused:
            fused.append(name)
    if fused:
        notes.insert(0, f"{', '.join(fused)}: a fused kernel that may skip masked tiles; "
                     "the formula counts them.")
    notes.insert(0, "GFLOP/s: 2 x the formula's multiply-adds / the forward time; peak: the "
                 "peak memory of a forward call.")
    notes.insert(0, "× batched: the time before it over the batched module's, same mode and run.")
    described = {c["name"]: c["description"] for c in results.get("configs", [])}
    what = f"{config} ({described[config]})" if config in described else config
    formats = {"forward": "time", "× batched": ".2f", "training": "time", "peak": "bytes"}
    return Table(columns, rows, title=f"{what}, {threads_text(results['meta'])}",
                 formats={k: v for k, v in formats.items() if k in columns}, notes=notes)


def versus_table(results: dict, numerator: str, denominator: str, configs=None,
                 title: str | None = None) -> Table:
    """``numerator`` over ``denominator`` per size: their work, and their time in each mode.

    Columns: the size, its number of heads, the ratio of the two implementations' multiply-adds
    (from the cost formulas: what the counts predict), then for each mode the ratio of their
    median times and which one was faster by :func:`compare_times` (``tie`` when the difference is
    within the run's own spread). ``title`` replaces the default one, which names the two
    implementations and the run's threads.

    Example:
        >>> rows = [{"config": "c", "mode": m, "implementation": n, "median_s": t, "iqr_s": 0.1,
        ...          "multiply_adds": w} for m in MODES
        ...         for n, t, w in (("batched", 1.0, 6), ("stacked", 2.0, 5))]
        >>> results = {"meta": {"threads": 1}, "configs": [{"name": "c", "num_heads": 2}],
        ...            "rows": rows}
        >>> print(versus_table(results, "batched", "stacked"))
        batched ÷ stacked, 1 thread
        size  heads  multiply-adds  forward  faster   training  faster
        ----  -----  -------------  -------  -------  --------  -------
        c         2           1.20     0.50  batched      0.50  batched
        ratios: batched over stacked (above 1: batched does more, or takes longer).
        faster: beyond the run's own spread; tie when within it.
    """
    configs = list(configs or [c["name"] for c in results["configs"]])
    heads = {c["name"]: c["num_heads"] for c in results.get("configs", [])}
    modes = [m for m in MODES if select(results, mode=m)]
    columns = ["size", "heads", "multiply-adds"]
    for mode in modes:
        columns += [MODE_LABELS[mode], "faster"]
    rows = []
    for config in configs:
        first = lookup(results, config, modes[0], numerator)
        work = first["multiply_adds"] / lookup(results, config, modes[0], denominator)["multiply_adds"]
        row = [config, heads.get(config), work]
        for mode in modes:
            duel = compare_times(results, config, mode, numerator, denominator)
            row += [duel["ratio"], duel["verdict"]]
        rows.append(row)
    formats = {name: ".2f" for name in ("multiply-adds", *MODE_LABELS.values())}
    notes = [f"ratios: {numerator} over {denominator} (above 1: {numerator} does more, or takes longer).",
             "faster: beyond the run's own spread; tie when within it."]
    title = title or f"{numerator} ÷ {denominator}, {threads_text(results['meta'])}"
    return Table(columns, rows, formats={k: v for k, v in formats.items() if k in columns},
                 title=title, notes=notes, align={"faster": "left"})


def threads_table(one: dict, two: dict, implementations=("stacked", "batched", "fast"),
                  configs=None) -> Table:
    """What more threads buy: each implementation's time in two runs of the same sizes with
    different thread counts, and the speed-up (the first run's time over the second's), per size
    and mode.

    Example:
        >>> rows = [{"config": "c", "mode": m, "implementation": "fast", "median_s": 1.0}
        ...         for m in MODES]
        >>> one = {"meta": {"threads": 1}, "configs": [{"name": "c"}], "rows": rows}
        >>> two = {"meta": {"threads": 2}, "configs": [{"name": "c"}],
        ...        "rows": [dict(r, median_s=0.5) for r in rows]}
        >>> print(threads_table(one, two, implementations=["fast"]))
        1 thread against 2 threads
        size  implementation  forward, 1  forward, 2  speed-up  training, 1  training, 2  speed-up
        ----  --------------  ----------  ----------  --------  -----------  -----------  --------
        c     fast                1.00 s      500 ms      2.00       1.00 s       500 ms      2.00
        forward, training: median times with 1 and with 2 threads; speed-up: the first over the second.
    """
    a, b = one["meta"]["threads"], two["meta"]["threads"]
    if a == b:
        raise ValueError(f"both runs used {threads_text(one['meta'])}; pass two runs with "
                         "different thread counts, e.g. bench-cpu.json and bench-cpu-2threads.json.")
    configs = list(configs or [c["name"] for c in one["configs"]])
    modes = [m for m in MODES if select(one, mode=m) and select(two, mode=m)]
    columns = ["size", "implementation"]
    for mode in modes:
        columns += [f"{MODE_LABELS[mode]}, {a}", f"{MODE_LABELS[mode]}, {b}", "speed-up"]
    rows = []
    for config in configs:
        for name in implementations:
            row = [config, name]
            for mode in modes:
                t1 = lookup(one, config, mode, name)["median_s"]
                t2 = lookup(two, config, mode, name)["median_s"]
                row += [t1, t2, t1 / t2]
            rows.append(row)
    formats = {name: (".2f" if name == "speed-up" else "time") for name in columns[2:]}
    note = (f"{', '.join(MODE_LABELS[m] for m in modes)}: median times with {a} and with {b} threads; "
            "speed-up: the first over the second.")
    return Table(columns, rows, key_columns=2, formats=formats, notes=[note],
                 title=f"{threads_text(one['meta'])} against {threads_text(two['meta'])}")
