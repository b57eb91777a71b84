"""The exercise checks: correct answers pass, every catalogued mistake gets its own message, an
answer that is or calls the package's own answer is refused, inputs change from run to run, and
``check`` never raises, prints exactly one line and leaves the caller's state alone.

The wrong answers below are written the way a learner would write them, independently of the
catalogue's own detectors, so a test passes only if the catalogue recognises real code. Every
check draws fresh inputs, as it does for a learner; ``MHA_COURSE_CHECK_SEED`` fixes them when a
failure needs reproducing.
"""

from __future__ import annotations

import copy
import io
import marshal
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import chapter6_answers
import chapter8_answers
import chapter7_answers
import mha_course
from mha_course import CausalAttention, MultiHeadAttention, MultiHeadAttentionWrapper, check
from mha_course.exercises import EXERCISES, run_check
from mha_course.exercises.capstone import batched_variant
from mha_course.exercises.chapter1 import head_variant, reference_head
from mha_course.exercises.chapter4 import fused_variant
from mha_course.exercises.chapter5 import ablated, trained_model
from mha_course.exercises.framework import OWN_CODE, SEED_ENV_VAR, judge, probe
from mha_course.experiments.specialisation import accuracy, evaluation_data, head_role, head_scores, train

# ----------------------------------------------------------------------------------------------
# Correct answers


def build_causal_mask(num_tokens, device=None):
    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)


def causal_attention_forward(x, W_query, W_key, W_value):
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    scores = queries @ keys.transpose(1, 2)
    mask = build_causal_mask(x.shape[1], device=x.device)
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")) / keys.shape[-1] ** 0.5, dim=-1)
    return weights @ values


def head_shapes(batch, num_tokens, d_in, d_out, context_length):
    return {"W_query.weight": (d_out, d_in), "queries": (batch, num_tokens, d_out),
            "scores": (batch, num_tokens, num_tokens), "mask": (context_length, context_length),
            "mask_used": (num_tokens, num_tokens), "weights": (batch, num_tokens, num_tokens),
            "context": (batch, num_tokens, d_out)}


class StackedHeads(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads))

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


def wrapper_with_width(d_in, width, num_heads, context_length):
    if width % num_heads:
        raise ValueError(f"width {width} cannot be split evenly into {num_heads} heads")
    return MultiHeadAttentionWrapper(d_in, width // num_heads, context_length, 0.0, num_heads)


def wrapper_parameter_count(d_in, d_out, num_heads, qkv_bias=False):
    return num_heads * 3 * (d_in * d_out + (d_out if qkv_bias else 0))


def to_heads(x, num_heads):
    batch, num_tokens, d_out = x.shape
    return x.view(batch, num_tokens, num_heads, d_out // num_heads).transpose(1, 2)


def from_heads(x):
    batch, num_heads, num_tokens, head_dim = x.shape
    return x.transpose(1, 2).contiguous().view(batch, num_tokens, num_heads * head_dim)


def transfer_heads(wrapper, mha):
    with torch.no_grad():
        for role in ("W_query", "W_key", "W_value"):
            target = getattr(mha, role)
            target.weight.copy_(torch.cat([getattr(h, role).weight for h in wrapper.heads], dim=0))
            if target.bias is not None:
                target.bias.copy_(torch.cat([getattr(h, role).bias for h in wrapper.heads], dim=0))
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))
        mha.out_proj.bias.zero_()
    return mha


def attention_layer_size(d_model, num_heads, context_length, qkv_bias=True):
    projections = 3 * (d_model * d_model + (d_model if qkv_bias else 0))
    return {"head_dim": d_model // num_heads, "parameters": projections + d_model * d_model + d_model,
            "attention_weights_mib": num_heads * context_length**2 * 4 / 2**20}


class BatchedHeads(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.num_heads, self.head_dim, self.d_out = num_heads, d_out // num_heads, d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (layer(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
                   for layer in (self.W_query, self.W_key, self.W_value))
        scores = q @ k.transpose(2, 3)
        scores = scores.masked_fill(self.mask[:t, :t], float("-inf"))
        weights = self.dropout(torch.softmax(scores / self.head_dim**0.5, dim=-1))
        context = (weights @ v).transpose(1, 2).contiguous().view(b, t, self.d_out)
        return self.out_proj(context)


def attention_share(num_tokens, d_in, d_out):
    attention = 2 * num_tokens**2 * d_out
    projections = 3 * num_tokens * d_in * d_out + num_tokens * d_out**2
    return attention / (attention + projections)


def sdpa_attention(mha, x):
    b, t, _ = x.shape
    q, k, v = (layer(x).view(b, t, mha.num_heads, mha.head_dim).transpose(1, 2)
               for layer in (mha.W_query, mha.W_key, mha.W_value))
    p = mha.dropout.p if mha.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    return mha.out_proj(context.transpose(1, 2).reshape(b, t, mha.d_out))


def accuracy_drop(model, head, tokens, labels):
    ablated = copy.deepcopy(model)
    d_h = model.attention.head_dim
    with torch.no_grad():
        ablated.attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0
    return accuracy(model, tokens, labels) - accuracy(ablated, tokens, labels)


CORRECT = {
    "1.1": build_causal_mask, "1.2": causal_attention_forward, "1.3": head_shapes,
    "2.1": StackedHeads, "2.2": wrapper_with_width, "2.3": wrapper_parameter_count,
    "3.1": to_heads, "3.2": from_heads, "3.3": transfer_heads, "3.4": attention_layer_size,
    "3.5": BatchedHeads, "4.1": attention_share, "4.2": sdpa_attention, "5.1": accuracy_drop,
}

# Other correct answers, in other styles: they pass too.


def build_causal_mask_by_comparison(num_tokens, device=None):
    positions = torch.arange(num_tokens, device=device)
    return positions[None, :] > positions[:, None]


def causal_attention_forward_zero_and_renormalise(x, W_query, W_key, W_value):
    keys = x @ W_key
    weights = torch.softmax((x @ W_query) @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5, dim=-1)
    weights = weights.masked_fill(build_causal_mask(x.shape[1], x.device), 0.0)
    return (weights / weights.sum(dim=-1, keepdim=True)) @ (x @ W_value)


def to_heads_by_reshape(x, num_heads):
    return x.reshape(x.shape[0], x.shape[1], num_heads, -1).permute(0, 2, 1, 3)


def from_heads_by_reshape(x):
    return x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


