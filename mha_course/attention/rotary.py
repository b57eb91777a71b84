"""Rotary position embeddings: queries and keys turned by an angle that grows with their position.

Attention by itself ignores order: permute the tokens and every token gets the same output, permuted.
Rotary embeddings (Su et al. 2021), used by Llama, give it positions. Each head's vector of width
``d_h`` is read as ``d_h / 2`` pairs of numbers, and pair ``c`` of the token at position ``p`` is
turned by the angle ``p * theta_c``, with frequencies ``theta_c = rope_theta ** (-2c / d_h)`` (the
book's notation: ``c`` counts pairs from 0). A rotation keeps lengths, and the dot product of two
rotated vectors depends on the difference of their angles only, so the score of a query at position
``p_i`` and a key at position ``p_j`` depends on ``p_i - p_j``: relative positions, without any
position vector added to the tokens.

Which numbers make a pair is a convention. Llama's, followed here, splits the head in two halves:
number ``c`` pairs with number ``c + d_h / 2`` (:func:`rotate_half`). The original paper pairs
neighbours ``2c`` and ``2c + 1`` (*interleaved*); the two compute the same function only after the
query and key weights' rows are permuted, which is why transformers' checkpoint converters permute them.

Keys are rotated before they enter a :class:`KVCache`: a cached key keeps the angle of its own
position, and the new tokens' positions continue from the cache.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The half-split partner of every number, turned a quarter: ``(x1, x2) -> (-x2, x1)``.

    ``x1`` is the first half of the last dimension and ``x2`` the second, so pair ``c`` is numbers
    ``c`` and ``c + d_h / 2``. With it a rotation is ``x * cos + rotate_half(x) * sin``.

    Example:
        >>> rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        tensor([-3., -4.,  1.,  2.])
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def inverse_frequencies(head_dim: int, rope_theta: float) -> torch.Tensor:
    """The ``head_dim / 2`` angles per position of Llama's default rotation, in float32.

    Example:
        >>> inverse_frequencies(4, 10000.0)
        tensor([1.0000, 0.0100])
    """
    pairs = torch.arange(0, head_dim, 2, dtype=torch.int64).float()  # 0, 2, ...
    exponents = pairs / head_dim
    return 1.0 / (rope_theta**exponents)


def validate_positions(position_ids, batch: int, num_new: int, like: torch.Tensor) -> None:
    """Check that ``position_ids`` is a ``(batch, num_new)`` integer tensor on ``like``'s device."""
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be a torch.Tensor of shape (batch, num_tokens) = ({batch}, "
                        f"{num_new}), got {type(position_ids).__name__}.")
    if position_ids.is_floating_point() or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must hold whole numbers (an integer dtype such as torch.long), "
                        f"got {position_ids.dtype}. Build them with torch.arange or attention_mask.cumsum(-1) - 1.")
    if tuple(position_ids.shape) != (batch, num_new):
        raise ValueError(f"position_ids must have shape (batch, num_tokens) = ({batch}, {num_new}), one position "
                         f"per new token of x, got {tuple(position_ids.shape)}.")
    if position_ids.device != like.device:
        raise ValueError(f"position_ids is on {position_ids.device} but x is on {like.device}: move it with "
                         f"position_ids.to({str(like.device)!r}).")


