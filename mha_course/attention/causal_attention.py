"""Stage 1 of the course: one causal attention head.

A single causal attention module *is* single-head attention: one set of query, key and value
weights turns a sequence of embedded tokens into one matrix of context vectors, and a causal mask
keeps every position from drawing on the positions after it.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validation import validate_attention_args, validate_input
from .heads import captured_attention_weights, score_dtype
from .masking import register_causal_mask


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

    Raises:
        ValueError: for a size that is not positive, a ``dropout`` outside ``[0, 1)``, or an input
            of the wrong shape or length; the message names the argument and the fix.
        TypeError: for an argument or input of the wrong type, e.g. integer token ids, or an input
            whose dtype differs from the module's.

    Attributes:
        W_query: ``nn.Linear(d_in, d_out)``, the query projection; ``W_key`` and ``W_value`` are
            its twins for keys and values. Their weights are stored transposed, ``(d_out, d_in)``.
        mask: boolean buffer ``(context_length, context_length)``, ``True`` above the diagonal,
            where a query must not see a key (see :func:`causal_mask`). It is saved in the
            ``state_dict``; loading one whose mask is not the causal pattern fails.

    Example:
        >>> _ = torch.manual_seed(123)
        >>> head = CausalAttention(3, 2, context_length=6, dropout=0.0)
        >>> head(torch.rand(2, 6, 3)).shape
        torch.Size([2, 6, 2])
    """

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        # Every argument checked at once; errors name the argument and the fix.
        args = validate_attention_args(d_in, d_out, context_length, dropout,
                                       qkv_bias)
        self.d_in, self.d_out = args.d_in, args.d_out
        self.context_length = args.context_length
        self.W_query = nn.Linear(self.d_in, self.d_out, bias=args.qkv_bias)
        self.W_key = nn.Linear(self.d_in, self.d_out, bias=args.qkv_bias)
        self.W_value = nn.Linear(self.d_in, self.d_out, bias=args.qkv_bias)
        # Dropout acts on the attention weights: in training some weights
        # are zeroed and the rest scaled up by 1 / (1 - p); in eval mode it
        # does nothing.
        self.dropout = nn.Dropout(args.dropout)
        # self.mask: True above the diagonal, where a position must not look
        # (a future token); side min(context_length, 1024), grown on demand.
        register_causal_mask(self, self.context_length)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Context vectors for ``x``: ``(B, T, d_in) -> (B, T, d_out)``.

        Row ``t`` of the output is a weighted average of the value vectors
        of tokens ``0 .. t``.
        """
        validate_input(x, self.d_in, self.context_length,
                       like=self.W_query.weight)
        num_tokens = x.shape[1]
        queries = self.W_query(x)  # (B, T, d_out)
        keys = self.W_key(x)  # (B, T, d_out)
        values = self.W_value(x)  # (B, T, d_out)
        # Half precision (float16) computes the scores in float32, where a
        # large q.k cannot overflow to inf; other dtypes are kept.
        dtype = score_dtype(queries.dtype)
        # Dividing by sqrt(d_out) keeps the scores' spread independent of
        # the head width, so the softmax does not saturate into a one-hot
        # vector with vanishing gradients.
        queries = queries.to(dtype) * self.d_out**-0.5
        # (B, T, T): row i = how much token i matches each key
        scores = queries @ keys.to(dtype).transpose(1, 2)
        # The mask is context_length wide; a shorter input uses its corner.
        future = self.mask[:num_tokens, :num_tokens]
        scores = scores.masked_fill(future, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, T, T), rows sum to 1
        weights = weights.to(values.dtype)
        return self.dropout(weights) @ values  # (B, T, d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The softmax attention weights for ``x``, shape ``(B, T, T)``.

        Entry ``[b, i, j]`` is how much token ``i`` draws on token ``j``; it
        is zero for ``j > i``. They are the weights ``forward`` computes,
        before dropout, so every row sums to one. Runs without gradients.

        Example:
            >>> head = CausalAttention(3, 2, context_length=6, dropout=0.0)
            >>> weights = head.attention_weights(torch.rand(1, 3, 3))
            >>> weights.shape
            torch.Size([1, 3, 3])
            >>> bool(weights[0, 0, 1] == 0)  # token 1 never sees token 2
            True
            >>> weights.sum(-1).allclose(torch.ones(1, 3))
            True
        """
        return captured_attention_weights(self, x)