class BatchedHeadsWithOwnHelpers(nn.Module):
    """The capstone written with the learner's own split and merge, and the package's causal_mask."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.W_query, self.W_key, self.W_value = (nn.Linear(d_in, d_out, bias=qkv_bias) for _ in range(3))
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", mha_course.causal_mask(context_length))

    def forward(self, x):
        num_tokens = x.shape[1]
        q, k, v = (to_heads(layer(x), self.num_heads) for layer in (self.W_query, self.W_key, self.W_value))
        q = q / q.shape[-1] ** 0.5
        scores = (q @ k.transpose(-2, -1)).masked_fill(self.mask[:num_tokens, :num_tokens], float("-inf"))
        return self.out_proj(from_heads(self.dropout(scores.softmax(dim=-1)) @ v))


def accuracy_drop_by_values(model, head, tokens, labels):
    # Zeroing the head's value rows silences it too (the model's projections have no bias).
    ablated_model = copy.deepcopy(model)
    d_h = model.attention.head_dim
    with torch.no_grad():
        ablated_model.attention.W_value.weight[head * d_h:(head + 1) * d_h] = 0
    return accuracy(model, tokens, labels) - accuracy(ablated_model, tokens, labels)


ALTERNATIVES = {
    "1.1": build_causal_mask_by_comparison,
    "1.2": causal_attention_forward_zero_and_renormalise,
    "3.1": to_heads_by_reshape,
    "3.2": from_heads_by_reshape,
    "3.5": BatchedHeadsWithOwnHelpers,
    "5.1": accuracy_drop_by_values,
}

# ----------------------------------------------------------------------------------------------
# Wrong answers, one per catalogue entry: (exercise, mistake key) -> answer


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


def _shapes(**changes):
    def shapes(batch, num_tokens, d_in, d_out, context_length):
        answer = head_shapes(batch, num_tokens, d_in, d_out, context_length)
        sizes = {"b": batch, "t": num_tokens, "i": d_in, "o": d_out, "c": context_length}
        return {**answer, **{key: tuple(sizes[s] for s in spec) for key, spec in changes.items()}}
    return shapes


class _PlainList(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        nn.Module.__init__(self)
        self.heads = [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]


class _OwnHeads(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.proj = nn.Linear(d_in, d_out * num_heads, bias=qkv_bias)

    def forward(self, x):
        return self.proj(x)


class _RepeatedHead(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        nn.Module.__init__(self)
        head = CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
        self.heads = nn.ModuleList([head] * num_heads)


class _TotalWidth(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out // num_heads, context_length, dropout, num_heads, qkv_bias)


class _CatTokens(StackedHeads):
    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=1)


class _Stacked(StackedHeads):
    def forward(self, x):
        return torch.stack([head(x) for head in self.heads], dim=2)


class _Summed(StackedHeads):
    def forward(self, x):
        return sum(head(x) for head in self.heads)


class _OneHead(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.head = CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)

    def forward(self, x):
        return self.head(x)


class _BiasIgnored(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads)


class _DropoutNotPassed(StackedHeads):
    """One of the four false passes of the old checks: the rate never reaches the heads."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, 0.0, num_heads, qkv_bias)


