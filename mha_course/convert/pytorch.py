"""Every conversion between the course's attention modules, and to and from PyTorch's.

These helpers let a reader (and the tests) check that :class:`MultiHeadAttention` computes what
``torch.nn.functional.scaled_dot_product_attention`` and ``torch.nn.MultiheadAttention`` compute
when they are given the same weights, and convert between the course's module and PyTorch's in
both directions (:func:`to_torch_multihead`, :func:`from_torch_multihead`).

The conversions between the course's own classes are classmethods of the class they build, written
in its module (``MultiHeadAttention.from_wrapper`` and ``from_fast``,
``FastMultiHeadAttention.from_multihead``, ``GroupedQueryAttention.from_multihead``,
``TiledMultiHeadAttention.from_multihead``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention._validation import validate_dropout, validate_input, validate_positive_int
from ..attention.heads import merge_heads, split_heads, stack_qkv, unstack_qkv
from ..attention.masking import causal_mask
from ..attention.multihead import MultiHeadAttention


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
    validate_input(x, mha.d_in, mha.context_length, like=mha.W_query.weight)
    q = split_heads(mha.W_query(x), mha.num_heads)  # (B, h, T, d_h)
    k = split_heads(mha.W_key(x), mha.num_heads)  # (B, h, T, d_h)
    v = split_heads(mha.W_value(x), mha.num_heads)  # (B, h, T, d_h)
    p = mha.dropout.p if mha.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, h, T, d_h)
    return mha.out_proj(merge_heads(context))  # (B, T, d_out)


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
    torch_mha.in_proj_weight.copy_(stack_qkv(mha.W_query.weight, mha.W_key.weight, mha.W_value.weight))
    bias = stack_qkv(mha.W_query.bias, mha.W_key.bias, mha.W_value.bias)
    if bias is None:
        torch_mha.in_proj_bias.zero_()
    else:
        torch_mha.in_proj_bias.copy_(bias)
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

    Raises:
        ValueError: for a module built with ``batch_first=False`` (PyTorch's default), which would
            read ``x`` as ``(num_tokens, batch, embed_dim)`` and attend across the batch.

    Example:
        >>> torch_mha = nn.MultiheadAttention(4, 2, batch_first=True)
        >>> x = torch.rand(1, 5, 4)
        >>> torch_multihead_forward(torch_mha, x).shape
        torch.Size([1, 5, 4])
    """
    if not isinstance(torch_mha, nn.MultiheadAttention):
        raise TypeError(
            f"torch_mha must be a torch.nn.MultiheadAttention, got {type(torch_mha).__name__}. "
            "Call the course's modules directly: module(x)."
        )
    if not torch_mha.batch_first:
        raise ValueError(
            "torch_mha was built with batch_first=False (PyTorch's default), so it reads its input as "
            "(num_tokens, batch, embed_dim) and would attend across the batch. Build it with "
            "batch_first=True, or convert it with from_torch_multihead(torch_mha, context_length), "
            "which works for either layout."
        )
    validate_input(x, torch_mha.embed_dim, None, like=torch_mha.in_proj_weight)
    mask = causal_mask(x.shape[1], device=x.device)  # True = may not attend, as PyTorch expects
    output, _ = torch_mha(x, x, x, attn_mask=mask, need_weights=False)
    return output


