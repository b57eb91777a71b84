"""Answers to the exercises of chapter 3 for the check tests: a correct one each, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors
(:func:`mha_course.exercises.capstone.batched_variant` and the rules of
:mod:`mha_course.exercises.chapter3`), so a test passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import mha_course
from mha_course import MultiHeadAttention

# ----------------------------------------------------------------------------------------------
# 3.1


def to_heads(x, num_heads):
    batch, num_tokens, d_out = x.shape
    return x.view(batch, num_tokens, num_heads, d_out // num_heads).transpose(1, 2)


def to_heads_by_reshape(x, num_heads):
    return x.reshape(x.shape[0], x.shape[1], num_heads, -1).permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------------
# 3.2


def from_heads(x):
    batch, num_heads, num_tokens, head_dim = x.shape
    return x.transpose(1, 2).contiguous().view(batch, num_tokens, num_heads * head_dim)


def from_heads_by_reshape(x):
    return x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


# ----------------------------------------------------------------------------------------------
# 3.3


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


def _calls_transfer_weights(wrapper, mha):
    return mha_course.transfer_weights(wrapper, mha)


def _loads_from_wrapper(wrapper, mha):
    with torch.no_grad():
        mha.load_state_dict(MultiHeadAttention.from_wrapper(wrapper).state_dict())


# ----------------------------------------------------------------------------------------------
# 3.4


def attention_layer_size(d_model, num_heads, context_length, qkv_bias=True):
    projections = 3 * (d_model * d_model + (d_model if qkv_bias else 0))
    return {"head_dim": d_model // num_heads, "parameters": projections + d_model * d_model + d_model,
            "attention_weights_mib": num_heads * context_length**2 * 4 / 2**20}


def _size(**changes):
    def size(d_model, num_heads, context_length, qkv_bias=True):
        answer = attention_layer_size(d_model, num_heads, context_length, qkv_bias)
        return {**answer, **{key: rule(d_model, num_heads, context_length, qkv_bias)
                             for key, rule in changes.items()}}
    return size


# ----------------------------------------------------------------------------------------------
# 3.5


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


CORRECT = {"3.1": to_heads, "3.2": from_heads, "3.3": transfer_heads, "3.4": attention_layer_size,
           "3.5": BatchedHeads}

#: More correct answers, written differently.
ALSO_CORRECT = {"3.1": [to_heads_by_reshape], "3.2": [from_heads_by_reshape], "3.5": [BatchedHeadsWithOwnHelpers]}

WRONG = {
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
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
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
}