def validate_position_embeddings(position_embeddings, batch: int, num_new: int, head_dim: int,
                                 like: torch.Tensor) -> None:
    """Check that ``position_embeddings`` is ``(cos, sin)``, each ``(batch or 1, num_new, head_dim)`` on
    ``like``'s device, as :meth:`RotaryEmbedding.cos_sin` makes them."""
    shape = f"({batch} or 1, {num_new}, {head_dim})"
    if not (isinstance(position_embeddings, (tuple, list)) and len(position_embeddings) == 2
            and all(isinstance(t, torch.Tensor) for t in position_embeddings)):
        raise TypeError(f"position_embeddings must be (cos, sin), two tensors of shape {shape} as "
                        "RotaryEmbedding.cos_sin(position_ids, dtype) returns them, got "
                        f"{type(position_embeddings).__name__}.")
    for name, t in zip(("cos", "sin"), position_embeddings):
        if t.dim() != 3 or t.shape[0] not in (1, batch) or tuple(t.shape[1:]) != (num_new, head_dim):
            raise ValueError(f"position_embeddings' {name} must have shape (batch or 1, num_tokens, head_dim) = "
                             f"{shape}, got {tuple(t.shape)}: make it with rotary.cos_sin(position_ids, dtype) "
                             "for the positions of x's tokens.")
        if t.device != like.device:
            raise ValueError(f"position_embeddings' {name} is on {t.device} but x is on {like.device}: move it "
                             f"with .to({str(like.device)!r}).")


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their positions (half-split convention, as Llama).

    Args:
        head_dim: the width of one head; must be even (the numbers rotate in pairs).
        rope_theta: the base of the frequencies, e.g. 10000.0 (Llama 2) or 500000.0 (Llama 3).

    Attributes:
        inv_freq: ``(head_dim / 2,)`` float32 buffer, the angle per position of each pair; saved in
            the state dict, so frequencies set by a conversion (Llama 3's scaled ones) survive a reload.
            It moves with the module but stays float32 when the module turns to half precision.

    Example:
        >>> rotary = RotaryEmbedding(head_dim=4, rope_theta=10000.0)
        >>> q = k = torch.ones(1, 1, 3, 4)  # (B, h, T, d_h)
        >>> q_rot, k_rot = rotary(q, k, start=0)
        >>> q_rot[0, 0, 0].tolist() == [1.0, 1.0, 1.0, 1.0]  # position 0 is not turned
        True
        >>> bool(torch.allclose(q_rot.norm(dim=-1), q.norm(dim=-1)))  # lengths are kept
        True
    """

    def __init__(self, head_dim: int, rope_theta: float) -> None:
        super().__init__()
        if isinstance(rope_theta, bool) or not isinstance(rope_theta, numbers.Real) or not rope_theta > 1:
            raise ValueError(f"rope_theta must be a number above 1 (the base of the rotary frequencies, "
                             f"e.g. rope_theta=10000.0), or None for no rotation; got {rope_theta!r}.")
        if head_dim % 2:
            raise ValueError(f"rotary embeddings turn the numbers of a head in pairs, so head_dim = d_out // "
                             f"num_heads must be even, got {head_dim}. Choose d_out and num_heads so that it "
                             "is, or pass rope_theta=None.")
        self.head_dim, self.rope_theta = head_dim, float(rope_theta)
        self.register_buffer("inv_freq", inverse_frequencies(head_dim, self.rope_theta))

    def cos_sin(self, position_ids: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and ``sin`` of every angle, ``(B, T, head_dim)`` each,
        computed in float32: the rotation a model computes once per call
        and hands to every layer (``position_embeddings``), as Llama does.

        Example:
            >>> rotary = RotaryEmbedding(4, 10000.0)
            >>> cos, sin = rotary.cos_sin(torch.tensor([[0, 1]]), torch.float32)
            >>> cos.shape, cos[0, 0].tolist()  # position 0: no turn
            (torch.Size([1, 2, 4]), [1.0, 1.0, 1.0, 1.0])
        """
        # (B, T, d_h / 2): position times the angle per position of each pair
        angles = position_ids[..., None].float() * self.inv_freq.float()
        # (B, T, d_h): pair c is numbers c and c + d_h/2, one angle for both
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, queries, keys, start: int, position_ids=None,
                position_embeddings=None):
        """Rotate queries ``(B, h, T, d_h)`` and keys ``(B, g, T, d_h)``.

        Positions are ``position_ids`` ``(B, T)``, by default ``start +
        arange(T)`` in every sequence (made once and broadcast). Or the
        rotation comes made: ``position_embeddings``, the ``(cos, sin)`` of
        :meth:`cos_sin`, computed by a model once per call for all layers.
        """
        batch, _, num_new, _ = queries.shape
        if position_embeddings is None:
            if position_ids is None:  # the new tokens follow the cached ones
                position_ids = torch.arange(start, start + num_new,
                                            device=queries.device)[None]
            else:
                validate_positions(position_ids, batch, num_new, queries)
            position_embeddings = self.cos_sin(position_ids, queries.dtype)
        else:
            validate_position_embeddings(position_embeddings, batch, num_new,
                                         self.head_dim, queries)
        # (B or 1, 1, T, d_h): the same angles for every head
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        return (queries * cos + rotate_half(queries) * sin,
                keys * cos + rotate_half(keys) * sin)

    def _apply(self, fn, recurse=True):
        """Move with the module (``.to``, ``.cuda``, ``.half``) as ``nn.Module`` moves every buffer,
        then put the frequencies back in float32: rounded to bfloat16, the angle of position 1000
        would be off by radians."""
        frequencies = self.inv_freq  # float32, before fn
        super()._apply(fn, recurse)
        self.inv_freq = frequencies.to(device=self.inv_freq.device)  # fn's device, float32 kept
        return self

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rope_theta={self.rope_theta:g}"
