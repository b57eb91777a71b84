"""Answers to the exercises of chapter 11 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own variants
(:mod:`mha_course.exercises.fewer_keys`), so a test passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch

# ----------------------------------------------------------------------------------------------
# 11.3 The sink column


def attend_with_sinks(queries, keys, values, sinks, mask):
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5  # (B, h, T, S)
    scores = scores.masked_fill(mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)  # (B, h, T, 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # the sink has no value
    return weights @ values


def _sinks_by_the_formula(queries, keys, values, sinks, mask):  # also correct: exp / (sum exp + exp(sink))
    scores = (queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5).masked_fill(mask, float("-inf"))
    top = torch.maximum(scores.amax(-1, keepdim=True), sinks.view(1, -1, 1, 1))  # for exp's sake
    e = torch.exp(scores - top)
    weights = e / (e.sum(-1, keepdim=True) + torch.exp(sinks.view(1, -1, 1, 1) - top))
    return weights @ values


def _sinks_left_out(queries, keys, values, sinks, mask):
    scores = (queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5).masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values


def _sink_given_to_the_first_key(queries, keys, values, sinks, mask):
    scores = (queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5).masked_fill(mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)
    out = weights[..., :-1] @ values
    visible = ~mask.expand(scores.shape)
    first = visible.float().argmax(-1)  # the first key each query sees: StreamingLLM's sink token
    first_values = torch.gather(values, 2, first.unsqueeze(-1).expand(*first.shape, values.shape[-1]))
    return out + weights[..., -1:] * first_values


def _sinks_unscaled(queries, keys, values, sinks, mask):
    scores = (queries @ keys.transpose(-2, -1)).masked_fill(mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ values


def _sinks_by_the_package(queries, keys, values, sinks, mask):
    from mha_course.attention.sinks import softmax_with_sinks

    return softmax_with_sinks(queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5, sinks, mask) @ values


# ----------------------------------------------------------------------------------------------
# 11.4 Top-k over the visible keys


def top_k_visible(scores, hidden, k):
    ranked = scores.masked_fill(hidden, float("-inf"))  # a hidden key never takes a place
    best = ranked.topk(min(k, scores.shape[-1]), dim=-1).indices  # (B, T, k)
    kept = torch.zeros_like(hidden).scatter(-1, best, True)
    return hidden | ~kept


def _top_k_by_threshold(scores, hidden, k):  # also correct: the k-th best visible score as a threshold
    ranked = scores.masked_fill(hidden, float("-inf"))
    kth = ranked.sort(dim=-1, descending=True).values[..., min(k, scores.shape[-1]) - 1:][..., :1]
    return hidden | (ranked < kth)


def _top_k_over_every_key(scores, hidden, k):
    best = scores.topk(min(k, scores.shape[-1]), dim=-1).indices  # the future competes too
    kept = torch.zeros_like(hidden).scatter(-1, best, True)
    return hidden | ~kept


def _top_k_forgetting_the_hidden(scores, hidden, k):
    best = scores.masked_fill(hidden, float("-inf")).topk(min(k, scores.shape[-1]), dim=-1).indices
    return ~torch.zeros_like(hidden).scatter(-1, best, True)


def _top_k_kept_as_true(scores, hidden, k):
    best = scores.masked_fill(hidden, float("-inf")).topk(min(k, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(hidden).scatter(-1, best, True) & ~hidden


def _top_k_by_the_package(scores, hidden, k):
    from mha_course.attention.sparse import keep_top_k

    return keep_top_k(scores, hidden, k)


CORRECT = {"11.3": attend_with_sinks, "11.4": top_k_visible}

#: More correct answers, written differently.
ALSO_CORRECT = {"11.3": [_sinks_by_the_formula], "11.4": [_top_k_by_threshold]}

WRONG = {
    ("11.3", "no-sink"): _sinks_left_out,
    ("11.3", "sink-to-a-value"): _sink_given_to_the_first_key,
    ("11.3", "unscaled"): _sinks_unscaled,
    ("11.4", "top-k-over-masked"): _top_k_over_every_key,
    ("11.4", "hidden-forgotten"): _top_k_forgetting_the_hidden,
    ("11.4", "inverted"): _top_k_kept_as_true,
}

#: Answers that are, or call, the package's own answer: refused, naming what they use.
BY_THE_PACKAGE = {
    "11.3 calls softmax_with_sinks": ("11.3", _sinks_by_the_package, "mha_course's own softmax_with_sinks"),
    "11.4 calls keep_top_k": ("11.4", _top_k_by_the_package, "mha_course's own keep_top_k"),
}
