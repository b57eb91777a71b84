"""The latent decoding benchmark (chapter 10): one generated token against the tokens cached, for
multi-head latent attention expanded and absorbed, and for grouped-query attention with the same cache.

``python -m mha_course bench --latent`` times one attention layer producing token ``S + 1``'s output
after ``S`` cached tokens, at every length of :data:`LATENT_CONFIGS` (up to 16k), four ways:

* ``multi_head``: :class:`~mha_course.GroupedQueryAttention` with a key/value head per query head,
  the heads and head width of the latent layer: the cache latent attention replaces;
* ``grouped_query``: the same query heads sharing 2 key/value heads, as wide as makes its cache
  hold as many numbers per token as the latent layer's (``2 * 2 * d_h = kv_lora_rank +
  qk_rope_head_dim``): the same cache budget;
* ``latent``: :class:`~mha_course.MultiHeadLatentAttention`, every cached latent expanded into
  every head's key and value at every step;
* ``latent_absorbed``: the same layer with ``absorb = True``: scored and weighted in the latent space.

The layers have DeepSeek-V2-Lite's attention sizes (width 2048, 16 heads of 128, a latent of 512
and a rotated key of 64; :data:`LATENT_SIZES`). The caches are filled with random numbers of the
shapes a prompt of ``S`` tokens leaves (a step's time depends on the shapes only), and each call
first puts its cache back to those ``S`` positions. Before timing, the absorbed layer's output is
compared with the expanded one's (``max_abs_diff``); then the four take turns in interleaved rounds
(:func:`mha_course.timing.time_interleaved`). Each row holds the median time, its spread, the
multiply-adds of the step, the bytes the cache holds (:attr:`KVCache.nbytes
<mha_course.KVCache.nbytes>`) and the ratio to ``grouped_query`` (``vs_grouped_query``). The results
have the main benchmark's format, with ``meta.benchmark = "latent"``; they are written as
``bench-latent-DEVICE.json`` and ``.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from tqdm import tqdm

from ..attention.grouped_query import GroupedQueryAttention
from ..attention.kv_cache import KVCache
from ..attention.latent import MultiHeadLatentAttention
from ..cost import grouped_query_multiply_adds, latent_multiply_adds
from ..tables import Table, format_bytes
from ..timing import time_interleaved, time_once
from .results import run_header, select, threads_text
from .run import observed_run, prepare_run
from .settings import RunSettings
from .sizes import BenchConfig

#: The mode every row of a latent run has.
LATENT_MODE = "latent-decode"

#: The four ways of decoding the next token, by name.
LATENT_IMPLEMENTATIONS = {
    "multi_head": "GroupedQueryAttention with a key/value head per query head: the cache latent attention replaces",
    "grouped_query": "GroupedQueryAttention with 2 key/value heads, its cache as large as the latent one",
    "latent": "MultiHeadLatentAttention: every cached latent expanded into keys and values at every step",
    "latent_absorbed": "MultiHeadLatentAttention(absorb=True): scores and weights in the latent space",
}

#: The latent layer's sizes besides its width and heads: DeepSeek-V2-Lite's (and DeepSeek-V3's).
LATENT_SIZES = dict(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)

#: Those of ``bench --latent --quick``.
QUICK_LATENT_SIZES = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)


def _latent(cached: int, quick: bool = False) -> BenchConfig:
    if quick:
        return BenchConfig(f"latent-tiny-{cached}", 1, cached, 64, 4, 8, f"{cached} cached tokens, width 64, 4 heads")
    return BenchConfig(f"latent-{cached}", 1, cached, 2048, 16, 128,
                       f"{cached} cached tokens, DeepSeek-V2-Lite's attention: width 2048, 16 heads of 128, "
                       "latent 512 + rotated key 64")


#: The lengths of the full run (cached tokens before the new one), by name.
LATENT_CONFIGS = {c.name: c for c in (_latent(n) for n in (256, 1024, 4096, 16384))}

#: The lengths of ``bench --latent --quick``: tiny layers, for CI.
QUICK_LATENT_CONFIGS = {c.name: c for c in (_latent(n, quick=True) for n in (8, 32))}

#: Every latent size by name, full and quick.
ALL_LATENT_CONFIGS = {**LATENT_CONFIGS, **QUICK_LATENT_CONFIGS}


@dataclass(frozen=True)
class LatentSettings(RunSettings):
    """How to run the latent decoding benchmark (``bench --latent``).

    Example:
        >>> s = LatentSettings.for_command(quick=True)
        >>> [c.name for c in s.configs], s.threads, s.label
        (['latent-tiny-8', 'latent-tiny-32'], 1, 'quick')
    """

    example_config: ClassVar[str] = "LATENT_CONFIGS['latent-1024']"

    @classmethod
    def for_command(cls, *, quick: bool = False, configs=None, min_run_time=None, rounds=None, threads=None,
                    **options) -> "LatentSettings":
        """The settings of ``python -m mha_course bench --latent``, with the defaults of ``bench``."""
        return cls._for_command(ALL_LATENT_CONFIGS, QUICK_LATENT_CONFIGS if quick else LATENT_CONFIGS, quick=quick,
                                configs=configs, min_run_time=min_run_time, rounds=rounds, threads=threads, **options)


def _sizes(config: BenchConfig) -> dict:
    return QUICK_LATENT_SIZES if config.name.startswith("latent-tiny") else LATENT_SIZES


def latent_layers(config: BenchConfig, device, seed: int = 0) -> dict:
    """The four layers of a length, by name, in eval mode on ``device`` (see the module's docstring)."""
    sizes, h, d = _sizes(config), config.num_heads, config.d_in
    budget = sizes["kv_lora_rank"] + sizes["qk_rope_head_dim"]  # numbers a latent layer caches per token
    if budget % 4:
        raise ValueError(f"kv_lora_rank + qk_rope_head_dim = {budget} must be a multiple of 4: the grouped-query "
                         "layer of the same cache holds 2 key/value heads of a key and a value each.")
    context = config.num_tokens + 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = {
            "multi_head": GroupedQueryAttention(d, h * config.head_dim, context, 0.0, h, h),
            "grouped_query": GroupedQueryAttention(d, h * budget // 4, context, 0.0, h, 2),
            "latent": MultiHeadLatentAttention(d, context, 0.0, h, **sizes),
        }
    layers["latent_absorbed"] = MultiHeadLatentAttention(d, context, 0.0, h, **sizes)
    layers["latent_absorbed"].load_state_dict(layers["latent"].state_dict())
    layers["latent_absorbed"].absorb = True
    return {name: layer.to(device).eval() for name, layer in layers.items()}


def latent_steps(config: BenchConfig, device, seed: int = 0) -> tuple[dict, dict]:
    """``(steps, caches)``: name -> a callable returning the new token's output, and name -> its cache.

    Each cache is filled with random numbers of the shapes ``config.num_tokens`` cached positions
    leave, and each call puts it back to them before decoding the new token.

    Example:
        >>> steps, caches = latent_steps(QUICK_LATENT_CONFIGS["latent-tiny-8"], "cpu")
        >>> torch.allclose(steps["latent_absorbed"](), steps["latent"](), atol=1e-5), len(caches["latent"])
        (True, 9)
    """
    device = torch.device(device)
    layers, cached, batch = latent_layers(config, device, seed), config.num_tokens, config.batch
    generator = torch.Generator().manual_seed(seed + 1)

    def noise(*shape):
        return torch.randn(*shape, generator=generator).to(device)

    past = {}
    for name, layer in layers.items():
        if isinstance(layer, MultiHeadLatentAttention):
            past[name] = {"latent": noise(batch, cached, layer.kv_lora_rank),
                          "rotated_key": noise(batch, 1, cached, layer.qk_rope_head_dim)}
        else:
            past[name] = {"keys": noise(batch, layer.num_kv_groups, cached, layer.head_dim),
                          "values": noise(batch, layer.num_kv_groups, cached, layer.head_dim)}
    past["latent_absorbed"] = past["latent"]  # the same latents: the same output
    new_token = noise(batch, 1, config.d_in)
    caches = {name: KVCache() for name in layers}

    def step(name):
        def call():
            caches[name].tensors = dict(past[name])  # back to the cached positions
            with torch.no_grad():
                return layers[name](new_token, cache=caches[name])  # (B, 1, d_out)
        return call

    return {name: step(name) for name in layers}, caches


def _work(config: BenchConfig, name: str) -> int:
    sizes, h, s = _sizes(config), config.num_heads, config.num_tokens
    if name.startswith("latent"):
        return latent_multiply_adds(1, 1, config.d_in, h, num_cached=s, absorb=name == "latent_absorbed",
                                    **sizes).total * config.batch
    groups, head_dim = (h, config.head_dim) if name == "multi_head" else \
        (2, (sizes["kv_lora_rank"] + sizes["qk_rope_head_dim"]) // 4)
    return grouped_query_multiply_adds(config.batch, 1, config.d_in, h * head_dim, h, groups, num_cached=s).total


def run_latent_benchmark(settings: LatentSettings) -> dict:
    """Time the four ways of decoding one token at every length of ``settings``.

    Returns:
        ``{"meta": {...}, "configs": [...], "implementations": {...}, "rows": [...]}`` with
        ``meta["benchmark"] == "latent"``; each row is one (length, implementation) with ``mode``
        ``"latent-decode"``, ``num_tokens`` (the cached tokens), ``median_s``, ``iqr_s``, ``runs``,
        ``vs_grouped_query``, ``multiply_adds``, ``flops_per_s``, ``ceiling_fraction``,
        ``cache_bytes`` (what the cache holds once the new token is in) and, for the absorbed layer,
        ``max_abs_diff`` (against the expanded one's output).
    """
    device = prepare_run(settings, LatentSettings, "LatentSettings.for_command(...)")
    bar = tqdm(total=2 + len(settings.configs), desc="bench --latent", disable=not settings.progress)

    def measure() -> list[dict]:
        rows = []
        for config in settings.configs:
            bar.set_postfix_str(f"{config.name}: {', '.join(LATENT_IMPLEMENTATIONS)}")
            rows += _length(config, device, settings)
            bar.update()
        return rows

    return observed_run(settings, device, bar, measure, dict(LATENT_IMPLEMENTATIONS), benchmark="latent")


def _length(config: BenchConfig, device: torch.device, settings: LatentSettings) -> list[dict]:
    steps, caches = latent_steps(config, device, seed=settings.seed)
    one_call, outputs = {}, {}
    for name, step in steps.items():  # the check is also the warm-up call
        one_call[name], outputs[name] = time_once(step)
    timings = time_interleaved(steps, rounds=settings.rounds, min_run_time=settings.min_run_time,
                               call_seconds=one_call)
    rows = []
    for name in LATENT_IMPLEMENTATIONS:
        timing, work = timings[name], _work(config, name)
        row = {"config": config.name, "implementation": name, "mode": LATENT_MODE, "num_tokens": config.num_tokens,
               "median_s": timing.median, "iqr_s": timing.iqr, "runs": timing.runs,
               "vs_grouped_query": timing.median / timings["grouped_query"].median, "multiply_adds": work,
               "flops_per_s": 2 * work / timing.median, "cache_bytes": caches[name].nbytes}
        if name == "latent_absorbed":
            row["max_abs_diff"] = float((outputs[name] - outputs["latent"]).abs().max())
        rows.append(row)
    return rows


def latent_rows(results: dict) -> dict[str, list[dict]]:
    """Implementation -> its rows of a latent run, fewest cached tokens first.

    Example:
        >>> rows = [{"config": f"latent-{s}", "implementation": n, "mode": "latent-decode", "num_tokens": s}
        ...         for s in (1024, 256) for n in LATENT_IMPLEMENTATIONS]
        >>> [r["num_tokens"] for r in latent_rows({"rows": rows})["latent"]]
        [256, 1024]
    """
    by_name = {name: sorted((r for r in select(results, mode=LATENT_MODE) if r["implementation"] == name),
                            key=lambda r: r["num_tokens"]) for name in LATENT_IMPLEMENTATIONS}
    lengths = {name: [r["num_tokens"] for r in rows] for name, rows in by_name.items()}
    if not by_name["latent"] or any(found != lengths["latent"] for found in lengths.values()):
        raise ValueError("these results hold no complete latent rows (the four ways at every length). Write them "
                         "with `python -m mha_course bench --latent`.")
    return by_name


def latent_table(results: dict) -> Table:
    """Median time of one decoded token, the four ways, at every length; the cache each holds at the longest."""
    by_name = latent_rows(results)
    names = list(LATENT_IMPLEMENTATIONS)
    rows = [[row["num_tokens"], *(by_name[n][i]["median_s"] for n in names),
             by_name["latent_absorbed"][i]["vs_grouped_query"],
             by_name["latent"][i]["median_s"] / by_name["latent_absorbed"][i]["median_s"]]
            for i, row in enumerate(by_name["latent"])]
    meta = results["meta"]
    longest = {n: by_name[n][-1]["cache_bytes"] for n in names}
    layer = results["configs"][-1]["description"].split(", ", 1)[1] if results.get("configs") else "one layer"
    title = (f"One decoded token after S cached ones, {layer}: median time on {meta['device_name']} "
             f"({meta['device']}, {threads_text(meta)})")
    labels = ["multi-head", "grouped-query", "latent", "latent absorbed"]
    held = ", ".join(f"{label} {format_bytes(longest[n])}" for label, n in zip(labels, names))
    notes = [f"cache held after {by_name['latent'][-1]['num_tokens'] + 1} tokens: {held}.",
             "absorbed ÷ grouped: the absorbed latent layer's time over grouped-query's, same cache; "
             "expanded ÷ absorbed: the latent layer's two forms, one run."]
    return Table(["cached S", *labels, "absorbed ÷ grouped", "expanded ÷ absorbed"], rows, title=title,
                 formats={**{label: "time" for label in labels}, "absorbed ÷ grouped": ".2f",
                          "expanded ÷ absorbed": ".1f"}, notes=notes)


def latent_summary(results: dict) -> str:
    """A plain-text summary of a latent run: the machine, then the table."""
    return f"{run_header(results['meta'])}\n\n{latent_table(results)}"
