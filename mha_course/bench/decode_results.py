"""The decoding benchmark's results, read back: one pair of rows per length, its table and summary.

Reading is kept apart from running (:mod:`mha_course.bench.decode`), so that chapter 6, the
figures (:mod:`mha_course.bench.plots`) and the files (:mod:`mha_course.bench.files`) read a
decoding run without importing what measures one.
"""

from __future__ import annotations

from ..tables import Table
from .results import run_header, select, threads_text

#: The mode every row of a decoding run has.
DECODE_MODE = "decode"

#: The two ways of producing the next token's output, by name.
DECODE_IMPLEMENTATIONS = {
    "recompute": "no cache: the layer on all T tokens again, the last output kept",
    "kv_cache": "KVCache: the layer on the new token only, reading the T - 1 cached keys and values",
}


def decode_rows(results: dict) -> list[tuple[dict, dict]]:
    """``(recompute row, kv_cache row)`` for every length of a decoding run, shortest first.

    Example:
        >>> rows = [{"config": "decode-8", "implementation": n, "mode": "decode", "num_tokens": 8}
        ...         for n in ("recompute", "kv_cache")]
        >>> [(a["implementation"], b["implementation"]) for a, b in decode_rows({"rows": rows})]
        [('recompute', 'kv_cache')]
    """
    pairs = {}
    for row in select(results, mode=DECODE_MODE):
        pairs.setdefault(row["num_tokens"], {})[row["implementation"]] = row
    missing = [t for t, pair in pairs.items() if set(pair) != set(DECODE_IMPLEMENTATIONS)]
    if missing or not pairs:
        raise ValueError("these results hold no complete decoding rows (recompute and kv_cache at every "
                         f"length){f'; incomplete at {missing} tokens' if missing else ''}. Write them with "
                         "`python -m mha_course bench --decode`.")
    return [(pairs[t]["recompute"], pairs[t]["kv_cache"]) for t in sorted(pairs)]


def decode_table(results: dict) -> Table:
    """Time per generated token with and without the cache, with the ratio measured in the run.

    ``× faster`` is the ratio of the two medians; ``× work`` the ratio of the multiply-adds of the
    two steps: recomputing a sequence of ``T`` tokens is ``T`` times the work of the cached step
    (:func:`mha_course.cost.grouped_query_multiply_adds`).
    """
    rows = [[recompute["num_tokens"], recompute["median_s"], cached["median_s"],
             recompute["median_s"] / cached["median_s"], cached["cache_bytes"],
             recompute["multiply_adds"] / cached["multiply_adds"]]
            for recompute, cached in decode_rows(results)]
    meta = results["meta"]
    config = results["configs"][0]["description"].split(":")[0] if results.get("configs") else "one layer"
    title = (f"One generated token, {config}: median time per token on {meta['device_name']} "
             f"({meta['device']}, {threads_text(meta)})")
    notes = ["× faster: the median time without the cache over the one with it, one run.",
             "cache held: one layer's keys and values, once the new token is in.",
             "× work: the multiply-adds of recomputing over the cached step's (= T)."]
    return Table(["tokens T", "no cache", "with cache", "× faster", "cache held", "× work"], rows, title=title,
                 formats={"no cache": "time", "with cache": "time", "× faster": ".1f", "cache held": "bytes",
                          "× work": "count"}, notes=notes)


def decode_summary(results: dict) -> str:
    """A plain-text summary of a decoding run: the machine (:func:`~mha_course.bench.results.run_header`),
    then the table."""
    return f"{run_header(results['meta'])}\n\n{decode_table(results)}"
