"""Stage 3 of the course: all heads in one module, computed at once.

``MultiHeadAttention`` does the work of :class:`MultiHeadAttentionWrapper` with one query, one key
and one value projection of width ``d_out``. Their outputs are viewed as ``num_heads`` slices of
``head_dim = d_out // num_heads`` columns, so a single batched matrix product serves every head.
An output projection then mixes the merged heads.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validation import validate_attention_args, validate_input
from .heads import captured_attention_weights, merge_heads, score_dtype, split_heads
from .masking import register_causal_mask, with_padding
from .wrapper import MultiHeadAttentionWrapper


class MultiHeadAttention(nn.Module):
    """Causal multi-head attention with the heads batched into one tensor.

    Args:
        d_in: width of each input token vector.
        d_out: **total** width of the output, split across heads (new in this class:
            ``head_dim = d_out // num_heads``; in :class:`MultiHeadAttentionWrapper` ``d_out`` is
            the width of one head).
        context_length: the longest sequence the module accepts.
        dropout: probability of zeroing an attention weight while training.
        num_heads: how many heads; must divide ``d_out``.
        qkv_bias: whether the query, key and value projections have a bias.

    Shapes:
        input ``(batch, num_tokens, d_in)`` -> output ``(batch, num_tokens, d_out)``; inside
        ``forward``, queries, keys and values are ``(batch, num_heads, num_tokens, head_dim)``
        (see :func:`split_heads`). ``forward(x, attention_mask)`` takes an optional padding mask
        ``(batch, num_tokens)``, 1 (or ``True``) for real tokens and 0 for padding: padded keys are
        hidden from every query (:func:`with_padding`).

    Attributes:
        head_dim: ``d_out // num_heads``, the width of one head.
        W_query: ``nn.Linear(d_in, d_out)``, the query projection of all heads at once (output
            columns ``h * head_dim`` to ``(h + 1) * head_dim`` belong to head ``h``); ``W_key``
            and ``W_value`` are its twins for keys and values.
        out_proj: ``nn.Linear(d_out, d_out)`` that mixes the concatenated heads.
        mask: boolean buffer ``(context_length, context_length)``, ``True`` where attention is
            forbidden, shared by every head.

    Conversions: ``MultiHeadAttention.from_wrapper(wrapper)`` and ``MultiHeadAttention.from_fast(fast)``
    build one that computes what the other module does (they live with every other conversion in
    ``mha_course.interop``).

    Example:
        >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
        >>> mha(torch.rand(1, 6, 3)).shape
        torch.Size([1, 6, 4])
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads,
                 qkv_bias=False):
        super().__init__()
        args = validate_attention_args(
            d_in, d_out, context_length, dropout, qkv_bias, num_heads,
            d_out_hint="In MultiHeadAttention d_out is the width of all heads.",
        )
        self.d_in, self.d_out = args.d_in, args.d_out
        self.num_heads, self.head_dim = args.num_heads, args.head_dim
        self.context_length = args.context_length
        # One projection per role for all heads: output columns
        # [h*head_dim, (h+1)*head_dim) belong to head h.
        self.W_query = nn.Linear(self.d_in, self.d_out, bias=args.qkv_bias)
        self.W_key = nn.Linear(self.d_in, self.d_out, bias=args.qkv_bias)
        self.W_value = nn.Linear(self.d_in, self.d_out, bias=args.qkv_bias)
        # New in this class: a learned linear map that mixes the heads.
        self.out_proj = nn.Linear(self.d_out, self.d_out)
        self.dropout = nn.Dropout(args.dropout)
        register_causal_mask(self, self.context_length)  # self.mask

    def forward(self, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(B, T, d_in) -> (B, T, d_out): all heads, merged and projected."""
        validate_input(x, self.d_in, self.context_length,
                       like=self.W_query.weight)
        num_tokens = x.shape[1]
        h = self.num_heads
        queries = split_heads(self.W_query(x), h)  # (B, h, T, d_h)
        keys = split_heads(self.W_key(x), h)  # (B, h, T, d_h)
        values = split_heads(self.W_value(x), h)  # (B, h, T, d_h)
        dtype = score_dtype(queries.dtype)  # float32 for float16 inputs
        # Scale the queries (B*T*d_out numbers), not the scores (B*h*T*T):
        # softmax(q k^T / sqrt(d_h)) is the same, and the queries are fewer.
        queries = queries.to(dtype) * self.head_dim**-0.5
        # (B, h, T, T): one score matrix per head
        scores = queries @ keys.to(dtype).transpose(2, 3)
        # One mask for every head and every sequence, by broadcasting; filled
        # in place, since the fresh score tensor is not needed unmasked.
        mask = self.mask[:num_tokens, :num_tokens]  # (T, T)
        mask = with_padding(mask, attention_mask, len(x))  # (B, 1, T, T)
        scores.masked_fill_(mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(values.dtype)
        context = self.dropout(weights) @ values  # (B, h, T, d_h)
        # The heads side by side, as the wrapper's torch.cat puts them:
        context = merge_heads(context)  # (B, T, d_out)
        return self.out_proj(context)  # (B, T, d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, shape (B, h, T, T).

        Example:
            >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
            >>> mha.attention_weights(torch.rand(1, 5, 3)).shape
            torch.Size([1, 2, 5, 5])
        """
        return captured_attention_weights(self, x)


@torch.no_grad()
def transfer_weights(wrapper: MultiHeadAttentionWrapper, mha: MultiHeadAttention) -> MultiHeadAttention:
    """Copy a wrapper's per-head weights into ``mha`` so that both compute the same function.

    Head ``h``'s query, key and value weights become rows ``h*head_dim`` to ``(h+1)*head_dim`` of
    ``mha``'s projections (the slice that :func:`split_heads` assigns to head ``h``), and the output
    projection becomes the identity, because the wrapper merges by concatenation alone.

    Args:
        wrapper: the stacked heads to copy from.
        mha: the batched module to copy into; it needs the wrapper's ``d_in``, ``num_heads``
            and ``qkv_bias``, and ``head_dim`` equal to the wrapper's ``d_out``, so
            ``mha.d_out == wrapper.num_heads * wrapper.d_out``.

    Returns:
        ``mha``, changed in place (no gradients are recorded).

    Raises:
        TypeError: if the arguments are not a wrapper and a ``MultiHeadAttention``.
        ValueError: if their sizes or bias settings differ; the message gives the constructor
            call that fits.

    Example:
        >>> wrapper = MultiHeadAttentionWrapper(3, 2, 6, dropout=0.0, num_heads=2)
        >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
        >>> mha = transfer_weights(wrapper, mha)
        >>> x = torch.rand(1, 6, 3)
        >>> torch.allclose(mha(x), wrapper(x), atol=1e-6)
        True
    """
    if not isinstance(wrapper, MultiHeadAttentionWrapper):
        raise TypeError(f"wrapper must be a MultiHeadAttentionWrapper, got {type(wrapper).__name__}.")
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"mha must be a MultiHeadAttention, got {type(mha).__name__}.")
    expected = {
        "d_in": wrapper.d_in,
        "num_heads": wrapper.num_heads,
        "head_dim": wrapper.d_out,
    }
    for name, want in expected.items():
        got = getattr(mha, name)
        if got != want:
            raise ValueError(
                f"mha.{name} is {got} but the wrapper needs {want}: build the target as "
                f"MultiHeadAttention(d_in={wrapper.d_in}, d_out={wrapper.num_heads * wrapper.d_out}, "
                f"..., num_heads={wrapper.num_heads}), since the wrapper's d_out is per head."
            )
    wrapper_bias = wrapper.heads[0].W_query.bias is not None
    if wrapper_bias != (mha.W_query.bias is not None):
        raise ValueError(
            f"qkv_bias differs: the wrapper has qkv_bias={wrapper_bias} but mha has "
            f"qkv_bias={not wrapper_bias}. Build both with the same qkv_bias."
        )
    for role in ("W_query", "W_key", "W_value"):
        target = getattr(mha, role)
        target.weight.copy_(torch.cat([getattr(head, role).weight for head in wrapper.heads], dim=0))
        if target.bias is not None:
            target.bias.copy_(torch.cat([getattr(head, role).bias for head in wrapper.heads], dim=0))
    mha.out_proj.weight.copy_(torch.eye(mha.d_out, dtype=mha.out_proj.weight.dtype))
    mha.out_proj.bias.zero_()
    return mha
