"""The heads map's results, read back: the cells of the map, its table and summary.

Reading is kept apart from running (:mod:`mha_course.bench.heads_map`), so that chapter 3, the
figures (:mod:`mha_course.bench.plots`) and the files (:mod:`mha_course.bench.files`) read a
heads map without importing what measures one.
"""

from __future__ import annotations

from ..tables import Table, format_bytes
from .results import run_header, select, threads_text

#: The benchmark's name in ``meta.benchmark`` and in its files' names.
HEADS_MAP = "heads-map"

#: The two implementations of the map, from :data:`mha_course.implementations.IMPLEMENTATIONS`.
HEADS_MAP_IMPLEMENTATIONS = ("stacked", "batched")


def heads_map_cells(results: dict) -> dict[tuple[int, int], dict]:
    """``(num_tokens, num_heads)`` -> the batched row of that cell (with ``vs_stacked`` and ``verdict``).

    Example:
        >>> rows = [{"config": "c", "implementation": "batched", "mode": "forward", "num_tokens": 8,
        ...          "num_heads": 2, "vs_stacked": 0.5, "verdict": "batched"}]
        >>> heads_map_cells({"rows": rows})[(8, 2)]["vs_stacked"]
        0.5
    """
    cells = {(row["num_tokens"], row["num_heads"]): row for row in select(results, mode="forward",
                                                                          implementation="batched")
             if "vs_stacked" in row}
    if not cells:
        raise ValueError("these results hold no heads-map cells (batched rows with vs_stacked). Write them with "
                         "`python -m mha_course bench --heads-map`.")
    return cells


def heads_map_table(results: dict) -> Table:
    """The map as a table: one row per sequence length, one column per number of heads, batched ÷ stacked.

    A cell within the run's own spread reads ``tie``-marked (``≈``) before its ratio.
    """
    cells = heads_map_cells(results)
    tokens = sorted({t for t, _ in cells})
    heads = sorted({h for _, h in cells})
    rows = [[t] + [(("≈" if cells[(t, h)]["verdict"] == "tie" else "") + f"{cells[(t, h)]['vs_stacked']:.2f}")
                   if (t, h) in cells else None for h in heads] for t in tokens]
    meta = results["meta"]
    return Table(["tokens T"] + [f"{h} head{'s' if h > 1 else ''}" for h in heads], rows,
                 title=f"batched ÷ stacked time, forward, on {meta['device_name']} ({threads_text(meta)})",
                 notes=["above 1: the batched module is slower; ≈: a tie, within the run's own spread."],
                 align={f"{h} head{'s' if h > 1 else ''}": "right" for h in heads})


def heads_map_summary(results: dict) -> str:
    """A plain-text summary of a heads-map run: the machine, its caches, then the map as a table."""
    caches = results["meta"].get("caches", {}).get("caches", [])
    text = ", ".join(f"{c['name']} {format_bytes(c['bytes'])}" + (f" shared by {c['shared_by']} cores"
                                                                   if (c.get("shared_by") or 1) > 1 else "")
                     for c in caches) or "not reported"
    return f"{run_header(results['meta'])}\ncaches: {text}\n\n{heads_map_table(results)}"
