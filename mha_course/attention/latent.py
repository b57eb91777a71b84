"""Multi-head latent attention: keys and values expanded from one small latent per token (DeepSeek-V2, V3).

:class:`GroupedQueryAttention` shrinks the key/value cache by letting heads share keys and values.
Multi-head latent attention (DeepSeek-AI 2024) keeps every head's own keys and values but computes
them from one *latent* vector per token, of width ``kv_lora_rank`` (512 in DeepSeek-V3, against
128 heads of 128 numbers): a low-rank factorisation of the key and value projections,
``K = c W_UK^T`` and ``V = c W_UV^T`` with ``c = RMSNorm(x W_DKV^T)``. The cache keeps ``c``, not
``K`` and ``V``.

Rotary positions do not survive that factorisation: a rotation by position between ``c`` and the
keys would have to be redone for every cached token at every step. So each head's query and key
have two parts: ``qk_nope_head_dim`` numbers with no position, expanded from the latent, and
``qk_rope_head_dim`` rotated numbers, whose key, ``RoPE(x W_KR^T)``, is one for all heads (as in
multi-query attention) and cached beside the latent. A token costs ``kv_lora_rank +
qk_rope_head_dim`` cached numbers per layer.

With ``absorb = True`` the module never expands the latent at all: since ``q_nope . (W_UK c) =
(W_UK^T q_nope) . c``, the key up-projection is folded into the query and the scores are taken
against the cached latents; the weighted sum of latents is then up-projected by ``W_UV``. Same
outputs, fewer multiply-adds per decoded token. The rotated part cannot be folded this way: its
rotation depends on the key's position, so no fixed matrix can be moved across it.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
from torch import nn

from ._validation import validate_bool, validate_dropout, validate_input, validate_positive_int
from .heads import captured_attention_weights, merge_heads, score_dtype, split_heads
from .kv_cache import cache_start
from .masking import causal_mask, safe_softmax, with_padding
from .rotary import RotaryEmbedding


def yarn_softmax_scale(qk_head_dim: int, factor: float = 1.0, mscale_all_dim: float = 0.0) -> float:
    """The scale of DeepSeek's scores: ``1/sqrt(qk_head_dim)``, times ``m**2`` when yarn stretches positions.

    YaRN (Peng et al. 2023) stretches the rotary frequencies by ``factor`` to reach a longer context;
    attention then grows flatter, and DeepSeek-V2 and V3 sharpen it again by
    ``m = 0.1 * mscale_all_dim * ln(factor) + 1`` on both the query and the key: ``m**2`` on the
    scores. ``factor <= 1`` or ``mscale_all_dim = 0`` leave the plain scale.

    Example:
        >>> round(yarn_softmax_scale(192), 6)  # DeepSeek-V3: 128 + 64 numbers per query and key
        0.072169
        >>> round(yarn_softmax_scale(192, factor=40, mscale_all_dim=1.0), 6)  # its yarn, factor 40
        0.135234
    """
    scale = qk_head_dim**-0.5
    if factor > 1 and mscale_all_dim:
        scale *= (0.1 * mscale_all_dim * math.log(factor) + 1.0) ** 2
    return scale


class LatentSizes(NamedTuple):
    """The checked sizes of a :class:`MultiHeadLatentAttention`."""

    d_in: int
    context_length: int
    dropout: float
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None
    bias: bool
    softmax_scale: float


def validate_latent_args(d_in, context_length, dropout, num_heads, kv_lora_rank, qk_nope_head_dim,
                         qk_rope_head_dim, v_head_dim, q_lora_rank, bias, softmax_scale) -> LatentSizes:
    """Check the constructor's arguments at once; ``softmax_scale=None`` becomes ``1/sqrt(qk_head_dim)``.

    Example:
        >>> validate_latent_args(8, 6, 0.0, 2, 4, 2, 3, 2, None, False, None)
        Traceback (most recent call last):
            ...
        ValueError: qk_rope_head_dim must be even, got 3: rotary embeddings turn its numbers in pairs. Choose e.g. qk_rope_head_dim=2 or 4.
    """
    sizes = {name: validate_positive_int(name, value) for name, value in (
        ("d_in", d_in), ("context_length", context_length), ("num_heads", num_heads),
        ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
        ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim))}
    if sizes["qk_rope_head_dim"] % 2:
        rope = sizes["qk_rope_head_dim"]
        raise ValueError(f"qk_rope_head_dim must be even, got {rope}: rotary embeddings turn its numbers in "
                         f"pairs. Choose e.g. qk_rope_head_dim={rope - 1} or {rope + 1}.")
    if q_lora_rank is not None:
        q_lora_rank = validate_positive_int(
            "q_lora_rank", q_lora_rank, hint="Pass None for a full-rank query projection.")
    if softmax_scale is None:
        softmax_scale = (sizes["qk_nope_head_dim"] + sizes["qk_rope_head_dim"]) ** -0.5
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real) or not softmax_scale > 0:
        raise ValueError(f"softmax_scale must be a positive number (the factor of the scores), or None for "
                         f"1/sqrt(qk_nope_head_dim + qk_rope_head_dim); got {softmax_scale!r}.")
    return LatentSizes(sizes["d_in"], sizes["context_length"], validate_dropout(dropout), sizes["num_heads"],
                       sizes["kv_lora_rank"], sizes["qk_nope_head_dim"], sizes["qk_rope_head_dim"],
                       sizes["v_head_dim"], q_lora_rank, validate_bool("bias", bias), float(softmax_scale))


def with_shared(per_head: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """``per_head @ shared`` for ``(B, h, T, n)`` and one ``(B, n, m)`` that every head shares: ``(B, h, T, m)``.

    ``torch.matmul`` would broadcast ``shared`` over the heads by copying it ``h`` times; with the
    heads folded into the rows it is one product, ``(B, h*T, n) @ (B, n, m)``, and nothing is copied.
    This is why a cache shared by all heads (the latent, the rotated key) is cheap to read.

    Example:
        >>> a, b = torch.rand(2, 3, 4, 5), torch.rand(2, 5, 6)
        >>> torch.allclose(with_shared(a, b), a @ b.unsqueeze(1))
        True
    """
    return (per_head.flatten(1, 2) @ shared).unflatten(1, per_head.shape[1:3])


class MultiHeadLatentAttention(nn.Module):
    """Causal attention whose keys and values are expanded from one cached latent per token (DeepSeek).

    Args:
        d_in: width of each input token vector, and of the output.
        context_length: the longest sequence the module accepts, cached positions included.
        dropout: probability of zeroing an attention weight while training.
        num_heads: how many heads; each has its own query, key and value.
        kv_lora_rank: width ``r`` of the latent every key and value is expanded from.
        qk_nope_head_dim: numbers of a head's query and key without position, from the latent.
        qk_rope_head_dim: numbers of a head's query and key turned by position; the key's part is one
            for all heads. Must be even.
        v_head_dim: width of a head's value.
        q_lora_rank: ``None`` (queries by one projection), or the width of the bottleneck the queries
            pass through, as DeepSeek-V3's do (1536).
        bias: whether the down-projections and the output projection have biases.
        rope_theta: the base of the rotary frequencies.
        softmax_scale: the factor of the scores, by default ``1/sqrt(qk_nope_head_dim +
            qk_rope_head_dim)`` (with yarn: :func:`yarn_softmax_scale`).

    Attributes:
        W_query: ``nn.Linear(d_in, num_heads * qk_head_dim)``, or with ``q_lora_rank`` an
            ``nn.Sequential`` of a down-projection, an ``nn.RMSNorm`` and an up-projection.
        W_latent: ``nn.Linear(d_in, kv_lora_rank)``, the down-projection ``W_DKV``; ``kv_norm`` the
            ``nn.RMSNorm`` after it.
        W_up_key, W_up_value: ``nn.Linear(kv_lora_rank, num_heads * qk_nope_head_dim)`` and
            ``(kv_lora_rank, num_heads * v_head_dim)``, the up-projections ``W_UK`` and ``W_UV``.
        W_key_rot: ``nn.Linear(d_in, qk_rope_head_dim)``, ``W_KR``: the key that is rotated.
        rotary: the :class:`~mha_course.attention.rotary.RotaryEmbedding` of the rotated part.
        out_proj: ``nn.Linear(num_heads * v_head_dim, d_in)``.
        absorb: ``False`` (default) expands keys and values from the latent; ``True`` folds ``W_UK``
            into the queries and ``W_UV`` into the output, never expanding them. Same outputs.

    ``forward(x, cache, attention_mask, position_ids)`` takes what
    :class:`GroupedQueryAttention`'s takes; a :class:`KVCache` keeps ``latent`` ``(B, T, r)`` and
    ``rotated_key`` ``(B, 1, T, qk_rope_head_dim)``. A query that sees no key gets a context of 0.
    Conversion: :func:`mha_course.from_deepseek_v3_attention`.

    Example:
        >>> mla = MultiHeadLatentAttention(16, context_length=8, dropout=0.0, num_heads=4, kv_lora_rank=6,
        ...                                qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
        >>> x = torch.rand(2, 8, 16)
        >>> mla(x).shape
        torch.Size([2, 8, 16])
        >>> from mha_course import KVCache
        >>> cache = KVCache()
        >>> _ = mla(x, cache=cache)
        >>> cache.nbytes == 2 * 8 * (6 + 2) * 4  # batch x tokens x (latent + rotated key) x 4 bytes
        True
    """

    def __init__(self, d_in, context_length, dropout, num_heads, kv_lora_rank,
                 qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 q_lora_rank=None, bias=False, rope_theta=10000.0,
                 softmax_scale=None):
        super().__init__()
        args = validate_latent_args(
            d_in, context_length, dropout, num_heads, kv_lora_rank,
            qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_lora_rank, bias,
            softmax_scale)
        self.d_in, self.context_length = args.d_in, args.context_length
        self.num_heads, self.softmax_scale = args.num_heads, args.softmax_scale
        self.qk_nope_head_dim = args.qk_nope_head_dim
        self.qk_rope_head_dim = args.qk_rope_head_dim
        self.v_head_dim, self.kv_lora_rank = args.v_head_dim, args.kv_lora_rank
        h, r, q_rank = self.num_heads, self.kv_lora_rank, args.q_lora_rank
        qk_width = h * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        # Queries as in multi-head attention, through a bottleneck if q_rank.
        self.W_query = (
            nn.Linear(d_in, qk_width, bias=False) if q_rank is None
            else nn.Sequential(nn.Linear(d_in, q_rank, bias=args.bias),
                               nn.RMSNorm(q_rank, eps=1e-6),
                               nn.Linear(q_rank, qk_width, bias=False)))
        # New: keys and values come from one latent of width r per token...
        self.W_latent = nn.Linear(d_in, r, bias=args.bias)  # W_DKV
        self.kv_norm = nn.RMSNorm(r, eps=1e-6)
        self.W_up_key = nn.Linear(r, h * self.qk_nope_head_dim, bias=False)
        self.W_up_value = nn.Linear(r, h * self.v_head_dim, bias=False)
        # ... beside one rotated key per token, shared by every head.
        self.W_key_rot = nn.Linear(d_in, self.qk_rope_head_dim, bias=args.bias)
        self.rotary = RotaryEmbedding(self.qk_rope_head_dim, rope_theta)
        self.out_proj = nn.Linear(h * self.v_head_dim, d_in, bias=args.bias)
        self.dropout = nn.Dropout(args.dropout)
        self.absorb = False  # True: decode in the latent space

    def forward(self, x, cache=None, attention_mask=None, position_ids=None):
        """Multi-head latent attention: ``(B, T, d_in) -> (B, T, d_in)``.

        Arguments as :meth:`GroupedQueryAttention.forward
        <mha_course.GroupedQueryAttention.forward>`'s; the cache keeps the
        latent and the rotated key of every position.
        """
        validate_input(x, self.d_in, self.context_length,
                       like=self.out_proj.weight)
        start = cache_start(cache, self, x.shape[1], self.context_length)
        # True where a query may not look, a later key or padding: (T, S),
        # or (B, 1, T, S) with padding; rows start .. start + T - 1
        mask = with_padding(causal_mask(x.shape[1], x.device, start=start),
                            attention_mask, len(x))
        h, d_nope, d_v = self.num_heads, self.qk_nope_head_dim, self.v_head_dim
        queries = split_heads(self.W_query(x), h)  # (B, h, T, d_nope + d_rope)
        q_nope, q_rot = queries.split([d_nope, self.qk_rope_head_dim], dim=-1)
        latent = self.kv_norm(self.W_latent(x))  # (B, T, r)
        k_rot = self.W_key_rot(x).unsqueeze(1)  # (B, 1, T, d_rope): all heads
        q_rot, k_rot = self.rotary(q_rot, k_rot, start, position_ids)
        if cache is not None:  # the past, then x: S = start + T positions
            latent, k_rot = cache.extend(latent=latent, rotated_key=k_rot)
        # The rotated part: each head's query against the one shared key
        scores = with_shared(q_rot, k_rot.squeeze(1).mT)  # (B, h, T, S)
        if self.absorb:  # W_UK folded into the queries: scored against latents
            w_uk = self.W_up_key.weight.view(h, d_nope, -1)  # (h, d_nope, r)
            scores += with_shared(q_nope @ w_uk, latent.mT)  # (B, h, T, S)
        else:  # every head's keys expanded from the latent
            k_nope = split_heads(self.W_up_key(latent), h)  # (B, h, S, d_nope)
            scores += q_nope @ k_nope.mT  # (B, h, T, S)
        scores = (scores * self.softmax_scale).to(score_dtype(scores.dtype))
        weights = safe_softmax(scores, mask)  # 0 where a query sees no key
        weights = self.dropout(weights.to(latent.dtype))
        if self.absorb:  # weigh the latents, then W_UV: (B, h, T, d_v)
            w_uv = self.W_up_value.weight.view(h, d_v, -1)  # (h, d_v, r)
            context = with_shared(weights, latent) @ w_uv.mT
        else:  # weigh every head's values, expanded from the latent
            values = split_heads(self.W_up_value(latent), h)  # (B, h, S, d_v)
            context = weights @ values  # (B, h, T, d_v)
        return self.out_proj(merge_heads(context))  # (B, T, d_in)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, ``(batch, num_heads, num_tokens, num_tokens)``.

        Example:
            >>> mla = MultiHeadLatentAttention(8, 6, 0.0, num_heads=2, kv_lora_rank=4, qk_nope_head_dim=2,
            ...                                qk_rope_head_dim=2, v_head_dim=2)
            >>> mla.attention_weights(torch.rand(1, 5, 8)).shape
            torch.Size([1, 2, 5, 5])
        """
        return captured_attention_weights(self, x)
