"""Answers to the exercise of chapter 8 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detector
(:func:`mha_course.exercises.chapter8.mapping_variant`), so a test passes only if the catalogue
recognises real code.
"""

from __future__ import annotations

import torch
from torch import nn

import mha_course

# ----------------------------------------------------------------------------------------------
# 8.1


def _copy(attention, mha, *, transpose=True, out_transpose=True, order=("q", "k", "v"), qkv_bias=True,
          out_bias=True, out_proj=True, per_head=False, no_grad=True):
    d = mha.d_out
    w, b = attention.c_attn.weight, attention.c_attn.bias  # (d, 3d), (3d,)
    if per_head:
        h, d_h = mha.num_heads, d // mha.num_heads
        w = w.view(d, h, 3, d_h)
        b = b.view(h, 3, d_h)
        parts = {role: (w[:, :, i].reshape(d, d), b[:, i].reshape(d)) for i, role in enumerate("qkv")}
    else:
        parts = {role: (w[:, i * d:(i + 1) * d], b[i * d:(i + 1) * d]) for i, role in enumerate("qkv")}
    context = torch.no_grad() if no_grad else torch.enable_grad()
    with context:
        for linear, role in zip((mha.W_query, mha.W_key, mha.W_value), order):
            weight, bias = parts[role]
            linear.weight.copy_(weight.T if transpose else weight)
            if qkv_bias:
                linear.bias.copy_(bias)
        if out_proj:
            c_proj = attention.c_proj.weight
            mha.out_proj.weight.copy_(c_proj.T if transpose and out_transpose else c_proj)
            if out_bias:
                mha.out_proj.bias.copy_(attention.c_proj.bias)
    return mha


def copy_gpt2_weights(attention, mha):
    return _copy(attention, mha)


def _by_split(attention, mha):  # also correct: split the output width, as GPT-2's forward does
    q, k, v = attention.c_attn.weight.split(mha.d_out, dim=1)
    qb, kb, vb = attention.c_attn.bias.split(mha.d_out)
    with torch.no_grad():
        for linear, w, b in zip((mha.W_query, mha.W_key, mha.W_value), (q, k, v), (qb, kb, vb)):
            linear.weight.copy_(w.t())
            linear.bias.copy_(b)
        mha.out_proj.load_state_dict({"weight": attention.c_proj.weight.t(), "bias": attention.c_proj.bias})
    return mha


def _by_state_dict(attention, mha):  # also correct: one load_state_dict, the mask kept
    w, b = attention.c_attn.weight.detach(), attention.c_attn.bias.detach()
    d = mha.d_out
    state = {"mask": mha.mask}
    for i, role in enumerate(("W_query", "W_key", "W_value")):
        state[f"{role}.weight"] = w[:, i * d:(i + 1) * d].T.clone()
        state[f"{role}.bias"] = b[i * d:(i + 1) * d].clone()
    state["out_proj.weight"] = attention.c_proj.weight.detach().T.clone()
    state["out_proj.bias"] = attention.c_proj.bias.detach().clone()
    mha.load_state_dict(state)
    return mha


def _with(**how):
    return lambda attention, mha: _copy(attention, mha, **how)


def _chunk_rows(attention, mha):  # the (d, 3d) weight cut along the wrong axis
    with torch.no_grad():
        for linear, w in zip((mha.W_query, mha.W_key, mha.W_value), attention.c_attn.weight.chunk(3, dim=0)):
            linear.weight.copy_(w)
    return mha


def _new_module(attention, mha):
    from mha_course import MultiHeadAttention

    fresh = MultiHeadAttention(mha.d_in, mha.d_out, mha.context_length, 0.0, mha.num_heads, qkv_bias=True)
    return _copy(attention, fresh)


def _shared(attention, mha):
    d = mha.d_out
    w, b = attention.c_attn.weight, attention.c_attn.bias
    for i, linear in enumerate((mha.W_query, mha.W_key, mha.W_value)):
        linear.weight = nn.Parameter(w[:, i * d:(i + 1) * d].T)
        linear.bias = nn.Parameter(b[i * d:(i + 1) * d])
    mha.out_proj.weight = nn.Parameter(attention.c_proj.weight.T)
    mha.out_proj.bias = nn.Parameter(attention.c_proj.bias)
    return mha


