"""The key/value cache of today's models, side by side: counted from their published configurations,
checked by measuring small layers of each kind.

Each model of :data:`PUBLISHED` is its ``config.json`` typed in as a transformers configuration
(the settings that decide the cache; the rest keeps transformers' defaults). :func:`cache_layers`
reads, layer by layer, what a layer keeps for the tokens it has seen:

* ``full``: keys and values of every position, ``2 * kv_heads * head_dim`` numbers per token
  (multi-head, grouped-query and multi-query attention);
* ``latent``: DeepSeek's latent and rotated key, ``kv_lora_rank + qk_rope_head_dim`` per token;
* ``window``: keys and values of the last ``sliding_window`` positions only;
* ``state``: a fixed-size recurrent state and the last ``conv_kernel - 1`` inputs of a short
  convolution (Gated DeltaNet, in Qwen3-Next), whatever the length. The state is kept in float32 in a
  half-precision model, as transformers and the course keep it; the inputs are all the next step
  needs (transformers keeps one more per channel, ``conv_kernel`` in all);
* ``shared``: nothing of its own; the layer reads an earlier layer's keys and values (Gemma 4's
  last ``num_kv_shared_layers``).

:func:`cache_bytes` adds them up at a length; :func:`cache_table` sets the models side by side.
:func:`measured_layer_bytes` builds one small layer of the course for each kind it has (``full`` as
:class:`~mha_course.GroupedQueryAttention`, ``window`` as the same with the model's ``window``, ``latent`` as :class:`~mha_course.MultiHeadLatentAttention`
converted from transformers' DeepSeek-V3 layer, ``state`` as
:class:`~mha_course.attention.gated_deltanet.GatedDeltaNet`) with a model's cache sizes and measures
:attr:`KVCache.nbytes <mha_course.KVCache.nbytes>` after two prompts: what a token adds, and what is
held whatever the length. This module is where a layer's cache is counted and measured;
:mod:`mha_course.state_memory` reads Qwen3-Next's from it.
:func:`measured_sharing` runs a small Gemma 4 in transformers with and without cross-layer sharing
and measures what its cache holds. transformers is imported only by the functions that build.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .tables import Table, format_bytes

#: The lengths the table and the figure read the caches at.
LENGTHS = (4096, 32768, 131072)

#: Bytes per number of the caches compared: bfloat16, as the models are served.
BYTES_PER_NUMBER = 2


def state_bytes_per_number(bytes_per_number: int = BYTES_PER_NUMBER) -> int:
    """Bytes per number of a recurrent state in a model of ``bytes_per_number``: float32 in half precision.

    transformers' Gated DeltaNet and the course's run the delta rule in float32 for a float16 or
    bfloat16 model (``score_dtype``) and keep the state so.

    Example:
        >>> state_bytes_per_number(2), state_bytes_per_number(8)
        (4, 8)
    """
    return max(bytes_per_number, 4)


def _repeat(num_layers: int, pattern: list[str]) -> list[str]:
    return [pattern[i % len(pattern)] for i in range(num_layers)]


@dataclass(frozen=True)
class Published:
    """A model's published configuration, as transformers' configuration class takes it."""

    name: str
    config_class: str  # the transformers class, e.g. "LlamaConfig"
    settings: dict = field(repr=False)  # what decides the cache, typed in from config.json
    source: str = ""  # where the configuration is published

    def config(self):
        """The transformers configuration (imports transformers)."""
        return getattr(importlib.import_module("transformers"), self.config_class)(**self.settings)


_HF = "https://huggingface.co/{}/blob/main/config.json"

#: The models compared, by name: their published configurations.
PUBLISHED = {p.name: p for p in (
    Published("Llama-3.1-8B", "LlamaConfig", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072), _HF.format("meta-llama/Llama-3.1-8B")),
    Published("Llama-3.1-70B", "LlamaConfig", dict(
        hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072), _HF.format("meta-llama/Llama-3.1-70B")),
    Published("Mistral-7B-v0.1", "MistralConfig", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        sliding_window=4096, max_position_embeddings=32768), _HF.format("mistralai/Mistral-7B-v0.1")),
    Published("DeepSeek-V3", "DeepseekV3Config", dict(
        hidden_size=7168, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=163840,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                             beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
        _HF.format("deepseek-ai/DeepSeek-V3")),
    Published("gpt-oss-120b", "GptOssConfig", dict(
        hidden_size=2880, num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        sliding_window=128, layer_types=_repeat(36, ["sliding_attention", "full_attention"]),
        max_position_embeddings=131072, num_local_experts=128, num_experts_per_tok=4), _HF.format("openai/gpt-oss-120b")),
    Published("Gemma-3-27B", "Gemma3TextConfig", dict(
        hidden_size=5376, num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16, head_dim=128,
        sliding_window=1024, query_pre_attn_scalar=168, max_position_embeddings=131072,
        layer_types=_repeat(62, ["sliding_attention"] * 5 + ["full_attention"])), _HF.format("google/gemma-3-27b-it")),
    Published("Qwen3-Next-80B-A3B", "Qwen3NextConfig", dict(
        hidden_size=2048, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, layer_types=_repeat(48, ["linear_attention"] * 3 + ["full_attention"]),
        max_position_embeddings=262144), _HF.format("Qwen/Qwen3-Next-80B-A3B-Instruct")),
    Published("Gemma-4-E2B", "Gemma4TextConfig", dict(
        hidden_size=1536, num_hidden_layers=35, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
        global_head_dim=512, sliding_window=512, num_kv_shared_layers=20, max_position_embeddings=131072,
        layer_types=_repeat(35, ["sliding_attention"] * 4 + ["full_attention"])), _HF.format("google/gemma-4-E2B-it")),
)}


@dataclass(frozen=True)
class LayerCache:
    """What one layer keeps: ``per_token`` numbers per position (all of them, or the last ``window``),
    ``fixed`` numbers whatever the length, and a recurrent ``state`` of that many numbers, which a
    half-precision model keeps in float32 (:func:`state_bytes_per_number`)."""

    kind: str  # full, latent, window, state or shared
    per_token: int = 0
    window: int | None = None
    fixed: int = 0
    state: int = 0

    def nbytes(self, num_tokens: int, bytes_per_number: int = BYTES_PER_NUMBER) -> int:
        """Bytes held after ``num_tokens`` tokens, in a model of ``bytes_per_number``.

        Example:
            >>> LayerCache("window", per_token=8, window=4).nbytes(10)  # 4 positions of 8 bfloat16 numbers
            64
            >>> LayerCache("state", fixed=6, state=16).nbytes(10)  # 6 bfloat16 inputs, 16 float32 numbers
            76
        """
        held = num_tokens if self.window is None else min(num_tokens, self.window)
        return ((self.per_token * held + self.fixed) * bytes_per_number
                + self.state * state_bytes_per_number(bytes_per_number))


def cache_layers(config) -> list[LayerCache]:
    """What each layer of a transformers configuration keeps, in order.

    Example:
        >>> layers = cache_layers(PUBLISHED["DeepSeek-V3"].config())
        >>> len(layers), layers[0]
        (61, LayerCache(kind='latent', per_token=576, window=None, fixed=0, state=0))
        >>> cache_layers(PUBLISHED["Qwen3-Next-80B-A3B"].config())[0]  # 3 inputs of 8,192 channels; 32 x 128 x 128
        LayerCache(kind='state', per_token=0, window=None, fixed=24576, state=524288)
    """
    if getattr(config, "kv_lora_rank", None):  # DeepSeek's latent attention
        return [LayerCache("latent", config.kv_lora_rank + config.qk_rope_head_dim)] * config.num_hidden_layers
    # Without layer types, every layer alike: windowed when the config has a window (Mistral 7B)
    every = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    types = getattr(config, "layer_types", None) or [every] * config.num_hidden_layers
    sharing = getattr(config, "kv_sharing_modes", None) or [None] * config.num_hidden_layers
    layers = []
    for index, (kind, shared) in enumerate(zip(types, sharing, strict=True)):
        own = config.per_layer_config[index] if getattr(config, "is_heterogeneous", False) else config
        per_token = 2 * own.num_key_value_heads * own.head_dim  # a key and a value per key/value head
        if shared == "reuse":
            layers.append(LayerCache("shared"))
        elif kind == "full_attention":
            layers.append(LayerCache("full", per_token))
        elif kind == "sliding_attention":
            layers.append(LayerCache("window", per_token, window=config.sliding_window))
        elif kind == "linear_attention":  # Gated DeltaNet: a (d_k x d_v) state per value head
            key_width = config.linear_num_key_heads * config.linear_key_head_dim
            value_width = config.linear_num_value_heads * config.linear_value_head_dim
            state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
            # the convolution's last kernel - 1 inputs of its query, key and value channels: all the next
            # step needs, as the course's layer keeps them (transformers keeps kernel inputs)
            convolved = (2 * key_width + value_width) * (config.linear_conv_kernel_dim - 1)
            layers.append(LayerCache("state", fixed=convolved, state=state))
        else:
            raise ValueError(f"layer {index} is of type {kind!r}, which cache_layers does not know: it reads "
                             "full_attention, sliding_attention and linear_attention layers.")
    return layers


def cache_bytes(config, num_tokens: int, batch: int = 1, bytes_per_number: int = BYTES_PER_NUMBER) -> int:
    """Bytes of the whole cache of a model after ``num_tokens`` tokens, for ``batch`` sequences.

    Example:
        >>> cache_bytes(PUBLISHED["Llama-3.1-8B"].config(), 1)  # 32 layers x 8 heads x 128 x 2 x 2 bytes
        131072
    """
    return batch * sum(layer.nbytes(num_tokens, bytes_per_number) for layer in cache_layers(config))


def describe_layers(layers: list[LayerCache]) -> str:
    """``"18 window 128 + 18 full"``: the layers by kind, in order of first appearance.

    Example:
        >>> describe_layers([LayerCache("window", 8, window=128), LayerCache("full", 8)] * 2)
        '2 window 128 + 2 full'
    """
    counts: dict[str, int] = {}
    for layer in layers:
        label = f"window {layer.window}" if layer.kind == "window" else layer.kind
        counts[label] = counts.get(label, 0) + 1
    return " + ".join(f"{n} {label}" for label, n in counts.items())


def cache_rows(names=None, lengths=LENGTHS, bytes_per_number: int = BYTES_PER_NUMBER) -> list[dict]:
    """One dict per model: ``name``, ``layers`` (by kind), ``per_token`` (bytes a token adds once every
    window is full), and ``bytes`` at each of ``lengths`` (one sequence)."""
    rows = []
    for name in names or PUBLISHED:
        config = PUBLISHED[name].config()
        layers = cache_layers(config)
        growing = sum(layer.per_token for layer in layers if layer.window is None)
        rows.append({"name": name, "layers": describe_layers(layers), "per_token": growing * bytes_per_number,
                     "bytes": {t: cache_bytes(config, t, bytes_per_number=bytes_per_number) for t in lengths}})
    return rows


def cache_table(names=None, lengths=LENGTHS, bytes_per_number: int = BYTES_PER_NUMBER) -> Table:
    """The models side by side: their cache layers, the bytes a token adds, and the whole cache of one
    sequence at each length, in bfloat16."""
    rows = cache_rows(names, lengths, bytes_per_number)
    columns = ["model", "cache layers", "per token"] + [f"{t // 1024}k tokens" for t in lengths]
    formats = {column: "bytes" for column in columns[2:]}
    return Table(columns, [[r["name"], r["layers"], r["per_token"], *r["bytes"].values()] for r in rows],
                 title="The cache of one sequence, every layer, in bfloat16", formats=formats,
                 notes=["per token: what each further token adds once the windows are full.",
                        "window W: keys and values of the last W positions; shared: reads an earlier layer's keys "
                        "and values.",
                        "state: Gated DeltaNet's recurrent state, in float32 as transformers and the course keep it, "
                        "and its convolution's last kernel - 1 inputs, all the next step needs (transformers keeps "
                        "one more)."])


class Held(NamedTuple):
    """Bytes a layer's cache holds for one sequence: ``per_token`` for each position, ``fixed`` whatever the
    length."""

    per_token: int
    fixed: int

    def __str__(self) -> str:
        """``"4.00 KiB a token"``, ``"2.05 MiB"``, or both joined by ``+``."""
        parts = [f"{format_bytes(self.per_token)} a token"] if self.per_token else []
        if self.fixed or not parts:
            parts.append(format_bytes(self.fixed))
        return " + ".join(parts)


def counted_held(layer: LayerCache, bytes_per_number: int = BYTES_PER_NUMBER) -> Held:
    """What :func:`cache_layers` counts for ``layer``, in bytes: before any window is full.

    Example:
        >>> print(counted_held(LayerCache("state", fixed=3, state=4)))  # 3 bfloat16 numbers, 4 float32
        22 B
    """
    fixed = layer.nbytes(0, bytes_per_number)
    return Held(layer.nbytes(1, bytes_per_number) - fixed, fixed)


def _small_layers(name: str, context_length: int) -> dict:
    """One small layer of the course for each kind of model ``name``'s layers the course builds, with the
    model's cache sizes: its key/value heads and head width, its latent and rotated widths, its Gated DeltaNet
    heads, state and convolution. Their width (and a latent layer's heads) are small: the cache does not
    depend on them."""
    from .attention.gated_deltanet import GatedDeltaNet
    from .attention.grouped_query import GroupedQueryAttention
    from .convert.deepseek import from_deepseek_v3_attention

    config = PUBLISHED[name].config()
    kinds = {layer.kind for layer in cache_layers(config)}
    torch.manual_seed(0)
    layers = {}
    if "latent" in kinds:
        small = type(config)(**{**PUBLISHED[name].settings, "hidden_size": 64, "num_attention_heads": 2,
                                "num_key_value_heads": 2, "q_lora_rank": None})
        modeling = importlib.import_module("transformers.models.deepseek_v3.modeling_deepseek_v3")
        layers["latent"] = from_deepseek_v3_attention(modeling.DeepseekV3Attention(small, layer_idx=0))
    for kind, layer_type in (("full", "full_attention"), ("window", "sliding_attention")):
        if kind not in kinds:
            continue
        own = config
        if getattr(config, "is_heterogeneous", False):  # the layers' own sizes
            own = config.per_layer_config[config.layer_types.index(layer_type)]
        heads, head_dim = own.num_key_value_heads, own.head_dim
        window = config.sliding_window if kind == "window" else None  # the prompts are shorter than it
        layers[kind] = GroupedQueryAttention(8, heads * head_dim, context_length, 0.0, heads, heads, window=window)
        # the explicit path keeps the same cache and runs in bfloat16 on any processor: PyTorch's fused
        # kernel on the CPU wants AVX-512 for bfloat16 prompts past a few tokens
        layers[kind].use_sdpa = False
    if "state" in kinds:
        layers["state"] = GatedDeltaNet(8, config.linear_num_value_heads, config.linear_num_key_heads,
                                        config.linear_key_head_dim, config.linear_value_head_dim,
                                        conv_size=config.linear_conv_kernel_dim)
    return layers


def measured_layer_bytes(name: str, prompts: tuple[int, int] = (6, 70), dtype=torch.bfloat16) -> dict[str, Held]:
    """What one layer of each kind the course builds keeps for one sequence of model ``name``, measured.

    Each small layer of :func:`_small_layers`, in ``dtype``, runs the two ``prompts`` (the longer one
    past a Gated DeltaNet's first chunk of 64 tokens); its :attr:`KVCache.nbytes
    <mha_course.KVCache.nbytes>` after each gives what a token adds and what is held whatever the
    length. Kinds the course does not build yet are left out.

    Example:
        >>> held = measured_layer_bytes("Qwen3-Next-80B-A3B")
        >>> held["full"].per_token, held["state"].per_token  # a key and a value of 2 x 256; a fixed state
        (2048, 0)
    """
    from .attention.kv_cache import KVCache

    short, long = prompts
    measured = {}
    for kind, layer in _small_layers(name, long).items():
        layer = layer.to(dtype).eval()
        held = []
        for num_tokens in prompts:
            cache = KVCache()
            with torch.no_grad():
                layer(torch.randn(1, num_tokens, layer.d_in, dtype=dtype), cache=cache)
            held.append(cache.nbytes)
        per_token, rest = divmod(held[1] - held[0], long - short)
        if rest:
            raise RuntimeError(f"{name}: a {kind} layer's cache grew by {held[1] - held[0]} bytes over "
                               f"{long - short} tokens, not a whole number of bytes a token.")
        measured[kind] = Held(per_token, held[0] - per_token * short)
    return measured


def layer_checks(names=None, bytes_per_number: int = BYTES_PER_NUMBER) -> list[dict]:
    """For each model and each kind of its layers the course builds: ``name``, ``kind``, ``counted`` and
    ``measured`` (:class:`Held`, a bfloat16 model), and whether they are ``equal``."""
    rows = []
    for name in names or PUBLISHED:
        counted = {layer.kind: counted_held(layer, bytes_per_number) for layer in cache_layers(PUBLISHED[name].config())}
        for kind, measured in measured_layer_bytes(name).items():
            rows.append({"name": name, "kind": kind, "counted": counted[kind], "measured": measured,
                         "equal": counted[kind] == measured})
    return rows


def layer_check_table(rows: list[dict]) -> Table:
    """:func:`layer_checks` as a table."""
    return Table(["model", "layer kind", "counted", "measured", "equal"],
                 [[r["name"], r["kind"], str(r["counted"]), str(r["measured"]), r["equal"]] for r in rows],
                 title="What one layer keeps for one sequence: counted, and measured with KVCache.nbytes",
                 notes=["a token: what each token adds; without it: what the layer holds whatever the length."])


def measured_sharing(num_tokens: int = 8) -> dict[str, int]:
    """Bytes of keys and values a small Gemma 4 (Gemma-4-E2B's layers, tiny widths) caches after a
    prompt, with its published cross-layer sharing (``shared``) and with every layer its own (``own``).

    Built and run with transformers (``Gemma4TextModel``, float32), whose cache holds what each
    layer keeps; the sharing layers keep nothing.
    """
    transformers = importlib.import_module("transformers")
    modeling = importlib.import_module("transformers.models.gemma4.modeling_gemma4")
    settings = PUBLISHED["Gemma-4-E2B"].settings
    held = {}
    for label, shared in (("shared", settings["num_kv_shared_layers"]), ("own", 0)):
        config = transformers.Gemma4TextConfig(**{
            **settings, "num_kv_shared_layers": shared, "hidden_size": 16, "num_attention_heads": 2,
            "head_dim": 8, "global_head_dim": 16, "intermediate_size": 16, "vocab_size": 64,
            "vocab_size_per_layer_input": 64, "hidden_size_per_layer_input": 4})
        torch.manual_seed(0)
        model = modeling.Gemma4TextModel(config).eval()
        with torch.no_grad():
            cache = model(torch.randint(0, 64, (1, num_tokens)), use_cache=True).past_key_values
        held[label] = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values)
                          if isinstance(t, torch.Tensor))
    return held
