"""The grouped-query benchmark (chapters 6 and 8): ``GroupedQueryAttention`` beside what it stands for.

``python -m mha_course bench --grouped`` times, forward under ``torch.no_grad``, pairs of layers that
compute the same function, in interleaved rounds (:func:`mha_course.timing.time_interleaved`):

* ``llama-prompt-1024``: a Llama-shaped attention layer (width 2,048, 32 query heads and 8 key/value
  heads of 64, one sequence) on a 1,024-token prompt, two ways: ``course``, the course's
  :class:`~mha_course.GroupedQueryAttention` made by :func:`~mha_course.from_llama_attention`, and
  ``transformers``, the ``LlamaAttention`` it was made from, on transformers' default ``sdpa`` path. Both
  are handed the rotation's cos and sin as a model hands them to its layers, computed once per call for
  all of them (``position_embeddings``; transformers' ``LlamaRotaryEmbedding``, whose numbers the
  course's ``RotaryEmbedding.cos_sin`` gives too);
* ``llama-decode-1024``: the same two layers generating one token with 1,024 positions cached, in a
  :class:`~mha_course.KVCache` and in transformers' ``DynamicCache``;
* ``gpt2-heads``: ``GroupedQueryAttention`` with one key/value head per query head (``grouped``)
  against :class:`~mha_course.FastMultiHeadAttention` (``fast``) with the same weights, at GPT-2-small's
  shapes (batch 4, 1,024 tokens, width 768, 12 heads of 64);
* ``gpt2-groups-4``: the same with 4 key/value heads, pooled from the same weights (a different
  function, so its check compares the module's fused path with its explicit one).

Every row holds its median time, spread, the ratio to its pair's reference (``vs_reference``: the
course over transformers, grouped over fast), the multiply-adds of the call and the largest
difference from the reference's output (``max_abs_diff``). The results have the main benchmark's
format, with ``meta.benchmark = "grouped"``, and are written as ``bench-grouped-DEVICE.json`` and
``.csv``. transformers is imported when the Llama pairs are built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..attention.fast import FastMultiHeadAttention
from ..attention.grouped_query import GroupedQueryAttention
from ..attention.kv_cache import KVCache
from ..attention.multihead import MultiHeadAttention
from ..convert.transformers import from_llama_attention
from ..cost import grouped_query_multiply_adds
from ..data import random_batch
from ..tables import Table, format_time
from ..timing import time_interleaved, time_once
from .results import run_header, select, threads_text
from .run import observed_run, prepare_run
from .settings import RunSettings
from .sizes import BenchConfig

#: The mode of every row of a grouped run.
GROUPED_MODE = "grouped"

#: The layers a grouped run times, by name; each pair's reference is ``transformers`` or ``fast``.
GROUPED_IMPLEMENTATIONS = {
    "course": "GroupedQueryAttention made by from_llama_attention (fused kernel, enable_gqa), cos and sin given",
    "transformers": "transformers' LlamaAttention, attn_implementation='sdpa', cos and sin given",
    "grouped": "GroupedQueryAttention built from the same weights as the fast path",
    "fast": "FastMultiHeadAttention: fused QKV projection and scaled_dot_product_attention",
}

#: The reference of each pair: the implementation the other one's time is divided by.
REFERENCE = {"course": "transformers", "grouped": "fast"}


@dataclass(frozen=True)
class GroupedConfig(BenchConfig):
    """A size of the grouped run: ``num_kv_groups`` key/value heads, ``num_cached`` positions in the
    cache before the call, and the pair timed (``"llama"``: course and transformers; ``"heads"``:
    grouped and fast)."""

    num_kv_groups: int = 1
    num_cached: int = 0
    pair: str = "heads"


def _llama(name: str, num_cached: int, tokens: int, width: int = 2048, heads: int = 32, groups: int = 8,
           what: str = "Llama-shaped layer (width 2,048, 32 heads and 8 key/value heads of 64)") -> GroupedConfig:
    step = f"one token after {num_cached:,} cached" if num_cached else f"a {tokens:,}-token prompt"
    return GroupedConfig(name, 1, tokens, width, heads, width // heads, f"{what}: {step}", groups, num_cached,
                         "llama")


def _heads(name: str, groups: int, batch: int = 4, tokens: int = 1024, width: int = 768, heads: int = 12,
           what: str = "GPT-2-small shapes (batch 4, 1,024 tokens, width 768, 12 heads of 64)") -> GroupedConfig:
    return GroupedConfig(name, batch, tokens, width, heads, width // heads,
                         f"{what}, {groups} key/value head{'s' if groups > 1 else ''}", groups, 0, "heads")


def _by_name(*configs: GroupedConfig) -> dict[str, GroupedConfig]:
    return {c.name: c for c in configs}


#: The sizes of the grouped run.
GROUPED_CONFIGS = _by_name(_llama("llama-prompt-1024", 0, 1024), _llama("llama-decode-1024", 1024, 1),
                           _heads("gpt2-heads", 12), _heads("gpt2-groups-4", 4))

#: The sizes of ``bench --grouped --quick``: tiny layers, for CI.
_TINY_LLAMA = "a tiny Llama-shaped layer (width 32, 4 heads and 2 key/value heads of 8)"
QUICK_GROUPED_CONFIGS = _by_name(_llama("llama-tiny-prompt-16", 0, 16, 32, 4, 2, _TINY_LLAMA),
                                 _llama("llama-tiny-decode-16", 16, 1, 32, 4, 2, _TINY_LLAMA),
                                 _heads("tiny-heads", 4, 2, 16, 32, 4, "tiny shapes (batch 2, 16 tokens, width 32)"))

#: Every grouped size by name, full and quick.
ALL_GROUPED_CONFIGS = {**GROUPED_CONFIGS, **QUICK_GROUPED_CONFIGS}


@dataclass(frozen=True)
class GroupedSettings(RunSettings):
    """How to run the grouped benchmark (``bench --grouped``).

    Example:
        >>> s = GroupedSettings.for_command(quick=True)
        >>> [c.name for c in s.configs], s.threads, s.label
        (['llama-tiny-prompt-16', 'llama-tiny-decode-16', 'tiny-heads'], 1, 'quick')
    """

    example_config = "GROUPED_CONFIGS['llama-prompt-1024']"

    @classmethod
    def for_command(cls, *, quick: bool = False, configs=None, min_run_time=None, rounds=None, threads=None,
                    **options) -> "GroupedSettings":
        """The settings of ``python -m mha_course bench --grouped``, with the defaults of ``bench``."""
        return cls._for_command(ALL_GROUPED_CONFIGS, QUICK_GROUPED_CONFIGS if quick else GROUPED_CONFIGS,
                                quick=quick, configs=configs, min_run_time=min_run_time, rounds=rounds,
                                threads=threads, **options)


def _transformers(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as error:
        raise ImportError("bench --grouped compares the course's layer with transformers' LlamaAttention: "
                          "install the course's pinned requirements (pip install -r requirements.txt).") from error


def _no_grad(fn):
    def call():
        with torch.no_grad():
            return fn()
    return call


def llama_calls(config: GroupedConfig, device="cpu", seed: int = 0) -> dict:
    """``course`` and ``transformers``: a converted layer and its original, as no-argument callables.

    Each returns the layer's output ``(batch, num_tokens, d_model)``; with ``num_cached`` positions,
    each call first puts its cache back to them, so that every call generates the same token.

    Example:
        >>> calls = llama_calls(QUICK_GROUPED_CONFIGS["llama-tiny-decode-16"])
        >>> torch.allclose(calls["course"](), calls["transformers"](), atol=1e-5)
        True
    """
    llama_config = _transformers("transformers", "LlamaConfig")
    llama_attention = _transformers("transformers.models.llama.modeling_llama", "LlamaAttention")
    rotary_embedding = _transformers("transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding")
    dynamic_cache = _transformers("transformers", "DynamicCache")
    cfg = llama_config(hidden_size=config.d_in, num_attention_heads=config.num_heads,
                       num_key_value_heads=config.num_kv_groups,
                       max_position_embeddings=max(2048, config.num_cached + config.num_tokens),
                       attn_implementation="sdpa")  # transformers' default where torch has the kernel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        theirs = llama_attention(cfg, layer_idx=0).to(device).eval()
    ours = from_llama_attention(theirs)
    rotary = rotary_embedding(cfg).to(device)
    total = config.num_cached + config.num_tokens
    x = random_batch(config.batch, total, config.d_in, seed=seed + 1, device=device)  # (B, cached + T, d)
    positions = torch.arange(total, device=device).expand(config.batch, -1)  # (B, cached + T)
    new, new_positions = x[:, config.num_cached:], positions[:, config.num_cached:]
    rotation = rotary(new, new_positions)  # (cos, sin), as a model computes them once for all layers
    if not config.num_cached:
        return {"course": _no_grad(lambda: ours(new, position_embeddings=rotation)),
                "transformers": _no_grad(lambda: theirs(new, rotation, None)[0])}
    cache, their_cache = KVCache(), dynamic_cache(config=cfg)
    past = x[:, :config.num_cached]
    with torch.no_grad():
        ours(past, cache=cache)
        theirs(past, rotary(past, positions[:, :config.num_cached]), None, past_key_values=their_cache)
    kept, their_layer = (cache.keys, cache.values), their_cache.layers[0]
    their_kept = (their_layer.keys, their_layer.values)

    def course():
        cache.keys, cache.values = kept  # back to the cached positions
        return ours(new, cache=cache, position_embeddings=rotation)

    def transformers():
        their_layer.keys, their_layer.values = their_kept
        return theirs(new, rotation, None, past_key_values=their_cache)[0]

    return {"course": _no_grad(course), "transformers": _no_grad(transformers)}


def heads_calls(config: GroupedConfig, device="cpu", seed: int = 0) -> dict:
    """``grouped`` and ``fast``, from one seeded ``MultiHeadAttention``, and ``grouped_explicit`` (the
    grouped module's explicit path), as no-argument callables.

    Example:
        >>> calls = heads_calls(QUICK_GROUPED_CONFIGS["tiny-heads"])
        >>> torch.allclose(calls["grouped"](), calls["fast"](), atol=1e-6)
        True
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mha = MultiHeadAttention(config.d_in, config.d_out, config.num_tokens, 0.0, config.num_heads)
    mha = mha.to(device).eval()
    fast = FastMultiHeadAttention.from_multihead(mha)
    grouped = GroupedQueryAttention.from_multihead(mha, config.num_kv_groups)
    explicit = GroupedQueryAttention.from_multihead(mha, config.num_kv_groups)
    explicit.use_sdpa = False
    x = random_batch(config.batch, config.num_tokens, config.d_in, seed=seed + 1, device=device)
    return {"grouped": _no_grad(lambda: grouped(x)), "fast": _no_grad(lambda: fast(x)),
            "grouped_explicit": _no_grad(lambda: explicit(x))}


def run_grouped_benchmark(settings: GroupedSettings) -> dict:
    """Time the pairs of ``settings``; return the results (``meta["benchmark"] == "grouped"``).

    Each row is one (config, implementation) with ``mode`` ``"grouped"``, ``num_tokens``,
    ``num_cached``, ``num_kv_groups``, ``median_s``, ``iqr_s``, ``runs``, ``reference`` (the name
    of its pair's reference), ``vs_reference``, ``multiply_adds``, ``flops_per_s``,
    ``ceiling_fraction`` and ``max_abs_diff``.
    """
    device = prepare_run(settings, GroupedSettings, "GroupedSettings.for_command(...)")
    bar = tqdm(total=2 + len(settings.configs), desc="bench --grouped", disable=not settings.progress)

    def measure() -> list[dict]:
        rows = []
        for config in settings.configs:
            bar.set_postfix_str(config.name)
            rows += _pair(config, device, settings)
            bar.update()
        return rows

    return observed_run(settings, device, bar, measure, dict(GROUPED_IMPLEMENTATIONS), benchmark="grouped")


def _pair(config: GroupedConfig, device: torch.device, settings: GroupedSettings) -> list[dict]:
    calls = (llama_calls if config.pair == "llama" else heads_calls)(config, device, seed=settings.seed)
    one_call, outputs = {}, {}
    for name, call in calls.items():  # the check is also the warm-up call
        one_call[name], outputs[name] = time_once(call)
    explicit = outputs.pop("grouped_explicit", None)
    one_call.pop("grouped_explicit", None)
    timed = {name: calls[name] for name in outputs}
    timings = time_interleaved(timed, rounds=settings.rounds, min_run_time=settings.min_run_time,
                               call_seconds=one_call)
    (name, reference), = ((n, r) for n, r in REFERENCE.items() if n in outputs)
    # The fast path keeps one key/value head per query head, whatever the grouped module shares.
    groups = {name: config.num_kv_groups, reference: config.num_heads if reference == "fast" else config.num_kv_groups}
    work = {n: grouped_query_multiply_adds(config.batch, config.num_tokens, config.d_in, config.d_out,
                                           config.num_heads, g, config.num_cached).total for n, g in groups.items()}
    same_function = config.num_kv_groups == config.num_heads or config.pair == "llama"
    rows = []
    for implementation in (name, reference):
        timing = timings[implementation]
        against = outputs[reference] if same_function or implementation == reference else explicit
        rows.append({"config": config.name, "implementation": implementation, "mode": GROUPED_MODE,
                     "num_tokens": config.num_tokens, "num_cached": config.num_cached,
                     "num_kv_groups": config.num_kv_groups, "reference": reference,
                     "median_s": timing.median, "iqr_s": timing.iqr, "runs": timing.runs,
                     "vs_reference": timing.median / timings[reference].median,
                     "multiply_adds": work[implementation], "flops_per_s": 2 * work[implementation] / timing.median,
                     "max_abs_diff": float((outputs[implementation] - against).abs().max())})
    return rows


def grouped_pairs(results: dict) -> list[tuple[dict, dict]]:
    """``(row, reference row)`` of every pair of a grouped run, in the run's order.

    Example:
        >>> rows = [{"config": "c", "implementation": n, "mode": "grouped", "reference": "fast"}
        ...         for n in ("grouped", "fast")]
        >>> [(a["implementation"], b["implementation"]) for a, b in grouped_pairs({"rows": rows})]
        [('grouped', 'fast')]
    """
    by_config = {}
    for row in select(results, mode=GROUPED_MODE):
        by_config.setdefault(row["config"], {})[row["implementation"]] = row
    pairs = []
    for config, rows in by_config.items():
        name = next((n for n, r in REFERENCE.items() if n in rows and r in rows), None)
        if name is None:
            raise ValueError(f"these results hold no complete pair for {config}. Write them with "
                             "`python -m mha_course bench --grouped`.")
        pairs.append((rows[name], rows[REFERENCE[name]]))
    if not pairs:
        raise ValueError("these results hold no grouped rows. Write them with `python -m mha_course bench --grouped`.")
    return pairs


def grouped_table(results: dict) -> Table:
    """Median time of each layer and of its reference, the ratio measured in the run, and the spread; the
    sizes are named in the table and described in its notes."""
    descriptions = {c["name"]: c["description"] for c in results.get("configs", [])}
    pairs = grouped_pairs(results)
    rows = [[row["config"], row["implementation"], reference["implementation"], row["median_s"],
             reference["median_s"], row["vs_reference"],
             max(row["iqr_s"] / row["median_s"], reference["iqr_s"] / reference["median_s"])]
            for row, reference in pairs]
    meta = results["meta"]
    title = (f"GroupedQueryAttention and what it replaces, forward: median time on {meta['device_name']} "
             f"({meta['device']}, {threads_text(meta)})")
    notes = [f"{row['config']}: {descriptions[row['config']]}." for row, _ in pairs if row["config"] in descriptions]
    notes += ["ratio: the first layer's median time over the second's, one run.",
              "spread: the larger of the two interquartile ranges over rounds, relative to its median."]
    def time(seconds):  # four digits, so that dividing the two printed times gives the printed ratio
        return format_time(seconds, digits=4)

    return Table(["size", "layer", "against", "its time", "their time", "ratio", "spread"], rows, title=title,
                 formats={"its time": time, "their time": time, "ratio": ".2f", "spread": ".0%"}, notes=notes)


def grouped_summary(results: dict) -> str:
    """A plain-text summary of a grouped run: the machine, then the table."""
    return f"{run_header(results['meta'])}\n\n{grouped_table(results)}"
