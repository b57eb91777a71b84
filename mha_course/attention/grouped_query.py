"""Sharing keys and values: grouped-query attention, with multi-head and multi-query at its ends.

In :class:`MultiHeadAttention` every query head has a key head and a value head of its own. In
``GroupedQueryAttention`` the ``num_heads`` query heads are split into ``num_kv_groups`` groups of
consecutive heads, and the heads of a group share one key head and one value head (Ainslie et al.
2023). The key and value projections shrink from ``d_in -> d_out`` to
``d_in -> num_kv_groups * head_dim``, and so does everything a :class:`KVCache` stores:

* ``num_kv_groups == num_heads``: one key/value head per query head, multi-head attention;
* ``num_kv_groups == 1``: one key/value head for all, multi-query attention (Shazeer 2019);
* in between: grouped-query attention.

Query head ``i`` reads key/value head ``i // r``, with ``r = num_heads // num_kv_groups``: group
``g`` serves query heads ``g*r`` to ``g*r + r - 1``. PyTorch's fused kernel,
``scaled_dot_product_attention(..., enable_gqa=True)``, reads the shared heads where they are; the
explicit path (``use_sdpa = False``, as in :class:`FastMultiHeadAttention`) repeats each key/value
head for the query heads of its group (``repeat_interleave`` along the head axis) and from there on
computes multi-head attention's scores, mask and softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import (validate_attention_args, validate_bool, validate_input, validate_positive_int,
                          validate_window)
from .heads import captured_attention_weights, merge_heads, score_dtype, split_heads
from .kv_cache import cache_start
from .masking import call_mask, causal_mask, drop_loaded_mask, safe_softmax
from .multihead import MultiHeadAttention, not_a_multihead
from .rotary import RotaryEmbedding
from .sinks import softmax_with_sinks


class GroupedQueryAttention(nn.Module):
    """Causal attention whose query heads share key/value heads in groups; with an optional KV cache.

    Args:
        d_in: width of each input token vector.
        d_out: total width of the query heads (``head_dim = d_out // num_heads``), and of the
            output unless ``out_width`` says otherwise, as in :class:`MultiHeadAttention`.
        context_length: the longest sequence the module accepts, cached positions included.
        dropout: probability of zeroing an attention weight while training.
        num_heads: how many query heads; must divide ``d_out``.
        num_kv_groups: how many key/value heads; must divide ``num_heads``. ``num_heads`` gives
            multi-head attention, ``1`` multi-query attention.
        qkv_bias: whether the query, key and value projections have a bias.
        rope_theta: ``None`` (no positions, the default), or the base of rotary position
            embeddings (e.g. ``10000.0``): queries and keys are then rotated by their positions
            with Llama's half-split convention (:class:`mha_course.attention.rotary.RotaryEmbedding`),
            keys before they enter the cache.
        window: ``None`` (the default: every earlier position is visible), or a sliding window
            (chapter 11): a query sees itself and the ``window - 1`` positions before it (key ``j``
            is visible from query ``i`` when ``0 <= i - j < window``, Mistral's and transformers'
            convention), and a :class:`KVCache` keeps only the last ``window - 1`` positions.
        sinks: ``False`` (the default), or ``True`` for gpt-oss's attention sinks (chapter 11):
            one learned logit per head, ``self.sinks``, a column of the softmax that takes
            probability and gives no value (:func:`~mha_course.softmax_with_sinks`).
        out_width: the width the output projection maps the merged heads to, ``d_out`` by default.
            Production models whose heads together are wider or narrower than the model (gpt-oss:
            64 heads of 64 in a width of 2880) pass their width here.

    Shapes:
        input ``(batch, num_tokens, d_in)`` -> output ``(batch, num_tokens, out_width)``; inside,
        queries are ``(batch, num_heads, num_tokens, head_dim)`` and keys and values
        ``(batch, num_kv_groups, num_tokens, head_dim)`` until they are repeated for the groups.

    Attributes:
        head_dim: ``d_out // num_heads``, the width of one head (query, key or value).
        group_size: ``num_heads // num_kv_groups``, the query heads that share one key/value head.
        W_query: ``nn.Linear(d_in, d_out)``, the query projection of all heads.
        W_key: ``nn.Linear(d_in, num_kv_groups * head_dim)``, one key head per group;
            ``W_value`` is its twin for values.
        out_proj: ``nn.Linear(d_out, out_width)`` that mixes the merged heads.
        rotary: the :class:`~mha_course.attention.rotary.RotaryEmbedding`, or ``None`` without ``rope_theta``.
        window: the sliding window, or ``None``.
        sinks: ``nn.Parameter`` of shape ``(num_heads,)``, the sink logits (zeros when made), or ``None``.
        use_sdpa: ``True`` (default) runs ``scaled_dot_product_attention`` with ``enable_gqa``;
            ``False`` runs the explicit computation, for comparison. ``attention_weights`` always
            uses the explicit one, and so does a module with sinks: the kernel has no sink column.

    No mask buffer: each call builds the causal mask of its own rows, ``(num_tokens, cached +
    num_tokens)``, and only where the fused kernel needs one (a prompt has ``is_causal``, one new
    token sees every position), so the module holds nothing that grows with ``context_length``. A
    state dict that holds a causal ``mask`` (``MultiHeadAttention``'s) loads all the same: the
    mask is checked and dropped.

    Padding: ``forward(x, cache, attention_mask, position_ids)``. ``attention_mask``
    ``(batch, cached + new positions)`` is 1 (or ``True``) for a real token and 0 for padding, as
    transformers' ``generate`` passes it; a padded key is hidden from every query. ``position_ids``
    ``(batch, num_tokens)`` are the positions the rotation uses, by default the cache's length plus
    ``0, 1, ...``; for a left-padded batch pass ``attention_mask.cumsum(-1) - 1`` (clamped at 0)
    so that each sequence counts from its first real token. Without rotation they change nothing.
    ``position_embeddings``, the ``(cos, sin)`` of ``RotaryEmbedding.cos_sin`` for those positions, replaces them: a model
    computes it once per call and hands it to every layer. A query that sees no key (a padded one,
    at the start of a left-padded sequence) gets a context vector of 0, on both paths.

    Conversion: :meth:`from_multihead` pools a trained ``MultiHeadAttention``'s key and value heads.

    Example:
        >>> gqa = GroupedQueryAttention(8, 8, context_length=6, dropout=0.0, num_heads=4, num_kv_groups=2)
        >>> gqa(torch.rand(1, 6, 8)).shape
        torch.Size([1, 6, 8])
        >>> gqa.W_query.weight.shape, gqa.W_key.weight.shape  # 4 query heads, 2 key heads, of width 2
        (torch.Size([8, 8]), torch.Size([4, 8]))
        >>> from mha_course import KVCache
        >>> windowed = GroupedQueryAttention(8, 8, 64, 0.0, 4, 2, window=4)  # a token sees 4 positions
        >>> cache = KVCache()
        >>> _ = windowed(torch.rand(1, 10, 8), cache=cache)
        >>> len(cache), cache.held  # 10 positions seen, the last 3 kept: all the next token can see
        (10, 3)
    """

    #: Run the fused kernel (True) or the explicit computation (False).
    use_sdpa: bool = True

    def __init__(self, d_in, d_out, context_length, dropout, num_heads,
                 num_kv_groups, qkv_bias=False, rope_theta=None, window=None,
                 sinks=False, out_width=None):
        super().__init__()
        args = validate_attention_args(
            d_in, d_out, context_length, dropout, qkv_bias, num_heads,
            num_kv_groups, d_out_hint="As in MultiHeadAttention, d_out is the "
            "total width of all heads.",
        )
        self.d_in, self.d_out = args.d_in, args.d_out
        self.num_heads, self.head_dim = args.num_heads, args.head_dim
        self.context_length = args.context_length
        self.num_kv_groups = args.num_kv_groups
        self.group_size = self.num_heads // self.num_kv_groups
        self.out_width = self.d_out if out_width is None else validate_positive_int(
            "out_width", out_width, hint="It is the width of the output, d_out by default.")
        self.W_query = nn.Linear(self.d_in, self.d_out, bias=args.qkv_bias)
        # New in this class: one key head and one value head per group, not
        # per query head, so the key and value projections are narrower.
        kv_width = self.num_kv_groups * self.head_dim
        self.W_key = nn.Linear(self.d_in, kv_width, bias=args.qkv_bias)
        self.W_value = nn.Linear(self.d_in, kv_width, bias=args.qkv_bias)
        self.out_proj = nn.Linear(self.d_out, self.out_width)
        self.dropout = nn.Dropout(args.dropout)
        self.rotary = (None if rope_theta is None  # Llama's rotary positions
                       else RotaryEmbedding(self.head_dim, rope_theta))
        # Chapter 11: a sliding window, and gpt-oss's sink logit per head.
        self.window = validate_window(window)
        self.sinks = (nn.Parameter(torch.zeros(self.num_heads))
                      if validate_bool("sinks", sinks) else None)
        # No mask buffer; a state dict with a causal mask (MultiHeadAttention's) loads all the same.
        self.register_load_state_dict_pre_hook(drop_loaded_mask)

    def forward(self, x, cache=None, attention_mask=None, position_ids=None,
                position_embeddings=None):
        """Grouped-query attention: ``(B, T, d_in) -> (B, T, out_width)``.

        With a ``cache``, ``x`` holds the tokens that follow the cached ones:
        their keys and values are appended to it, and each of them attends
        to every cached position and to the tokens of ``x`` up to itself
        (with a ``window``, to those of the last ``window`` positions).
        ``attention_mask`` ``(B, cached + T)``: 1 for a real token, 0 for
        padding; ``position_ids`` ``(B, T)`` or ``position_embeddings``
        (``(cos, sin)``, made once for all layers): the rotation's positions.
        """
        validate_input(x, self.d_in, self.context_length,
                       like=self.W_query.weight)
        # x's first position: 0, or how many positions the cache holds
        start = cache_start(cache, self, x.shape[1], self.context_length)
        h, g = self.num_heads, self.num_kv_groups
        queries = split_heads(self.W_query(x), h)  # (B, h, T, d_h)
        keys = split_heads(self.W_key(x), g)  # (B, g, T, d_h)
        values = split_heads(self.W_value(x), g)  # (B, g, T, d_h)
        if self.rotary is not None:  # turned by position, keys before caching
            queries, keys = self.rotary(queries, keys, start, position_ids,
                                        position_embeddings)
        if cache is not None:  # the past held, then x: (B, g, S, d_h) each
            keys, values = cache.append(keys, values, window=self.window)
        # True where a query may not look: (T, S), or (B, 1, T, S) with
        # padding. None where the kernel needs none: a prompt is_causal, and
        # one new token sees every key held.
        mask = call_mask(x, start, self.window, attention_mask)
        if self.use_sdpa and self.sinks is None:  # groups read their KV heads
            p = self.dropout.p if self.training else 0.0
            context = F.scaled_dot_product_attention(  # its mask: True = see
                queries, keys, values, dropout_p=p, enable_gqa=g < h,
                is_causal=mask is None and not start,
                attn_mask=None if mask is None else ~mask)  # (B, h, T, d_h)
        else:  # step by step: each key/value head repeated for its group,
            # KV1 KV1 KV2 KV2 ... (repeat_interleave; repeat: KV1 KV2 KV1 KV2)
            r = self.group_size
            keys = keys.repeat_interleave(r, dim=1)  # (B, h, S, d_h)
            values = values.repeat_interleave(r, dim=1)  # (B, h, S, d_h)
            dtype = score_dtype(queries.dtype)  # float32 for half-precision inputs
            queries = queries.to(dtype) * self.head_dim**-0.5
            scores = queries @ keys.to(dtype).transpose(2, 3)  # (B, h, T, S)
            if mask is None:
                mask = causal_mask(x.shape[1], x.device, start=start)
            if self.sinks is None:
                weights = safe_softmax(scores, mask)  # 0 where no key is seen
            else:  # one more column per head, a logit that has no value
                weights = softmax_with_sinks(scores, self.sinks, mask)
            context = self.dropout(weights.to(values.dtype)) @ values
        return self.out_proj(merge_heads(context))  # (B, T, out_width)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every query head's attention weights, shape ``(batch, num_heads, num_tokens, num_tokens)``.

        Heads of one group score the same keys, with queries of their own, so their weights differ.

        Example:
            >>> gqa = GroupedQueryAttention(3, 4, 6, dropout=0.0, num_heads=2, num_kv_groups=1)
            >>> gqa.attention_weights(torch.rand(1, 5, 3)).shape
            torch.Size([1, 2, 5, 5])
        """
        use_sdpa, self.use_sdpa = self.use_sdpa, False  # the kernel keeps no weights
        try:
            return captured_attention_weights(self, x)
        finally:
            self.use_sdpa = use_sdpa

    @classmethod
    @torch.no_grad()
    def from_multihead(cls, mha: MultiHeadAttention, num_kv_groups: int) -> GroupedQueryAttention:
        """A ``GroupedQueryAttention`` made from a trained ``MultiHeadAttention`` by mean-pooling.

        The uptraining recipe of Ainslie et al. (2023): the query and output projections are copied;
        the key (and value) head of each group is the mean of the key (and value) heads of the query
        heads in that group. With ``num_kv_groups == mha.num_heads`` nothing is pooled and the result
        computes exactly what ``mha`` computes; with fewer groups it approximates it, and a short
        further training recovers most of the difference. Dropout, bias setting, device, dtype and
        training mode follow ``mha``.

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
        error = not_a_multihead(mha, "GroupedQueryAttention.from_multihead", ", num_kv_groups")
        if error:
            raise error
        weight = mha.W_query.weight
        gqa = cls(mha.d_in, mha.d_out, mha.context_length, mha.dropout.p, mha.num_heads, num_kv_groups,
                  qkv_bias=mha.W_query.bias is not None).to(device=weight.device, dtype=weight.dtype)
        gqa.W_query.load_state_dict(mha.W_query.state_dict())
        gqa.out_proj.load_state_dict(mha.out_proj.state_dict())
        for role in ("W_key", "W_value"):
            source, target = getattr(mha, role), getattr(gqa, role)
            target.weight.copy_(mean_per_group(source.weight, gqa.num_kv_groups, gqa.head_dim))
            if target.bias is not None:
                target.bias.copy_(mean_per_group(source.bias, gqa.num_kv_groups, gqa.head_dim))
        return gqa.train(mha.training)


def mean_per_group(t: torch.Tensor, num_kv_groups: int,
                   head_dim: int) -> torch.Tensor:
    """Average the heads of each group: ``(h * d_h, ...) -> (g * d_h, ...)``.

    ``t`` is a key or value projection's weight ``(h * d_h, d_in)`` or
    bias ``(h * d_h,)``; group ``g`` is made of the consecutive heads
    ``g*r`` to ``g*r + r - 1``.

    Example:
        >>> mean_per_group(torch.tensor([1.0, 3.0, 5.0, 7.0]), 1, head_dim=2)
        tensor([3., 5.])
    """
    rest = t.shape[1:]  # (d_in,) for a weight, () for a bias
    grouped = t.reshape(num_kv_groups, -1, head_dim, *rest)  # (g, r, d_h, ...)
    pooled = grouped.mean(dim=1)  # (g, d_h, ...): each group's mean head
    return pooled.reshape(num_kv_groups * head_dim, *rest)  # (g * d_h, ...)