class _DropoutOnOutput(StackedHeads):
    """One of the four false passes of the old checks: dropout on the merged output."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, 0.0, num_heads, qkv_bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(super().forward(x))


class _DropoutTwice(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(super().forward(x))


def _width(per_head, heads=None, cls=MultiHeadAttentionWrapper):
    def build(d_in, width, num_heads, context_length):
        return cls(d_in, per_head(width, num_heads), context_length, 0.0, heads or num_heads)
    return build


def _width_with_dropout(d_in, width, num_heads, context_length):
    if width % num_heads:
        raise ValueError(f"{num_heads} heads cannot share {width} columns evenly")
    return MultiHeadAttentionWrapper(d_in, width // num_heads, context_length, 0.1, num_heads)


def _width_without_error(d_in, width, num_heads, context_length):
    return MultiHeadAttentionWrapper(d_in, width // num_heads, context_length, 0.0, num_heads)


def _copy_roles(wrapper, mha, order=None, roles=None, biases=True):
    heads = list(wrapper.heads) if order is None else order(list(wrapper.heads))
    roles = roles or {"W_query": "W_query", "W_key": "W_key", "W_value": "W_value"}
    for target, source in roles.items():
        getattr(mha, target).weight.copy_(torch.cat([getattr(h, source).weight for h in heads], dim=0))
        if biases and getattr(mha, target).bias is not None:
            getattr(mha, target).bias.copy_(torch.cat([getattr(h, source).bias for h in heads], dim=0))


def _transfer_without_no_grad(wrapper, mha):
    _copy_roles(wrapper, mha)


def _transfer_columns(wrapper, mha):
    with torch.no_grad():
        for role in ("W_query", "W_key", "W_value"):
            getattr(mha, role).weight.copy_(torch.cat([getattr(h, role).weight for h in wrapper.heads], dim=1))


def _transfer_new_module(wrapper, mha):
    mha = MultiHeadAttention(wrapper.d_in, wrapper.num_heads * wrapper.d_out, wrapper.context_length, 0.0,
                             wrapper.num_heads)
    transfer_heads(wrapper, mha)
    return mha


def _transfer_qkv_only(wrapper, mha):
    with torch.no_grad():
        _copy_roles(wrapper, mha)


def _transfer_keeps_out_bias(wrapper, mha):
    with torch.no_grad():
        _copy_roles(wrapper, mha)
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))


def _transfer_with(**how):
    def transfer(wrapper, mha):
        with torch.no_grad():
            _copy_roles(wrapper, mha, **how)
            mha.out_proj.weight.copy_(torch.eye(mha.d_out))
            mha.out_proj.bias.zero_()
    return transfer


def _transfer_first_head(wrapper, mha):
    with torch.no_grad():
        for role in ("W_query", "W_key", "W_value"):
            getattr(mha, role).weight[: mha.head_dim] = getattr(wrapper.heads[0], role).weight
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))
        mha.out_proj.bias.zero_()


def _transfer_plain_tensors(wrapper, mha):
    """One of the four false passes of the old checks: the weights become plain tensors."""
    with torch.no_grad():
        for role in ("W_query", "W_key", "W_value"):
            linear = getattr(mha, role)
            weight = torch.cat([getattr(h, role).weight for h in wrapper.heads], dim=0)
            del linear.weight
            linear.weight = weight  # a plain attribute now: the module forgets its parameter
            if linear.bias is not None:
                bias = torch.cat([getattr(h, role).bias for h in wrapper.heads], dim=0)
                del linear.bias
                linear.bias = bias
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))
        mha.out_proj.bias.zero_()


def _transfer_frozen(wrapper, mha):
    for parameter in mha.parameters():
        parameter.requires_grad_(False)  # "so that copy_ does not complain"
    _copy_roles(wrapper, mha)
    mha.out_proj.weight.copy_(torch.eye(mha.d_out))
    mha.out_proj.bias.zero_()


def _size(**changes):
    def size(d_model, num_heads, context_length, qkv_bias=True):
        answer = attention_layer_size(d_model, num_heads, context_length, qkv_bias)
        return {**answer, **{key: rule(d_model, num_heads, context_length, qkv_bias)
                             for key, rule in changes.items()}}
    return size


class _Batched(BatchedHeads):
    """The capstone with one step written differently (the keyword arguments)."""

    options: dict = {}

    def forward(self, x):
        o = self.options
        b, t, _ = x.shape
        h, d_h = self.num_heads, self.head_dim

        def split(p):
            if o.get("split") == "no-transpose":
                return p.view(b, h, t, d_h)
            if o.get("split") == "interleaved":
                return p.view(b, t, d_h, h).permute(0, 3, 1, 2)
            return p.view(b, t, h, d_h).transpose(1, 2)

        q, k, v = (split(layer(x)) for layer in (self.W_query, self.W_key, self.W_value))
        scores = q @ k.transpose(2, 3)
        if o.get("dropout") == "scores":
            scores = self.dropout(scores)
        if o.get("mask") == "whole":
            mask = self.mask.bool()
        elif o.get("mask") == "fresh":
            mask = torch.triu(torch.ones(t, t), diagonal=1).bool()  # built on the CPU, every call
        elif o.get("mask") == "diagonal":
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device))
        else:
            mask = self.mask.bool()[:t, :t]
        if o.get("mask") != "none":
            scores = scores.masked_fill(mask, float("-inf"))
        if o.get("dropout") == "masked-scores":
            scores = self.dropout(scores)
        divisor = {"d_out": self.d_out**0.5, "none": 1.0}.get(o.get("scale"), d_h**0.5)
        weights = torch.softmax(scores / divisor, dim=o.get("dim", -1))
        if o.get("dropout") in (None, "always"):
            weights = F.dropout(weights, self.dropout.p, training=True) if o.get("dropout") else self.dropout(weights)
        context = weights @ v
        if o.get("merge") == "no-transpose":
            merged = context.reshape(b, t, self.d_out)
        elif o.get("merge") == "view":
            merged = context.transpose(1, 2).view(b, t, self.d_out)
        else:
            merged = context.transpose(1, 2).contiguous().view(b, t, self.d_out)
        out = merged if o.get("out_proj") is False else self.out_proj(merged)
        return self.dropout(out) if o.get("dropout") == "output" else out


def _batched(**options):
    return type("BatchedHeadsVariant", (_Batched,), {"options": options})


class _WrapperWidth(BatchedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out * num_heads, context_length, dropout, num_heads, qkv_bias)


class _SwappedLinear(BatchedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.W_query = nn.Linear(d_out, d_in, bias=qkv_bias)


class _OutProjWithoutBias(BatchedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out, bias=False)


class _CapstoneBiasIgnored(BatchedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads)


class _MaskAttribute(BatchedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        mask = self.mask
        del self.mask
        self.mask = mask  # a plain attribute, not a buffer


class _DropoutMissing(BatchedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, 0.0, num_heads, qkv_bias)


def _sdpa(causal="is_causal", heads=True, merge=True, out_proj=True, scale=None, dropout="mode"):
    def forward(mha, x):
        b, t, _ = x.shape
        h = mha.num_heads if heads else 1
        projected = [layer(x) for layer in (mha.W_query, mha.W_key, mha.W_value)]
        q, k, v = (p.view(b, t, h, -1).transpose(1, 2) for p in projected) if heads else projected
        p = {"mode": mha.dropout.p if mha.training else 0.0, "never": 0.0, "always": mha.dropout.p}[dropout]
        options = {"is_causal": {"is_causal": True}, "none": {},
                   "mask": {"attn_mask": torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)}}[causal]
        if scale is not None:
            options["scale"] = scale(mha)
        context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, **options)
        if heads:
            context = context.transpose(1, 2) if merge else context
            context = context.reshape(b, t, mha.d_out)
        return mha.out_proj(context) if out_proj else context
    return forward


def _drop(zero, result="drop", in_place=False, all_positions=False, train_original=False):
    def accuracy_drop(model, head, tokens, labels):
        if train_original:
            model.train()  # e.g. to read the mode-dependent layers; the weights stay as they were
        target = model if in_place else copy.deepcopy(model)
        attention, d_h = target.attention, model.attention.head_dim
        with torch.no_grad():
            zero(attention, head, d_h)

        def score(m):
            if all_positions:
                return (m(tokens).argmax(-1) == labels).float().mean().item()
            return accuracy(m, tokens, labels)
        full, without = score(model) if not in_place else None, score(target)
        if in_place:
            return 1.0 - without
        return {"drop": full - without, "negative": without - full, "accuracy": without}[result]
    return accuracy_drop


def _columns(attention, head, d_h):
    attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0


def _others(attention, head, d_h):
    for other in range(attention.num_heads):
        if other != head:
            _columns(attention, other, d_h)


def _with_bias(attention, head, d_h):
    _columns(attention, head, d_h)
    attention.out_proj.bias.zero_()


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
    ("1.3", "linear-weight-transposed"): _shapes(**{"W_query.weight": "io"}),
    ("1.3", "queries-input-width"): _shapes(queries="bti"),
    ("1.3", "scores-like-queries"): _shapes(scores="bto"),
    ("1.3", "scores-without-batch"): _shapes(scores="tt"),
    ("1.3", "mask-per-input"): _shapes(mask="tt"),
    ("1.3", "mask-used-whole"): _shapes(mask_used="cc"),
    ("1.3", "weights-like-values"): _shapes(weights="bto"),
    ("1.3", "context-input-width"): _shapes(context="bti"),
    ("1.3", "context-like-weights"): _shapes(context="btt"),
    ("2.1", "plain-list"): _PlainList,
    ("2.1", "own-heads"): _OwnHeads,
    ("2.1", "repeated-head"): _RepeatedHead,
    ("2.1", "d-out-as-total"): _TotalWidth,
    ("2.1", "concatenated-tokens"): _CatTokens,
    ("2.1", "stacked"): _Stacked,
    ("2.1", "summed"): _Summed,
    ("2.1", "one-head"): _OneHead,
    ("2.1", "qkv-bias-ignored"): _BiasIgnored,
    ("2.1", "dropout-not-passed"): _DropoutNotPassed,
    ("2.1", "dropout-on-output"): _DropoutOnOutput,
    ("2.1", "dropout-twice"): _DropoutTwice,
    ("2.2", "batched-module"): _width(lambda width, heads: width, cls=MultiHeadAttention),
    ("2.2", "changed-num-heads"): _width(lambda width, heads: width, heads=1),
    ("2.2", "d-out-is-width"): _width(lambda width, heads: width),
    ("2.2", "d-out-times-heads"): _width(lambda width, heads: width * heads),
    ("2.2", "halved"): _width(lambda width, heads: width // 2),
    ("2.2", "indivisible-accepted"): _width_without_error,
    ("2.2", "dropout-kept"): _width_with_dropout,
    ("2.3", "no-heads-factor"): lambda d_in, d_out, h, qkv_bias=False: 3 * (d_in + qkv_bias) * d_out,
    ("2.3", "one-projection"): lambda d_in, d_out, h, qkv_bias=False: h * (d_in + qkv_bias) * d_out,
    ("2.3", "output-projection"): lambda d_in, d_out, h, qkv_bias=False: (
        wrapper_parameter_count(d_in, d_out, h, qkv_bias) + (h * d_out) * (h * d_out + 1)),
    ("2.3", "bias-ignored"): lambda d_in, d_out, h, qkv_bias=False: 3 * h * d_in * d_out,
    ("2.3", "bias-always"): lambda d_in, d_out, h, qkv_bias=False: 3 * h * (d_in + 1) * d_out,
    ("3.1", "view-without-transpose"): lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
    ("3.1", "no-transpose"): lambda x, h: x.view(x.shape[0], x.shape[1], h, -1),
    ("3.1", "interleaved"): lambda x, h: x.unflatten(-1, (-1, h)).permute(0, 3, 1, 2),
    ("3.1", "head-dim-first"): lambda x, h: x.view(x.shape[0], x.shape[1], -1, h).transpose(1, 2),
    ("3.1", "wrong-axes"): lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).transpose(2, 3),
    ("3.2", "needs-contiguous"): lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1),
    ("3.2", "no-transpose"): lambda x: x.contiguous().view(x.shape[0], x.shape[2], -1),
    ("3.2", "interleaved"): lambda x: x.permute(0, 2, 3, 1).flatten(2),
    ("3.2", "stopped-early"): lambda x: x.transpose(1, 2),
    ("3.3", "needs-no-grad"): _transfer_without_no_grad,
    ("3.3", "rows-not-columns"): _transfer_columns,
    ("3.3", "not-in-place"): _transfer_new_module,
    ("3.3", "out-proj-left-random"): _transfer_qkv_only,
    ("3.3", "out-proj-bias"): _transfer_keeps_out_bias,
    ("3.3", "heads-reversed"): _transfer_with(order=lambda heads: heads[::-1]),
    ("3.3", "roles-swapped"): _transfer_with(roles={"W_query": "W_key", "W_key": "W_query", "W_value": "W_value"}),
    ("3.3", "first-head-only"): _transfer_first_head,
    ("3.3", "bias-forgotten"): _transfer_with(biases=False),
    ("3.3", "plain-tensors"): _transfer_plain_tensors,
    ("3.3", "frozen"): _transfer_frozen,
    ("3.4", "head-dim-is-d-model"): _size(head_dim=lambda d, h, t, b: d),
    ("3.4", "no-qkv-bias"): _size(parameters=lambda d, h, t, b: 4 * d * d + d),
    ("3.4", "no-biases"): _size(parameters=lambda d, h, t, b: 4 * d * d),
    ("3.4", "no-out-proj"): _size(parameters=lambda d, h, t, b: 3 * d * (d + b)),
    ("3.4", "d-model-per-head"): _size(parameters=lambda d, h, t, b: h * 3 * d * (d + b)),
    ("3.4", "one-head"): _size(attention_weights_mib=lambda d, h, t, b: t * t * 4 / 2**20),
    ("3.4", "bytes-not-mib"): _size(attention_weights_mib=lambda d, h, t, b: h * t * t * 4),
    ("3.4", "float64"): _size(attention_weights_mib=lambda d, h, t, b: h * t * t * 8 / 2**20),
    ("3.4", "lower-triangle-only"): _size(attention_weights_mib=lambda d, h, t, b: h * t * (t + 1) / 2 * 4 / 2**20),
    ("3.4", "bias-always"): _size(parameters=lambda d, h, t, b: 4 * d * d + 4 * d),
    ("3.5", "d-out-per-head"): _WrapperWidth,
    ("3.5", "linear-arguments-swapped"): _SwappedLinear,
    ("3.5", "out-proj-without-bias"): _OutProjWithoutBias,
    ("3.5", "qkv-bias-ignored"): _CapstoneBiasIgnored,
    ("3.5", "mask-not-a-buffer"): _MaskAttribute,
    ("3.5", "mask-not-sliced"): _batched(mask="whole"),
    ("3.5", "scale-d-out"): _batched(scale="d_out"),
    ("3.5", "no-scale"): _batched(scale="none"),
    ("3.5", "split-without-transpose"): _batched(split="no-transpose"),
    ("3.5", "split-interleaved"): _batched(split="interleaved"),
    ("3.5", "merge-without-transpose"): _batched(merge="no-transpose"),
    ("3.5", "no-out-proj"): _batched(out_proj=False),
    ("3.5", "no-mask"): _batched(mask="none"),
    ("3.5", "mask-diagonal"): _batched(mask="diagonal"),
    ("3.5", "softmax-axis"): _batched(dim=-2),
    ("3.5", "dropout-missing"): _DropoutMissing,
    ("3.5", "dropout-on-scores"): _batched(dropout="scores"),
    ("3.5", "dropout-on-output"): _batched(dropout="output"),
    ("3.5", "dropout-always"): _batched(dropout="always"),
    ("3.5", "mask-on-cpu"): _batched(mask="fresh"),
    ("3.5", "dropout-on-masked-scores"): _batched(dropout="masked-scores"),
    ("3.5", "view-without-contiguous"): _batched(merge="view"),
    ("4.1", "one-attention-product"): lambda t, d_in, d_out: t * t * d_out / (t * t * d_out + 3 * t * d_in * d_out + t * d_out**2),
    ("4.1", "no-out-proj"): lambda t, d_in, d_out: 2 * t * t * d_out / (2 * t * t * d_out + 3 * t * d_in * d_out),
    ("4.1", "ratio-not-share"): lambda t, d_in, d_out: 2 * t * t * d_out / (3 * t * d_in * d_out + t * d_out**2),
    ("4.1", "widths-swapped"): lambda t, d_in, d_out: attention_share(t, d_out, d_in),
    ("4.1", "percentage"): lambda t, d_in, d_out: 100 * attention_share(t, d_in, d_out),
    ("4.2", "not-causal"): _sdpa(causal="none"),
    ("4.2", "mask-meaning"): _sdpa(causal="mask"),
    ("4.2", "one-head"): _sdpa(heads=False),
    ("4.2", "scale-d-out"): _sdpa(scale=lambda mha: mha.d_out**-0.5),
    ("4.2", "merge-without-transpose"): _sdpa(merge=False),
    ("4.2", "no-out-proj"): _sdpa(out_proj=False),
    ("4.2", "dropout-never"): _sdpa(dropout="never"),
    ("4.2", "dropout-always"): _sdpa(dropout="always"),
    ("5.1", "in-place"): _drop(_columns, in_place=True),
    ("5.1", "output-rows"): _drop(lambda a, h, d: a.out_proj.weight[h * d:(h + 1) * d].zero_()),
    ("5.1", "interleaved"): _drop(lambda a, h, d: a.out_proj.weight[:, h::a.num_heads].zero_()),
    ("5.1", "queries-zeroed"): _drop(lambda a, h, d: a.W_query.weight[h * d:(h + 1) * d].zero_()),
    ("5.1", "kept-only-that-head"): _drop(_others),
    ("5.1", "bias-zeroed"): _drop(_with_bias),
    ("5.1", "sign-flipped"): _drop(_columns, result="negative"),
    ("5.1", "accuracy-not-drop"): _drop(_columns, result="accuracy"),
    ("5.1", "position-zero-counted"): _drop(_columns, all_positions=True),
    ("5.1", "mode-changed"): _drop(_columns, train_original=True),
}

# Chapter 6's answers live in their own module (its checks draw fresh inputs on every run).
CORRECT.update(chapter6_answers.CORRECT)
WRONG.update(chapter6_answers.WRONG)
CORRECT.update(chapter8_answers.CORRECT)
WRONG.update(chapter8_answers.WRONG)
CORRECT.update(chapter7_answers.CORRECT)
WRONG.update(chapter7_answers.WRONG)

CATALOGUE = [(exercise.id, mistake) for exercise in EXERCISES.values() for mistake in exercise.mistakes]


def test_every_catalogue_entry_has_a_wrong_answer_here():
    assert {(eid, m.key) for eid, m in CATALOGUE} == set(WRONG)


def test_every_exercise_has_a_correct_answer_and_at_least_three_per_chapter():
    assert set(CORRECT) == set(EXERCISES)
    for chapter in (1, 2, 3):
        assert sum(e.chapter == chapter for e in EXERCISES.values()) >= 3
    for chapter in sorted({e.chapter for e in EXERCISES.values()}):  # ids run 1, 2, 3 ... in every chapter
        numbers = [int(e.id.split(".")[1]) for e in EXERCISES.values() if e.chapter == chapter]
        assert numbers == list(range(1, len(numbers) + 1))


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_correct_answer_passes(exercise_id, capsys):
    result = check(exercise_id, CORRECT[exercise_id])
    total = len(EXERCISES[exercise_id].checks)
    assert capsys.readouterr().out == f"✓ {exercise_id} passed ({total} checks)\n"
    assert result.passed and result.checks_passed == total == result.checks_total


@pytest.mark.parametrize("exercise_id", list(ALTERNATIVES))
def test_correct_answers_in_other_styles_pass(exercise_id):
    assert run_check(exercise_id, ALTERNATIVES[exercise_id]).passed


@pytest.mark.parametrize("exercise_id,mistake", CATALOGUE, ids=[f"{e}-{m.key}" for e, m in CATALOGUE])
def test_mistake_gets_its_message(exercise_id, mistake, capsys):
    result = check(exercise_id, WRONG[(exercise_id, mistake.key)])
    line = capsys.readouterr().out
    assert result.status == "failed"
    assert result.mistake == mistake.key, line
    assert line == result.line + "\n" and line.count("\n") == 1
    assert line.startswith(f"✗ {exercise_id}: {result.failed_check}: expected ")
    assert mistake.message in line
    assert result.failed_check != OWN_CODE


def test_the_four_false_passes_of_the_old_checks_fail():
    # Each passed both check() and the grader before: the mask ignoring its device argument, the
    # stacked heads without dropout or with it on the merged output, the transfer that leaves
    # plain tensors where mha's parameters were.
    cases = {("1.1", "device-ignored"): "mask on the requested device",
             ("2.1", "dropout-not-passed"): "dropout acts on every head's attention weights in training mode",
             ("2.1", "dropout-on-output"): "dropout acts on every head's attention weights in training mode",
             ("3.3", "plain-tensors"): "mha keeps its parameters, trainable"}
    for (exercise_id, key), failed_check in cases.items():
        result = run_check(exercise_id, WRONG[(exercise_id, key)])
        assert (result.status, result.failed_check, result.mistake) == ("failed", failed_check, key), result.line


def test_two_more_false_passes_fail_with_a_hint():
    # Each passed check() and the grader: the wrapper built with dropout 0.1 where the exercise asks for
    # none, and head indices made on the CPU, which the meta device let index_select take.
    cases = {("2.2", "dropout-kept"): "no dropout", ("6.1", "index-on-cpu"): "output on the input's device"}
    for (exercise_id, key), failed_check in cases.items():
        result = run_check(exercise_id, WRONG[(exercise_id, key)])
        assert (result.status, result.failed_check, result.mistake) == ("failed", failed_check, key), result.line


@pytest.mark.parametrize("exercise_id, key, words", [
    ("1.2", "dropout-left-in", "dropout (F.dropout, nn.Dropout) is left in"),  # was: a future-token leak alone
    ("3.5", "dropout-on-masked-scores", "multiplies their -inf by 0, which is NaN"),  # was: got [nan, ...] alone
    ("3.5", "view-without-contiguous", "call .contiguous() first"),  # was: torch's error alone
    ("4.1", "percentage", "That is a percentage"),
    ("5.1", "mode-changed", "got the same weights but training mode"),  # was: "Work on a copy" to one who did
    ("6.2", "appended-twice", "hold the new token twice"),
    ("6.2", "cpu-tensor", "makes a tensor on the CPU"),
])
def test_messages_that_misled_now_say_what_went_wrong(exercise_id, key, words):
    result = run_check(exercise_id, WRONG[(exercise_id, key)])
    assert (result.status, result.mistake) == ("failed", key), result.line
    assert words in result.line


def test_numbers_are_shown_as_the_type_the_learner_returned():
    def ints(d_model, num_heads, context_length, qkv_bias=True):  # head_dim wrong, every number an int
        return {"head_dim": d_model, "parameters": 4 * d_model * (d_model + 1),
                "attention_weights_mib": num_heads * context_length**2 * 4 // 2**20}

    line = run_check("3.4", ints).line
    assert "got 768." in line and "768.0" not in line, line
    tensors = lambda d, h, t, qkv_bias=True: {k: torch.tensor(v) for k, v in ints(d, h, t, qkv_bias).items()}
    assert "got tensor(768)." in run_check("3.4", tensors).line
    floats = lambda d, h, t, qkv_bias=True: {k: float(v) for k, v in ints(d, h, t, qkv_bias).items()}
    assert "got 768.0." in run_check("3.4", floats).line


def test_records_judged_side_by_side_get_the_verdicts_they_get_alone():
    """The grader judges several notebooks' records at once (--jobs); dropout is replayed from
    torch's global random state, which the threads share."""
    from concurrent.futures import ThreadPoolExecutor

    records = [(eid, probe(EXERCISES[eid], CORRECT[eid])) for eid in ("2.1", "3.5", "4.2", "6.2", "3.3")]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda item: judge(EXERCISES[item[0]], item[1]), records * 6))
    assert [r.exercise for r in results if not r.passed] == []