def _plain_tensors(attention, mha):
    d = mha.d_out
    w, b = attention.c_attn.weight.detach(), attention.c_attn.bias.detach()
    for i, linear in enumerate((mha.W_query, mha.W_key, mha.W_value)):
        del linear.weight, linear.bias
        linear.weight = w[:, i * d:(i + 1) * d].T.clone()
        linear.bias = b[i * d:(i + 1) * d].clone()
    with torch.no_grad():
        mha.out_proj.weight.copy_(attention.c_proj.weight.T)
        mha.out_proj.bias.copy_(attention.c_proj.bias)
    return mha


def _frozen(attention, mha):
    _copy(attention, mha)
    for p in mha.parameters():
        p.requires_grad_(False)
    return mha


def _no_return(attention, mha):  # right copies, but nothing returned
    _copy(attention, mha)


def _gpt2_call(attention, x):
    t = x.shape[1]
    mask = torch.zeros(t, t, dtype=x.dtype).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return attention(x, attention_mask=mask[None, None])[0]


def _forward_replaced(attention, mha):  # nothing copied: mha now calls GPT-2 itself
    mha.forward = lambda x: _gpt2_call(attention, x)
    return mha


def _class_swapped(attention, mha):  # the same trick, by swapping the module's class
    class CallsGPT2(type(mha)):
        def forward(self, x):
            return _gpt2_call(attention, x)

    mha.__class__ = CallsGPT2
    return mha


def _copied_and_forward_replaced(attention, mha):  # weights copied, yet its own forward not used
    _copy(attention, mha)
    return _forward_replaced(attention, mha)


def _by_the_package(attention, mha):
    return mha.load_state_dict(mha_course.from_gpt2_attention(attention).state_dict())


# ----------------------------------------------------------------------------------------------
# 8.2


def _turn(x, start, rope_theta, *, sign=1, interleaved=False, offset=True):
    d, t = x.shape[-1], x.shape[-2]
    freqs = 1.0 / rope_theta ** (torch.arange(0, d, 2).float() / d)  # (d/2,)
    positions = torch.arange(t).float() + (start if offset else 0)
    angles = positions[:, None] * freqs  # (T, d/2)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * angles.cos() - b * sign * angles.sin(),
                            a * sign * angles.sin() + b * angles.cos()), dim=-1).flatten(-2)
    cos, sin = torch.cat((angles, angles), -1).cos(), sign * torch.cat((angles, angles), -1).sin()
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rotate_by_position(queries, keys, values, start, rope_theta):
    return _turn(queries, start, rope_theta), _turn(keys, start, rope_theta), values


