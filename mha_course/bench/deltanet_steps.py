"""What ``bench --deltanet`` (chapter 12) times, as calls: a prompt three ways, and one decoded token two ways.

Built here, apart from the run (:mod:`mha_course.bench.deltanet`), so that the memory server
(:mod:`mha_course.bench.memory`) can build them in its child processes without importing the run,
as :mod:`mha_course.bench.tiled_steps` does for the tiled benchmark.

* A **prompt** (mode ``"deltanet-prompt"``): ``T`` tokens' queries, keys and values ``(1, h, T, d)``
  through the gated delta rule in its chunked form (:func:`~mha_course.chunked_gated_delta_rule`,
  chunks of 64) and its recurrent form (:func:`~mha_course.recurrent_gated_delta_rule`, one token at a
  time), and through causal softmax attention with PyTorch's fused kernel
  (``scaled_dot_product_attention(is_causal=True)``), which the delta rule replaces.
* One **decoded token** (mode ``"deltanet-decode"``) after ``T - 1`` earlier ones, by a whole layer
  of width ``h * d``: :class:`~mha_course.GroupedQueryAttention` (one key/value head per query head)
  reading a :class:`~mha_course.KVCache` of ``T - 1`` keys and values, and
  :class:`~mha_course.GatedDeltaNet` (``h`` heads of ``d``) reading its fixed-size cache. Each call
  first puts its cache back, so every call decodes the same token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.delta_rule import chunked_gated_delta_rule, l2_normalise, recurrent_gated_delta_rule
from ..attention.gated_deltanet import GatedDeltaNet
from ..attention.grouped_query import GroupedQueryAttention
from ..attention.kv_cache import KVCache
from .sizes import BenchConfig

#: The two modes of a run: a prompt processed, and one token decoded.
PROMPT_MODE, DECODE_MODE = "deltanet-prompt", "deltanet-decode"

#: The ways of processing a prompt, by name.
PROMPT_IMPLEMENTATIONS = {
    "chunked": "the gated delta rule in chunks of 64: matrix products and a triangular solve per chunk",
    "recurrent": "the gated delta rule one token at a time: one state update per token",
    "sdpa": "causal softmax attention, scaled_dot_product_attention(is_causal=True): the fused kernel",
}

#: The ways of decoding one token, by name.
DECODE_IMPLEMENTATIONS = {
    "kv_cache": "GroupedQueryAttention (multi-head) reading a KVCache of every earlier key and value",
    "state": "GatedDeltaNet reading and updating its fixed-size state",
}


def prompt_inputs(config: BenchConfig, device="cpu", seed: int = 1):
    """Seeded ``(queries, keys, values, log_decay, beta)`` of one prompt, as the layer makes them:
    queries and keys of length 1 (queries scaled by ``1/sqrt(d)``), decays and strengths of a trained
    layer's range."""
    g = torch.Generator().manual_seed(seed)
    shape = (config.batch, config.num_heads, config.num_tokens, config.head_dim)
    q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))
    log_decay = -torch.rand(*shape[:3], generator=g) * 0.1  # a decay between 0.9 and 1 per token
    beta = torch.sigmoid(torch.randn(*shape[:3], generator=g))
    q = l2_normalise(q) * config.head_dim**-0.5
    return tuple(t.to(device) for t in (q, l2_normalise(k), v, log_decay, beta))


def prompt_calls(config: BenchConfig, device="cpu", seed: int = 1) -> dict:
    """Name -> a no-argument callable that processes the prompt that way, under ``torch.no_grad``,
    and returns its outputs ``(1, h, T, d)``.

    Example:
        >>> calls = prompt_calls(BenchConfig("tiny", 1, 70, 16, 2, 8, ""))
        >>> torch.allclose(calls["chunked"](), calls["recurrent"](), atol=1e-5), list(calls)
        (True, ['chunked', 'recurrent', 'sdpa'])
    """
    q, k, v, log_decay, beta = prompt_inputs(config, device, seed)
    functions = {
        "chunked": lambda: chunked_gated_delta_rule(q, k, v, log_decay, beta)[0],
        "recurrent": lambda: recurrent_gated_delta_rule(q, k, v, log_decay, beta)[0],
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }

    def no_grad(fn):
        def call():
            with torch.no_grad():
                return fn()
        return call

    return {name: no_grad(functions[name]) for name in PROMPT_IMPLEMENTATIONS}


def decode_layers(config: BenchConfig, seed: int = 0) -> dict:
    """The two layers of a decoding size, by name, seeded, in eval mode (on the CPU)."""
    h, d, width = config.num_heads, config.head_dim, config.d_in
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = {"kv_cache": GroupedQueryAttention(width, h * d, config.num_tokens, 0.0, h, h),
                  "state": GatedDeltaNet(width, h, h, d, d)}
    return {name: layer.eval() for name, layer in layers.items()}


def decode_calls(config: BenchConfig, device="cpu", seed: int = 0) -> tuple[dict, dict]:
    """``(calls, caches)``: name -> a callable returning token ``T``'s output ``(1, 1, width)`` after
    ``T - 1`` earlier tokens, and name -> the cache it reads (filled by a prompt of those tokens).

    Example:
        >>> calls, caches = decode_calls(BenchConfig("tiny", 1, 20, 16, 2, 8, ""))
        >>> len(caches["kv_cache"]), len(caches["state"])  # the 19 earlier tokens
        (19, 19)
        >>> outputs = [calls["state"]() for _ in range(2)]  # every call decodes the same token
        >>> outputs[0].shape, torch.equal(*outputs), len(caches["state"])
        (torch.Size([1, 1, 16]), True, 20)
    """
    layers = {name: layer.to(device) for name, layer in decode_layers(config, seed).items()}
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(config.batch, config.num_tokens, config.d_in, generator=g).to(device)
    caches, saved = {}, {}
    for name, layer in layers.items():
        caches[name] = KVCache()
        with torch.no_grad():
            if config.num_tokens > 1:
                layer(x[:, :-1], cache=caches[name])  # the T - 1 earlier tokens
        saved[name] = caches[name].__getstate__()  # what it holds after them

    def step(name):
        layer, cache = layers[name], caches[name]

        def call():
            held = saved[name]  # back to the T - 1 earlier tokens:
            cache.__setstate__({**held, "tensors": dict(held["tensors"]), "states": dict(held["states"])})
            with torch.no_grad():
                return layer(x[:, -1:], cache=cache)
        return call

    return {name: step(name) for name in DECODE_IMPLEMENTATIONS}, caches