def test_head_variant_defaults_are_the_package_reference():
    x = torch.randn(2, 5, 4)
    weights = [torch.randn(4, 3) for _ in range(3)]
    assert torch.allclose(head_variant(x, *weights), reference_head(x, *weights), atol=1e-6)


def test_capstone_variant_defaults_are_the_package_module():
    mha = MultiHeadAttention(5, 6, 8, dropout=0.5, num_heads=3, qkv_bias=True)
    state, x = {n: p.detach() for n, p in mha.named_parameters()}, torch.randn(2, 7, 5)
    assert torch.allclose(batched_variant(state, x, 3), mha.eval()(x), atol=1e-6)
    torch.manual_seed(3)
    expected = mha.train()(x)
    torch.manual_seed(3)
    assert torch.allclose(batched_variant(state, x, 3, dropout=0.5), expected, atol=1e-6)


def test_fused_variant_defaults_are_the_package_module():
    mha, x = MultiHeadAttention(5, 6, 8, dropout=0.0, num_heads=3).eval(), torch.randn(2, 7, 5)
    assert torch.allclose(fused_variant(mha, x), mha(x), atol=1e-6)


def test_ablation_reference_silences_exactly_one_head():
    model = trained_model(2)
    tokens, _ = evaluation_data()
    # Without head 0 the output equals the output when head 0's context vectors are zero.
    captured = {}
    handle = model.attention.out_proj.register_forward_pre_hook(
        lambda module, args: (args[0] * torch.tensor([0.0] * 8 + [1.0] * 8),))
    with torch.no_grad():
        captured["hooked"] = model(tokens[:50])
    handle.remove()
    with torch.no_grad():
        assert torch.allclose(ablated(model, 0)(tokens[:50]), captured["hooked"], atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Shortcuts: an answer that is, or calls, the package's own answer is refused


def _calls_transfer_weights(wrapper, mha):
    return mha_course.transfer_weights(wrapper, mha)


def _loads_from_wrapper(wrapper, mha):
    with torch.no_grad():
        mha.load_state_dict(MultiHeadAttention.from_wrapper(wrapper).state_dict())


class _SubclassedWrapper(MultiHeadAttentionWrapper):
    pass


class _CapstoneOnTheModule(MultiHeadAttention):
    pass


class _CapstoneWithPackageHelpers(BatchedHeads):
    def forward(self, x):
        t = x.shape[1]
        q, k, v = (mha_course.split_heads(layer(x), self.num_heads) for layer in (self.W_query, self.W_key, self.W_value))
        scores = (q @ k.transpose(2, 3)).masked_fill(self.mask[:t, :t], float("-inf"))
        return self.out_proj(mha_course.merge_heads(self.dropout(torch.softmax(scores / self.head_dim**0.5, -1)) @ v))


class _CapstoneWithFusedCall(BatchedHeads):
    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (layer(x).view(b, t, self.num_heads, -1).transpose(1, 2) for layer in (self.W_query, self.W_key, self.W_value))
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout.p if self.training else 0.0)
        return self.out_proj(context.transpose(1, 2).reshape(b, t, -1))


