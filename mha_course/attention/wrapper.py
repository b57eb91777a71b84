"""Stage 2 of the course: several causal heads, stacked side by side.

``MultiHeadAttentionWrapper`` holds ``num_heads`` independent :class:`CausalAttention` modules.
The same input enters every head unchanged; each head owns its own query, key and value weights
and produces its own context vectors Z_1 ... Z_h; the only place the heads meet is the merge,
a concatenation along the feature dimension.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validation import validate_attention_args, validate_input
from .causal_attention import CausalAttention


class MultiHeadAttentionWrapper(nn.Module):
    """Multi-head attention built by stacking independent causal heads.

    Args:
        d_in: width of each input token vector.
        d_out: width of **each head's** output (new in this class: the merged output is
            ``num_heads * d_out`` wide; contrast :class:`MultiHeadAttention`, where ``d_out`` is
            the total width).
        context_length: the longest sequence the module accepts.
        dropout: probability of zeroing an attention weight while training.
        num_heads: how many heads to stack.
        qkv_bias: whether the query, key and value projections have a bias.

    Shapes:
        input ``(batch, num_tokens, d_in)`` -> output ``(batch, num_tokens, num_heads * d_out)``.

    Attributes:
        heads: ``nn.ModuleList`` of ``num_heads`` independent :class:`CausalAttention` heads;
            columns ``(m - 1) * d_out`` to ``m * d_out - 1`` of the output come from head ``m``,
            ``heads[m - 1]``.

    Example:
        >>> wrapper = MultiHeadAttentionWrapper(3, 2, 6, dropout=0.0, num_heads=2)
        >>> wrapper(torch.rand(1, 6, 3)).shape
        torch.Size([1, 6, 4])
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads,
                 qkv_bias=False):
        super().__init__()
        args = validate_attention_args(
            d_in, d_out, context_length, dropout, qkv_bias, num_heads,
            d_out_hint="In the wrapper d_out is the width of each head.",
            d_out_per_head=True,
        )
        self.d_in, self.d_out = args.d_in, args.d_out  # d_out: one head's width
        self.num_heads = args.num_heads
        self.context_length = args.context_length
        # Each head is a complete CausalAttention with weights of its own:
        # nothing is shared.
        self.heads = nn.ModuleList(
            CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
            for _ in range(self.num_heads)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run every head on ``x`` and concatenate their outputs.

        ``(B, T, d_in) -> (B, T, num_heads * d_out)``.
        """
        validate_input(x, self.d_in, self.context_length,
                       like=self.heads[0].W_query.weight)
        # The merge: the only place where the heads' paths meet.
        outputs = [head(x) for head in self.heads]  # h x (B, T, d_out)
        return torch.cat(outputs, dim=-1)  # (B, T, num_heads * d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, shape ``(B, num_heads, T, T)``.

        Example:
            >>> wrapper = MultiHeadAttentionWrapper(3, 2, 6, dropout=0.0,
            ...                                     num_heads=2)
            >>> wrapper.attention_weights(torch.rand(1, 4, 3)).shape
            torch.Size([1, 2, 4, 4])
        """
        validate_input(x, self.d_in, self.context_length,
                       like=self.heads[0].W_query.weight)
        weights = [head.attention_weights(x) for head in self.heads]
        return torch.stack(weights, dim=1)  # (B, num_heads, T, T)
