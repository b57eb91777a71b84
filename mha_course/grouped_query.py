"""Sharing keys and values: grouped-query attention, with multi-head and multi-query at its ends.

In :class:`MultiHeadAttention` every query head has a key head and a value head of its own. In
``GroupedQueryAttention`` the ``num_heads`` query heads are split into ``num_kv_groups`` groups of
consecutive heads, and the heads of a group share one key head and one value head (Ainslie et al.
2023). The key and value projections shrink from ``d_in -> d_out`` to
``d_in -> num_kv_groups * head_dim``, and so does everything a :class:`KVCache` stores:

* ``num_kv_groups == num_heads``: one key/value head per query head, multi-head attention;
* ``num_kv_groups == 1``: one key/value head for all, multi-query attention (Shazeer 2019);
* in between: grouped-query attention.

Before the scores, each key/value head is repeated for the query heads of its group
(``repeat_interleave`` along the head axis: group ``g`` serves query heads ``g*r`` to
``g*r + r - 1``, with ``r = num_heads // num_kv_groups``); from there on the computation is
multi-head attention's.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validation import (validate_bool, validate_divisible, validate_dropout, validate_input, validate_kv_groups,
                          validate_positive_int)
from .heads import merge_heads, split_heads
from .kv_cache import KVCache
from .masking import causal_mask, validate_loaded_mask
from .multihead import MultiHeadAttention


def _mean_per_group(
    t: torch.Tensor, num_kv_groups: int, head_dim: int
) -> torch.Tensor:
    """Average the heads of each group: ``(h * d_h, ...) -> (g * d_h, ...)``.

    ``t`` is a key or value projection's weight ``(h * d_h, d_in)`` or bias
    ``(h * d_h,)``; group ``g`` is made of the consecutive heads ``g*r`` to
    ``g*r + r - 1``.
    """
    rest = t.shape[1:]  # (d_in,) for a weight, () for a bias
    grouped = t.reshape(num_kv_groups, -1, head_dim, *rest)  # (g, r, d_h, ...)
    pooled = grouped.mean(dim=1)  # (g, d_h, ...): each group's mean head
    return pooled.reshape(num_kv_groups * head_dim, *rest)  # (g * d_h, ...)


class GroupedQueryAttention(nn.Module):
    """Causal attention whose query heads share key/value heads in groups; with an optional KV cache.

    Args:
        d_in: width of each input token vector.
        d_out: total width of the output, split across the query heads
            (``head_dim = d_out // num_heads``), as in :class:`MultiHeadAttention`.
        context_length: the longest sequence the module accepts, cached positions included.
        dropout: probability of zeroing an attention weight while training.
        num_heads: how many query heads; must divide ``d_out``.
        num_kv_groups: how many key/value heads; must divide ``num_heads``. ``num_heads`` gives
            multi-head attention, ``1`` multi-query attention.
        qkv_bias: whether the query, key and value projections have a bias.

    Shapes:
        input ``(batch, num_tokens, d_in)`` -> output ``(batch, num_tokens, d_out)``; inside,
        queries are ``(batch, num_heads, num_tokens, head_dim)`` and keys and values
        ``(batch, num_kv_groups, num_tokens, head_dim)`` until they are repeated for the groups.

    Attributes:
        head_dim: ``d_out // num_heads``, the width of one head (query, key or value).
        group_size: ``num_heads // num_kv_groups``, the query heads that share one key/value head.
        W_query: ``nn.Linear(d_in, d_out)``, the query projection of all heads.
        W_key: ``nn.Linear(d_in, num_kv_groups * head_dim)``, one key head per group;
            ``W_value`` is its twin for values.
        out_proj: ``nn.Linear(d_out, d_out)`` that mixes the merged heads.
        mask: boolean buffer ``(context_length, context_length)``, ``True`` where attention is
            forbidden.

    Example:
        >>> gqa = GroupedQueryAttention(8, 8, context_length=6, dropout=0.0, num_heads=4, num_kv_groups=2)
        >>> gqa(torch.rand(1, 6, 8)).shape
        torch.Size([1, 6, 8])
        >>> gqa.W_query.weight.shape, gqa.W_key.weight.shape  # 4 query heads, 2 key heads, of width 2
        (torch.Size([8, 8]), torch.Size([4, 8]))
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, num_kv_groups, qkv_bias=False):
        super().__init__()
        self.d_in = validate_positive_int("d_in", d_in)
        self.d_out = validate_positive_int(
            "d_out", d_out, hint="As in MultiHeadAttention, d_out is the total width of all heads."
        )
        self.num_heads = validate_positive_int("num_heads", num_heads)
        self.context_length = validate_positive_int("context_length", context_length)
        self.head_dim = validate_divisible(self.d_out, self.num_heads)
        self.num_kv_groups = validate_kv_groups(num_kv_groups, self.num_heads)
        self.group_size = self.num_heads // self.num_kv_groups
        qkv_bias = validate_bool("qkv_bias", qkv_bias)
        self.W_query = nn.Linear(self.d_in, self.d_out, bias=qkv_bias)
        # New in this class: one key head and one value head per group, not per
        # query head, so the key and value projections are narrower than d_out.
        kv_width = self.num_kv_groups * self.head_dim
        self.W_key = nn.Linear(self.d_in, kv_width, bias=qkv_bias)
        self.W_value = nn.Linear(self.d_in, kv_width, bias=qkv_bias)
        self.out_proj = nn.Linear(self.d_out, self.d_out)
        self.dropout = nn.Dropout(validate_dropout(dropout))
        self.register_buffer("mask", causal_mask(self.context_length))
        self.register_load_state_dict_pre_hook(validate_loaded_mask)  # a loaded mask must be causal

    def _weights_and_values(
        self, x: torch.Tensor, cache: KVCache | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        validate_input(x, self.d_in, self.context_length, like=self.W_query.weight)
        start = self._cached_length(cache, x.shape[1])  # x's first position
        end = start + x.shape[1]
        queries = split_heads(self.W_query(x), self.num_heads)  # (B, h, T, d_h)
        keys = split_heads(self.W_key(x), self.num_kv_groups)  # (B, g, T, d_h)
        values = split_heads(self.W_value(x), self.num_kv_groups)  # (B, g, T, d_h)
        if cache is not None:
            # The past, then x: (B, g, start + T, d_h) each.
            keys, values = cache.append(keys, values)
        # Each key/value head serves the group_size query heads of its group,
        # g0 g0 g1 g1 ... (repeat_interleave; repeat would give g0 g1 g0 g1 ...).
        r = self.group_size
        keys = keys.repeat_interleave(r, dim=1)  # (B, h, start + T, d_h)
        values = values.repeat_interleave(r, dim=1)  # (B, h, start + T, d_h)
        queries = queries * self.head_dim**-0.5
        scores = queries @ keys.transpose(2, 3)  # (B, h, T, start + T)
        # Rows are x's positions start .. end-1, columns every position up to
        # end-1: the cached past is visible to all of them, and within x the
        # usual causal triangle applies.
        scores.masked_fill_(self.mask[start:end, :end], float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, h, T, start + T)
        return weights, values

    def _cached_length(self, cache: KVCache | None, num_new: int) -> int:
        if cache is None:
            return 0
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}. Make one with KVCache().")
        if len(cache) + num_new > self.context_length:
            raise ValueError(
                f"the cache holds {len(cache)} positions and x adds {num_new} more, {len(cache) + num_new} "
                f"in all, but the module was built with context_length={self.context_length}, so its "
                f"causal mask covers only {self.context_length} positions. Start a new sequence with "
                f"cache.reset(), or build the module with context_length>={len(cache) + num_new}."
            )
        return len(cache)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Grouped-query attention over ``x``: ``(B, T, d_in) -> (B, T, d_out)``.

        With a ``cache``, ``x`` holds the tokens that follow the cached ones: their keys and values
        are appended to the cache, and each of them attends to every cached position and to the
        tokens of ``x`` up to itself. The cache and ``x`` together must fit in
        ``context_length``, and ``x`` must come in the batch size, dtype and device the cache was
        filled with.
        """
        weights, values = self._weights_and_values(x, cache)  # validates x and the cache
        context = self.dropout(weights) @ values  # (B, h, T, d_h)
        return self.out_proj(merge_heads(context))  # (B, T, d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every query head's attention weights, shape ``(batch, num_heads, num_tokens, num_tokens)``.

        Heads of one group score the same keys, with queries of their own, so their weights differ.

        Example:
            >>> gqa = GroupedQueryAttention(3, 4, 6, dropout=0.0, num_heads=2, num_kv_groups=1)
            >>> gqa.attention_weights(torch.rand(1, 5, 3)).shape
            torch.Size([1, 2, 5, 5])
        """
        return self._weights_and_values(x, None)[0]

    @classmethod
    @torch.no_grad()
    def from_multihead(cls, mha: MultiHeadAttention, num_kv_groups: int) -> "GroupedQueryAttention":
        """A ``GroupedQueryAttention`` made from a trained ``MultiHeadAttention`` by mean-pooling.

        The uptraining recipe of Ainslie et al. (2023): the query and output projections are copied;
        the key (and value) head of each group is the mean of the key (and value) heads of the
        query heads in that group. With ``num_kv_groups == mha.num_heads`` nothing is pooled and the
        result computes exactly what ``mha`` computes; with fewer groups it approximates it, and a
        short further training recovers most of the difference. Dropout, bias setting, device,
        dtype and training mode follow ``mha``.

        Example:
            >>> mha = MultiHeadAttention(8, 8, context_length=6, dropout=0.0, num_heads=4)
            >>> x = torch.rand(2, 6, 8)
            >>> same = GroupedQueryAttention.from_multihead(mha, num_kv_groups=4)
            >>> torch.allclose(same(x), mha(x), atol=1e-6)
            True
            >>> pooled = GroupedQueryAttention.from_multihead(mha, num_kv_groups=2)
            >>> pooled.W_key.weight.shape  # 2 key heads of width 2, each the mean of two
            torch.Size([4, 8])
        """
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(
                f"mha must be a MultiHeadAttention, got {type(mha).__name__}. Convert it first, with "
                "MultiHeadAttention.from_wrapper(wrapper) or MultiHeadAttention.from_fast(fast)."
            )
        weight = mha.W_query.weight
        gqa = cls(
            mha.d_in, mha.d_out, mha.context_length, mha.dropout.p, mha.num_heads, num_kv_groups,
            qkv_bias=mha.W_query.bias is not None,
        ).to(device=weight.device, dtype=weight.dtype)
        gqa.W_query.load_state_dict(mha.W_query.state_dict())
        gqa.out_proj.load_state_dict(mha.out_proj.state_dict())
        for role in ("W_key", "W_value"):
            source, target = getattr(mha, role), getattr(gqa, role)
            target.weight.copy_(_mean_per_group(source.weight, gqa.num_kv_groups, gqa.head_dim))
            if target.bias is not None:
                target.bias.copy_(_mean_per_group(source.bias, gqa.num_kv_groups, gqa.head_dim))
        return gqa.train(mha.training)
