"""The decoding benchmark: the time to generate one token, with and without a key/value cache.

``python -m mha_course bench --decode`` times one attention layer (a
:class:`~mha_course.GroupedQueryAttention` with one key/value head per query head, that is
multi-head attention) at the moment it produces the output of token ``T`` of a sequence, two ways:

* ``recompute``: without a cache, the layer runs on all ``T`` tokens again and the last output is
  kept, which is what generating without a cache does at every step;
* ``kv_cache``: the layer runs on the new token alone and reads the keys and values of the
  ``T - 1`` tokens before it from a :class:`~mha_course.KVCache`.

Before timing, the two outputs are compared (``max_abs_diff``). The two ways take turns in
interleaved rounds (:func:`mha_course.timing.time_interleaved`), at every length of
:data:`~mha_course.bench.sizes.DECODE_CONFIGS`, and each row holds the median time, its spread,
the multiply-adds of the step (:func:`mha_course.cost.grouped_query_multiply_adds`) and the ratio
to ``recompute`` of the same length (``vs_recompute``). The results have the format of the main
benchmark's (:data:`~mha_course.bench.results.FORMAT_VERSION`), with ``meta.benchmark = "decode"``
and ``mode = "decode"`` in every row; they are written as ``bench-decode-DEVICE.json`` and ``.csv``.
"""

from __future__ import annotations

import torch

from ..cost import grouped_query_multiply_adds
from ..data import random_batch
from ..attention.grouped_query import GroupedQueryAttention
from ..attention.kv_cache import KVCache
from tqdm import tqdm
from ..timing import time_interleaved, time_once
from .decode_results import DECODE_IMPLEMENTATIONS, DECODE_MODE
from .run import observed_run, prepare_run
from .settings import DecodeSettings
from .sizes import BenchConfig

def decode_steps(config: BenchConfig, device, seed: int = 0):
    """The two ways of computing token ``config.num_tokens``'s output, as no-argument callables.

    Returns ``(steps, cache)``: ``steps`` maps each name of :data:`DECODE_IMPLEMENTATIONS` to a
    callable returning the new token's output ``(batch, 1, d_out)``; ``cache`` is the
    :class:`KVCache` the ``kv_cache`` step reads. Each call of that step first puts the cache back
    to the ``num_tokens - 1`` earlier positions, so every call generates the same token.

    Example:
        >>> from mha_course.bench import QUICK_DECODE_CONFIGS
        >>> steps, cache = decode_steps(QUICK_DECODE_CONFIGS["decode-tiny-8"], "cpu")
        >>> torch.allclose(steps["kv_cache"](), steps["recompute"](), atol=1e-6), len(cache)
        (True, 8)
    """
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = GroupedQueryAttention(config.d_in, config.d_out, config.num_tokens, 0.0, config.num_heads,
                                      num_kv_groups=config.num_heads)
    layer = layer.to(device).eval()
    x = random_batch(config.batch, config.num_tokens, config.d_in, seed=1, device=device)  # (B, T, d_in)
    cache = KVCache()
    with torch.no_grad():
        if config.num_tokens > 1:
            layer(x[:, :-1], cache=cache)  # the prompt so far: T - 1 positions
    past_keys, past_values = cache.keys, cache.values  # (B, h, T - 1, d_h), or None for the first token
    new_token = x[:, -1:]  # (B, 1, d_in)

    def recompute():
        with torch.no_grad():
            return layer(x)[:, -1:]  # (B, 1, d_out): every position computed, the last one kept

    def with_cache():
        cache.keys, cache.values = past_keys, past_values  # back to the T - 1 earlier positions
        with torch.no_grad():
            return layer(new_token, cache=cache)  # (B, 1, d_out)

    return {"recompute": recompute, "kv_cache": with_cache}, cache


def run_decode_benchmark(settings: DecodeSettings) -> dict:
    """Time one generated token with and without a cache at every length of ``settings``.

    Returns:
        ``{"meta": {...}, "configs": [...], "implementations": {...}, "rows": [...]}`` as
        :func:`mha_course.bench.run_benchmark` does, with ``meta["benchmark"] == "decode"``; each
        row is one (config, implementation) with ``mode`` ``"decode"``, ``num_tokens``,
        ``median_s``, ``iqr_s``, ``runs``, ``vs_recompute``, ``multiply_adds``, ``flops_per_s``,
        ``ceiling_fraction``, ``max_abs_diff`` (against ``recompute``'s output) and, for
        ``kv_cache``, ``cache_bytes`` (the keys and values the layer's cache holds).
    """
    device = prepare_run(settings, DecodeSettings, "DecodeSettings.for_command(...)")
    bar = tqdm(total=2 + len(settings.configs), desc="bench --decode", disable=not settings.progress)

    def measure() -> list[dict]:
        rows = []
        for config in settings.configs:
            bar.set_postfix_str(f"{config.name}: recompute and kv_cache")
            rows += _length(config, device, settings)
            bar.update()
        return rows

    return observed_run(settings, device, bar, measure, dict(DECODE_IMPLEMENTATIONS), benchmark="decode")


def _length(config: BenchConfig, device: torch.device, settings: DecodeSettings) -> list[dict]:
    steps, cache = decode_steps(config, device, seed=settings.seed)
    one_call, outputs = {}, {}
    for name, step in steps.items():  # the check is also the warm-up call
        one_call[name], outputs[name] = time_once(step)
    cache_bytes = cache.nbytes
    timings = time_interleaved(steps, rounds=settings.rounds, min_run_time=settings.min_run_time,
                               call_seconds=one_call)
    b, t, d_in, d_out, h = config.batch, config.num_tokens, config.d_in, config.d_out, config.num_heads
    work = {"recompute": grouped_query_multiply_adds(b, t, d_in, d_out, h, h).total,
            "kv_cache": grouped_query_multiply_adds(b, 1, d_in, d_out, h, h, num_cached=t - 1).total}
    rows = []
    for name in DECODE_IMPLEMENTATIONS:
        timing = timings[name]
        row = {"config": config.name, "implementation": name, "mode": DECODE_MODE, "num_tokens": t,
               "median_s": timing.median, "iqr_s": timing.iqr, "runs": timing.runs,
               "vs_recompute": timing.median / timings["recompute"].median,
               "multiply_adds": work[name], "flops_per_s": 2 * work[name] / timing.median,
               "max_abs_diff": float((outputs[name] - outputs["recompute"]).abs().max())}
        if name == "kv_cache":
            row["cache_bytes"] = cache_bytes
        rows.append(row)
    return rows
