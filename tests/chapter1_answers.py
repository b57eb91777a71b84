"""Answers to the exercises of chapter 1 for the check tests: a correct one each, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors
(:func:`mha_course.exercises.chapter1.head_variant` and the mask and shape rules of that module), so
a test passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

import mha_course
from mha_course import CausalAttention

# ----------------------------------------------------------------------------------------------
# 1.1


def build_causal_mask(num_tokens, device=None):
    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)


def build_causal_mask_by_comparison(num_tokens, device=None):
    positions = torch.arange(num_tokens, device=device)
    return positions[None, :] > positions[:, None]


# ----------------------------------------------------------------------------------------------
# 1.2


def causal_attention_forward(x, W_query, W_key, W_value):
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    scores = queries @ keys.transpose(1, 2)
    mask = build_causal_mask(x.shape[1], device=x.device)
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")) / keys.shape[-1] ** 0.5, dim=-1)
    return weights @ values


def causal_attention_forward_zero_and_renormalise(x, W_query, W_key, W_value):
    keys = x @ W_key
    weights = torch.softmax((x @ W_query) @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5, dim=-1)
    weights = weights.masked_fill(build_causal_mask(x.shape[1], x.device), 0.0)
    return (weights / weights.sum(dim=-1, keepdim=True)) @ (x @ W_value)


def _head(x, W_query, W_key, W_value, *, diagonal=1, fill=float("-inf"), dim=-1, scale=None, mix=None,
          transposed=False, zero_after=False, use_mask=True, mask_device=True, dropout=0.0):
    q, k, v = x @ W_query, x @ W_key, x @ W_value
    scores = k @ q.transpose(1, 2) if transposed else q @ k.transpose(1, 2)
    n = x.shape[1]
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device if mask_device else None), diagonal=diagonal)
    if not use_mask:
        mask = torch.zeros_like(mask)
    divisor = k.shape[-1] ** 0.5 if scale is None else scale(x, W_key)
    if zero_after:
        weights = torch.softmax(scores / divisor, dim=dim).masked_fill(mask, 0.0)
    else:
        weights = torch.softmax(scores.masked_fill(mask, fill) / divisor, dim=dim)
    if dropout:
        weights = F.dropout(weights, p=dropout)  # left in from the module, which has dropout
    return weights @ (v if mix is None else mix(x, k))


def _head_through_causal_attention(x, W_query, W_key, W_value):
    head = CausalAttention(W_query.shape[0], W_query.shape[1], x.shape[1], 0.0)
    return functional_call(head, {"W_query.weight": W_query.T, "W_key.weight": W_key.T, "W_value.weight": W_value.T}, (x,))


# ----------------------------------------------------------------------------------------------
# 1.3


def head_shapes(batch, num_tokens, d_in, d_out, context_length):
    return {"W_query.weight": (d_out, d_in), "queries": (batch, num_tokens, d_out),
            "scores": (batch, num_tokens, num_tokens), "mask": (context_length, context_length),
            "mask_used": (num_tokens, num_tokens), "weights": (batch, num_tokens, num_tokens),
            "context": (batch, num_tokens, d_out)}


def _shapes(**changes):
    def shapes(batch, num_tokens, d_in, d_out, context_length):
        answer = head_shapes(batch, num_tokens, d_in, d_out, context_length)
        sizes = {"b": batch, "t": num_tokens, "i": d_in, "o": d_out, "c": context_length}
        return {**answer, **{key: tuple(sizes[s] for s in spec) for key, spec in changes.items()}}
    return shapes


def _shapes_by_running_the_module(batch, num_tokens, d_in, d_out, context_length):
    head = CausalAttention(d_in, d_out, context_length, 0.0)
    x = torch.zeros(batch, num_tokens, d_in)
    return {**head_shapes(batch, num_tokens, d_in, d_out, context_length), "context": tuple(head(x).shape)}


CORRECT = {"1.1": build_causal_mask, "1.2": causal_attention_forward, "1.3": head_shapes}

#: More correct answers, written differently.
ALSO_CORRECT = {"1.1": [build_causal_mask_by_comparison], "1.2": [causal_attention_forward_zero_and_renormalise]}

def _keys_dot_T(x, W_query, W_key, W_value):
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    scores = queries @ keys.T / keys.shape[-1] ** 0.5  # .T as on the 2-D matrices of the chapter
    mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), diagonal=1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ values


WRONG = {
    ("1.1", "diagonal-masked"): lambda n, device=None: torch.ones(n, n, device=device).triu().bool(),
    ("1.1", "transposed"): lambda n, device=None: torch.ones(n, n, dtype=torch.bool, device=device).tril(-1),
    ("1.1", "visibility-table"): lambda n, device=None: torch.tril(torch.ones(n, n, device=device)) == 1,
    ("1.1", "nothing-masked"): lambda n, device=None: torch.zeros(n, n, dtype=torch.bool, device=device),
    ("1.1", "additive-mask"): lambda n, device=None: torch.full((n, n), float("-inf"), device=device).triu(1),
    ("1.1", "not-bool"): lambda n, device=None: torch.triu(torch.ones(n, n, device=device), diagonal=1),
    # One of the four false passes of the old checks (they passed wherever the default device is the CPU).
    ("1.1", "device-ignored"): lambda n, device=None: torch.triu(torch.ones(n, n, dtype=torch.bool), 1),
    ("1.2", "no-mask"): lambda x, q, k, v: _head(x, q, k, v, use_mask=False),
    ("1.2", "mask-diagonal"): lambda x, q, k, v: _head(x, q, k, v, diagonal=0),
    ("1.2", "mask-fill-zero"): lambda x, q, k, v: _head(x, q, k, v, fill=0.0),
    ("1.2", "zero-after-softmax"): lambda x, q, k, v: _head(x, q, k, v, zero_after=True),
    ("1.2", "softmax-axis"): lambda x, q, k, v: _head(x, q, k, v, dim=1),
    ("1.2", "scores-transposed"): lambda x, q, k, v: _head(x, q, k, v, transposed=True),
    ("1.2", "no-scale"): lambda x, q, k, v: _head(x, q, k, v, scale=lambda x, w: 1.0),
    ("1.2", "scale-d-in"): lambda x, q, k, v: _head(x, q, k, v, scale=lambda x, w: x.shape[-1] ** 0.5),
    ("1.2", "scale-no-sqrt"): lambda x, q, k, v: _head(x, q, k, v, scale=lambda x, w: w.shape[1]),
    ("1.2", "weights-times-inputs"): lambda x, q, k, v: _head(x, q, k, v, mix=lambda x, keys: x),
    ("1.2", "weights-times-keys"): lambda x, q, k, v: _head(x, q, k, v, mix=lambda x, keys: keys),
    ("1.2", "mask-on-cpu"): lambda x, q, k, v: _head(x, q, k, v, mask_device=False),
    ("1.2", "dropout-left-in"): lambda x, q, k, v: _head(x, q, k, v, dropout=0.1),
    ("1.2", "keys-dot-T"): _keys_dot_T,
    ("1.3", "linear-weight-transposed"): _shapes(**{"W_query.weight": "io"}),
    ("1.3", "queries-input-width"): _shapes(queries="bti"),
    ("1.3", "scores-like-queries"): _shapes(scores="bto"),
    ("1.3", "scores-without-batch"): _shapes(scores="tt"),
    ("1.3", "mask-per-input"): _shapes(mask="tt"),
    ("1.3", "mask-used-whole"): _shapes(mask_used="cc"),
    ("1.3", "weights-like-values"): _shapes(weights="bto"),
    ("1.3", "context-input-width"): _shapes(context="bti"),
    ("1.3", "context-like-weights"): _shapes(context="btt"),
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "1.1 is causal_mask": ("1.1", mha_course.causal_mask, "mha_course's own causal_mask"),
    "1.1 calls causal_mask": ("1.1", lambda n, device=None: mha_course.causal_mask(n, device), "mha_course's own causal_mask"),
    "1.1 calls visibility": ("1.1", lambda n, device=None: ~mha_course.visibility(n).to(device), "mha_course's own visibility"),
    "1.1 reads a module's buffer": ("1.1", lambda n, device=None: CausalAttention(2, 2, n, 0.0).mask.to(device),
                                    "mha_course's own causal_mask"),
    "1.2 runs CausalAttention": ("1.2", _head_through_causal_attention, "mha_course's own CausalAttention"),
    "1.2 calls the fused kernel": ("1.2", lambda x, q, k, v: F.scaled_dot_product_attention(
        (x @ q)[:, None], (x @ k)[:, None], (x @ v)[:, None], is_causal=True)[:, 0], "torch's scaled_dot_product_attention"),
    "1.3 measures a module": ("1.3", _shapes_by_running_the_module, "mha_course's own CausalAttention"),
}
