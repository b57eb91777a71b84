"""Splitting into heads, merging heads back, and packing the three projections into one.

The reshapes every multi-head module shares, written once. Notation, as in the book: ``B`` batch,
``T`` tokens, ``h`` heads, ``d_h`` the width of one head (``head_dim`` in code), so a projection
of all heads is ``h * d_h`` wide.

* :func:`split_heads` views one projection ``(B, T, h * d_h)`` as ``h`` heads ``(B, h, T, d_h)``,
  so a single batched matrix product serves every head;
* :func:`merge_heads` is its inverse, gluing the heads' context vectors side by side again;
* :func:`stack_qkv` packs query, key and value weights (or biases) into the one tensor of a fused
  projection, as :class:`FastMultiHeadAttention` and ``torch.nn.MultiheadAttention`` hold them;
  :func:`unstack_qkv` cuts it back.
"""

from __future__ import annotations

import torch

from ._validation import validate_positive_int


def _validate_tensor(t, dims: int, shape: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor of shape {shape}, got {type(t).__name__}.")
    if t.dim() != dims:
        raise ValueError(f"t must be a {dims}-D tensor of shape {shape}, got shape {tuple(t.shape)} ({t.dim()}-D).")


def split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """View one projection as heads: (B, T, h*d_h) -> (B, h, T, d_h).

    Head ``m`` (counted from 1, as the book counts) gets columns
    ``(m - 1) * d_h`` to ``m * d_h - 1`` of the last dimension, index
    ``m - 1`` of the head axis. No number is copied: ``view`` cuts the last dimension into
    ``(h, d_h)`` and ``transpose`` swaps strides, so the result shares
    memory with ``t``.

    Args:
        t: a projection's output, shape ``(B, T, num_heads * head_dim)``.
        num_heads: how many heads to cut it into; it must divide
            ``t.shape[-1]``.

    Raises:
        ValueError: for a tensor that is not 3-D, or a width that
            ``num_heads`` does not divide.

    Example:
        >>> t = torch.arange(8.0).view(1, 2, 4)  # 2 tokens, width 4
        >>> heads = split_heads(t, num_heads=2)
        >>> heads.shape
        torch.Size([1, 2, 2, 2])
        >>> heads[0, 1]  # head 2 (index 1): columns 2 and 3 of every token
        tensor([[2., 3.],
                [6., 7.]])
    """
    _validate_tensor(t, 3, "(batch, num_tokens, num_heads * head_dim)")
    num_heads = validate_positive_int("num_heads", num_heads)
    batch, num_tokens, width = t.shape
    if width % num_heads != 0:
        raise ValueError(
            f"t is {width} wide (t.shape[-1]) but num_heads={num_heads} "
            "does not divide it: every head gets head_dim = width // "
            f"num_heads columns. Use a num_heads that divides {width}."
        )
    head_dim = width // num_heads
    t = t.view(batch, num_tokens, num_heads, head_dim)  # (B, T, h, d_h)
    return t.transpose(1, 2)  # (B, h, T, d_h): heads become a batch axis


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """Glue the heads side by side again: (B, h, T, d_h) -> (B, T, h*d_h).

    The inverse of :func:`split_heads`: head ``m`` fills columns
    ``(m - 1) * d_h`` to ``m * d_h - 1`` of every token, as concatenating the heads' outputs
    would.

    Args:
        t: the heads' context vectors, shape ``(B, num_heads, T, head_dim)``.

    Example:
        >>> t = torch.rand(2, 3, 5, 4)  # (B, h, T, d_h)
        >>> merge_heads(t).shape
        torch.Size([2, 5, 12])
        >>> x = torch.rand(2, 5, 12)
        >>> torch.equal(merge_heads(split_heads(x, 3)), x)
        True
    """
    _validate_tensor(t, 4, "(batch, num_heads, num_tokens, head_dim)")
    batch, num_heads, num_tokens, head_dim = t.shape
    # transpose only swaps strides: in memory the numbers stay in
    # (B, h, T, d_h) order, and view cannot glue a token's heads side by side
    # from memory laid out that way. contiguous() copies them into
    # (B, T, h, d_h) order; then view relabels that memory, copying nothing.
    t = t.transpose(1, 2).contiguous()  # (B, T, h, d_h)
    return t.view(batch, num_tokens, num_heads * head_dim)  # (B, T, h*d_h)


def stack_qkv(query: torch.Tensor | None, key: torch.Tensor | None,
              value: torch.Tensor | None) -> torch.Tensor | None:
    """Pack query, key and value weights (or biases) into the one tensor of a fused projection.

    ``nn.Linear(d_in, d_out)`` stores its weight as ``(d_out, d_in)``; stacking the three along the
    first dimension gives the ``(3 * d_out, d_in)`` weight of one ``nn.Linear(d_in, 3 * d_out)``
    whose output holds the queries, then the keys, then the values. Biases ``(d_out,)`` stack the
    same way into ``(3 * d_out,)``; three ``None`` (projections without a bias) give ``None``.

    Raises:
        ValueError: if some of the three are ``None`` and others are not (a bias on some
            projections only), or if their shapes differ.

    Example:
        >>> from torch import nn
        >>> q, k, v = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(3, 4)
        >>> stack_qkv(q.weight, k.weight, v.weight).shape
        torch.Size([12, 3])
        >>> stack_qkv(q.bias, k.bias, v.bias).shape
        torch.Size([12])
        >>> print(stack_qkv(None, None, None))
        None
    """
    parts = {"query": query, "key": key, "value": value}
    missing = [name for name, part in parts.items() if part is None]
    if len(missing) == 3:
        return None
    if missing:
        present = [name for name in parts if name not in missing]
        raise ValueError(
            f"stack_qkv got a tensor for {' and '.join(present)} but None for {' and '.join(missing)}: "
            "a fused projection has a bias for all three roles or for none. Build the three "
            "projections with the same bias setting (qkv_bias)."
        )
    shapes = {name: tuple(part.shape) for name, part in parts.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(
            f"query, key and value must have the same shape to be stacked, got {shapes}. Each role "
            "is a projection of the same width."
        )
    return torch.cat([query, key, value], dim=0)  # (3 * d_out, d_in) or (3 * d_out,)


def unstack_qkv(packed: torch.Tensor | None, dim: int = 0) -> tuple:
    """Cut a fused projection's tensor into its query, key and value parts: the inverse of :func:`stack_qkv`.

    Args:
        packed: a packed weight ``(3 * d_out, d_in)`` or bias ``(3 * d_out,)``, or a fused
            projection's output ``(B, T, 3 * d_out)`` with ``dim=-1``; ``None`` gives three ``None``.
        dim: the dimension that holds the three parts, one after another.

    Returns:
        ``(query, key, value)``: views of ``packed``, no copy.

    Raises:
        ValueError: if the size along ``dim`` is not a multiple of three.

    Example:
        >>> query, key, value = unstack_qkv(torch.arange(6.0))
        >>> query, key, value
        (tensor([0., 1.]), tensor([2., 3.]), tensor([4., 5.]))
        >>> [part.shape for part in unstack_qkv(torch.rand(2, 5, 12), dim=-1)]
        [torch.Size([2, 5, 4]), torch.Size([2, 5, 4]), torch.Size([2, 5, 4])]
    """
    if packed is None:
        return None, None, None
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packed must be a torch.Tensor or None, got {type(packed).__name__}.")
    size = packed.shape[dim]
    if size % 3 != 0:
        raise ValueError(
            f"packed has size {size} along dim={dim}, not a multiple of 3: a fused projection holds "
            "queries, keys and values one after another, each a third of it."
        )
    return packed.chunk(3, dim=dim)


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which attention scores and their softmax are computed for inputs of ``dtype``.

    ``float32`` for the half-precision types: a float16 dot product ``q . k`` above 65504 overflows
    to ``inf``, and a row of ``inf`` scores turns the softmax into ``NaN``, so production code (and
    PyTorch's own fused kernels) computes this step in float32. Any other dtype is kept.

    Example:
        >>> score_dtype(torch.float16), score_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def captured_attention_weights(module: torch.nn.Module, *inputs) -> torch.Tensor:
    """The attention weights that ``module(*inputs)`` hands to its ``dropout``, without gradients.

    Every attention module of the course computes its weights in ``forward`` and passes them through
    ``self.dropout`` before weighting the values; this runs ``forward`` once and keeps what dropout
    received, so the weights are exactly the ones ``forward`` used, before dropout (each row sums to
    one). Its ``attention_weights`` methods use it, so that ``forward`` holds the computation alone.

    Example:
        >>> from mha_course import CausalAttention
        >>> head = CausalAttention(3, 2, context_length=4, dropout=0.5)
        >>> weights = captured_attention_weights(head, torch.rand(1, 4, 3))
        >>> weights.shape, bool(weights.sum(-1).allclose(torch.ones(1, 4)))
        (torch.Size([1, 4, 4]), True)
    """
    captured = []
    hook = module.dropout.register_forward_hook(lambda _module, args, _output: captured.append(args[0]))
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        hook.remove()
    if len(captured) != 1:
        raise RuntimeError(f"{type(module).__name__}.forward called its dropout {len(captured)} times, "
                           "not once: its attention weights cannot be read from it.")
    return captured[0]
