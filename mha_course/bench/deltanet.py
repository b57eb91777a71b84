"""The state benchmark (chapter 12): the gated delta rule against softmax attention, for a prompt and
for one decoded token.

``python -m mha_course bench --deltanet`` measures, on the CPU (or a GPU), two things:

* **a prompt** of ``T`` tokens, up to 16k (:data:`PROMPT_LENGTHS`), three ways
  (:data:`~mha_course.bench.deltanet_steps.PROMPT_IMPLEMENTATIONS`): the chunked and the recurrent
  forms of the gated delta rule, and causal softmax attention with PyTorch's fused kernel. Rows of
  mode ``"deltanet-prompt"`` hold the median time, its spread, the ratio to SDPA (``vs_sdpa``), the
  peak memory of one call in a fresh child process (:mod:`mha_course.bench.memory`, on the CPU), and
  for the chunked form its largest difference from the recurrent one (``max_abs_diff``);
* **one decoded token** after ``T - 1`` earlier ones (:data:`DECODE_LENGTHS`), by a layer of
  attention reading its key/value cache and by a Gated DeltaNet layer reading its state
  (:data:`~mha_course.bench.deltanet_steps.DECODE_IMPLEMENTATIONS`). Rows of mode
  ``"deltanet-decode"`` hold the median time, its spread, the ratio to the key/value cache
  (``vs_kv_cache``) and the bytes each cache holds (``cache_bytes``, :attr:`KVCache.nbytes
  <mha_course.KVCache.nbytes>`).

The ways take turns in interleaved rounds (:func:`mha_course.timing.time_interleaved`). The
results have the main benchmark's format with ``meta.benchmark = "deltanet"``, written as
``bench-deltanet-DEVICE.json`` and ``.csv``; :func:`crossing` reads where two ways' times cross.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from tqdm import tqdm

from ..tables import Table
from ..timing import time_interleaved, time_once
from .deltanet_steps import (DECODE_IMPLEMENTATIONS, DECODE_MODE, PROMPT_IMPLEMENTATIONS, PROMPT_MODE, decode_calls,
                             prompt_calls)
from .results import run_header, select, threads_text
from .run import memory_probe, observed_run, prepare_run
from .settings import RunSettings
from .sizes import BenchConfig

#: The lengths of the prompts and of the decoding runs.
PROMPT_LENGTHS = (256, 1024, 4096, 16384)
DECODE_LENGTHS = (16, 64, 256, 1024, 4096, 16384)


def _prompt(tokens: int, heads: int = 4, head_dim: int = 64, prefix: str = "deltanet-prompt") -> BenchConfig:
    return BenchConfig(f"{prefix}-{tokens}", 1, tokens, heads * head_dim, heads, head_dim,
                       f"a prompt of {tokens} tokens, {heads} heads of {head_dim}")


def _decode(tokens: int, heads: int = 4, head_dim: int = 64, prefix: str = "deltanet-decode") -> BenchConfig:
    return BenchConfig(f"{prefix}-{tokens}", 1, tokens, heads * head_dim, heads, head_dim,
                       f"token {tokens} of a sequence, width {heads * head_dim}, {heads} heads of {head_dim}")


def _by_name(*configs: BenchConfig) -> dict[str, BenchConfig]:
    return {c.name: c for c in configs}


#: The sizes of the full run: the prompts, then the decoded tokens.
DELTANET_CONFIGS = _by_name(*(_prompt(t) for t in PROMPT_LENGTHS), *(_decode(t) for t in DECODE_LENGTHS))

#: The sizes of ``bench --deltanet --quick``: 2 heads of 8, for CI.
QUICK_DELTANET_CONFIGS = _by_name(*(_prompt(t, 2, 8, "deltanet-prompt-tiny") for t in (16, 80)),
                                  *(_decode(t, 2, 8, "deltanet-decode-tiny") for t in (8, 32)))

#: Every size of the state benchmark by name, full and quick.
ALL_DELTANET_CONFIGS = {**DELTANET_CONFIGS, **QUICK_DELTANET_CONFIGS}


def mode_of(config: BenchConfig) -> str:
    """``"deltanet-prompt"`` or ``"deltanet-decode"``: what a size of the state benchmark measures.

    Example:
        >>> mode_of(DELTANET_CONFIGS["deltanet-decode-256"])
        'deltanet-decode'
    """
    return PROMPT_MODE if config.name.startswith(PROMPT_MODE) else DECODE_MODE


@dataclass(frozen=True)
class DeltaNetSettings(RunSettings):
    """How to run the state benchmark (``bench --deltanet``).

    Example:
        >>> s = DeltaNetSettings.for_command(quick=True)
        >>> [c.name for c in s.configs][:2], s.threads, s.label
        (['deltanet-prompt-tiny-16', 'deltanet-prompt-tiny-80'], 1, 'quick')
    """

    memory: bool = True  # peak memory of each prompt call, in a fresh child process (CPU)
    example_config: ClassVar[str] = "DELTANET_CONFIGS['deltanet-prompt-1024']"

    @classmethod
    def for_command(cls, *, quick: bool = False, configs=None, min_run_time=None, rounds=None, threads=None,
                    **options) -> "DeltaNetSettings":
        """The settings of ``python -m mha_course bench --deltanet``, with the defaults of ``bench``."""
        return cls._for_command(ALL_DELTANET_CONFIGS, QUICK_DELTANET_CONFIGS if quick else DELTANET_CONFIGS,
                                quick=quick, configs=configs, min_run_time=min_run_time, rounds=rounds,
                                threads=threads, **options)


def run_deltanet_benchmark(settings: DeltaNetSettings) -> dict:
    """Time and measure a prompt three ways and a decoded token two ways at every size of ``settings``.

    Returns:
        the results dict of every run (``meta``, ``configs``, ``implementations``, ``rows``), with
        ``meta["benchmark"] == "deltanet"``; the rows are described in the module's docstring.
    """
    device = prepare_run(settings, DeltaNetSettings, "DeltaNetSettings.for_command(...)")
    bar = tqdm(total=2 + len(settings.configs), desc="bench --deltanet", disable=not settings.progress)

    def measure() -> list[dict]:
        rows = []
        for config in settings.configs:
            bar.set_postfix_str(config.name)
            prompt = mode_of(config) == PROMPT_MODE
            rows += _prompt_rows(config, device, settings, probe) if prompt else _decode_rows(config, device, settings)
            bar.update()
        return rows

    with memory_probe(settings.memory, device) as (probe, skipped_because):
        results = observed_run(settings, device, bar, measure, {**PROMPT_IMPLEMENTATIONS, **DECODE_IMPLEMENTATIONS},
                               memory=settings.memory and not skipped_because, benchmark="deltanet")
    if skipped_because:
        results["meta"]["memory_skipped"] = skipped_because
    return results


def _timed(calls: dict, settings: DeltaNetSettings):
    one_call, outputs = {}, {}
    for name, call in calls.items():  # the check is also the warm-up call
        one_call[name], outputs[name] = time_once(call)
    return time_interleaved(calls, rounds=settings.rounds, min_run_time=settings.min_run_time,
                            call_seconds=one_call), outputs


def _row(config: BenchConfig, name: str, mode: str, timing) -> dict:
    return {"config": config.name, "implementation": name, "mode": mode, "num_tokens": config.num_tokens,
            "median_s": timing.median, "iqr_s": timing.iqr, "runs": timing.runs}


def _prompt_rows(config: BenchConfig, device, settings: DeltaNetSettings, probe) -> list[dict]:
    timings, outputs = _timed(prompt_calls(config, device, seed=settings.seed + 1), settings)
    rows = []
    for name in PROMPT_IMPLEMENTATIONS:
        row = {**_row(config, name, PROMPT_MODE, timings[name]), "vs_sdpa": timings[name].median / timings["sdpa"].median}
        if name == "chunked":
            row["max_abs_diff"] = float((outputs["chunked"] - outputs["recurrent"]).abs().max())
        if probe is not None:
            row.update(probe.measure(config, name, PROMPT_MODE, torch.get_num_threads(), 0, benchmark="deltanet"))
            row.pop("minor_faults_per_call", None)
        elif device.type == "cuda":
            from .steps import cuda_peak_memory

            row.update(cuda_peak_memory(prompt_calls(config, device, seed=settings.seed + 1)[name], device))
        rows.append(row)
    return rows


def _decode_rows(config: BenchConfig, device, settings: DeltaNetSettings) -> list[dict]:
    calls, caches = decode_calls(config, device, seed=settings.seed)
    timings, _ = _timed(calls, settings)
    return [{**_row(config, name, DECODE_MODE, timings[name]), "cache_bytes": caches[name].nbytes,
             "vs_kv_cache": timings[name].median / timings["kv_cache"].median} for name in DECODE_IMPLEMENTATIONS]


def deltanet_rows(results: dict, mode: str) -> dict[str, list[dict]]:
    """Implementation -> its rows of a state run in ``mode`` (``"deltanet-prompt"`` or ``"deltanet-decode"``),
    shortest first.

    Example:
        >>> rows = [{"implementation": n, "mode": "deltanet-decode", "num_tokens": t, "median_s": 1.0}
        ...         for t in (64, 16) for n in ("kv_cache", "state")]
        >>> [r["num_tokens"] for r in deltanet_rows({"rows": rows}, "deltanet-decode")["state"]]
        [16, 64]
    """
    names = PROMPT_IMPLEMENTATIONS if mode == PROMPT_MODE else DECODE_IMPLEMENTATIONS
    by_name = {name: sorted((r for r in select(results, mode=mode) if r["implementation"] == name),
                            key=lambda r: r["num_tokens"]) for name in names}
    lengths = {name: [r["num_tokens"] for r in rows] for name, rows in by_name.items()}
    if not all(lengths.values()) or len({tuple(t) for t in lengths.values()}) > 1:
        raise ValueError(f"these results hold no complete {mode} rows ({', '.join(names)} at every length). "
                         "Write them with `python -m mha_course bench --deltanet`.")
    return by_name


def crossing(results: dict, mode: str, slower_first: str, faster_later: str) -> tuple[int, int] | None:
    """Where ``faster_later`` overtakes ``slower_first``: the longest length at which it is still slower and
    the first at which it is faster, or ``None`` if the lines do not cross in the run.

    Example:
        >>> rows = [{"implementation": n, "mode": "deltanet-decode", "num_tokens": t, "median_s": s}
        ...         for t, a, b in ((16, 1, 3), (64, 2, 3), (256, 5, 3)) for n, s in (("kv_cache", a), ("state", b))]
        >>> crossing({"rows": rows}, "deltanet-decode", "kv_cache", "state")
        (64, 256)
    """
    by_name = deltanet_rows(results, mode)
    lengths = [r["num_tokens"] for r in by_name[slower_first]]
    ahead = [b["median_s"] < a["median_s"] for a, b in zip(by_name[slower_first], by_name[faster_later])]
    first = next((i for i in range(len(ahead)) if all(ahead[i:])), None)  # ahead from here on
    if first is None or first == 0:
        return None
    return lengths[first - 1], lengths[first]


def deltanet_tables(results: dict) -> list[Table]:
    """The prompt table (peak memory and time of the three ways) and the decoding table (time and cache
    bytes of the two ways) of a state run."""
    meta, where = results["meta"], f"on {results['meta']['device_name']} ({results['meta']['device']}, "
    where += f"{threads_text(meta)})"
    prompt = deltanet_rows(results, PROMPT_MODE)
    has_memory = all("peak_bytes" in r for rows in prompt.values() for r in rows)
    kinds = (["peak"] if has_memory else []) + ["time"]
    columns = ["tokens T"] + [f"{name} {kind}" for kind in kinds for name in PROMPT_IMPLEMENTATIONS]
    key = {"peak": "peak_bytes", "time": "median_s"}
    rows = [[r["num_tokens"]] + [prompt[name][i][key[kind]] for kind in kinds for name in PROMPT_IMPLEMENTATIONS]
            for i, r in enumerate(prompt["sdpa"])]
    formats = {c: ("bytes" if c.endswith("peak") else "time") for c in columns[1:]}
    tables = [Table(columns, rows, formats=formats, title=f"A prompt through the gated delta rule and softmax "
                    f"attention: peak memory of one call and median time {where}",
                    notes=["peak: the growth of the peak memory during one call, in a fresh process."] if has_memory
                    else [])]
    decode = deltanet_rows(results, DECODE_MODE)
    columns = ["tokens T", "kv_cache time", "state time", "kv_cache bytes", "state bytes"]
    rows = [[a["num_tokens"], a["median_s"], b["median_s"], a["cache_bytes"], b["cache_bytes"]]
            for a, b in zip(decode["kv_cache"], decode["state"])]
    tables.append(Table(columns, rows, formats={"kv_cache time": "time", "state time": "time",
                                                "kv_cache bytes": "bytes", "state bytes": "bytes"},
                        title=f"Token T decoded by attention with a key/value cache and by Gated DeltaNet: median "
                        f"time and the bytes each cache holds, {where}"))
    return tables


def deltanet_summary(results: dict) -> str:
    """A plain-text summary of a state run: the machine, then its two tables."""
    return "\n\n".join([run_header(results["meta"]), *map(str, deltanet_tables(results))])
