"""The heads map: is the batched module faster than the stacked heads, and where?

``python -m mha_course bench --heads-map`` times the textbook batched module (``batched``,
:class:`~mha_course.MultiHeadAttention`) and the stacked heads (``stacked``,
:class:`~mha_course.MultiHeadAttentionWrapper`) forward, on the same weights and input, at every
cell of a grid of sequence lengths ``T`` x numbers of heads ``h`` at one model width (``h * d_h``
fixed, :data:`~mha_course.bench.sizes.HEADS_MAP_WIDTH`) and one batch. Each cell's two
implementations take turns in interleaved rounds (:func:`mha_course.timing.time_interleaved`), and
the batched row holds their ratio (``vs_stacked``: above 1, batched is slower) and the verdict of
:func:`~mha_course.bench.results.compare_times` (``tie`` when the difference is within the run's own
spread).

The two sides of the answer are recorded with the times: batching makes one call per projection
instead of ``h`` (less Python and fewer, larger products), but it holds every head's ``T x T``
scores at once, ``score_bytes_all`` against one head's ``score_bytes_one``; the processor's caches
(:func:`~mha_course.bench.machine.cache_sizes`) are stored in ``meta.caches`` to set those sizes
against. The results have the format of the main benchmark's, with ``meta.benchmark =
"heads-map"``; they are written as ``bench-heads-map-DEVICE.json`` and ``.csv`` (and a PNG of
:func:`~mha_course.bench.plots.plot_heads_map`), and read back by
:mod:`~mha_course.bench.heads_map_results`.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ..cost import class_d_out, multiply_adds
from ..data import random_batch
from ..timing import time_interleaved, time_once
from .machine import cache_sizes
from .heads_map_results import HEADS_MAP, HEADS_MAP_IMPLEMENTATIONS
from .results import compare_times, select
from .run import observed_run, prepare_run
from .settings import HeadsMapSettings
from .sizes import BenchConfig
from .steps import build_for, make_step

#: Bytes of one float32 number: the scores the forward pass holds.
_FLOAT32_BYTES = 4


def run_heads_map(settings: HeadsMapSettings) -> dict:
    """Time stacked and batched heads forward at every cell of ``settings``.

    Returns:
        ``{"meta": {...}, "configs": [...], "implementations": {...}, "rows": [...]}`` as
        :func:`mha_course.bench.run_benchmark` does, with ``meta["benchmark"] == "heads-map"`` and
        ``meta["caches"]`` (:func:`~mha_course.bench.machine.cache_sizes`). Each row is one (cell,
        implementation), mode ``forward``, with ``num_tokens``, ``num_heads``, ``head_dim``,
        ``median_s``, ``iqr_s``, ``runs``, ``multiply_adds``, ``flops_per_s``, ``ceiling_fraction``,
        ``max_abs_diff`` (against the batched output), ``score_bytes_one`` and ``score_bytes_all``
        (one head's float32 scores for the batch, and all heads' at once); the batched row adds
        ``vs_stacked`` and ``verdict``.

    Example:
        >>> from mha_course.bench import QUICK_HEADS_MAP_CONFIGS
        >>> settings = HeadsMapSettings(configs=(QUICK_HEADS_MAP_CONFIGS["map-tiny-T8-h2"],), min_run_time=0.01,
        ...                             rounds=1, threads=1, progress=False, ceiling_size=64)
        >>> results = run_heads_map(settings)
        >>> batched = select(results, implementation="batched")[0]
        >>> results["meta"]["benchmark"], batched["num_heads"], batched["verdict"] in ("tie", "batched", "stacked")
        ('heads-map', 2, True)
    """
    device = prepare_run(settings, HeadsMapSettings, "HeadsMapSettings.for_command(...)")
    bar = tqdm(total=2 + len(settings.configs), desc="bench --heads-map", disable=not settings.progress)

    def measure() -> list[dict]:
        rows = []
        for config in settings.configs:
            bar.set_postfix_str(f"{config.name}: stacked and batched")
            rows += _cell(config, device, settings)
            bar.update()
        return rows

    from ..implementations import IMPLEMENTATIONS

    results = observed_run(settings, device, bar, measure,
                           {name: IMPLEMENTATIONS[name].description for name in HEADS_MAP_IMPLEMENTATIONS},
                           benchmark=HEADS_MAP)
    results["meta"]["caches"] = cache_sizes() if device.type == "cpu" else {"source": "unavailable", "caches": []}
    for config in settings.configs:
        duel = compare_times(results, config.name, "forward", "batched", "stacked")
        row = select(results, config.name, "forward", "batched")[0]
        row.update(vs_stacked=duel["ratio"], verdict=duel["verdict"])
    return results


def _cell(config: BenchConfig, device: torch.device, settings: HeadsMapSettings) -> list[dict]:
    impls, _ = build_for(config, device, HEADS_MAP_IMPLEMENTATIONS, seed=settings.seed)
    x = random_batch(config.batch, config.num_tokens, config.d_in, seed=1, device=device)  # (B, T, d_in)
    steps, one_call, outputs = {}, {}, {}
    for name in HEADS_MAP_IMPLEMENTATIONS:  # the check is also the warm-up call
        with torch.no_grad():
            one_call[name], outputs[name] = time_once(lambda impl=impls[name]: impl.forward(x))
        steps[name] = make_step(impls[name], "forward", x)
    timings = time_interleaved(steps, rounds=settings.rounds, min_run_time=settings.min_run_time,
                               call_seconds=one_call)
    b, t, h = config.batch, config.num_tokens, config.num_heads
    one_head = b * t * t * _FLOAT32_BYTES  # (B, T, T): the scores of one head
    rows = []
    for name in HEADS_MAP_IMPLEMENTATIONS:
        impl, timing = impls[name], timings[name]
        work = multiply_adds(impl.cost_kind, b, t, config.d_in, class_d_out(impl.cost_kind, h, config.head_dim),
                             h).total
        rows.append({"config": config.name, "implementation": name, "mode": "forward", "num_tokens": t,
                     "num_heads": h, "head_dim": config.head_dim, "median_s": timing.median, "iqr_s": timing.iqr,
                     "runs": timing.runs, "multiply_adds": work, "flops_per_s": 2 * work / timing.median,
                     "max_abs_diff": float((outputs[name] - outputs["batched"]).abs().max()),
                     "score_bytes_one": one_head, "score_bytes_all": h * one_head})
    return rows
