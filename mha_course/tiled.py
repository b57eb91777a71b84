"""Attention without the score matrix: the tiled loop with an online softmax (chapter 7).

The textbook computation stores every head's ``(T, T)`` scores before the softmax reads them.
:func:`tiled_attention` gets the same numbers while holding only one ``block_size x block_size``
tile of scores at a time. It walks the keys and values in blocks and keeps, for every query row,

* a **running maximum** ``m`` of the scores seen so far (so ``exp`` never overflows),
* a **running sum** ``l`` of their exponentials (the softmax's denominator), and
* an **accumulator** of the exponential-weighted values (its numerator),

and rescales the sum and the accumulator by ``exp(m_old - m_new)`` whenever the maximum grows.
Dividing the accumulator by the sum at the end gives exactly ``softmax(scores) @ values``. This
is the online softmax of Milakov and Gimelshein (2018), used for attention in O(T) memory by
Rabe and Staats (2021) and by FlashAttention (Dao et al., 2022), whose compiled kernels
``torch.nn.functional.scaled_dot_product_attention`` runs. Under the causal mask a tile that lies
wholly above the diagonal would be masked entirely, so the loop never computes it.

:class:`TiledMultiHeadAttention` is :class:`~mha_course.MultiHeadAttention` with this loop in the
middle of ``forward``.
"""

from __future__ import annotations

import torch

from ._validation import validate_bool, validate_input, validate_positive_int
from .heads import merge_heads, split_heads
from .multihead import MultiHeadAttention


def tiled_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    block_size: int = 64, causal: bool = True) -> torch.Tensor:
    """Scaled dot-product attention, one tile of scores at a time, with an online softmax.

    Equal, up to rounding, to ``torch.nn.functional.scaled_dot_product_attention(queries, keys,
    values, is_causal=causal)``, gradients included, for any sequence length (a multiple of
    ``block_size`` or not); no tensor of shape ``(T, T)`` is ever built.

    Args:
        queries: ``(batch, num_heads, num_tokens, head_dim)``.
        keys: the same shape as ``queries`` (as many keys as queries).
        values: ``(batch, num_heads, num_tokens, value_dim)``; ``value_dim`` is usually ``head_dim``.
        block_size: how many queries, and how many keys, one tile holds.
        causal: mask the future (position ``j > i``), and skip the tiles that lie wholly in it.

    Returns:
        ``(batch, num_heads, num_tokens, value_dim)``.

    Example:
        >>> import torch.nn.functional as F
        >>> q, k, v = torch.randn(3, 2, 4, 10, 8).unbind(0)  # (B, h, T, d_h) each
        >>> out = tiled_attention(q, k, v, block_size=4)  # tiles of 4 x 4 scores
        >>> out.shape, torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
        (torch.Size([2, 4, 10, 8]), True)
    """
    block_size = validate_tiled_arguments(queries, keys, values, block_size, causal)
    return tiled_loop(queries, keys, values, block_size, causal)


def tiled_loop(queries, keys, values, block_size, causal):
    """The loop of :func:`tiled_attention`, its arguments already checked."""
    num_tokens, head_dim = queries.shape[-2:]
    queries = queries * head_dim**-0.5  # scale once, as MultiHeadAttention does
    positions = torch.arange(num_tokens, device=queries.device)
    outputs = []
    for q_start in range(0, num_tokens, block_size):  # one block of query rows
        q = queries[:, :, q_start:q_start + block_size]  # (B, h, T_b, d_h)
        rows = positions[q_start:q_start + block_size]  # (T_b,)
        row_max = q.new_full((*q.shape[:-1], 1), -torch.inf)  # (B, h, T_b, 1)
        row_sum = q.new_zeros(*q.shape[:-1], 1)  # (B, h, T_b, 1)
        acc = q.new_zeros(*q.shape[:-1], values.shape[-1])  # (B, h, T_b, d_v)
        # Causal: the keys after this block's last row are all masked: skip.
        k_stop = q_start + q.shape[2] if causal else num_tokens
        for k_start in range(0, k_stop, block_size):  # one tile of scores
            k = keys[:, :, k_start:k_start + block_size]  # (B, h, T_b, d_h)
            v = values[:, :, k_start:k_start + block_size]  # (B, h, T_b, d_v)
            scores = q @ k.transpose(2, 3)  # (B, h, T_b, T_b): one tile
            if causal and k_start + k.shape[2] - 1 > q_start:  # diagonal cuts
                cols = positions[k_start:k_start + block_size]  # (T_b,)
                future = cols[None, :] > rows[:, None]  # (T_b, T_b)
                scores = scores.masked_fill(future, -torch.inf)
            new_max = torch.maximum(row_max, scores.amax(-1, keepdim=True))
            weights = torch.exp(scores - new_max)  # (B, h, T_b, T_b), each <= 1
            rescale = torch.exp(row_max - new_max)  # (B, h, T_b, 1), 0 at first
            row_sum = row_sum * rescale + weights.sum(-1, keepdim=True)
            acc = acc * rescale + weights @ v  # (B, h, T_b, d_v)
            row_max = new_max
        outputs.append(acc / row_sum)  # (B, h, T_b, d_v): softmax @ values
    return torch.cat(outputs, dim=2)  # (B, h, T, d_v)