def _head_through_causal_attention(x, W_query, W_key, W_value):
    head = CausalAttention(W_query.shape[0], W_query.shape[1], x.shape[1], 0.0)
    return functional_call(head, {"W_query.weight": W_query.T, "W_key.weight": W_key.T, "W_value.weight": W_value.T}, (x,))


def _shapes_by_running_the_module(batch, num_tokens, d_in, d_out, context_length):
    head = CausalAttention(d_in, d_out, context_length, 0.0)
    x = torch.zeros(batch, num_tokens, d_in)
    return {**head_shapes(batch, num_tokens, d_in, d_out, context_length), "context": tuple(head(x).shape)}


def _drop_from_the_checks(model, head, tokens, labels):
    from mha_course.exercises import chapter5

    return accuracy(model, tokens, labels) - accuracy(chapter5.ablated(model, head), tokens, labels)


SHORTCUTS = {
    "1.1 is causal_mask": ("1.1", mha_course.causal_mask, "mha_course's own causal_mask"),
    "1.1 calls causal_mask": ("1.1", lambda n, device=None: mha_course.causal_mask(n, device), "mha_course's own causal_mask"),
    "1.1 calls visibility": ("1.1", lambda n, device=None: ~mha_course.visibility(n).to(device), "mha_course's own visibility"),
    "1.1 reads a module's buffer": ("1.1", lambda n, device=None: CausalAttention(2, 2, n, 0.0).mask.to(device),
                                    "mha_course's own causal_mask"),
    "1.2 runs CausalAttention": ("1.2", _head_through_causal_attention, "mha_course's own CausalAttention"),
    "1.2 calls the fused kernel": ("1.2", lambda x, q, k, v: F.scaled_dot_product_attention(
        (x @ q)[:, None], (x @ k)[:, None], (x @ v)[:, None], is_causal=True)[:, 0], "torch's scaled_dot_product_attention"),
    "1.3 measures a module": ("1.3", _shapes_by_running_the_module, "mha_course's own CausalAttention"),
    "2.1 subclasses the wrapper": ("2.1", _SubclassedWrapper, "a subclass of mha_course's own MultiHeadAttentionWrapper"),
    "2.1 is the wrapper": ("2.1", MultiHeadAttentionWrapper, "mha_course's own MultiHeadAttentionWrapper"),
    "2.3 asks the cost module": ("2.3", lambda d_in, d_out, h, qkv_bias=False: mha_course.cost.parameter_count(
        "wrapper", d_in, d_out, h, qkv_bias=qkv_bias), "mha_course's own parameter_count"),
    "2.3 counts a built wrapper": ("2.3", lambda d_in, d_out, h, qkv_bias=False: sum(
        p.numel() for p in MultiHeadAttentionWrapper(d_in, d_out, 1, 0.0, h, qkv_bias).parameters()),
        "mha_course's own MultiHeadAttentionWrapper"),
    "3.1 is split_heads": ("3.1", mha_course.split_heads, "mha_course's own split_heads"),
    "3.2 calls merge_heads": ("3.2", lambda x: mha_course.merge_heads(x), "mha_course's own merge_heads"),
    "3.3 is transfer_weights": ("3.3", mha_course.transfer_weights, "mha_course's own transfer_weights"),
    "3.3 calls transfer_weights": ("3.3", _calls_transfer_weights, "mha_course's own transfer_weights"),
    "3.3 loads from_wrapper": ("3.3", _loads_from_wrapper, "mha_course's own MultiHeadAttention.from_wrapper"),
    "3.4 asks the cost module": ("3.4", lambda d, h, t, qkv_bias=True: {
        "head_dim": d // h, "parameters": mha_course.cost.parameter_count("batched", d, d, h, qkv_bias=qkv_bias),
        "attention_weights_mib": mha_course.cost.score_memory_bytes(1, h, t) / 2**20}, "mha_course's own parameter_count"),
    "3.5 subclasses MultiHeadAttention": ("3.5", _CapstoneOnTheModule, "a subclass of mha_course's own MultiHeadAttention"),
    "3.5 uses the package's split": ("3.5", _CapstoneWithPackageHelpers, "mha_course's own split_heads"),
    "3.5 uses the fused kernel": ("3.5", _CapstoneWithFusedCall, "torch's scaled_dot_product_attention"),
    "4.1 asks the cost module": ("4.1", lambda t, d_in, d_out: (lambda m: (m.scores + m.weighted_sum) / m.total)(
        mha_course.cost.multiply_adds("batched", 1, t, d_in, d_out)), "mha_course's own multiply_adds"),
    "4.2 calls the module": ("4.2", lambda mha, x: mha(x), "mha_course's own MultiHeadAttention"),
    "4.2 is sdpa_forward": ("4.2", mha_course.sdpa_forward, "mha_course's own sdpa_forward"),
    "5.1 calls the check's reference": ("5.1", _drop_from_the_checks, "the checks' own chapter5.ablated"),
}


