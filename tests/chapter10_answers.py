"""Answers to the exercises of chapter 10 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own variants
(:func:`mha_course.exercises.latent.compress_variant` and ``scores_variant``), so a test passes only
if the catalogue recognises real code.
"""

from __future__ import annotations

import torch

import mha_course

# ----------------------------------------------------------------------------------------------
# 10.1


def _turn(x, first, theta):
    """x (..., T, d) turned by positions first, first + 1, ... (half-split pairs)."""
    d, t = x.shape[-1], x.shape[-2]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device).float() / d)
    angles = torch.arange(first, first + t, device=x.device).float()[:, None] * freqs  # (T, d/2)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def compress(layer, x, start):
    latent = layer.kv_norm(layer.W_latent(x))  # (B, T, r)
    rotated = _turn(layer.W_key_rot(x), start, layer.rotary.rope_theta)  # (B, T, d_rope)
    return latent, rotated.unsqueeze(1)  # one key for all heads: (B, 1, T, d_rope)


def _compress_with_layer_rotary(layer, x, start):  # also correct: the layer's own rotation, norm by hand
    z = layer.W_latent(x)
    latent = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + layer.kv_norm.eps) * layer.kv_norm.weight
    key = layer.W_key_rot(x).unsqueeze(1)
    _, key = layer.rotary(key, key, start)
    return latent, key


def _compress_expanded(layer, x, start):
    latent = layer.kv_norm(layer.W_latent(x))
    b, t, _ = x.shape
    h = layer.num_heads
    keys = layer.W_up_key(latent).view(b, t, h, -1).transpose(1, 2)
    rotated = _turn(layer.W_key_rot(x), start, layer.rotary.rope_theta).unsqueeze(1).expand(b, h, t, -1)
    values = layer.W_up_value(latent).view(b, t, h, -1).transpose(1, 2)
    return torch.cat([keys, rotated], dim=-1), values


def _compress_rotating_the_latent(layer, x, start):
    latent, key = compress(layer, x, start)
    return _turn(latent, start, layer.rotary.rope_theta), key


def _compress_without_norm(layer, x, start):
    return layer.W_latent(x), _turn(layer.W_key_rot(x), start, layer.rotary.rope_theta).unsqueeze(1)


def _compress_from_zero(layer, x, start):
    return compress(layer, x, 0)


def _compress_unrotated(layer, x, start):
    return layer.kv_norm(layer.W_latent(x)), layer.W_key_rot(x).unsqueeze(1)


def _compress_by_the_package(layer, x, start):
    cache = mha_course.KVCache()
    layer(torch.cat([torch.zeros(len(x), start, x.shape[-1]), x], dim=1), cache=cache)
    return cache.tensors["latent"][:, start:], cache.tensors["rotated_key"][..., start:, :]


# ----------------------------------------------------------------------------------------------
# 10.2


def _queries(layer, x, start, rotate=True):
    b, t, _ = x.shape
    q = layer.W_query(x).view(b, t, layer.num_heads, -1).transpose(1, 2)  # (B, h, T, d_nope + d_rope)
    q_nope, q_rot = q[..., : layer.qk_nope_head_dim], q[..., layer.qk_nope_head_dim:]
    return q_nope, (_turn(q_rot, start, layer.rotary.rope_theta) if rotate else q_rot)


def absorbed_scores(layer, x, start, latent, rotated_key):
    q_nope, q_rot = _queries(layer, x, start)
    w_uk = layer.W_up_key.weight.view(layer.num_heads, layer.qk_nope_head_dim, -1)  # (h, d_nope, r)
    q_latent = q_nope @ w_uk  # (B, h, T, r): W_UK folded into the queries
    scores = q_latent @ latent.unsqueeze(1).transpose(-2, -1)  # (B, h, T, S)
    scores = scores + q_rot @ rotated_key.transpose(-2, -1)
    return scores * layer.softmax_scale


