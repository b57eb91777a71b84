"""The causal mask: which earlier positions each token may draw on."""

from __future__ import annotations

import torch

from ._validation import check_positive_int


def causal_mask(num_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (num_tokens, num_tokens) mask that is ``True`` where attention is forbidden.

    Row ``i`` is the query position and column ``j`` the key position; ``mask[i, j]`` is ``True``
    when ``j > i``, that is, when the key lies in the query's future. Every position sees itself
    and the positions before it. This is the convention of ``masked_fill`` (fill where ``True``)
    and of ``torch.nn.MultiheadAttention``'s boolean ``attn_mask``.

    Args:
        num_tokens: sequence length, a positive integer.
        device: where to create the mask (default: the CPU).

    Example:
        >>> causal_mask(3).int()
        tensor([[0, 1, 1],
                [0, 0, 1],
                [0, 0, 0]], dtype=torch.int32)
    """
    num_tokens = check_positive_int("num_tokens", num_tokens)
    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)


def visibility(num_tokens: int) -> torch.Tensor:
    """Boolean (num_tokens, num_tokens) table that is ``True`` where token ``i`` may see token ``j``.

    The complement of :func:`causal_mask`: a lower triangle including the diagonal. Row ``i`` lists
    the tokens that token ``i`` may draw on: itself and every token before it.

    Example:
        >>> visibility(3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    return ~causal_mask(num_tokens)
