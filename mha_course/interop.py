"""The course's batched module next to PyTorch's own attention functions.

These helpers let a reader (and the tests) check that :class:`MultiHeadAttention` computes what
``torch.nn.functional.scaled_dot_product_attention`` and ``torch.nn.MultiheadAttention`` compute
when they are given the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import check_input
from .masking import causal_mask
from .multihead import MultiHeadAttention


def _require_mha(module) -> MultiHeadAttention:
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"mha must be a MultiHeadAttention, got {type(module).__name__}.")
    return module


def sdpa_forward(mha: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Run ``mha``'s projections around PyTorch's fused ``scaled_dot_product_attention``.

    The query, key, value and output projections are ``mha``'s own; only the middle (scores,
    scale, mask, softmax, weighted sum) is replaced by the fused call with ``is_causal=True``.
    Dropout is applied only when ``mha`` is in training mode.

    Args:
        mha: the module whose weights to use.
        x: input of shape ``(batch, num_tokens, mha.d_in)``.

    Returns:
        ``(batch, num_tokens, mha.d_out)``, equal to ``mha(x)`` up to rounding in eval mode.

    Example:
        >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
        >>> x = torch.rand(2, 6, 3)
        >>> torch.allclose(sdpa_forward(mha, x), mha(x), atol=1e-6)
        True
    """
    mha = _require_mha(mha)
    check_input(x, mha.d_in, mha.context_length)
    batch, num_tokens, _ = x.shape
    q = mha._split_heads(mha.W_query(x))  # (B, h, T, hd)
    k = mha._split_heads(mha.W_key(x))
    v = mha._split_heads(mha.W_value(x))
    p = mha.dropout.p if mha.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, h, T, hd)
    context = context.transpose(1, 2).reshape(batch, num_tokens, mha.d_out)
    return mha.out_proj(context)


@torch.no_grad()
def to_torch_multihead(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """Build a ``torch.nn.MultiheadAttention`` (``batch_first=True``) with ``mha``'s weights.

    PyTorch's module maps ``embed_dim`` to ``embed_dim``, so this needs ``mha.d_in == mha.d_out``.
    Its packed ``in_proj_weight`` holds ``mha``'s query, key and value weights stacked, its
    ``out_proj`` is ``mha``'s; biases missing in ``mha`` become zeros. Call it as
    ``torch_mha(x, x, x, attn_mask=causal_mask(T), need_weights=False)``, or use
    :func:`torch_multihead_forward`.

    Args:
        mha: the module to copy; needs ``d_in == d_out``.

    Returns:
        A new ``torch.nn.MultiheadAttention`` on ``mha``'s device and dtype, in ``mha``'s
        training mode.

    Example:
        >>> mha = MultiHeadAttention(4, 4, 6, dropout=0.0, num_heads=2)
        >>> torch_mha = to_torch_multihead(mha)
        >>> x = torch.rand(2, 6, 4)
        >>> y = torch_multihead_forward(torch_mha, x)
        >>> torch.allclose(y, mha(x), atol=1e-6)
        True
    """
    mha = _require_mha(mha)
    if mha.d_in != mha.d_out:
        raise ValueError(
            f"torch.nn.MultiheadAttention needs d_in == d_out, got d_in={mha.d_in} and "
            f"d_out={mha.d_out}. Build the MultiHeadAttention with d_out={mha.d_in}."
        )
    weight = mha.W_query.weight
    torch_mha = nn.MultiheadAttention(
        mha.d_out, mha.num_heads, dropout=mha.dropout.p, bias=True, batch_first=True,
        device=weight.device, dtype=weight.dtype,
    )
    torch_mha.in_proj_weight.copy_(torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight]))
    if mha.W_query.bias is None:
        torch_mha.in_proj_bias.zero_()
    else:
        torch_mha.in_proj_bias.copy_(torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias]))
    torch_mha.out_proj.weight.copy_(mha.out_proj.weight)
    torch_mha.out_proj.bias.copy_(mha.out_proj.bias)
    torch_mha.train(mha.training)
    return torch_mha


def torch_multihead_forward(torch_mha: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal self-attention with a ``torch.nn.MultiheadAttention``: ``(B, T, E) -> (B, T, E)``.

    Queries, keys and values are all ``x``; the mask is :func:`causal_mask` of ``x``'s length.

    Args:
        torch_mha: a ``batch_first=True`` module, e.g. from :func:`to_torch_multihead`.
        x: input of shape ``(batch, num_tokens, embed_dim)``.

    Example:
        >>> torch_mha = nn.MultiheadAttention(4, 2, batch_first=True)
        >>> x = torch.rand(1, 5, 4)
        >>> torch_multihead_forward(torch_mha, x).shape
        torch.Size([1, 5, 4])
    """
    mask = causal_mask(x.shape[1], device=x.device)  # True = may not attend, as PyTorch expects
    output, _ = torch_mha(x, x, x, attn_mask=mask, need_weights=False)
    return output
