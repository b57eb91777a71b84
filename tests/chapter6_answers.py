"""Answers to the exercises of chapter 6 for the check tests: a correct one each, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors
(:func:`mha_course.exercises.chapter6.step_variant` and friends), so a test passes only if the
catalogue recognises real code.
"""

from __future__ import annotations

import torch

from mha_course import cost
from mha_course.exercises import chapter6

# ----------------------------------------------------------------------------------------------
# 6.1


def expand_kv_heads(kv, num_heads):  # a new axis of size 1 after the heads, stretched and folded
    batch, groups, tokens, head_dim = kv.shape
    return kv[:, :, None].expand(batch, groups, num_heads // groups, tokens, head_dim).reshape(
        batch, num_heads, tokens, head_dim)


def expand_by_repeat_interleave(kv, num_heads):  # right numbers, but the listing's own call: refused
    return kv.repeat_interleave(num_heads // kv.shape[1], dim=1)


def _expand_by_indexing(kv, num_heads):  # also correct: indexing by CPU indices works on a GPU too
    return kv[:, torch.arange(num_heads) // (num_heads // kv.shape[1])]


def _expand_by_index_select(kv, num_heads):  # also correct: the indices made on kv's device
    return kv.index_select(1, torch.arange(num_heads, device=kv.device) // (num_heads // kv.shape[1]))


# ----------------------------------------------------------------------------------------------
# 6.2


def _heads(t, n):
    batch, tokens, width = t.shape
    return t.view(batch, tokens, n, width // n).transpose(1, 2)


def _step(gqa, x_new, past_keys, past_values, *, tile=False, scale=True, append_first=True, new_first=False,
          project_out=True, use_bias=True, dim=-1, row_zero_mask=False, return_past=False, append_twice=False,
          cpu_tensor=False):
    def linear(layer, t):
        return layer(t) if use_bias else t @ layer.weight.T

    queries = _heads(linear(gqa.W_query, x_new), gqa.num_heads)
    new_keys = _heads(linear(gqa.W_key, x_new), gqa.num_kv_groups)
    new_values = _heads(linear(gqa.W_value, x_new), gqa.num_kv_groups)
    if new_first:
        keys, values = torch.cat([new_keys, past_keys], dim=2), torch.cat([new_values, past_values], dim=2)
    else:
        keys, values = torch.cat([past_keys, new_keys], dim=2), torch.cat([past_values, new_values], dim=2)
    if append_twice:  # the new token appended once to attend, then once more to return
        keys, values = torch.cat([keys, new_keys], dim=2), torch.cat([values, new_values], dim=2)
    seen_keys, seen_values = (keys, values) if append_first else (past_keys, past_values)
    r = gqa.num_heads // gqa.num_kv_groups
    if tile:
        seen_keys, seen_values = seen_keys.repeat(1, r, 1, 1), seen_values.repeat(1, r, 1, 1)
    else:
        seen_keys, seen_values = seen_keys.repeat_interleave(r, 1), seen_values.repeat_interleave(r, 1)
    scores = queries @ seen_keys.transpose(-2, -1)
    if scale:
        scores = scores / (gqa.d_out if scale == "d_out" else seen_keys.shape[-1]) ** 0.5
    if cpu_tensor:  # a fresh tensor without a device: on the CPU, whatever the inputs' device
        scores = scores + torch.zeros(scores.shape[-1])
    if row_zero_mask:  # the first row of the causal mask
        first_row = torch.ones(1, scores.shape[-1], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(first_row, float("-inf"))
    context = (torch.softmax(scores, dim=dim) @ seen_values).transpose(1, 2).flatten(2)
    out = gqa.out_proj(context) if project_out else context
    return (out, past_keys, past_values) if return_past else (out, keys, values)


def decode_step(gqa, x_new, past_keys, past_values):
    return _step(gqa, x_new, past_keys, past_values)


def _step_with(**how):
    return lambda gqa, x_new, past_keys, past_values: _step(gqa, x_new, past_keys, past_values, **how)


def _step_by_the_module(gqa, x_new, past_keys, past_values):
    from mha_course import KVCache

    cache = KVCache()
    if past_keys.shape[2]:
        cache.keys, cache.values = past_keys, past_values
    return gqa(x_new, cache=cache), cache.keys, cache.values


def _step_by_the_cache(gqa, x_new, past_keys, past_values):
    from mha_course import KVCache

    out, _, _ = decode_step(gqa, x_new, past_keys, past_values)
    cache = KVCache()
    if past_keys.shape[2]:
        cache.append(past_keys, past_values)
    keys, values = cache.append(_heads(gqa.W_key(x_new), gqa.num_kv_groups),
                                _heads(gqa.W_value(x_new), gqa.num_kv_groups))
    return out, keys, values


def _step_by_attention_weights(gqa, x_new, past_keys, past_values):
    # Recomputes nothing it was not given... but reads the module's own weights for the new token.
    out, keys, values = decode_step(gqa, x_new, past_keys, past_values)
    gqa.attention_weights(x_new)
    return out, keys, values


# ----------------------------------------------------------------------------------------------
# 6.3


def kv_cache_size(num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number):
    per_token = 2 * num_layers * num_kv_groups * head_dim * bytes_per_number  # a key and a value per layer
    return per_token * num_tokens * batch_size


def _size_by_the_package(num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number):
    from mha_course.cost import kv_cache_bytes

    return kv_cache_bytes(num_layers, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number)


CORRECT = {"6.1": expand_kv_heads, "6.2": decode_step, "6.3": kv_cache_size}

#: More correct answers, written differently.
ALSO_CORRECT = {"6.1": [_expand_by_indexing, _expand_by_index_select]}

WRONG = {
    ("6.1", "repeat"): lambda kv, h: kv.repeat(1, h // kv.shape[1], 1, 1),
    ("6.1", "repeated-num-heads"): lambda kv, h: kv.repeat_interleave(h, dim=1),
    ("6.1", "repeated-num-groups"): lambda kv, h: kv.repeat_interleave(kv.shape[1], dim=1),
    ("6.1", "token-axis"): lambda kv, h: torch.repeat_interleave(kv, h // kv.shape[1], dim=2),
    ("6.1", "feature-axis"): lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=3),
    ("6.1", "expand-one-group"): lambda kv, h: kv.expand(-1, h, -1, -1),
    # Passed on the meta device, which lets index_select take CPU indices; a GPU refuses them.
    ("6.1", "index-on-cpu"): lambda kv, h: kv.index_select(1, torch.arange(h) // (h // kv.shape[1])),
    ("6.2", "keys-not-appended"): _step_with(return_past=True),
    ("6.2", "new-token-first"): _step_with(new_first=True),
    ("6.2", "new-token-not-attended"): _step_with(append_first=False),
    ("6.2", "repeat-not-interleave"): _step_with(tile=True),
    ("6.2", "no-scale"): _step_with(scale=False),
    ("6.2", "scale-d-out"): _step_with(scale="d_out"),
    ("6.2", "no-out-proj"): _step_with(project_out=False),
    ("6.2", "bias-ignored"): _step_with(use_bias=False),
    ("6.2", "softmax-over-queries"): _step_with(dim=-2),
    ("6.2", "mask-row-of-first-token"): _step_with(row_zero_mask=True),
    ("6.2", "appended-twice"): _step_with(append_twice=True),
    ("6.2", "cpu-tensor"): _step_with(cpu_tensor=True),
    ("6.3", "mib"): lambda L, h, g, d, T, B, b: kv_cache_size(L, h, g, d, T, B, b) / 2**20,
    ("6.3", "keys-only"): lambda L, h, g, d, T, B, b: L * g * d * b * T * B,
    ("6.3", "query-heads"): lambda L, h, g, d, T, B, b: 2 * L * h * d * b * T * B,
    ("6.3", "group-size"): lambda L, h, g, d, T, B, b: 2 * L * (h // g) * d * b * T * B,
    ("6.3", "one-layer"): lambda L, h, g, d, T, B, b: 2 * g * d * b * T * B,
    ("6.3", "batch-ignored"): lambda L, h, g, d, T, B, b: 2 * L * g * d * b * T,
    ("6.3", "per-token"): lambda L, h, g, d, T, B, b: 2 * L * g * d * b * B,
    ("6.3", "tokens-squared"): lambda L, h, g, d, T, B, b: 2 * L * g * d * b * T * T * B,
    ("6.3", "bits"): lambda L, h, g, d, T, B, b: 2 * L * g * d * 8 * b * T * B,
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "6.1 is the checks' reference": ("6.1", chapter6.reference_expand, "the checks' own chapter6.reference_expand"),
    "6.2 runs the module": ("6.2", _step_by_the_module, "mha_course's own GroupedQueryAttention"),
    "6.2 appends with the package's cache": ("6.2", _step_by_the_cache, "mha_course's own KVCache.append"),
    "6.2 reads attention_weights": ("6.2", _step_by_attention_weights, "mha_course's own GroupedQueryAttention"),
    "6.3 is kv_cache_bytes": ("6.3", cost.kv_cache_bytes, "mha_course's own kv_cache_bytes"),
    "6.3 calls kv_cache_bytes": ("6.3", _size_by_the_package, "mha_course's own kv_cache_bytes"),
}
