"""Answers to the exercises of chapter 9 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors
(:func:`mha_course.exercises.positions.rotation_variant` and ``padded_variant``), so a test passes
only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch

import mha_course

# ----------------------------------------------------------------------------------------------
# 9.1


def _turn(x, start, rope_theta, *, sign=1, interleaved=False, offset=True):
    d, t = x.shape[-1], x.shape[-2]
    freqs = 1.0 / rope_theta ** (torch.arange(0, d, 2, device=x.device).float() / d)  # (d/2,)
    positions = torch.arange(t, device=x.device).float() + (start if offset else 0)
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
        freqs = 1.0 / rope_theta ** (torch.arange(0, d, 2, device=x.device).float() / d)
        angles = torch.arange(start, start + x.shape[-2], device=x.device).float()[:, None] * freqs
        z = torch.complex(x[..., :d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(angles), angles)
        return torch.cat((z.real, z.imag), dim=-1)
    return turn(queries), turn(keys), values


def _rotate_with(**how):
    return lambda q, k, v, start, theta: (_turn(q, start, theta, **how), _turn(k, start, theta, **how), v)


def _rotate_exponent_i_over_d(queries, keys, values, start, rope_theta):
    def turn(x):
        d, t = x.shape[-1], x.shape[-2]
        freqs = rope_theta ** (-torch.arange(d // 2, device=x.device).float() / d)  # i / d, not 2i / d
        angles = torch.arange(start, start + t, device=x.device).float()[:, None] * freqs
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    return turn(queries), turn(keys), values


def _values_rotated(queries, keys, values, start, rope_theta):
    return tuple(_turn(t, start, rope_theta) for t in (queries, keys, values))


def _rotate_by_the_package(queries, keys, values, start, rope_theta):
    q, k = mha_course.RotaryEmbedding(queries.shape[-1], rope_theta)(queries, keys, start)
    return q, k, values


# ----------------------------------------------------------------------------------------------
# 9.2


def padded_attention(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    causal = torch.ones(t, t, dtype=torch.bool, device=queries.device).triu(1)  # True: a future key
    hidden = causal | (attention_mask == 0)[:, None, None, :]  # (B, 1, T, T): padded keys too
    hidden = hidden & ~hidden.all(dim=-1, keepdim=True)  # a row that sees nothing: see all instead
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return weights @ values


def _padded_with_finfo_min(queries, keys, values, attention_mask):  # also correct: transformers' way
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool, device=queries.device).triu(1) | ~attention_mask.bool()[:, None, None, :]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ values


def _padded_masking_queries(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool, device=queries.device).triu(1) | (attention_mask == 0)[:, None, :, None]
    hidden = hidden & ~hidden.all(dim=-1, keepdim=True)
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ values


def _padded_causal_only(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=queries.device).triu(1), float("-inf")), -1) @ values


def _padded_without_causal_mask(queries, keys, values, attention_mask):
    hidden = (attention_mask == 0)[:, None, None, :]  # the padding, but every later real token is seen
    hidden = hidden & ~hidden.all(dim=-1, keepdim=True)
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ values


def _padded_scaled_by_d(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool, device=queries.device).triu(1) | (attention_mask == 0)[:, None, None, :]
    hidden = hidden & ~hidden.all(dim=-1, keepdim=True)
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1]  # d, not its square root
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ values


def _padded_filled_with_zero(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool, device=queries.device).triu(1) | (attention_mask == 0)[:, None, None, :]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(hidden, 0.0), dim=-1) @ values  # exp(0) = 1: still weighed


def _padded_by_nonzero(queries, keys, values, attention_mask):  # also correct: one sequence at a time
    out = torch.zeros_like(queries)
    for b in range(len(queries)):
        real = attention_mask[b].nonzero().flatten()
        q, k, v = queries[b][:, real], keys[b][:, real], values[b][:, real]
        future = torch.ones(len(real), len(real), dtype=torch.bool, device=q.device).triu(1)
        scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(future, float("-inf"))
        out[b][:, real] = torch.softmax(scores, dim=-1) @ v
    return out


def _padded_by_boolean_index(queries, keys, values, attention_mask):  # also correct: a boolean index
    out = torch.zeros_like(queries)
    for b in range(len(queries)):
        real = attention_mask[b].bool()
        q, k, v = queries[b][:, real], keys[b][:, real], values[b][:, real]
        n = q.shape[1]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(future, float("-inf"))
        out[b][:, real] = torch.softmax(scores, dim=-1) @ v
    return out


def _padded_nan_rows(queries, keys, values, attention_mask):
    t = queries.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool, device=queries.device).triu(1) | (attention_mask == 0)[:, None, None, :]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ values


def _padded_by_the_package(queries, keys, values, attention_mask):
    mask = mha_course.with_padding(mha_course.causal_mask(queries.shape[-2]), attention_mask, len(queries))
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ values


CORRECT = {"9.1": rotate_by_position, "9.2": padded_attention}

#: More correct answers, written differently.
ALSO_CORRECT = {"9.1": [_rotate_pairs_by_hand, _rotate_complex],
                "9.2": [_padded_with_finfo_min, _padded_by_nonzero, _padded_by_boolean_index]}

WRONG = {
    ("9.1", "sign"): _rotate_with(sign=-1),
    ("9.1", "interleaved"): _rotate_with(interleaved=True),
    ("9.1", "no-offset"): _rotate_with(offset=False),
    ("9.1", "values-rotated"): _values_rotated,
    ("9.1", "exponent-i-over-d"): _rotate_exponent_i_over_d,
    ("9.2", "masked-queries"): _padded_masking_queries,
    ("9.2", "no-padding-mask"): _padded_causal_only,
    ("9.2", "nan-rows"): _padded_nan_rows,
    ("9.2", "no-causal-mask"): _padded_without_causal_mask,
    ("9.2", "scaled-by-d"): _padded_scaled_by_d,
    ("9.2", "filled-with-zero"): _padded_filled_with_zero,
}

#: Answers that are, or call, the package's own answer: refused, naming what they use.
#: Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "9.1 calls RotaryEmbedding": ("9.1", _rotate_by_the_package, "mha_course's own RotaryEmbedding"),
    "9.2 calls with_padding": ("9.2", _padded_by_the_package, "mha_course's own with_padding"),
}
