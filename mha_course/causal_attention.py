"""Stage 1 of the course: one causal attention head.

A single causal attention module *is* single-head attention: one set of query, key and value
weights turns a sequence of embedded tokens into one matrix of context vectors, and a causal mask
keeps every position from drawing on the positions after it.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validation import check_dropout, check_input, check_positive_int
from .masking import causal_mask


class CausalAttention(nn.Module):
    """One causal self-attention head.

    Args:
        d_in: width of each input token vector.
        d_out: width of each output context vector (the head's width).
        context_length: the longest sequence the module accepts; the causal mask is built for it.
        dropout: probability of zeroing an attention weight while training (0.0 for none).
        qkv_bias: whether the query, key and value projections have a bias.

    Shapes:
        input ``(batch, num_tokens, d_in)`` -> output ``(batch, num_tokens, d_out)``,
        with ``num_tokens <= context_length``.

    Example:
        >>> torch.manual_seed(123)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> head = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)
        >>> head(torch.rand(2, 6, 3)).shape
        torch.Size([2, 6, 2])
    """

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_in = check_positive_int("d_in", d_in)
        self.d_out = check_positive_int("d_out", d_out)
        self.context_length = check_positive_int("context_length", context_length)
        self.W_query = nn.Linear(self.d_in, self.d_out, bias=qkv_bias)
        self.W_key = nn.Linear(self.d_in, self.d_out, bias=qkv_bias)
        self.W_value = nn.Linear(self.d_in, self.d_out, bias=qkv_bias)
        # Dropout acts on the attention weights: in training some weights are zeroed and the rest
        # scaled up by 1 / (1 - p); in eval mode it does nothing.
        self.dropout = nn.Dropout(check_dropout(dropout))
        # A buffer, not a parameter: it is never trained, but it moves with .to(device) and is
        # saved in the state_dict. True marks a future position that must not be attended to.
        self.register_buffer("mask", causal_mask(self.context_length))

    def _weights_and_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_input(x, self.d_in, self.context_length)
        num_tokens = x.shape[1]
        queries = self.W_query(x)  # (B, T, d_out)
        keys = self.W_key(x)  # (B, T, d_out)
        values = self.W_value(x)  # (B, T, d_out)
        scores = queries @ keys.transpose(1, 2)  # (B, T, T): row i = how much token i matches each key
        # The mask buffer is context_length wide; a shorter input uses its top-left corner.
        scores = scores.masked_fill(self.mask[:num_tokens, :num_tokens], float("-inf"))
        # Dividing by sqrt(d_out) keeps the scores' spread independent of the head width, so the
        # softmax does not saturate into a one-hot vector with vanishing gradients.
        weights = torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)  # (B, T, T), rows sum to 1
        return weights, values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, values = self._weights_and_values(x)
        return self.dropout(weights) @ values  # (B, T, d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The softmax attention weights for ``x``, shape ``(batch, num_tokens, num_tokens)``.

        Dropout is not applied, so the rows sum to one; ``forward`` is unchanged.
        """
        return self._weights_and_values(x)[0]