@pytest.mark.parametrize("name", list(SHORTCUTS))
def test_an_answer_that_is_or_calls_the_package_answer_is_refused(name):
    exercise_id, answer, label = SHORTCUTS[name]
    result = run_check(exercise_id, answer)
    assert (result.status, result.failed_check, result.checks_passed) == ("failed", OWN_CODE, 0), result.line
    assert label in result.line
    shortcut = next(s for s in EXERCISES[exercise_id].all_shortcuts() if s.label == label.removeprefix("a subclass of "))
    if label.startswith("a subclass of "):
        assert result.line.endswith(f"This subclasses {shortcut.label}: write the class yourself.")
    else:
        assert result.line.endswith(shortcut.hint(is_answer=result.got == label))


def test_the_message_names_the_package_function_to_write_yourself():
    result = run_check("3.3", _calls_transfer_weights)
    assert result.line.endswith("This calls mha_course's own transfer_weights: write it yourself.")


def test_building_blocks_the_exercise_is_meant_to_use_stay_allowed():
    # StackedHeads uses CausalAttention; the capstone may use causal_mask and its own split/merge;
    # the fused forward of 4.2 must call scaled_dot_product_attention; 5.1 uses the package's accuracy.
    for exercise_id, answer in (("2.1", StackedHeads), ("3.5", BatchedHeadsWithOwnHelpers),
                                ("4.2", sdpa_attention), ("5.1", accuracy_drop)):
        assert run_check(exercise_id, answer).passed


