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
from .heads import captured_attention_weights, unstack_qkv
from .masking import padded_softmax, register_causal_mask
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
        (the split of :func:`split_heads`, written out in ``forward``). ``forward(x,
        attention_mask)`` takes an optional padding mask ``(batch, num_tokens)``, 1 (or ``True``)
        for real tokens and 0 for padding: padded keys are hidden from every query, and a query
        left with no key to see (a padded one, at the start of a left-padded sequence) gets
        attention weights of 0 and a context vector of 0, as ``scaled_dot_product_attention``
        gives it, so its output is ``out_proj``'s bias.

    Attributes:
        head_dim: ``d_out // num_heads``, the width of one head.
        W_query: ``nn.Linear(d_in, d_out)``, the query projection of all heads at once (head
            ``m``, counted from 1, owns output columns ``(m - 1) * head_dim`` to
            ``m * head_dim - 1``); ``W_key`` and ``W_value`` are its twins for keys and values.
        out_proj: ``nn.Linear(d_out, d_out)`` that mixes the concatenated heads.
        mask: boolean buffer ``(context_length, context_length)``, ``True`` where attention is
            forbidden, shared by every head (for a ``context_length`` above
            ``MASK_BUFFER_SIDE`` (``mha_course.attention.masking``), as long as the longest input seen).

    Conversions: :meth:`from_wrapper` and :meth:`from_fast` build one that computes what the other
    module does.

    Example:
        >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
        >>> mha(torch.rand(1, 6, 3)).shape
        torch.Size([1, 6, 4])
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads,
                 qkv_bias=False):
        super().__init__()
        validate_attention_args(d_in, d_out, context_length, dropout, qkv_bias,
                                num_heads)  # errors name the argument, the fix
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        # One projection per role for all heads: head m (counted from 1)
        # owns output columns (m - 1) * head_dim to m * head_dim - 1.
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        # New in this class: a learned linear map that mixes the heads.
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        register_causal_mask(self, context_length)  # self.mask

    def forward(self, x, attention_mask=None):
        """``(batch, num_tokens, d_in) -> (batch, num_tokens, d_out)``; ``attention_mask``: padding."""
        validate_input(x, self.d_in, self.context_length, self.W_query.weight,
                       attention_mask)  # its shape, dtype, device; the mask's
        batch, num_tokens, _ = x.shape
        # Split: read each projection's d_out columns as num_heads groups
        # of head_dim, then move the heads in front of the tokens.
        split = (batch, num_tokens, self.num_heads, self.head_dim)
        queries = self.W_query(x).view(split).transpose(1, 2)  # (B, h, T, d_h)
        keys = self.W_key(x).view(split).transpose(1, 2)  # (B, h, T, d_h)
        values = self.W_value(x).view(split).transpose(1, 2)  # (B, h, T, d_h)
        # float32 scores and softmax for half-precision inputs
        dtype = torch.promote_types(queries.dtype, torch.float32)
        # Scale the queries (B*T*d_out numbers), not the scores (B*h*T*T).
        queries = queries.to(dtype) * self.head_dim**-0.5
        scores = queries @ keys.to(dtype).transpose(2, 3)  # (B, h, T, T)
        # One (T, T) mask for every head and sequence, filled in place.
        scores.masked_fill_(self.mask[:num_tokens, :num_tokens], float("-inf"))
        # torch.softmax(scores, dim=-1), padded keys hidden too (chapter 9)
        weights = padded_softmax(scores, attention_mask).to(values.dtype)
        context = self.dropout(weights) @ values  # (B, h, T, d_h)
        # Merge: the heads side by side again; contiguous() copies them
        # into (B, T, h, d_h) order so that view can fold the last two axes.
        context = context.transpose(1, 2).contiguous()  # (B, T, h, d_h)
        context = context.view(batch, num_tokens, self.d_out)  # (B, T, d_out)
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

    # --- Conversions from the other batched layouts (not in the listing) ---

    @classmethod
    @torch.no_grad()
    def from_wrapper(cls, wrapper: MultiHeadAttentionWrapper) -> MultiHeadAttention:
        """A ``MultiHeadAttention`` that computes what ``wrapper`` does.

        Its ``d_out`` is ``wrapper.num_heads * wrapper.d_out`` (the wrapper's ``d_out`` is per
        head); it has the wrapper's dropout, bias setting, device, dtype and training mode, and
        weights copied by :func:`transfer_weights`.

        Example:
            >>> wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2)
            >>> mha = MultiHeadAttention.from_wrapper(wrapper)
            >>> x = torch.rand(2, 6, 3)
            >>> mha.d_out, torch.allclose(mha(x), wrapper(x), atol=1e-6)
            (4, True)
        """
        if not isinstance(wrapper, MultiHeadAttentionWrapper):
            hint = (" For a FastMultiHeadAttention use MultiHeadAttention.from_fast(fast)."
                    if _has_fused_qkv(wrapper) else "")
            raise TypeError(f"wrapper must be a MultiHeadAttentionWrapper, got {type(wrapper).__name__}.{hint}")
        first = wrapper.heads[0]
        mha = cls(wrapper.d_in, wrapper.num_heads * wrapper.d_out, wrapper.context_length, first.dropout.p,
                  wrapper.num_heads, qkv_bias=first.W_query.bias is not None)
        weight = first.W_query.weight
        mha = mha.to(device=weight.device, dtype=weight.dtype)
        return transfer_weights(wrapper, mha).train(wrapper.training)

    @classmethod
    @torch.no_grad()
    def from_fast(cls, fast) -> MultiHeadAttention:
        """A ``MultiHeadAttention`` that computes what a ``FastMultiHeadAttention`` does.

        The inverse of :meth:`FastMultiHeadAttention.from_multihead`: the fused ``qkv`` weight (and
        bias) is cut back into the query, key and value projections; the output projection, the
        dropout probability, device, dtype and training mode are copied. ``fast`` is read by its
        parts, a fused ``qkv`` projection, ``out_proj``, ``dropout`` and the sizes, since this module
        does not import ``mha_course.attention.fast`` (which imports it): any module laid out as
        ``FastMultiHeadAttention`` converts.

        Example:
            >>> from mha_course import FastMultiHeadAttention
            >>> fast = FastMultiHeadAttention(3, 4, 6, 0.0, num_heads=2)
            >>> mha = MultiHeadAttention.from_fast(fast)
            >>> x = torch.rand(2, 6, 3)
            >>> torch.allclose(mha(x), fast(x), atol=1e-6)
            True
        """
        if not _has_fused_qkv(fast):
            hint = (" For a wrapper use MultiHeadAttention.from_wrapper(wrapper)."
                    if isinstance(fast, MultiHeadAttentionWrapper) else "")
            raise TypeError(f"fast must be a FastMultiHeadAttention, got {type(fast).__name__}.{hint}")
        weight = fast.qkv.weight
        mha = cls(fast.d_in, fast.d_out, fast.context_length, fast.dropout.p, fast.num_heads,
                  qkv_bias=fast.qkv.bias is not None).to(device=weight.device, dtype=weight.dtype)
        weights, biases = unstack_qkv(fast.qkv.weight), unstack_qkv(fast.qkv.bias)
        for linear, w, b in zip((mha.W_query, mha.W_key, mha.W_value), weights, biases, strict=True):
            linear.weight.copy_(w)
            if b is not None:
                linear.bias.copy_(b)
        mha.out_proj.load_state_dict(fast.out_proj.state_dict())
        return mha.train(fast.training)