def _rotate_pairs_by_hand(queries, keys, values, start, rope_theta):  # also correct: pair by pair
    def turn(x):
        d = x.shape[-1]
        out = x.clone()
        for t in range(x.shape[-2]):
            for i in range(d // 2):
                angle = torch.tensor((start + t) * rope_theta ** (-2 * i / d))
                a, b = x[..., t, i], x[..., t, i + d // 2]
                out[..., t, i] = a * angle.cos() - b * angle.sin()
                out[..., t, i + d // 2] = a * angle.sin() + b * angle.cos()
        return out
    return turn(queries), turn(keys), values


def _rotate_complex(queries, keys, values, start, rope_theta):  # also correct: as complex numbers
    def turn(x):
        d = x.shape[-1]
        freqs = 1.0 / rope_theta ** (torch.arange(0, d, 2).float() / d)
        angles = torch.arange(start, start + x.shape[-2]).float()[:, None] * freqs
        z = torch.complex(x[..., :d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(angles), angles)
        return torch.cat((z.real, z.imag), dim=-1)
    return turn(queries), turn(keys), values


def _rotate_with(**how):
    return lambda q, k, v, start, theta: (_turn(q, start, theta, **how), _turn(k, start, theta, **how), v)


def _values_rotated(queries, keys, values, start, rope_theta):
    return tuple(_turn(t, start, rope_theta) for t in (queries, keys, values))


def _rotate_by_the_package(queries, keys, values, start, rope_theta):
    q, k = mha_course.RotaryEmbedding(queries.shape[-1], rope_theta)(queries, keys, start)
    return q, k, values


# ----------------------------------------------------------------------------------------------
# 8.3


def padded_attention(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True: a future key
    hidden = causal | (attention_mask == 0)[:, None, None, :]  # (B, 1, T, T): padded keys too
    hidden = hidden & ~hidden.all(dim=-1, keepdim=True)  # a row that sees nothing: see all instead
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return weights @ values


def _padded_with_finfo_min(queries, keys, values, attention_mask):  # also correct: transformers' way
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool).triu(1) | ~attention_mask.bool()[:, None, None, :]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ values


def _padded_masking_queries(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool).triu(1) | (attention_mask == 0)[:, None, :, None]
    hidden = hidden & ~hidden.all(dim=-1, keepdim=True)
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ values


def _padded_causal_only(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")), -1) @ values


def _padded_nan_rows(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool).triu(1) | (attention_mask == 0)[:, None, None, :]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ values


def _padded_by_the_package(queries, keys, values, attention_mask):
    mask = mha_course.with_padding(mha_course.causal_mask(queries.shape[-2]), attention_mask, len(queries))
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ values


CORRECT = {"8.1": copy_gpt2_weights, "8.2": rotate_by_position, "8.3": padded_attention}

#: More correct answers, written differently.
ALSO_CORRECT = {"8.1": [_by_split, _by_state_dict], "8.2": [_rotate_pairs_by_hand, _rotate_complex],
                "8.3": [_padded_with_finfo_min]}

WRONG = {
    ("8.1", "needs-no-grad"): _with(no_grad=False),
    ("8.1", "shapes-do-not-fit"): _chunk_rows,
    ("8.1", "not-in-place"): _new_module,
    ("8.1", "not-transposed"): _with(transpose=False),
    ("8.1", "c-proj-not-transposed"): _with(out_transpose=False),
    ("8.1", "qkv-order"): _with(order=("k", "q", "v")),
    ("8.1", "split-per-head"): _with(per_head=True),
    ("8.1", "qkv-biases-dropped"): _with(qkv_bias=False),
    ("8.1", "out-bias-dropped"): _with(out_bias=False),
    ("8.1", "out-proj-left"): _with(out_proj=False),
    ("8.1", "shared"): _shared,
    ("8.1", "plain-tensors"): _plain_tensors,
    ("8.1", "frozen"): _frozen,
    ("8.1", "no-return"): _no_return,
    ("8.1", "forward-replaced"): _forward_replaced,
    ("8.2", "sign"): _rotate_with(sign=-1),
    ("8.2", "interleaved"): _rotate_with(interleaved=True),
    ("8.2", "no-offset"): _rotate_with(offset=False),
    ("8.2", "values-rotated"): _values_rotated,
    ("8.3", "masked-queries"): _padded_masking_queries,
    ("8.3", "no-padding-mask"): _padded_causal_only,
    ("8.3", "nan-rows"): _padded_nan_rows,
}

#: Answers that give GPT-2's output without what the exercise asks: each must fail (not caught as a
#: catalogued mistake's only example above, and kept here so the tests see every trick).
TRICKS = {"class-swapped": _class_swapped, "copied-and-forward-replaced": _copied_and_forward_replaced}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "8.1 is from_gpt2_attention": ("8.1", mha_course.from_gpt2_attention, "mha_course's own from_gpt2_attention"),
    "8.1 loads from_gpt2_attention": ("8.1", _by_the_package, "mha_course's own from_gpt2_attention"),
    "8.2 calls RotaryEmbedding": ("8.2", _rotate_by_the_package, "mha_course's own RotaryEmbedding"),
    "8.3 calls with_padding": ("8.3", _padded_by_the_package, "mha_course's own with_padding"),
}