# ----------------------------------------------------------------------------------------------
# Inputs drawn afresh for every run


def test_each_run_draws_other_inputs_and_messages_show_them(monkeypatch):
    wrong = WRONG[("2.3", "bias-ignored")]
    lines = set()
    for seed in ("11", "12"):
        monkeypatch.setenv(SEED_ENV_VAR, seed)
        result = run_check("2.3", wrong)
        # The learner's input and both results, e.g. "expected 1,743 for wrapper_parameter_count(
        # d_in=37, d_out=5, num_heads=3, qkv_bias=True), got 1,665".
        assert re.search(r"expected [\d,]+ for wrapper_parameter_count\(d_in=\d+, d_out=\d+, num_heads=\d+, "
                         r"qkv_bias=True\), got [\d,]+\.", result.line), result.line
        lines.add(result.line)
    assert len(lines) == 2


def test_a_number_copied_from_a_message_is_no_answer(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "21")
    first = run_check("2.3", lambda d_in, d_out, num_heads, qkv_bias=False: 0)
    copied = int(re.search(r"expected ([\d,]+)", first.line).group(1).replace(",", ""))

    def memorised(d_in, d_out, num_heads, qkv_bias=False):
        return copied

    assert not run_check("2.3", memorised).passed  # other cases of the same run already differ
    monkeypatch.setenv(SEED_ENV_VAR, "22")
    assert not run_check("2.3", memorised).passed


def test_tensor_messages_say_how_to_rebuild_the_input(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "5")
    result = run_check("3.1", WRONG[("3.1", "view-without-transpose")])
    assert re.search(r"for to_heads\(random_batch\(\d+, \d+, \d+, seed=\d+\), \d+\)", result.line), result.line


def test_the_seed_variable_fixes_the_inputs(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "7")
    assert run_check("1.2", WRONG[("1.2", "no-scale")]).line == run_check("1.2", WRONG[("1.2", "no-scale")]).line
    monkeypatch.setenv(SEED_ENV_VAR, "seven")
    result = run_check("1.2", causal_attention_forward)
    assert result.status == "error" and SEED_ENV_VAR in result.line


# ----------------------------------------------------------------------------------------------
# The stored models of exercise 5.1