@torch.no_grad()
def from_torch_multihead(
    torch_mha: nn.MultiheadAttention, context_length: int, dropout: float | None = None
) -> MultiHeadAttention:
    """Build a :class:`MultiHeadAttention` with the weights of a ``torch.nn.MultiheadAttention``.

    The inverse of :func:`to_torch_multihead`. The packed ``in_proj_weight`` (and ``in_proj_bias``)
    is cut into the query, key and value projections, ``out_proj`` is copied, and the new module is
    on ``torch_mha``'s device and dtype, in its training mode. Run causally, both compute the same
    function: ``mha(x)`` equals ``torch_multihead_forward(torch_mha, x)``. A sequence-first
    (``batch_first=False``) module converts as well: the layout belongs to the input, not to the
    weights.

    Args:
        torch_mha: the module to copy; it must be self-attention shaped (``kdim == vdim ==
            embed_dim``) without ``add_bias_kv`` or ``add_zero_attn``.
        context_length: the longest sequence the new module accepts (PyTorch's module has no such
            limit; the course's modules build their causal mask for it).
        dropout: the new module's attention dropout; ``None`` (default) keeps ``torch_mha.dropout``.

    Returns:
        A new ``MultiHeadAttention`` with ``d_in == d_out == embed_dim``. Its ``qkv_bias`` is
        ``torch_mha``'s ``bias``; a module built with ``bias=False`` has no output bias either, and
        the course's module gets a zero one (the same function, but a bias that training may move).

    Raises:
        TypeError: if ``torch_mha`` is not a ``torch.nn.MultiheadAttention``.
        ValueError: for what the course's modules cannot hold: separate key/value widths, learned
            extra key/value biases, an extra zero attention slot.

    Example:
        >>> torch_mha = nn.MultiheadAttention(4, 2, batch_first=True)
        >>> mha = from_torch_multihead(torch_mha, context_length=6)
        >>> mha.d_in, mha.d_out, mha.num_heads
        (4, 4, 2)
        >>> x = torch.rand(2, 6, 4)
        >>> torch.allclose(mha(x), torch_multihead_forward(torch_mha, x), atol=1e-6)
        True
    """
    if not isinstance(torch_mha, nn.MultiheadAttention):
        hint = " To go the other way, use to_torch_multihead(mha)." if isinstance(
            torch_mha, MultiHeadAttention) else ""
        raise TypeError(f"torch_mha must be a torch.nn.MultiheadAttention, got {type(torch_mha).__name__}.{hint}")
    if not torch_mha.kdim == torch_mha.vdim == torch_mha.embed_dim:
        raise ValueError(
            f"torch_mha has kdim={torch_mha.kdim} and vdim={torch_mha.vdim}, which differ from "
            f"embed_dim={torch_mha.embed_dim}: its keys and values come from inputs of other widths "
            "(cross-attention), while the course's modules are self-attention, one input for all "
            "three. Only a module with kdim == vdim == embed_dim converts."
        )
    if torch_mha.bias_k is not None:
        raise ValueError(
            "torch_mha was built with add_bias_kv=True: it appends a learned key and value to every "
            "sequence, which the course's modules do not have. Only a module with add_bias_kv=False "
            "converts."
        )
    if torch_mha.add_zero_attn:
        raise ValueError(
            "torch_mha was built with add_zero_attn=True: it appends a zero key and value to every "
            "sequence, which the course's modules do not have. Only a module with "
            "add_zero_attn=False converts."
        )
    context_length = validate_positive_int("context_length", context_length)
    dropout = torch_mha.dropout if dropout is None else validate_dropout(dropout)
    weight = torch_mha.in_proj_weight
    mha = MultiHeadAttention(
        torch_mha.embed_dim, torch_mha.embed_dim, context_length, dropout, torch_mha.num_heads,
        qkv_bias=torch_mha.in_proj_bias is not None,
    ).to(device=weight.device, dtype=weight.dtype)
    weights, biases = unstack_qkv(weight), unstack_qkv(torch_mha.in_proj_bias)
    for linear, w, b in zip((mha.W_query, mha.W_key, mha.W_value), weights, biases, strict=True):
        linear.weight.copy_(w)
        if b is not None:
            linear.bias.copy_(b)
    mha.out_proj.weight.copy_(torch_mha.out_proj.weight)
    if torch_mha.out_proj.bias is None:
        mha.out_proj.bias.zero_()
    else:
        mha.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return mha.train(torch_mha.training)
