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


CORRECT = {"8.1": copy_gpt2_weights}

#: More correct answers, written differently.
ALSO_CORRECT = {"8.1": [_by_split, _by_state_dict]}

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
}

#: Answers that give GPT-2's output without what the exercise asks: each must fail (not caught as a
#: catalogued mistake's only example above, and kept here so the tests see every trick).
TRICKS = {"class-swapped": _class_swapped, "copied-and-forward-replaced": _copied_and_forward_replaced}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "8.1 is from_gpt2_attention": ("8.1", mha_course.from_gpt2_attention, "mha_course's own from_gpt2_attention"),
    "8.1 loads from_gpt2_attention": ("8.1", _by_the_package, "mha_course's own from_gpt2_attention"),
}
