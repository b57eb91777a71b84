"""The tiled benchmark (chapter 7): attention with and without the score matrix, against the length.

``python -m mha_course bench --tiled`` runs the middle of causal attention (scores, mask, softmax,
weighted sum) on the same ``(B, h, T, d_h)`` queries, keys and values three ways:

* ``scores``: the textbook computation, :func:`explicit_attention`, which stores every head's
  ``(T, T)`` scores and weights;
* ``tiled``: :func:`mha_course.tiled_attention`, the Python loop over tiles with an online
  softmax, which holds one ``block_size x block_size`` tile of scores at a time;
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, PyTorch's fused
  kernel, which runs the same kind of loop in compiled code.

At every length of :data:`TILED_CONFIGS` it runs them in two modes: the forward pass under
``torch.no_grad`` (inference, rows of mode ``"tiled"``), and the forward and backward passes
(training, mode ``"tiled-training"``: the gradients of the queries, keys and values). In each it
checks the three agree (``max_abs_diff`` against ``sdpa``, of the output or of the gradients),
times them in interleaved rounds (:func:`mha_course.timing.time_interleaved`) and measures each
one's peak memory in a fresh child process (:mod:`mha_course.bench.memory`); a training row also
records what autograd keeps for the backward (``saved_bytes``, :func:`~mha_course.bench.tiled_steps.
saved_tensor_bytes`). The results have the main benchmark's format, with
``meta.benchmark = "tiled"``, and are written as ``bench-tiled-DEVICE.json`` and ``.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..tables import Table
from ..timing import time_interleaved, time_once
from .results import run_header, select, threads_text
from .run import memory_probe, observed_run, prepare_run
from .settings import RunSettings
from .sizes import BenchConfig
from .tiled_steps import TILED_IMPLEMENTATIONS, TILED_MODE, TRAINING_MODE, tiled_calls, tiled_saved_bytes

#: The modes of a tiled run: forward only, and forward with backward.
TILED_MODES = (TILED_MODE, TRAINING_MODE)

def _tiled(num_tokens: int, num_heads: int = 4, head_dim: int = 64, prefix: str = "tiled") -> BenchConfig:
    return BenchConfig(f"{prefix}-{num_tokens}", 1, num_tokens, num_heads * head_dim, num_heads, head_dim,
                       f"one sequence of {num_tokens} tokens, {num_heads} heads of {head_dim}")


def _by_name(*configs: BenchConfig) -> dict[str, BenchConfig]:
    return {c.name: c for c in configs}


#: The lengths of the tiled run: one sequence, 4 heads of 64.
TILED_CONFIGS = _by_name(*(_tiled(n) for n in (256, 512, 1024, 2048, 4096)))

#: The lengths of ``bench --tiled --quick``: 2 heads of 8, for CI.
QUICK_TILED_CONFIGS = _by_name(*(_tiled(n, 2, 8, "tiled-tiny") for n in (16, 64)))

#: Every tiled size by name, full and quick.
ALL_TILED_CONFIGS = {**TILED_CONFIGS, **QUICK_TILED_CONFIGS}


@dataclass(frozen=True)
class TiledSettings(RunSettings):
    """How to run the tiled benchmark (``bench --tiled``): lengths, and the loop's ``block_size``.

    Example:
        >>> s = TiledSettings.for_command(quick=True)
        >>> [c.name for c in s.configs], s.block_size, s.threads, s.label
        (['tiled-tiny-16', 'tiled-tiny-64'], 8, 1, 'quick')
    """

    block_size: int = 64  # queries and keys per tile of the tiled loop
    memory: bool = True  # peak memory of each call, in a fresh child process (CPU)

    def __post_init__(self):
        super().__post_init__()
        from ..attention._validation import validate_positive_int

        validate_positive_int("block_size", self.block_size)

    @classmethod
    def for_command(cls, *, quick: bool = False, configs=None, min_run_time=None, rounds=None, threads=None,
                    **options) -> "TiledSettings":
        """The settings of ``python -m mha_course bench --tiled``, with the defaults of ``bench``."""
        if quick:
            options.setdefault("block_size", 8)
        return cls._for_command(ALL_TILED_CONFIGS, QUICK_TILED_CONFIGS if quick else TILED_CONFIGS, quick=quick,
                                configs=configs, min_run_time=min_run_time, rounds=rounds, threads=threads,
                                **options)


def run_tiled_benchmark(settings: TiledSettings) -> dict:
    """Time and measure the three ways at every length of ``settings``.

    Returns:
        ``{"meta": {...}, "configs": [...], "implementations": {...}, "rows": [...]}`` with
        ``meta["benchmark"] == "tiled"`` and ``meta["block_size"]``; each row is one (length,
        implementation, mode) with ``mode`` ``"tiled"`` or ``"tiled-training"``, ``num_tokens``, ``median_s``, ``iqr_s``, ``runs``,
        ``vs_sdpa``, ``multiply_adds`` (the full ``T x T`` square, as the textbook computes it;
        three times that in training, for the backward's four products),
        ``flops_per_s``, ``ceiling_fraction``, ``max_abs_diff`` (against ``sdpa``),
        ``score_bytes`` (what every head's ``(T, T)`` float32 scores take), in training
        ``saved_bytes`` and, when memory is measured, ``peak_bytes`` and ``peak_method``.
    """
    device = prepare_run(settings, TiledSettings, "TiledSettings.for_command(...)")
    bar = tqdm(total=2 + 2 * len(settings.configs), desc="bench --tiled", disable=not settings.progress)

    def measure() -> list[dict]:
        rows = []
        for mode in TILED_MODES:
            for config in settings.configs:
                bar.set_postfix_str(f"{config.name}, {mode}: scores, tiled and sdpa")
                rows += _length(config, device, settings, probe if memory else None, mode)
                bar.update()
        return rows

    with memory_probe(settings.memory, device) as (probe, skipped_because):
        memory = settings.memory and not skipped_because
        results = observed_run(settings, device, bar, measure, dict(TILED_IMPLEMENTATIONS), memory=memory,
                               benchmark="tiled")
    results["meta"]["block_size"] = settings.block_size
    if skipped_because:
        results["meta"]["memory_skipped"] = skipped_because
    return results


def _length(config: BenchConfig, device: torch.device, settings: TiledSettings, probe, mode: str) -> list[dict]:
    calls = tiled_calls(config, settings.block_size, device, seed=settings.seed + 1, mode=mode)
    saved = tiled_saved_bytes(config, settings.block_size, device, seed=settings.seed + 1) \
        if mode == TRAINING_MODE else {}
    one_call, outputs = {}, {}
    for name, call in calls.items():  # the check is also the warm-up call
        one_call[name], outputs[name] = time_once(call)
    timings = time_interleaved(calls, rounds=settings.rounds, min_run_time=settings.min_run_time,
                               call_seconds=one_call)
    b, h, t, d = config.batch, config.num_heads, config.num_tokens, config.head_dim
    work = 2 * b * h * t * t * d  # q @ k^T and weights @ v, the whole square
    if mode == TRAINING_MODE:
        work *= 3  # and dV, dP, dQ, dK in the backward: twice the forward's
    rows = []
    for name in TILED_IMPLEMENTATIONS:
        timing = timings[name]
        row = {"config": config.name, "implementation": name, "mode": mode, "num_tokens": t,
               "median_s": timing.median, "iqr_s": timing.iqr, "runs": timing.runs,
               "vs_sdpa": timing.median / timings["sdpa"].median, "multiply_adds": work,
               "flops_per_s": 2 * work / timing.median, "score_bytes": b * h * t * t * 4,
               "max_abs_diff": float((outputs[name] - outputs["sdpa"]).abs().max())}
        if name in saved:
            row["saved_bytes"] = saved[name]
        if probe is not None:
            row.update(probe.measure(config, name, mode, torch.get_num_threads(), 0, benchmark="tiled",
                                     block_size=settings.block_size))
            row.pop("minor_faults_per_call", None)
        elif device.type == "cuda":
            from .steps import cuda_peak_memory

            row.update(cuda_peak_memory(calls[name], device))
        rows.append(row)
    return rows


def tiled_rows(results: dict, mode: str = TILED_MODE) -> dict[str, list[dict]]:
    """Implementation -> its rows of a tiled run in ``mode`` (forward only: ``"tiled"``; forward and
    backward: ``"tiled-training"``), shortest length first.

    Example:
        >>> rows = [{"config": f"tiled-{t}", "implementation": n, "mode": "tiled", "num_tokens": t}
        ...         for t in (512, 256) for n in ("scores", "tiled", "sdpa")]
        >>> [r["num_tokens"] for r in tiled_rows({"rows": rows})["tiled"]]
        [256, 512]
    """
    by_name = {name: sorted((r for r in select(results, mode=mode) if r["implementation"] == name),
                            key=lambda r: r["num_tokens"]) for name in TILED_IMPLEMENTATIONS}
    lengths = {name: [r["num_tokens"] for r in rows] for name, rows in by_name.items()}
    if not by_name["sdpa"] or any(found != lengths["sdpa"] for found in lengths.values()):
        raise ValueError(f"these results hold no complete {mode} rows (scores, tiled and sdpa at every length). "
                         "Write them with `python -m mha_course bench --tiled`.")
    return by_name


def has_training_rows(results: dict) -> bool:
    """Whether a tiled run holds the forward-and-backward rows (runs before they existed do not)."""
    return any(r["mode"] == TRAINING_MODE for r in results["rows"])


def tiled_table(results: dict, mode: str = TILED_MODE) -> Table:
    """Peak memory and median time of the three ways at every length of a tiled run, in ``mode``;
    in training, what autograd keeps for the backward too."""
    by_name = tiled_rows(results, mode)
    has_memory = all("peak_bytes" in r for rows in by_name.values() for r in rows)
    columns, formats, rows = ["tokens T", "scores held"], {"scores held": "bytes"}, []
    kinds = (["saved"] if mode == TRAINING_MODE else []) + (["peak"] if has_memory else []) + ["time"]
    for kind in kinds:
        for name in TILED_IMPLEMENTATIONS:
            columns.append(f"{name} {kind}")
            formats[f"{name} {kind}"] = "time" if kind == "time" else "bytes"
    key = {"saved": "saved_bytes", "peak": "peak_bytes", "time": "median_s"}
    for index, sdpa in enumerate(by_name["sdpa"]):
        row = [sdpa["num_tokens"], by_name["scores"][index]["score_bytes"]]
        row += [by_name[name][index][key[kind]] for kind in kinds for name in TILED_IMPLEMENTATIONS]
        rows.append(row)
    meta = results["meta"]
    config = results["configs"][0]["description"].split(",", 1)[1].strip() if results.get("configs") else ""
    passes = "forward and backward" if mode == TRAINING_MODE else "forward"
    title = (f"Attention's middle, {config}, block_size {meta.get('block_size')}, {passes}: peak memory of "
             f"one call and median time on {meta['device_name']} ({meta['device']}, {threads_text(meta)})")
    notes = ["scores held: what every head's (T, T) float32 scores take, once."]
    if mode == TRAINING_MODE:
        notes.append("saved: what autograd keeps for the backward pass.")
    if has_memory:
        notes.append("peak: the growth of the peak memory during one call, in a fresh process.")
    return Table(columns, rows, title=title, formats=formats, notes=notes)


def tiled_summary(results: dict) -> str:
    """A plain-text summary of a tiled run: the machine, then the table of each mode it holds."""
    tables = [tiled_table(results)] + ([tiled_table(results, TRAINING_MODE)] if has_training_rows(results) else [])
    return "\n\n".join([run_header(results["meta"]), *map(str, tables)])