def _has_fused_qkv(module) -> bool:
    """Whether ``module`` is laid out as ``FastMultiHeadAttention``: a fused ``qkv`` and an ``out_proj``."""
    return all(isinstance(getattr(module, name, None), nn.Linear) for name in ("qkv", "out_proj"))


#: The hint of :func:`not_a_multihead` for a module that is not a ``MultiHeadAttention``, by its class.
_CONVERT_FIRST = {
    "MultiHeadAttentionWrapper": " Convert it first: {name}(MultiHeadAttention.from_wrapper(wrapper){rest}).",
    "FastMultiHeadAttention": " Convert it first: {name}(MultiHeadAttention.from_fast(fast){rest}).",
    "GroupedQueryAttention": (" It already shares key/value heads; build a new GroupedQueryAttention with the "
                              "num_kv_groups you want, or start from the MultiHeadAttention it was made from."),
    "MultiheadAttention": " Convert it first: {name}(from_torch_multihead(torch_mha, context_length){rest}).",
}


def not_a_multihead(mha, name: str, rest: str = "") -> TypeError | None:
    """The error for a conversion from ``MultiHeadAttention`` handed something else, or ``None`` for one.

    ``name`` is the conversion called and ``rest`` its further arguments, for the call the hint
    shows. The hint is chosen by the class's name, so that this module imports none of the classes
    that convert from it.

    Example:
        >>> print(not_a_multihead(MultiHeadAttention(3, 4, 6, 0.0, 2), "f"))
        None
        >>> not_a_multihead(MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2), "f")
        TypeError('mha must be a MultiHeadAttention, got MultiHeadAttentionWrapper. Convert it first: f(MultiHeadAttention.from_wrapper(wrapper)).')
    """
    if isinstance(mha, MultiHeadAttention):
        return None
    got = type(mha).__name__
    hint = _CONVERT_FIRST.get(got, "").format(name=name, rest=rest)
    return TypeError(f"mha must be a MultiHeadAttention, got {got}.{hint}")


@torch.no_grad()
def transfer_weights(wrapper: MultiHeadAttentionWrapper, mha: MultiHeadAttention) -> MultiHeadAttention:
    """Copy a wrapper's per-head weights into ``mha`` so that both compute the same function.

    Head ``m``'s query, key and value weights (``wrapper.heads[m - 1]``) become rows
    ``(m - 1) * head_dim`` to ``m * head_dim - 1`` of ``mha``'s projections (the slice that the split
    into heads gives head ``m``), and the output
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
