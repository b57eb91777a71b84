"""Stage 4 of the course: the batched module on PyTorch's fused attention kernel.

``FastMultiHeadAttention`` computes exactly what :class:`MultiHeadAttention` computes, organised
for speed in two ways:

* one fused projection ``qkv`` of width ``3 * d_out`` replaces the separate query, key and value
  projections, so the input is read once and one large matrix product replaces three;
* the middle of attention (scores, scale, causal mask, softmax, dropout, weighted sum) is one
  call to ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal=True``. PyTorch
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

from ._validation import validate_bool, validate_divisible, validate_dropout, validate_input, validate_positive_int
from .heads import merge_heads, split_heads, stack_qkv, unstack_qkv
from .masking import causal_mask
from .multihead import MultiHeadAttention


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
        input ``(batch, num_tokens, d_in)`` -> output ``(batch, num_tokens, d_out)``.

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
        self.d_in = validate_positive_int("d_in", d_in)
        self.d_out = validate_positive_int(
            "d_out", d_out,
            hint="As in MultiHeadAttention, d_out is all heads' width.",
        )
        self.num_heads = validate_positive_int("num_heads", num_heads)
        self.context_length = validate_positive_int(
            "context_length", context_length)
        self.head_dim = validate_divisible(self.d_out, self.num_heads)
        qkv_bias = validate_bool("qkv_bias", qkv_bias)
        # Rows [0, d_out) compute queries, [d_out, 2*d_out) keys and
        # [2*d_out, 3*d_out) values; within each block head h owns rows
        # [h*head_dim, (h+1)*head_dim), as in MultiHeadAttention.
        self.qkv = nn.Linear(self.d_in, 3 * self.d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(self.d_out, self.d_out)
        self.dropout = nn.Dropout(validate_dropout(dropout))
        # No mask buffer: is_causal=True gives the kernel the causal pattern,
        # and the explicit path builds the (T, T) mask on the fly.
        # context_length still bounds the accepted input, so the module is a
        # drop-in replacement for MultiHeadAttention.

    def _queries_keys_values(self, x: torch.Tensor):
        """Queries, keys and values, (B, h, T, d_h) each, by one product."""
        validate_input(x, self.d_in, self.context_length, like=self.qkv.weight)
        qkv = self.qkv(x)  # (B, T, 3*d_out): one product for all three roles
        # Each (B, T, d_out): views of qkv, nothing copied.
        queries, keys, values = unstack_qkv(qkv, dim=-1)
        # Each (B, h, T, d_h); split_heads only changes strides, so nothing
        # is copied here either.
        return tuple(split_heads(t, self.num_heads)
                     for t in (queries, keys, values))

    def _explicit_weights(self, queries, keys) -> torch.Tensor:
        """The attention weights (B, h, T, T), step by step."""
        num_tokens = queries.shape[2]
        queries = queries * self.head_dim**-0.5
        scores = queries @ keys.transpose(2, 3)  # (B, h, T, T)
        mask = causal_mask(num_tokens, device=scores.device)  # (T, T)
        scores.masked_fill_(mask, float("-inf"))
        return torch.softmax(scores, dim=-1)  # (B, h, T, T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fused projection, fused attention, merge, output projection.

        ``(B, T, d_in) -> (B, T, d_out)``.
        """
        # Validates x; each of the three is (B, h, T, d_h).
        queries, keys, values = self._queries_keys_values(x)
        if self.use_sdpa:
            # Dropout only in training: in eval mode the kernel must drop
            # nothing, and it does not know the module's mode by itself.
            p = self.dropout.p if self.training else 0.0
            context = F.scaled_dot_product_attention(
                queries, keys, values, dropout_p=p, is_causal=True
            )  # (B, h, T, d_h); the scale defaults to 1/sqrt(d_h)
        else:
            weights = self._explicit_weights(queries, keys)  # (B, h, T, T)
            context = self.dropout(weights) @ values  # (B, h, T, d_h)
        return self.out_proj(merge_heads(context))  # (B, T, d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, shape (B, h, T, T).

        Computed the explicit way (the fused kernel never returns them),
        without dropout, so each row sums to one. Meant for plots and checks
        at small sizes.
        """
        queries, keys, _ = self._queries_keys_values(x)
        return self._explicit_weights(queries, keys)

    @classmethod
    def from_multihead(cls, mha: MultiHeadAttention):
        """A ``FastMultiHeadAttention`` that computes what ``mha`` does.

        The query, key and value weights (and biases) are stacked into
        ``qkv``; the output projection and the dropout probability are
        copied; device, dtype and training mode follow ``mha``.

        Example:
            >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
            >>> fast = FastMultiHeadAttention.from_multihead(mha)
            >>> x = torch.rand(2, 6, 3)
            >>> torch.allclose(fast(x), mha(x), atol=1e-6)
            True
        """
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(
                "mha must be a MultiHeadAttention, got "
                f"{type(mha).__name__}. "
                "For a MultiHeadAttentionWrapper, convert it first: "
                "FastMultiHeadAttention.from_multihead("
                "MultiHeadAttention.from_wrapper(wrapper))."
            )
        weight = mha.W_query.weight
        fast = cls(
            mha.d_in, mha.d_out, mha.context_length, mha.dropout.p,
            mha.num_heads, qkv_bias=mha.W_query.bias is not None,
        ).to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            fast.qkv.weight.copy_(stack_qkv(
                mha.W_query.weight, mha.W_key.weight, mha.W_value.weight))
            if fast.qkv.bias is not None:
                fast.qkv.bias.copy_(stack_qkv(
                    mha.W_query.bias, mha.W_key.bias, mha.W_value.bias))
            fast.out_proj.load_state_dict(mha.out_proj.state_dict())
        return fast.train(mha.training)
