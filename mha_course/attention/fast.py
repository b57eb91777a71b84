"""Stage 4 of the course: the batched module on PyTorch's fused attention kernel.

``FastMultiHeadAttention`` computes exactly what :class:`MultiHeadAttention` computes, organised
for speed in two ways:

* one fused projection ``qkv`` of width ``3 * d_out`` replaces the separate query, key and value
  projections, so the input is read once and one large matrix product replaces three;
* the middle of attention (scores, scale, causal mask, softmax, dropout, weighted sum) is one
  call to ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal=True`` (or, for a
  padded batch, the causal and padding masks combined by :func:`with_padding`). PyTorch
  picks its kernel by device, dtype and arguments. Its fused kernels work through the score
  matrix tile by tile, so the ``(batch, heads, tokens, tokens)`` score tensor is never stored
  whole, and some skip the tiles that lie entirely in the masked future; its fallback ("math")
  kernel computes the scores as the textbook module does and stores them.

As in nanoGPT, the explicit computation stays beside the fused one in the same ``forward``
(``use_sdpa = False`` selects it), so the two can be compared; ``attention_weights`` always uses
it, because the fused kernel never materialises the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import validate_attention_args, validate_input
from .heads import captured_attention_weights, merge_heads, score_dtype, split_heads, stack_qkv, unstack_qkv
from .masking import call_mask, causal_mask, safe_softmax
from .multihead import MultiHeadAttention, not_a_multihead


class FastMultiHeadAttention(nn.Module):
    """Causal multi-head attention with a fused QKV projection and PyTorch's fused kernel.

    The constructor takes the same arguments as :class:`MultiHeadAttention`; the parameters are
    the same in number, arranged differently (``qkv.weight`` is the three projections stacked).

    Args:
        d_in: width of each input token vector.
        d_out: total width of the output, split across heads (``head_dim = d_out // num_heads``).
        context_length: the longest sequence the module accepts.
        dropout: probability of zeroing an attention weight while training (applied inside the
            fused kernel, and only in training mode).
        num_heads: how many heads; must divide ``d_out``.
        qkv_bias: whether the fused query/key/value projection has a bias.

    Attributes:
        use_sdpa: ``True`` (default) runs ``scaled_dot_product_attention``; ``False`` runs the
            same fused projection followed by the explicit score/mask/softmax computation, for
            comparison.

    Shapes:
        input ``(batch, num_tokens, d_in)`` -> output ``(batch, num_tokens, d_out)``; the optional
        ``attention_mask`` of ``forward`` is ``(batch, num_tokens)``, 1 for real tokens and 0 for
        padding, as for :class:`MultiHeadAttention`; a query that sees no key gets a context vector
        of 0 on both paths.

    Conversions: :meth:`from_multihead` stacks a ``MultiHeadAttention``'s weights into ``qkv``;
    :meth:`MultiHeadAttention.from_fast` cuts them back.

    Example:
        >>> fast = FastMultiHeadAttention(3, 4, context_length=6, dropout=0.0, num_heads=2)
        >>> fast(torch.rand(1, 6, 3)).shape
        torch.Size([1, 6, 4])
    """

    #: Run the fused kernel (True) or the explicit computation (False).
    use_sdpa: bool = True

    def __init__(self, d_in, d_out, context_length, dropout, num_heads,
                 qkv_bias=False):
        super().__init__()
        args = validate_attention_args(
            d_in, d_out, context_length, dropout, qkv_bias, num_heads,
            d_out_hint="As in MultiHeadAttention, d_out is all heads' width.",
        )
        self.d_in, self.d_out = args.d_in, args.d_out
        self.num_heads, self.head_dim = args.num_heads, args.head_dim
        self.context_length = args.context_length
        # qkv's output columns 0 to d_out - 1 are queries, the next d_out keys,
        # the last d_out values; in each block head m (from 1) owns columns
        # (m - 1) * head_dim to m * head_dim - 1, as in MultiHeadAttention.
        self.qkv = nn.Linear(self.d_in, 3 * self.d_out, bias=args.qkv_bias)
        self.out_proj = nn.Linear(self.d_out, self.d_out)
        self.dropout = nn.Dropout(args.dropout)
        # No mask buffer: is_causal=True gives the kernel the causal pattern,
        # and the explicit path builds the mask on the fly. context_length
        # still bounds the input: a drop-in for MultiHeadAttention.

    def forward(self, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """Fused projection and attention: ``(B, T, d_in) -> (B, T, d_out)``."""
        validate_input(x, self.d_in, self.context_length, like=self.qkv.weight,
                       attention_mask=attention_mask)
        qkv = self.qkv(x)  # (B, T, 3*d_out): one product for all three roles
        # Each (B, h, T, d_h): views of qkv, nothing copied.
        queries, keys, values = (split_heads(t, self.num_heads)
                                 for t in unstack_qkv(qkv, dim=-1))
        mask = call_mask(x, attention_mask=attention_mask)  # None unless padded
        if self.use_sdpa:
            # Dropout only in training: in eval mode the kernel must drop
            # nothing, and it does not know the module's mode by itself.
            p = self.dropout.p if self.training else 0.0
            context = F.scaled_dot_product_attention(  # its mask: True = see
                queries, keys, values, dropout_p=p, is_causal=mask is None,
                attn_mask=None if mask is None else ~mask,
            )  # (B, h, T, d_h); the scale defaults to 1/sqrt(d_h)
        else:  # the same, step by step (scores in float32 for float16)
            dtype = score_dtype(queries.dtype)
            queries = queries.to(dtype) * self.head_dim**-0.5
            scores = queries @ keys.to(dtype).transpose(2, 3)  # (B, h, T, T)
            mask = causal_mask(x.shape[1], x.device) if mask is None else mask
            weights = safe_softmax(scores, mask).to(values.dtype)  # 0: no key
            context = self.dropout(weights) @ values  # (B, h, T, d_h)
        return self.out_proj(merge_heads(context))  # (B, T, d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, shape (B, h, T, T).

        Computed the explicit way (the fused kernel never returns them),
        without dropout, so each row sums to one. Meant for plots and checks
        at small sizes.

        Example:
            >>> fast = FastMultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
            >>> fast.attention_weights(torch.rand(1, 5, 3)).shape
            torch.Size([1, 2, 5, 5])
            >>> fast.use_sdpa  # unchanged: the fused kernel still runs forward
            True
        """
        use_sdpa, self.use_sdpa = self.use_sdpa, False
        try:
            return captured_attention_weights(self, x)
        finally:
            self.use_sdpa = use_sdpa

    @classmethod
    @torch.no_grad()
    def from_multihead(cls, mha: MultiHeadAttention) -> FastMultiHeadAttention:
        """A ``FastMultiHeadAttention`` that computes what ``mha`` does.

        The query, key and value weights (and biases) are stacked into ``qkv``; the output projection
        and the dropout probability are copied; device, dtype and training mode follow ``mha``.

        Example:
            >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
            >>> fast = FastMultiHeadAttention.from_multihead(mha)
            >>> x = torch.rand(2, 6, 3)
            >>> torch.allclose(fast(x), mha(x), atol=1e-6)
            True
        """
        error = not_a_multihead(mha, "FastMultiHeadAttention.from_multihead")
        if error:
            raise error
        weight = mha.W_query.weight
        fast = cls(mha.d_in, mha.d_out, mha.context_length, mha.dropout.p, mha.num_heads,
                   qkv_bias=mha.W_query.bias is not None).to(device=weight.device, dtype=weight.dtype)
        fast.qkv.weight.copy_(stack_qkv(mha.W_query.weight, mha.W_key.weight, mha.W_value.weight))
        if fast.qkv.bias is not None:
            fast.qkv.bias.copy_(stack_qkv(mha.W_query.bias, mha.W_key.bias, mha.W_value.bias))
        fast.out_proj.load_state_dict(mha.out_proj.state_dict())
        return fast.train(mha.training)
