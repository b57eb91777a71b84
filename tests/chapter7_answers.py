"""Answers to the exercises of chapter 7 for the check tests: a correct one each, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors
(:func:`mha_course.exercises.chapter7.update_variant` and :func:`~mha_course.exercises.chapter7.tile_variant`),
so a test passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch

from mha_course.attention import tiled

# ----------------------------------------------------------------------------------------------
# 7.1


def online_softmax_update(row_max, row_sum, acc, scores, values):
    new_max = torch.maximum(row_max, scores.max(dim=-1, keepdim=True).values)
    weights = torch.exp(scores - new_max)
    rescale = torch.exp(row_max - new_max)
    return new_max, row_sum * rescale + weights.sum(dim=-1, keepdim=True), acc * rescale + weights @ values


def _update_in_another_style(row_max, row_sum, acc, scores, values):  # also correct: one exp per state
    new_max = torch.max(row_max, scores.amax(-1, keepdim=True))
    p = (scores - new_max).exp()
    alpha = (row_max - new_max).exp()
    return new_max, alpha * row_sum + p.sum(-1, keepdim=True), alpha * acc + torch.matmul(p, values)


def _update(row_max, row_sum, acc, scores, values, *, acc_rescaled=True, sum_rescaled=True, by="new", use_max=True):
    tile_max = scores.max(dim=-1, keepdim=True).values
    new_max = torch.maximum(row_max, tile_max)
    if not use_max:
        weights = torch.exp(scores)
        return new_max, row_sum + weights.sum(-1, keepdim=True), acc + weights @ values
    weights = torch.exp(scores - new_max)
    rescale = {"new": torch.exp(row_max - new_max), "tile": torch.exp(row_max - tile_max),
               "inverted": torch.exp(new_max - row_max)}[by]
    new_sum = (row_sum * rescale if sum_rescaled else row_sum) + weights.sum(-1, keepdim=True)
    new_acc = (acc * rescale if acc_rescaled else acc) + weights @ values
    return new_max, new_sum, new_acc


def _update_with(**how):
    return lambda row_max, row_sum, acc, scores, values: _update(row_max, row_sum, acc, scores, values, **how)


def _max_kept(row_max, row_sum, acc, scores, values):
    m = torch.maximum(row_max, scores.amax(-1, keepdim=True))
    w = torch.exp(scores - m)
    r = torch.exp(row_max - m)
    return row_max, r * row_sum + w.sum(-1, keepdim=True), r * acc + w @ values


def _tile_max_only(row_max, row_sum, acc, scores, values):
    m = scores.amax(-1, keepdim=True)
    w = torch.exp(scores - m)
    r = torch.exp(row_max - m)
    return m, r * row_sum + w.sum(-1, keepdim=True), r * acc + w @ values


def _tile_only(row_max, row_sum, acc, scores, values):
    m = scores.max(-1, keepdim=True).values
    w = (scores - m).exp()
    return m, w.sum(-1, keepdim=True), w @ values


def _base_2(row_max, row_sum, acc, scores, values):
    m = torch.maximum(row_max, scores.amax(-1, keepdim=True))
    w = torch.exp2(scores - m)
    r = torch.exp2(row_max - m)
    return m, r * row_sum + w.sum(-1, keepdim=True), r * acc + w @ values


def _old_max_weights(row_max, row_sum, acc, scores, values):
    m = torch.maximum(row_max, scores.amax(-1, keepdim=True))
    w = torch.exp(scores - row_max)
    r = torch.exp(row_max - m)
    return m, r * row_sum + w.sum(-1, keepdim=True), r * acc + w @ values


def _acc_normalised(row_max, row_sum, acc, scores, values):
    m = torch.maximum(row_max, scores.amax(-1, keepdim=True))
    w = torch.exp(scores - m)
    r = torch.exp(row_max - m)
    new_sum = r * row_sum + w.sum(-1, keepdim=True)
    return m, new_sum, (r * acc + w @ values) / new_sum


def _sum_over_rows(row_max, row_sum, acc, scores, values):
    m = torch.maximum(row_max, scores.amax(-1, keepdim=True))
    w = torch.exp(scores - m)
    r = torch.exp(row_max - m)
    return m, r * row_sum + w.sum(dim=-2, keepdim=True), r * acc + w @ values


def _update_by_the_package(row_max, row_sum, acc, scores, values):
    from mha_course import tiled_attention

    tiled_attention(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), block_size=1)
    return online_softmax_update(row_max, row_sum, acc, scores, values)


# ----------------------------------------------------------------------------------------------
# 7.2


def tile_kind(q_start, k_start, block_size, num_tokens):
    last_query = min(q_start + block_size, num_tokens) - 1
    last_key = min(k_start + block_size, num_tokens) - 1
    if k_start > last_query:
        return "skipped"
    if last_key > q_start:
        return "cut"
    return "computed"


def _tile_kind_by_blocks(q_start, k_start, block_size, num_tokens):  # also correct: compare block indices
    i, j = q_start // block_size, k_start // block_size
    if j > i:
        return "skipped"
    if j < i:
        return "computed"
    return "cut" if min(block_size, num_tokens - q_start) > 1 else "computed"


def _diagonal_skipped(q_start, k_start, block_size, num_tokens):
    if k_start >= q_start:
        return "skipped"
    return "computed"


def _diagonal_not_cut(q_start, k_start, block_size, num_tokens):
    return "skipped" if k_start > q_start else "computed"


def _one_tile_past(q_start, k_start, block_size, num_tokens):
    if k_start > q_start + block_size:
        return "skipped"
    return "cut" if k_start >= q_start else "computed"


def _no_clamp(q_start, k_start, block_size, num_tokens):
    last_query = q_start + block_size - 1
    if k_start > last_query:
        return "skipped"
    return "cut" if k_start + block_size - 1 > q_start else "computed"


def _diagonal_always_cut(q_start, k_start, block_size, num_tokens):
    if k_start > min(q_start + block_size, num_tokens) - 1:
        return "skipped"
    return "cut" if k_start == q_start else "computed"


def _tile_kind_by_the_package(q_start, k_start, block_size, num_tokens):
    from mha_course.attention.tiled import tile_kind as package_tile_kind

    return package_tile_kind(q_start, k_start, block_size, num_tokens)


# ----------------------------------------------------------------------------------------------
# 7.3


def attention_backward(queries, keys, values, out, row_max, row_sum, grad_out):
    scale = queries.shape[-1] ** -0.5
    T = queries.shape[-2]
    scores = queries @ keys.transpose(-2, -1) * scale
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=queries.device), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    lse = row_max + torch.log(row_sum)
    p = torch.exp(scores - lse)
    dv = p.transpose(-2, -1) @ grad_out
    dp = grad_out @ values.transpose(-2, -1)
    D = (grad_out * out).sum(dim=-1, keepdim=True)
    ds = p * (dp - D)
    return ds @ keys * scale, ds.transpose(-2, -1) @ queries * scale, dv


def _backward_with_d_from_p_times_dp(queries, keys, values, out, row_max, row_sum, grad_out):
    # also correct: D as the row sum of P * dP, which equals the row sum of dO * O
    d = queries.shape[-1]
    s = torch.einsum("bhid,bhjd->bhij", queries, keys) / d**0.5
    s = s + torch.full_like(s[0, 0], float("-inf")).triu(1)
    p = (s - row_max).exp() / row_sum
    dp = torch.einsum("bhic,bhjc->bhij", grad_out, values)
    ds = p * (dp - (p * dp).sum(-1, keepdim=True)) / d**0.5
    return (torch.einsum("bhij,bhjd->bhid", ds, keys), torch.einsum("bhij,bhid->bhjd", ds, queries),
            torch.einsum("bhij,bhic->bhjc", p, grad_out))


def _backward(queries, keys, values, out, row_max, row_sum, grad_out, *, mask=True, with_max=True, d_from="o",
              scaled=True):
    scale = queries.shape[-1] ** -0.5
    scores = queries @ keys.transpose(-2, -1) * scale
    if mask:
        T = queries.shape[-2]
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1).to(scores.device), float("-inf"))
    lse = (row_max if with_max else 0) + torch.log(row_sum)
    p = torch.exp(scores - lse)
    dv = p.transpose(-2, -1) @ grad_out
    dp = grad_out @ values.transpose(-2, -1)
    D = {"o": (grad_out * out).sum(-1, keepdim=True), "p": p.sum(-1, keepdim=True), None: 0}[d_from]
    ds = p * (dp - D)
    if scaled:
        return ds @ keys * scale, ds.transpose(-2, -1) @ queries * scale, dv
    return ds @ keys, ds.transpose(-2, -1) @ queries, dv


def _backward_with(**how):
    return lambda *args: _backward(*args, **how)


def _backward_not_divided(queries, keys, values, out, row_max, row_sum, grad_out):
    scale = queries.shape[-1] ** -0.5
    T = queries.shape[-2]
    scores = (queries @ keys.transpose(-2, -1) * scale).masked_fill(
        torch.ones(T, T, dtype=torch.bool, device=queries.device).triu(1), float("-inf"))
    p = torch.exp(scores - row_max)  # the maximum taken off, but the row sum never divided
    dv = p.transpose(-2, -1) @ grad_out
    ds = p * (grad_out @ values.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True))
    return ds @ keys * scale, ds.transpose(-2, -1) @ queries * scale, dv


def _backward_dv_untransposed(queries, keys, values, out, row_max, row_sum, grad_out):
    scale = queries.shape[-1] ** -0.5
    T = queries.shape[-2]
    scores = (queries @ keys.transpose(-2, -1) * scale).masked_fill(
        torch.ones(T, T, dtype=torch.bool, device=queries.device).triu(1), float("-inf"))
    p = torch.exp(scores - row_max - torch.log(row_sum))
    dv = p @ grad_out  # P, not P^T: the shapes match, so nothing complains
    ds = p * (grad_out @ values.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True))
    return ds @ keys * scale, ds.transpose(-2, -1) @ queries * scale, dv


def _backward_by_autograd_of_the_package(queries, keys, values, out, row_max, row_sum, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in (queries, keys, values)]
    return torch.autograd.grad(tiled.tiled_attention(*leaves), leaves, grad_out)


def _backward_by_sdpa(queries, keys, values, out, row_max, row_sum, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in (queries, keys, values)]
    output = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    return torch.autograd.grad(output, leaves, grad_out)


CORRECT = {"7.1": online_softmax_update, "7.2": tile_kind, "7.3": attention_backward}

#: More correct answers, written differently.
ALSO_CORRECT = {"7.1": [_update_in_another_style], "7.2": [_tile_kind_by_blocks],
                "7.3": [_backward_with_d_from_p_times_dp]}

WRONG = {
    ("7.1", "no-running-max"): _update_with(use_max=False),
    ("7.1", "neither-rescaled"): _update_with(acc_rescaled=False, sum_rescaled=False),
    ("7.1", "acc-not-rescaled"): _update_with(acc_rescaled=False),
    ("7.1", "sum-not-rescaled"): _update_with(sum_rescaled=False),
    ("7.1", "rescale-by-tile-max"): _update_with(by="tile"),
    ("7.1", "rescale-inverted"): _update_with(by="inverted"),
    ("7.1", "max-kept"): _max_kept,
    ("7.1", "tile-max-only"): _tile_max_only,
    ("7.1", "tile-only"): _tile_only,
    ("7.1", "base-2"): _base_2,
    ("7.1", "old-max-weights"): _old_max_weights,
    ("7.1", "acc-normalised"): _acc_normalised,
    ("7.1", "sum-over-rows"): _sum_over_rows,
    ("7.2", "diagonal-skipped"): _diagonal_skipped,
    ("7.2", "diagonal-not-cut"): _diagonal_not_cut,
    ("7.2", "one-tile-past"): _one_tile_past,
    ("7.2", "no-clamp"): _no_clamp,
    ("7.2", "diagonal-always-cut"): _diagonal_always_cut,
    ("7.3", "no-causal-mask"): _backward_with(mask=False),
    ("7.3", "lse-without-max"): _backward_with(with_max=False),
    ("7.3", "d-from-p"): _backward_with(d_from="p"),
    ("7.3", "no-d"): _backward_with(d_from=None),
    ("7.3", "grads-not-scaled"): _backward_with(scaled=False),
    ("7.3", "row-sum-not-divided"): _backward_not_divided,
    ("7.3", "dv-untransposed"): _backward_dv_untransposed,
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "7.1 runs tiled_attention": ("7.1", _update_by_the_package, "mha_course's own tiled_attention"),
    "7.2 is tile_kind": ("7.2", tiled.tile_kind, "mha_course's own tile_kind"),
    "7.2 calls tile_kind": ("7.2", _tile_kind_by_the_package, "mha_course's own tile_kind"),
    "7.3 runs tiled_attention's backward": ("7.3", _backward_by_autograd_of_the_package,
                                            "mha_course's own tiled_attention"),
    "7.3 runs the fused kernel's backward": ("7.3", _backward_by_sdpa, "torch's scaled_dot_product_attention"),
}