def _absorbed_with_einsum(layer, x, start, latent, rotated_key):  # also correct: einsum, folded heads
    q_nope, q_rot = _queries(layer, x, start)
    w_uk = layer.W_up_key.weight.view(layer.num_heads, layer.qk_nope_head_dim, -1)
    q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)
    scores = torch.einsum("bhtr,bsr->bhts", q_latent, latent) + torch.einsum("bhtd,bsd->bhts", q_rot,
                                                                             rotated_key[:, 0])
    return scores * layer.softmax_scale


def _expanded_scores(layer, x, start, latent, rotated_key):  # the right numbers, but keys expanded
    q_nope, q_rot = _queries(layer, x, start)
    b, s, _ = latent.shape
    keys = layer.W_up_key(latent).view(b, s, layer.num_heads, -1).transpose(1, 2)  # (B, h, S, d_nope)
    return (q_nope @ keys.transpose(-2, -1) + q_rot @ rotated_key.transpose(-2, -1)) * layer.softmax_scale


def _scores_with_plain_scale(layer, x, start, latent, rotated_key):
    scores = absorbed_scores(layer, x, start, latent, rotated_key) / layer.softmax_scale
    return scores / (layer.qk_nope_head_dim + layer.qk_rope_head_dim) ** 0.5


def _scores_latent_only(layer, x, start, latent, rotated_key):
    q_nope, _ = _queries(layer, x, start)
    w_uk = layer.W_up_key.weight.view(layer.num_heads, layer.qk_nope_head_dim, -1)
    return (q_nope @ w_uk) @ latent.unsqueeze(1).transpose(-2, -1) * layer.softmax_scale


def _scores_unrotated_query(layer, x, start, latent, rotated_key):
    q_nope, q_rot = _queries(layer, x, start, rotate=False)
    w_uk = layer.W_up_key.weight.view(layer.num_heads, layer.qk_nope_head_dim, -1)
    scores = (q_nope @ w_uk) @ latent.unsqueeze(1).transpose(-2, -1) + q_rot @ rotated_key.transpose(-2, -1)
    return scores * layer.softmax_scale


def _scores_by_the_package(layer, x, start, latent, rotated_key):
    q_nope, q_rot = _queries(layer, x, start)
    w_uk = layer.W_up_key.weight.view(layer.num_heads, layer.qk_nope_head_dim, -1)
    from mha_course.attention.latent import with_shared

    scores = with_shared(q_nope @ w_uk, latent.transpose(1, 2)) + with_shared(q_rot, rotated_key[:, 0].transpose(1, 2))
    return scores * layer.softmax_scale


CORRECT = {"10.1": compress, "10.2": absorbed_scores}

#: More correct answers, written differently.
ALSO_CORRECT = {"10.1": [_compress_with_layer_rotary], "10.2": [_absorbed_with_einsum]}

WRONG = {
    ("10.1", "expanded"): _compress_expanded,
    ("10.1", "rotated-latent"): _compress_rotating_the_latent,
    ("10.1", "no-norm"): _compress_without_norm,
    ("10.1", "no-offset"): _compress_from_zero,
    ("10.1", "unrotated-key"): _compress_unrotated,
    ("10.2", "yarn-scale"): _scores_with_plain_scale,
    ("10.2", "rope-absorbed"): _scores_latent_only,
    ("10.2", "unrotated-query"): _scores_unrotated_query,
}

#: Answers that are, or call, the package's own answer: refused, naming what they use.
#: Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "10.1 runs the layer": ("10.1", _compress_by_the_package, "mha_course's own MultiHeadLatentAttention"),
    "10.2 calls with_shared": ("10.2", _scores_by_the_package, "mha_course's own with_shared"),
}

#: Correct numbers that fail a check all the same: the keys expanded (10.2 counts the multiply-adds).
EXPANDED_SCORES = _expanded_scores
