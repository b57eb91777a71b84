"""Answers to the exercises of chapter 2 for the check tests: a correct one each, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors (the
rules of :mod:`mha_course.exercises.chapter2`, which read the probe's record), so a test passes only
if the catalogue recognises real code.
"""

from __future__ import annotations

import torch
from torch import nn

import mha_course
from mha_course import CausalAttention, MultiHeadAttention, MultiHeadAttentionWrapper

# ----------------------------------------------------------------------------------------------
# 2.1


class StackedHeads(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads))

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


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


class _SubclassedWrapper(MultiHeadAttentionWrapper):
    pass


# ----------------------------------------------------------------------------------------------
# 2.2


def wrapper_with_width(d_in, width, num_heads, context_length):
    if width % num_heads:
        raise ValueError(f"width {width} cannot be split evenly into {num_heads} heads")
    return MultiHeadAttentionWrapper(d_in, width // num_heads, context_length, 0.0, num_heads)


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


# ----------------------------------------------------------------------------------------------
# 2.3


def wrapper_parameter_count(d_in, d_out, num_heads, qkv_bias=False):
    return num_heads * 3 * (d_in * d_out + (d_out if qkv_bias else 0))


CORRECT = {"2.1": StackedHeads, "2.2": wrapper_with_width, "2.3": wrapper_parameter_count}

#: More correct answers, written differently.
ALSO_CORRECT = {}

WRONG = {
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
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "2.1 subclasses the wrapper": ("2.1", _SubclassedWrapper, "a subclass of mha_course's own MultiHeadAttentionWrapper"),
    "2.1 is the wrapper": ("2.1", MultiHeadAttentionWrapper, "mha_course's own MultiHeadAttentionWrapper"),
    "2.3 asks the cost module": ("2.3", lambda d_in, d_out, h, qkv_bias=False: mha_course.cost.parameter_count(
        "wrapper", d_in, d_out, h, qkv_bias=qkv_bias), "mha_course's own parameter_count"),
    "2.3 counts a built wrapper": ("2.3", lambda d_in, d_out, h, qkv_bias=False: sum(
        p.numel() for p in MultiHeadAttentionWrapper(d_in, d_out, 1, 0.0, h, qkv_bias).parameters()),
        "mha_course's own MultiHeadAttentionWrapper"),
}