@pytest.mark.parametrize("num_heads", [2, 4])
def test_the_stored_models_are_the_packages_seeded_training(num_heads):
    # The two-head model is the one chapter 5 trains live: same seed, same settings, same weights.
    # (`write_models()` regenerates the file from the same training.)
    run = train(num_heads, seed=0)
    stored = trained_model(num_heads).state_dict()
    assert stored.keys() == run.model.state_dict().keys()
    # Trained on another processor, whose kernels round differently: after hundreds of steps the
    # weights agree to about 1e-5, where another seed or setting moves them by whole units.
    assert all(torch.allclose(stored[name], value, atol=1e-4) for name, value in run.model.state_dict().items())


def test_what_the_solution_of_5_1_says_about_the_models():
    # The solution of 5.1 in chapter 5: the two-head model loses most of its accuracy without either
    # head; two heads of the four-head model read the first token and two the previous one, yet in a
    # pair one head can go without any loss while losing the other costs most of the accuracy.
    tokens, labels = evaluation_data()
    two = [accuracy_drop(trained_model(2), head, tokens, labels) for head in range(2)]
    four = [accuracy_drop(trained_model(4), head, tokens, labels) for head in range(4)]
    assert accuracy(trained_model(2), tokens, labels) == accuracy(trained_model(4), tokens, labels) == 1.0
    assert min(two) > 0.5
    roles = [head_role(*pair) for pair in head_scores(trained_model(4), tokens).tolist()]
    assert sorted(roles) == ["first", "first", "previous", "previous"]
    pairs = [[drop for drop, r in zip(four, roles) if r == role] for role in ("first", "previous")]
    assert any(min(pair) < 0.01 and max(pair) > 0.5 for pair in pairs), (roles, four)


# ----------------------------------------------------------------------------------------------
# Not implemented, unknown, hostile answers


def _stub(*args, **kwargs):
    raise NotImplementedError("Replace this line with your solution.")


class _StubModule(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        raise NotImplementedError


class _HalfDone(StackedHeads):
    def forward(self, x):
        raise NotImplementedError


@pytest.mark.parametrize("exercise_id", list(CORRECT))
@pytest.mark.parametrize("answer", [None, ..., _stub], ids=["None", "Ellipsis", "stub"])
def test_not_implemented(exercise_id, answer, capsys):
    result = check(exercise_id, answer)
    assert capsys.readouterr().out == f"○ {exercise_id} not implemented yet\n"
    assert result.status == "not implemented" and not result


@pytest.mark.parametrize("exercise_id", ["2.1", "3.5"])
@pytest.mark.parametrize("answer", [_StubModule, _HalfDone])
def test_class_stubs_are_not_implemented(exercise_id, answer):
    assert run_check(exercise_id, answer).status == "not implemented"


def test_unknown_exercise_is_reported_not_raised(capsys):
    result = check("9.9", build_causal_mask)
    assert result.status == "error"
    assert capsys.readouterr().out.startswith("✗ 9.9: no exercise has this id; the exercises are 1.1, 1.2")


def _exits(*args, **kwargs):
    sys.exit(3)


def _recurses(*args, **kwargs):
    return _recurses(*args, **kwargs)


class _Weird:
    def __eq__(self, other):
        raise RuntimeError("no comparing me")

    def __len__(self):
        raise RuntimeError("no measuring me")


def _prints_and_warns(*args, **kwargs):
    import warnings

    print("debugging output")
    warnings.warn("a warning", stacklevel=2)
    return _Weird()


HOSTILE = [_exits, _recurses, _prints_and_warns, lambda *a, **k: [_Weird()], lambda *a, **k: {"a": _Weird()},
           lambda *a, **k: torch.tensor(float("nan")), 42, "not a function", StackedHeads]


@pytest.mark.parametrize("exercise_id", list(CORRECT))
@pytest.mark.parametrize("answer", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_check_never_raises_and_prints_one_line(exercise_id, answer, capsys):
    if answer is StackedHeads and exercise_id == "2.1":
        pytest.skip("the correct answer")
    result = check(exercise_id, answer)
    out = capsys.readouterr()
    assert result.status == "failed", result.line
    assert out.out == result.line + "\n" and out.out.count("\n") == 1
    assert out.err == ""
    assert result.line.startswith(f"✗ {exercise_id}: ")


def test_check_leaves_the_random_state_grad_mode_and_profiler_alone():
    torch.manual_seed(5)
    state = torch.get_rng_state()
    profiler = sys.getprofile()
    with torch.no_grad():
        check("2.1", StackedHeads)  # builds modules, which draws random numbers
        check("1.2", causal_attention_forward)
        assert not torch.is_grad_enabled()
    assert torch.equal(torch.get_rng_state(), state)
    assert sys.getprofile() is profiler


def test_gradient_checks_run_even_under_no_grad(capsys):
    with torch.no_grad():
        assert run_check("1.2", causal_attention_forward).passed


def test_result_displays_nothing_in_a_notebook():
    result = run_check("1.1", build_causal_mask)
    assert result._ipython_display_() is None
    assert result.to_dict()["status"] == "passed"


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_records_survive_the_trip_to_the_grader(exercise_id):
    # The grader moves records from the process where the answers run to its own, as marshal data
    # (mha_course.grading.answer_probing): the verdict must be the same on the other side.
    from mha_course.grading.answer_probing import from_message, to_message

    exercise = EXERCISES[exercise_id]
    for answer in (CORRECT[exercise_id], *[WRONG[(exercise_id, m.key)] for m in exercise.mistakes][:2]):
        record = probe(exercise, answer)
        loaded = from_message(marshal.loads(marshal.dumps(to_message(record))))
        assert judge(exercise, loaded) == judge(exercise, record)


def test_answer_output_is_swallowed(capsys):
    def noisy(num_tokens, device=None):
        print("looking at", num_tokens, file=io.StringIO())
        print("debug", num_tokens)
        return build_causal_mask(num_tokens, device)

    check("1.1", noisy)
    assert capsys.readouterr().out == f"✓ 1.1 passed ({len(EXERCISES['1.1'].checks)} checks)\n"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
def test_checks_run_on_the_gpu_too():
    # probe_devices adds the GPU to the meta device: correct answers pass, a CPU-bound mask fails.
    for exercise_id, answer in CORRECT.items():
        assert run_check(exercise_id, answer).passed, exercise_id
    result = run_check("1.2", WRONG[("1.2", "mask-on-cpu")])
    assert result.failed_check == "output on the input's device"


def test_replacing_secrets_randbelow_does_not_fix_the_inputs(monkeypatch):
    import secrets

    from mha_course.exercises.framework import run_seed

    monkeypatch.delenv(SEED_ENV_VAR, raising=False)
    monkeypatch.setattr(secrets, "randbelow", lambda n: 4242)
    assert len({run_seed() for _ in range(20)}) > 1
