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
Rabe and Staats (2021) and by FlashAttention (Dao et al., 2022; Dao, 2023), whose loop order this
follows: an outer loop over blocks of queries, the division once at the end. Under the causal
mask a tile that lies wholly above the diagonal would be masked entirely, so the loop never
computes it. A sliding window (chapter 11) hides the keys that are ``window`` or more positions
before their query as well, and the loop skips the tiles wholly outside it too, as FlashAttention's
local attention does: the work of a long sequence then grows with ``T * window``, not ``T**2``.

The backward pass is written too (:class:`TiledAttention`): the forward keeps the inputs, the
output and one log-sum-exp per query row, and the backward recomputes each tile's probabilities
from them, so that training, like inference, never holds a ``(T, T)`` tensor.

:class:`TiledMultiHeadAttention` is :class:`~mha_course.MultiHeadAttention` with this loop in the
middle of ``forward``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ._validation import (validate_attention_mask, validate_bool, validate_input, validate_positive_int,
                          validate_window)
from .heads import captured_attention_weights, merge_heads, score_dtype, split_heads
from .multihead import MultiHeadAttention, not_a_multihead


def tiled_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    block_size: int = 64, causal: bool = True,
                    attention_mask: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """Scaled dot-product attention, one tile of scores at a time, with an online softmax.

    Equal, up to rounding, to ``torch.nn.functional.scaled_dot_product_attention(queries, keys,
    values, is_causal=causal)``, gradients included, for any sequence length (a multiple of
    ``block_size`` or not); no tensor of shape ``(T, T)`` is ever built, in the forward pass or in
    the backward (``TiledAttention``). Half-precision inputs are computed in float32 throughout
    and the result is returned in their dtype (PyTorch's kernels round the probabilities to the
    half-precision type before the product with the values: this loop is the more accurate).

    Args:
        queries: ``(batch, num_heads, num_tokens, head_dim)``.
        keys: the same shape as ``queries`` (as many keys as queries).
        values: ``(batch, num_heads, num_tokens, value_dim)``; ``value_dim`` is usually ``head_dim``.
        block_size: how many queries, and how many keys, one tile holds.
        causal: mask the future (position ``j > i``), and skip the tiles that lie wholly in it.
        attention_mask: ``None``, or a padding mask ``(batch, num_tokens)``, 1 (or ``True``) for a real
            key and 0 for padding, hidden from every query. A query left with no key to see (a
            padded one, at the start of a left-padded sequence) gets an output of 0 and gradients of
            0, as ``scaled_dot_product_attention`` gives it.
        window: ``None``, or a sliding window under the causal mask: query ``i`` sees key ``j`` when
            ``0 <= i - j < window``, and the tiles wholly outside the window are skipped. Equal to
            ``scaled_dot_product_attention`` with that mask (:func:`~mha_course.causal_mask` with
            ``window``), gradients included.

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
    window = validate_window(window)
    if window is not None and not causal:
        raise ValueError(f"window={window} needs causal=True: the sliding window is a band under the causal "
                         "mask, key j visible from query i when 0 <= i - j < window.")
    real = None if attention_mask is None else validate_attention_mask(
        attention_mask, queries.shape[0], queries.shape[2], queries.device)  # (B, T), True: real
    if queries.shape[2] == 0:  # no tokens: an empty result, as the other modules give
        return values.clone()
    return TiledAttention.apply(queries, keys, values, block_size, causal, real, window)


def key_starts(q_start: int, q_stop: int, num_tokens: int, block_size: int, causal: bool,
               window: int | None = None) -> range:
    """Where the blocks of keys start that the queries ``q_start:q_stop`` meet: under the causal mask
    none after the block's last query, with a window none wholly before the first query's window
    (those tiles are skipped), otherwise every block.

    Example:
        >>> list(key_starts(4, 8, 10, 4, causal=True)), list(key_starts(4, 8, 10, 4, causal=False))
        ([0, 4], [0, 4, 8])
        >>> list(key_starts(8, 12, 12, 2, causal=True, window=3))  # keys 6 to 11, in blocks of 2
        [6, 8, 10]
    """
    first = 0  # with a window, the block of the first query's oldest key
    if window is not None:
        first = max(0, q_start - window + 1) // block_size * block_size
    return range(first, q_stop if causal else num_tokens, block_size)


def tile_scores(q: torch.Tensor, keys: torch.Tensor, q_start: int,
                k_start: int, block_size: int, causal: bool,
                real: torch.Tensor | None = None,
                window: int | None = None) -> torch.Tensor:
    """One tile of scaled scores, ``(B, h, T_q, T_k)``: the queries ``q``
    (from position ``q_start``) against the block of ``keys`` from
    ``k_start``, with ``-inf`` where a key comes after its query, lies
    ``window`` or more positions before it, or is padding (``real``,
    ``(B, T)``, ``False``).

    Example:
        >>> q, k = torch.ones(1, 1, 2, 4), torch.ones(1, 1, 6, 4)
        >>> tile_scores(q, k, 2, 2, 2, causal=True)[0, 0]  # scaled: 4 / 2
        tensor([[2., -inf],
                [2., 2.]])
    """
    k = keys[:, :, k_start:k_start + block_size]  # (B, h, T_k, d_h)
    scores = (q @ k.transpose(2, 3)) * q.shape[-1] ** -0.5  # (B, h, T_q, T_k)
    rows = torch.arange(q_start, q_start + q.shape[2], device=q.device)[:, None]
    cols = torch.arange(k_start, k_start + k.shape[2], device=q.device)
    if causal and k_start + k.shape[2] - 1 > q_start:  # the diagonal cuts it
        scores = scores.masked_fill(cols > rows, -torch.inf)
    if window is not None and q_start + q.shape[2] - 1 - k_start >= window:
        too_old = rows - cols >= window  # the window's edge cuts the tile
        scores = scores.masked_fill(too_old, -torch.inf)
    if real is not None:  # padded keys: hidden from every query
        padded = ~real[:, None, None, k_start:k_start + k.shape[2]]  # B,1,1,T_k
        scores = scores.masked_fill(padded, -torch.inf)
    return scores


class TiledAttention(torch.autograd.Function):
    """The tiled loop with a backward pass of its own, as FlashAttention writes it.

    The forward pass saves the inputs, the output ``O`` and one log-sum-exp per query row,
    ``L_i = m_i + log(l_i)``; the backward recomputes each tile's probabilities
    ``P = exp(S - L)`` from them instead of keeping every tile's intermediates, and skips the same
    causal tiles and those outside the window. A row that sees no key gets ``O = 0`` and ``L = +inf``, so that its ``P`` is 0
    (FlashAttention-2's rule). Both passes loop over blocks of queries outside and blocks of keys
    inside. Call it through :func:`tiled_attention`, which checks the arguments.
    """

    @staticmethod
    def forward(ctx, queries, keys, values, block_size, causal, real, window):
        dtype = score_dtype(queries.dtype)  # float32 for half precision
        q_all, k_all, v_all = (t.to(dtype) for t in (queries, keys, values))
        batch, heads, num_tokens, _ = queries.shape
        out = values.new_empty(batch, heads, num_tokens, values.shape[-1])
        lse = q_all.new_empty(batch, heads, num_tokens, 1)  # (B, h, T, 1)
        for q_start in range(0, num_tokens, block_size):  # a block of queries
            rows = slice(q_start, q_start + block_size)
            q = q_all[:, :, rows]  # (B, h, T_b, d_h)
            row_max = q.new_full((*q.shape[:-1], 1), -torch.inf)  # (B, h, T_b, 1)
            row_sum = q.new_zeros(*q.shape[:-1], 1)  # (B, h, T_b, 1)
            acc = q.new_zeros(*q.shape[:-1], values.shape[-1])  # (B, h, T_b, d_v)
            for k_start in key_starts(q_start, q_start + q.shape[2], num_tokens,
                                      block_size, causal, window):  # one tile
                scores = tile_scores(q, k_all, q_start, k_start, block_size,
                                     causal, real, window)
                v = v_all[:, :, k_start:k_start + block_size]  # (B, h, T_b, d_v)
                new_max = torch.maximum(row_max, scores.amax(-1, keepdim=True))
                # A row masked whole so far keeps max -inf: subtract 0 there,
                # since exp(-inf - (-inf)) is NaN.
                safe_max = new_max.masked_fill(new_max == -torch.inf, 0.0)
                weights = torch.exp(scores - safe_max)  # (B, h, T_b, T_b)
                rescale = torch.exp(row_max - safe_max)  # (B, h, T_b, 1)
                row_sum = row_sum * rescale + weights.sum(-1, keepdim=True)
                acc = acc * rescale + weights @ v  # (B, h, T_b, d_v)
                row_max = new_max
            # No key seen: sum 0, acc 0; output 0, not 0/0, and L = +inf (P = 0)
            empty = row_sum == 0  # (B, h, T_b, 1)
            out[:, :, rows] = acc / row_sum.masked_fill(empty, 1.0)  # softmax @ V
            lse[:, :, rows] = (row_max + torch.log(row_sum)).masked_fill(
                empty, torch.inf)  # log sum_j e^s_ij
        ctx.save_for_backward(queries, keys, values, out, lse)
        ctx.block_size, ctx.causal, ctx.real = block_size, causal, real
        ctx.window = window
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        queries, keys, values, out, lse = ctx.saved_tensors
        block_size, causal, real = ctx.block_size, ctx.causal, ctx.real
        window = ctx.window
        num_tokens = queries.shape[2]
        q_all, k_all, v_all, d_out = (t.to(lse.dtype)
                                      for t in (queries, keys, values, grad_out))
        # D_i = sum_c dO_ic O_ic, which equals sum_j P_ij dP_ij: one per row.
        D = (d_out * out.to(lse.dtype)).sum(-1, keepdim=True)  # (B, h, T, 1)
        dq, dk, dv = (torch.zeros_like(t) for t in (q_all, k_all, v_all))
        scale = queries.shape[-1] ** -0.5
        for q_start in range(0, num_tokens, block_size):  # a block of queries
            rows = slice(q_start, q_start + block_size)
            q, do = q_all[:, :, rows], d_out[:, :, rows]  # (B, h, T_b, d_h|d_v)
            for k_start in key_starts(q_start, q_start + q.shape[2], num_tokens,
                                      block_size, causal, window):  # the same tiles
                cols = slice(k_start, k_start + block_size)
                scores = tile_scores(q, k_all, q_start, k_start, block_size,
                                     causal, real, window)
                p = torch.exp(scores - lse[:, :, rows])  # P recomputed from L
                dv[:, :, cols] += p.transpose(2, 3) @ do  # dV = P^T dO
                dp = do @ v_all[:, :, cols].transpose(2, 3)  # dP = dO V^T
                ds = p * (dp - D[:, :, rows]) * scale  # dS, through the scale
                dq[:, :, rows] += ds @ k_all[:, :, cols]  # dQ = dS K
                dk[:, :, cols] += ds.transpose(2, 3) @ q  # dK = dS^T Q
        return (dq.to(queries.dtype), dk.to(keys.dtype), dv.to(values.dtype),
                None, None, None, None)


#: What the causal loop does with a tile (see :func:`tile_kind`).
COMPUTED, CUT, SKIPPED = "computed", "cut", "skipped"


def tile_kind(q_start: int, k_start: int, block_size: int, num_tokens: int, window: int | None = None) -> str:
    """What the causal loop does with the tile of queries and keys starting at ``q_start`` and ``k_start``.

    ``"skipped"``: every key comes after every query of the tile, or (with a ``window``) lies
    ``window`` or more positions before every query, so every score would be masked and the loop
    never computes it; ``"cut"``: the diagonal or the window's edge runs through the tile, which is
    computed and then masked where a key is hidden; ``"computed"``: every key is visible from every
    query, nothing to mask. Tiles hold ``block_size`` positions, fewer at the end.

    Example:
        >>> [tile_kind(4, k, 4, 10) for k in (0, 4, 8)]
        ['computed', 'cut', 'skipped']
        >>> tile_kind(3, 3, 1, 10)  # a 1 x 1 tile on the diagonal: a token sees itself
        'computed'
        >>> [tile_kind(8, k, 2, 12, window=3) for k in (4, 6, 8)]  # queries 8, 9 see keys 6 to 9
        ['skipped', 'cut', 'cut']
    """
    last_row = min(q_start + block_size, num_tokens) - 1
    last_col = min(k_start + block_size, num_tokens) - 1
    if k_start > last_row or (window is not None and q_start - last_col >= window):
        return SKIPPED
    too_old = window is not None and last_row - k_start >= window
    return CUT if last_col > q_start or too_old else COMPUTED


def tile_counts(num_tokens: int, block_size: int, window: int | None = None) -> dict[str, int]:
    """How many tiles of the causal loop are computed whole, cut, and skipped: :func:`tile_kind` of each.

    Example:
        >>> tile_counts(16, 4), tile_counts(16, 4, window=4)
        ({'computed': 6, 'cut': 4, 'skipped': 6}, {'computed': 0, 'cut': 7, 'skipped': 9})
    """
    counts = dict.fromkeys((COMPUTED, CUT, SKIPPED), 0)
    for q_start in range(0, num_tokens, block_size):
        for k_start in range(0, num_tokens, block_size):
            counts[tile_kind(q_start, k_start, block_size, num_tokens, window)] += 1
    return counts


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
    ``tiled = False`` runs :class:`MultiHeadAttention`'s explicit computation instead, and
    ``attention_weights`` always does, since the loop never holds the weights whole. ``forward(x,
    attention_mask)`` takes the padding mask of :class:`MultiHeadAttention`, with the same rule for a
    query that sees no key (output ``out_proj``'s bias, gradients 0). Made from a trained
    ``MultiHeadAttention`` by :meth:`from_multihead`.

    Example:
        >>> mha = MultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2)
        >>> tiled = TiledMultiHeadAttention.from_multihead(mha, block_size=2)
        >>> x = torch.rand(2, 5, 3)
        >>> torch.allclose(tiled(x), mha(x), atol=1e-6)
        True
    """

    #: Run the tiled loop (True) or MultiHeadAttention's explicit computation (False).
    tiled: bool = True

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, block_size=64):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias=qkv_bias)
        self.block_size = validate_positive_int(
            "block_size", block_size, hint="It is how many queries and keys one tile holds, e.g. block_size=64.")

    def forward(self, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(B, T, d_in) -> (B, T, d_out): the projections around the tiled loop."""
        if not self.tiled:  # the explicit computation, for comparison
            return super().forward(x, attention_mask)
        validate_input(x, self.d_in, self.context_length, like=self.W_query.weight,
                       attention_mask=attention_mask)
        if self.training and self.dropout.p > 0:
            raise RuntimeError(
                f"TiledMultiHeadAttention applies no dropout, but this module has dropout={self.dropout.p} "
                "and is in training mode. Call .eval() first, or build it with dropout=0.0.")
        h = self.num_heads
        queries = split_heads(self.W_query(x), h)  # (B, h, T, d_h)
        keys = split_heads(self.W_key(x), h)  # (B, h, T, d_h)
        values = split_heads(self.W_value(x), h)  # (B, h, T, d_h)
        context = tiled_attention(queries, keys, values, self.block_size,
                                  attention_mask=attention_mask)  # (B, h, T, d_h)
        return self.out_proj(merge_heads(context))  # (B, T, d_out)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, shape (B, h, T, T), as :class:`MultiHeadAttention` computes them.

        The tiled loop never holds a row of weights whole, so they come from the explicit computation
        of the same weights; meant for plots and checks at small sizes.

        Example:
            >>> tiled = TiledMultiHeadAttention(3, 4, 6, dropout=0.0, num_heads=2, block_size=2)
            >>> tiled.attention_weights(torch.rand(1, 5, 3)).shape
            torch.Size([1, 2, 5, 5])
        """
        tiled, self.tiled = self.tiled, False
        try:
            return captured_attention_weights(self, x)
        finally:
            self.tiled = tiled

    @classmethod
    @torch.no_grad()
    def from_multihead(cls, mha: MultiHeadAttention, block_size: int = 64) -> TiledMultiHeadAttention:
        """A ``TiledMultiHeadAttention`` with ``mha``'s weights, device, dtype and training mode.

        The two share a ``state_dict``, so it is loaded as it is; ``block_size`` is the new module's.

        Raises:
            TypeError: if ``mha`` is not a ``MultiHeadAttention``; for a module that converts to one,
                the message gives the call that does.
        """
        error = not_a_multihead(mha, "TiledMultiHeadAttention.from_multihead", ", block_size")
        if error:
            raise error
        weight = mha.W_query.weight
        tiled = cls(mha.d_in, mha.d_out, mha.context_length, mha.dropout.p, mha.num_heads,
                    qkv_bias=mha.W_query.bias is not None, block_size=block_size)
        tiled = tiled.to(device=weight.device, dtype=weight.dtype)
        tiled.load_state_dict(mha.state_dict())
        return tiled.train(mha.training)
