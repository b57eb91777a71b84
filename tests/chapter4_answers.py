"""Answers to the exercises of chapter 4 for the check tests: a correct one each, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors
(:func:`mha_course.exercises.chapter4.share_variant` and :func:`~mha_course.exercises.chapter4.fused_variant`),
so a test passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mha_course

# ----------------------------------------------------------------------------------------------
# 4.1


def attention_share(num_tokens, d_in, d_out):
    attention = 2 * num_tokens**2 * d_out
    projections = 3 * num_tokens * d_in * d_out + num_tokens * d_out**2
    return attention / (attention + projections)


# ----------------------------------------------------------------------------------------------
# 4.2


def sdpa_attention(mha, x):
    b, t, _ = x.shape
    q, k, v = (layer(x).view(b, t, mha.num_heads, mha.head_dim).transpose(1, 2)
               for layer in (mha.W_query, mha.W_key, mha.W_value))
    p = mha.dropout.p if mha.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    return mha.out_proj(context.transpose(1, 2).reshape(b, t, mha.d_out))


def _sdpa(causal="is_causal", heads=True, merge=True, out_proj=True, scale=None, dropout="mode", split=True):
    def forward(mha, x):
        b, t, _ = x.shape
        h = mha.num_heads if heads else 1
        projected = [layer(x) for layer in (mha.W_query, mha.W_key, mha.W_value)]
        if heads and not split:  # the heads' axis viewed where it should end up, no transpose
            q, k, v = (p.view(b, h, t, -1) for p in projected)
        else:
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


CORRECT = {"4.1": attention_share, "4.2": sdpa_attention}

#: More correct answers, written differently.
ALSO_CORRECT = {}

WRONG = {
    ("4.1", "one-attention-product"): lambda t, d_in, d_out: t * t * d_out / (t * t * d_out + 3 * t * d_in * d_out + t * d_out**2),
    ("4.1", "one-product-shared"): lambda t, d_in, d_out: t * t * d_out / (2 * t * t * d_out + 3 * t * d_in * d_out
                                                                          + t * d_out**2),
    ("4.1", "no-out-proj"): lambda t, d_in, d_out: 2 * t * t * d_out / (2 * t * t * d_out + 3 * t * d_in * d_out),
    ("4.1", "ratio-not-share"): lambda t, d_in, d_out: 2 * t * t * d_out / (3 * t * d_in * d_out + t * d_out**2),
    ("4.1", "widths-swapped"): lambda t, d_in, d_out: attention_share(t, d_out, d_in),
    ("4.1", "percentage"): lambda t, d_in, d_out: 100 * attention_share(t, d_in, d_out),
    ("4.2", "not-causal"): _sdpa(causal="none"),
    ("4.2", "mask-meaning"): _sdpa(causal="mask"),
    ("4.2", "one-head"): _sdpa(heads=False),
    ("4.2", "scale-d-out"): _sdpa(scale=lambda mha: mha.d_out**-0.5),
    ("4.2", "split-without-transpose"): _sdpa(split=False),
    ("4.2", "merge-without-transpose"): _sdpa(merge=False),
    ("4.2", "no-out-proj"): _sdpa(out_proj=False),
    ("4.2", "dropout-never"): _sdpa(dropout="never"),
    ("4.2", "dropout-always"): _sdpa(dropout="always"),
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "4.1 asks the cost module": ("4.1", lambda t, d_in, d_out: (lambda m: (m.scores + m.weighted_sum) / m.total)(
        mha_course.cost.multiply_adds("batched", 1, t, d_in, d_out)), "mha_course's own multiply_adds"),
    "4.2 calls the module": ("4.2", lambda mha, x: mha(x), "mha_course's own MultiHeadAttention"),
    "4.2 is sdpa_forward": ("4.2", mha_course.sdpa_forward, "mha_course's own sdpa_forward"),
}