#: What the causal loop does with a tile (see :func:`tile_kind`).
COMPUTED, CUT, SKIPPED = "computed", "cut", "skipped"


def tile_kind(q_start: int, k_start: int, block_size: int, num_tokens: int) -> str:
    """What the causal loop does with the tile of queries and keys starting at ``q_start`` and ``k_start``.

    ``"skipped"``: every key comes after every query of the tile, so every score would be masked
    and the loop never computes it; ``"cut"``: the diagonal runs through the tile, which is
    computed and then masked where a key comes after its query; ``"computed"``: every key is at
    or before every query, nothing to mask. Tiles hold ``block_size`` positions, fewer at the end.

    Example:
        >>> [tile_kind(4, k, 4, 10) for k in (0, 4, 8)]
        ['computed', 'cut', 'skipped']
        >>> tile_kind(3, 3, 1, 10)  # a 1 x 1 tile on the diagonal: a token sees itself
        'computed'
    """
    last_row = min(q_start + block_size, num_tokens) - 1
    last_col = min(k_start + block_size, num_tokens) - 1
    if k_start > last_row:
        return SKIPPED
    return CUT if last_col > q_start else COMPUTED


def validate_tiled_arguments(queries, keys, values, block_size, causal) -> int:
    """Check the arguments of :func:`tiled_attention`; return ``block_size`` as an ``int``.

    Example:
        >>> q = torch.zeros(1, 1, 3, 2)
        >>> validate_tiled_arguments(q, q, q, 0, True)
        Traceback (most recent call last):
            ...
        ValueError: block_size must be a positive integer, got 0. Pass a whole number of at least 1. It is how many queries and keys one tile holds, e.g. block_size=64.
    """
    hint = "It is how many queries and keys one tile holds, e.g. block_size=64."
    block_size = validate_positive_int("block_size", block_size, hint=hint)
    validate_bool("causal", causal)
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must be a 4-D tensor (batch, num_heads, num_tokens, head_dim), got {got}. "
                "Split the heads first: split_heads(x, num_heads).")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}. Convert it with .float().")
    if keys.shape != queries.shape:
        raise ValueError(
            f"keys {tuple(keys.shape)} must have the shape of queries {tuple(queries.shape)}: the same "
            "batch, heads and head_dim, and as many keys as queries (a causal self-attention).")
    if values.shape[:-1] != keys.shape[:-1]:
        raise ValueError(
            f"values {tuple(values.shape)} must match keys {tuple(keys.shape)} in batch, heads and "
            "num_tokens: one value per key.")
    if len({t.dtype for t in (queries, keys, values)}) > 1 or len({t.device for t in (queries, keys, values)}) > 1:
        raise TypeError(
            f"queries, keys and values must share dtype and device, got {queries.dtype} on {queries.device}, "
            f"{keys.dtype} on {keys.device} and {values.dtype} on {values.device}. Convert them with .to(queries).")
    return block_size


class TiledMultiHeadAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` whose middle is :func:`tiled_attention`: no ``(T, T)`` scores.

    The same constructor, weights and ``state_dict`` as :class:`MultiHeadAttention`, plus
    ``block_size``; the projections, the merge of the heads and the output projection are its own.
    The loop applies no dropout, so a module with ``dropout > 0`` runs only in eval mode.

    Example:
        >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
        >>> tiled = TiledMultiHeadAttention.from_multihead(mha, block_size=2)
        >>> x = torch.rand(2, 5, 3)
        >>> torch.allclose(tiled(x), mha(x), atol=1e-6)
        True
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, block_size=64):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias=qkv_bias)
        self.block_size = validate_positive_int(
            "block_size", block_size, hint="It is how many queries and keys one tile holds, e.g. block_size=64.")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_in) -> (B, T, d_out): the projections around the tiled loop."""
        validate_input(x, self.d_in, self.context_length, like=self.W_query.weight)
        if self.training and self.dropout.p > 0:
            raise RuntimeError(
                f"TiledMultiHeadAttention applies no dropout, but this module has dropout={self.dropout.p} "
                "and is in training mode. Call .eval() first, or build it with dropout=0.0.")
        h = self.num_heads
        queries = split_heads(self.W_query(x), h)  # (B, h, T, d_h)
        keys = split_heads(self.W_key(x), h)  # (B, h, T, d_h)
        values = split_heads(self.W_value(x), h)  # (B, h, T, d_h)
        context = tiled_loop(queries, keys, values, self.block_size, causal=True)  # (B, h, T, d_h)
        return self.out_proj(merge_heads(context))  # (B, T, d_out)

    @classmethod
    def from_multihead(cls, mha: MultiHeadAttention, block_size: int = 64):
        """A ``TiledMultiHeadAttention`` with ``mha``'s weights, device, dtype and training mode."""
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(f"mha must be a MultiHeadAttention, got {type(mha).__name__}.")
        weight = mha.W_query.weight
        tiled = cls(mha.d_in, mha.d_out, mha.context_length, mha.dropout.p, mha.num_heads,
                    qkv_bias=mha.W_query.bias is not None, block_size=block_size)
        tiled = tiled.to(device=weight.device, dtype=weight.dtype)
        tiled.load_state_dict(mha.state_dict())
        return tiled.train(mha.training)
