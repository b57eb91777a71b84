"""DeepSeek's sparse attention: a small indexer picks each query's top-k keys, and latent attention reads those alone.

:class:`MultiHeadLatentAttention` stores little per token, but every query still reads every earlier
latent: the work of a decoded token grows with the context. DeepSeek-V3.2 (DeepSeek-AI 2025) puts a
*lightning indexer* in front of it. The indexer has its own small query heads, read from the
latent attention's query bottleneck, and one key per token, shared by its heads; its score of key
``s`` for query ``t`` is

    I[t, s] = sum over index heads j of  w[t, j] * ReLU(q[t, j] . k[s] / sqrt(d)),

with ``w`` a weight per index head computed from the token itself. Each query keeps the ``topk``
visible keys of highest score (2048 in DeepSeek-V3.2), and the latent attention attends to those
alone: the other keys are masked, exactly as the future is. The indexer's numbers are rotated by
position (the first ``qk_rope_head_dim`` of them, half-split, where the latent attention's part
pairs neighbours) and its key is cached beside the latent and the rotated key.

The selection is not differentiable: no gradient reaches the indexer through the attention.
DeepSeek trains it by a loss of its own (its scores pulled towards the attention's weights), so
here, as in transformers, the indexer runs without gradients.

A ReLU gives exact zeros. With few index heads many keys tie at 0, and ``topk`` breaks such ties by
the order its kernel reads them, which need not be the same for a whole prompt and for one row
decoded alone: the selected keys, and so the outputs, can then differ. With more index heads ties
become rare (:func:`zero_ties`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import validate_input, validate_positive_int
from .heads import merge_heads, score_dtype, split_heads
from .kv_cache import cache_start
from .latent import MultiHeadLatentAttention, with_shared
from .masking import causal_mask, safe_softmax, with_padding
from .rotary import RotaryEmbedding


class LightningIndexer(nn.Module):
    """DeepSeek-V3.2's indexer: a cheap score of every visible key for every query, and its top-k.

    Args:
        d_in: width of each input token vector.
        q_lora_rank: width of the latent attention's query bottleneck, which the index queries read.
        num_heads: how many index heads (64 in DeepSeek-V3.2).
        head_dim: width of an index query and of the index key (128 in DeepSeek-V3.2).
        rope_head_dim: how many of those numbers turn by position (the first ones); even.
        topk: how many keys each query keeps.
        rope_theta: the base of the rotary frequencies.

    Attributes:
        W_query: ``nn.Linear(q_lora_rank, num_heads * head_dim)``, the index queries.
        W_key: ``nn.Linear(d_in, head_dim)`` and ``key_norm`` (``nn.LayerNorm``): one key per token.
        W_head_weights: ``nn.Linear(d_in, num_heads)``: how much each index head counts, per query.
        rotary: the :class:`~mha_course.attention.rotary.RotaryEmbedding` of the first ``rope_head_dim``.

    Example:
        >>> indexer = LightningIndexer(8, 6, num_heads=4, head_dim=4, rope_head_dim=2, topk=2)
        >>> x, q_low = torch.rand(1, 5, 8), torch.rand(1, 5, 6)
        >>> queries, keys = indexer(x, q_low, start=0)
        >>> tuple(queries.shape), tuple(keys.shape)  # (B, T, heads, d), (B, S, d)
        ((1, 5, 4, 4), (1, 5, 4))
        >>> hidden = indexer.select(indexer.scores(x, queries, keys), torch.ones(5, 5).triu(1).bool())
        >>> (~hidden).sum(-1).flatten().tolist()  # keys each query still sees: at most 2
        [1, 2, 2, 2, 2]
    """

    def __init__(self, d_in, q_lora_rank, num_heads, head_dim, rope_head_dim, topk, rope_theta=10000.0):
        super().__init__()
        self.num_heads = validate_positive_int("num_heads", num_heads)
        self.head_dim = validate_positive_int("head_dim", head_dim)
        self.rope_head_dim = validate_positive_int("rope_head_dim", rope_head_dim)
        self.topk = validate_positive_int("topk", topk, hint="It is how many keys each query keeps, e.g. 2048.")
        if self.rope_head_dim > self.head_dim:
            raise ValueError(f"rope_head_dim={rope_head_dim} must not exceed head_dim={head_dim}: the indexer turns "
                             f"the first rope_head_dim numbers of its heads. Choose rope_head_dim<={head_dim}.")
        self.W_query = nn.Linear(q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.W_key = nn.Linear(d_in, self.head_dim, bias=False)
        self.key_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.W_head_weights = nn.Linear(d_in, self.num_heads, bias=False)
        self.rotary = RotaryEmbedding(self.rope_head_dim, rope_theta)

    @torch.no_grad()
    def forward(self, x, q_low, start: int, position_ids=None):
        """The index queries ``(B, T, heads, d)`` and keys ``(B, T, d)``, their first numbers turned."""
        r = self.rope_head_dim
        queries = split_heads(self.W_query(q_low), self.num_heads)  # (B, H, T, d)
        keys = self.key_norm(self.W_key(x)).unsqueeze(1)  # (B, 1, T, d): one for all
        q_rot, k_rot = self.rotary(queries[..., :r], keys[..., :r], start, position_ids)
        queries = torch.cat([q_rot, queries[..., r:]], dim=-1)
        keys = torch.cat([k_rot, keys[..., r:]], dim=-1)
        return queries.transpose(1, 2), keys.squeeze(1)  # (B, T, H, d), (B, T, d)

    @torch.no_grad()
    def scores(self, x, queries, keys):
        """``I[b, t, s]``: the index heads' ReLU'd scores, weighted per query and summed; ``(B, T, S)``, float32."""
        dots = queries.float() @ keys.float().mT.unsqueeze(1)  # (B, T, H, S)
        relu = F.relu(dots * self.head_dim**-0.5)
        weights = self.W_head_weights(x).float() * self.num_heads**-0.5  # (B, T, H)
        return (weights.unsqueeze(-2) @ relu).squeeze(-2)  # (B, T, S)

    @torch.no_grad()
    def select(self, scores, hidden):
        """``hidden`` (``True``: a query may not look), plus each query's keys outside its top-k: ``(B, 1, T, S)``.

        Hidden keys score ``-inf`` first, so that the top-k are chosen among the visible keys only.
        """
        hidden = hidden if hidden.dim() == 2 else hidden.squeeze(1)  # (T, S) or (B, T, S)
        return keep_top_k(scores, hidden, self.topk).unsqueeze(1)  # (B, 1, T, S)


class SparseLatentAttention(MultiHeadLatentAttention):
    """:class:`MultiHeadLatentAttention` whose queries read only the keys a :class:`LightningIndexer` picks.

    The arguments of :class:`MultiHeadLatentAttention` (``q_lora_rank`` is required: the indexer
    reads the query bottleneck), plus ``index_heads``, ``index_head_dim`` and ``index_topk``, the
    indexer's. Attributes are the latent attention's and ``indexer``. ``forward(x, cache,
    attention_mask, position_ids)`` as :class:`MultiHeadLatentAttention`'s, ``absorb`` included; a
    :class:`KVCache` keeps ``latent``, ``rotated_key`` and the indexer's ``index_key`` ``(B, T,
    index_head_dim)``. A query with at most ``index_topk`` visible keys reads them all, so a short
    sequence gives what latent attention gives. Conversion: :func:`mha_course.from_deepseek_v32_attention`.

    Example:
        >>> dsa = SparseLatentAttention(16, 8, 0.0, num_heads=4, kv_lora_rank=6, qk_nope_head_dim=4,
        ...                             qk_rope_head_dim=2, v_head_dim=4, q_lora_rank=8, index_heads=2,
        ...                             index_head_dim=4, index_topk=3)
        >>> from mha_course import KVCache
        >>> cache = KVCache()
        >>> dsa(torch.rand(2, 8, 16), cache=cache).shape
        torch.Size([2, 8, 16])
        >>> sorted(cache.tensors), cache.nbytes == 2 * 8 * (6 + 2 + 4) * 4  # latent, rotated and index keys
        (['index_key', 'latent', 'rotated_key'], True)
    """

    def __init__(self, d_in, context_length, dropout, num_heads, kv_lora_rank, qk_nope_head_dim,
                 qk_rope_head_dim, v_head_dim, q_lora_rank, index_heads, index_head_dim, index_topk,
                 bias=False, rope_theta=10000.0, softmax_scale=None):
        if q_lora_rank is None:
            raise ValueError("q_lora_rank must be a positive integer, got None: the indexer reads the queries' "
                             "bottleneck. Pass the width of the bottleneck, e.g. q_lora_rank=1536 as DeepSeek-V3.2.")
        super().__init__(d_in, context_length, dropout, num_heads, kv_lora_rank, qk_nope_head_dim,
                         qk_rope_head_dim, v_head_dim, q_lora_rank, bias, rope_theta, softmax_scale)
        self.indexer = LightningIndexer(d_in, q_lora_rank, index_heads, index_head_dim,
                                        qk_rope_head_dim, index_topk, rope_theta)

    def forward(self, x, cache=None, attention_mask=None, position_ids=None):
        """DeepSeek's sparse attention: ``(B, T, d_in) -> (B, T, d_in)``."""
        validate_input(x, self.d_in, self.context_length,
                       like=self.out_proj.weight)
        start = cache_start(cache, self, x.shape[1], self.context_length)
        # True where a query may not look: a later key, or padding
        mask = with_padding(causal_mask(x.shape[1], x.device, start=start),
                            attention_mask, len(x))  # (T, S) or (B, 1, T, S)
        down, norm, up = self.W_query
        q_low = norm(down(x))  # (B, T, q_lora_rank): read by the indexer too
        queries = split_heads(up(q_low), self.num_heads)  # (B, h, T, d_qk)
        q_nope, q_rot = queries.split(
            [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        latent = self.kv_norm(self.W_latent(x))  # (B, T, r)
        k_rot = self.W_key_rot(x).unsqueeze(1)  # (B, 1, T, d_rope): all heads
        q_rot, k_rot = self.rotary(q_rot, k_rot, start, position_ids)
        # New: the indexer's queries and its one key per token, cached too
        index_q, index_k = self.indexer(x, q_low, start, position_ids)
        if cache is not None:  # the past, then x: S = start + T positions
            latent, k_rot, index_k = cache.extend(
                latent=latent, rotated_key=k_rot, index_key=index_k)
        # New: each query keeps its top-k visible keys, by the indexer's score
        scores = self.indexer.scores(x, index_q, index_k)  # (B, T, S)
        mask = self.indexer.select(scores, mask)  # (B, 1, T, S)
        return self.attend(q_nope, q_rot, latent, k_rot, mask)

    def attend(self, q_nope, q_rot, latent, k_rot, mask):
        """Latent attention's scores, softmax and values, for the visible keys of ``mask``: ``(B, T, d_in)``."""
        h, d_nope, d_v = self.num_heads, self.qk_nope_head_dim, self.v_head_dim
        scores = with_shared(q_rot, k_rot.squeeze(1).mT)  # (B, h, T, S)
        if self.absorb:  # W_UK folded into the queries: scored against latents
            w_uk = self.W_up_key.weight.view(h, d_nope, -1)  # (h, d_nope, r)
            scores += with_shared(q_nope @ w_uk, latent.mT)
        else:  # every head's keys expanded from the latent
            scores += q_nope @ split_heads(self.W_up_key(latent), h).mT
        scores = scores.to(score_dtype(scores.dtype)) * self.softmax_scale
        weights = safe_softmax(scores, mask)  # 0 in a row that sees no key
        weights = self.dropout(weights.to(latent.dtype))
        if self.absorb:  # weigh the latents, then W_UV: (B, h, T, d_v)
            w_uv = self.W_up_value.weight.view(h, d_v, -1)  # (h, d_v, r)
            context = with_shared(weights, latent) @ w_uv.mT
        else:  # weigh every head's values, expanded from the latent
            context = weights @ split_heads(self.W_up_value(latent), h)
        return self.out_proj(merge_heads(context))  # (B, T, d_in)


def keep_top_k(scores: torch.Tensor, hidden: torch.Tensor, k: int) -> torch.Tensor:
    """``hidden`` plus, for each query, every visible key outside its ``k`` highest ``scores``: ``(B, T, S)``.

    ``scores`` ``(B, T, S)``; ``hidden`` ``True`` where a query may not look, broadcastable to it.
    Hidden keys score ``-inf`` before the top-k are taken, so they never take one of the ``k``
    places; a query that sees fewer than ``k`` keys keeps them all, and the hidden stay hidden.

    Example:
        >>> scores = torch.tensor([[[5.0, 1.0, 3.0, 9.0]]])  # one query, four keys
        >>> keep_top_k(scores, torch.tensor([False, False, False, True]), k=2).int()  # key 3 is the future
        tensor([[[0, 1, 0, 1]]], dtype=torch.int32)
    """
    ranked = scores.masked_fill(hidden, float("-inf"))
    chosen = ranked.topk(min(k, scores.shape[-1]), dim=-1).indices  # (B, T, k)
    outside = torch.ones_like(ranked, dtype=torch.bool).scatter(-1, chosen, False)
    return hidden | outside


def zero_ties(scores: torch.Tensor, hidden: torch.Tensor, topk: int) -> torch.Tensor:
    """For each query row, whether its top-k boundary falls among keys that score exactly 0 (a tie).

    ``scores`` ``(B, T, S)`` from :meth:`LightningIndexer.scores`, ``hidden`` the mask of keys a query
    may not look at. A row ties when it sees more than ``topk`` keys and its ``topk``-th highest score
    is 0 with another visible key at 0 left out: which of those ``topk`` keeps is then up to the kernel.

    Example:
        >>> scores = torch.tensor([[[3.0, 0.0, 0.0, 1.0]]])
        >>> zero_ties(scores, torch.zeros(1, 4, dtype=torch.bool), topk=3).tolist()  # two zeros, one place
        [[True]]
        >>> zero_ties(scores, torch.zeros(1, 4, dtype=torch.bool), topk=2).tolist()
        [[False]]
    """
    hidden = hidden if hidden.dim() == 2 else hidden.squeeze(1)
    visible = (~hidden).expand_as(scores)
    zeros = ((scores == 0) & visible).sum(-1)  # (B, T): visible keys at exactly 0
    above = ((scores > 0) & visible).sum(-1)  # (B, T): visible keys above them
    return (above < topk) & (above + zeros > topk)
