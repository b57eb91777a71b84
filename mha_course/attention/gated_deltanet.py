"""Gated DeltaNet: the gated delta rule as a layer, as Qwen3-Next uses it in three layers of every four.

The layer (Yang et al. 2025; Qwen3-Next) wraps the rule of :mod:`.delta_rule` in what makes it work
in a model:

* projections of each token to queries and keys (``num_key_heads`` heads of ``key_dim``), values
  and an output gate (``num_heads`` heads of ``value_dim``), and two numbers per value head: the
  update strength ``beta = sigmoid(b)`` and the decay's ``a``;
* a short causal convolution over the last ``conv_size`` tokens, one filter per channel, on the
  queries, keys and values, followed by SiLU: each token sees a little of its neighbours before the
  state does;
* queries and keys normalised to length 1 (queries then scaled by ``1 / sqrt(key_dim)``), so that
  the rule's correction cannot blow up;
* the decay ``g = -exp(A_log) * softplus(a + dt_bias)``, at most 0, per head and token (as Mamba 2);
* grouped key heads: each query/key head serves ``num_heads / num_key_heads`` consecutive value
  heads, as grouped-query attention's key/value heads serve query heads;
* a gated RMSNorm on each head's output, ``rms_norm(o) * weight * silu(z)``, then the output
  projection.

A prompt runs the chunked form (``form="chunked"``, the default), a single token the recurrent
step; ``form="recurrent"`` runs every call one token at a time. With a :class:`~mha_course.KVCache`
the layer keeps the convolution's last ``conv_size - 1`` inputs and the ``(num_heads, key_dim,
value_dim)`` state per sequence: ``cache.nbytes`` is the same after ten tokens and after ten
thousand. The rule runs in float32 for float16 and bfloat16 layers, and the state is kept in
float32, as transformers keeps it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import validate_attention_mask, validate_input, validate_positive_int
from .delta_rule import chunked_gated_delta_rule, l2_normalise, recurrent_gated_delta_rule
from .heads import score_dtype, split_heads
from .kv_cache import cache_start

#: The two forms of :class:`GatedDeltaNet`: chunks of matrix products for a prompt, or one token at a time.
FORMS = ("chunked", "recurrent")


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / rms(x) * weight * silu(gate)`` along the last dimension: Qwen3-Next's gated RMSNorm.

    Example:
        >>> x = torch.tensor([[3.0, -3.0]])
        >>> (gated_rms_norm(x, torch.full((1, 2), 20.0), torch.ones(2)) / 20).round(decimals=3).tolist()
        [[1.0, -1.0]]
    """
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed * weight * F.silu(gate)


def checked_sizes(d_in, num_heads, num_key_heads, key_dim, value_dim, conv_size, chunk_size) -> tuple[int, ...]:
    """The sizes of a :class:`GatedDeltaNet`, checked: whole numbers of at least 1, and ``num_key_heads``
    dividing ``num_heads``.

    Example:
        >>> checked_sizes(16, 4, 3, 8, 6, 4, 64)
        Traceback (most recent call last):
            ...
        ValueError: num_key_heads (3) must divide num_heads (4): each query/key head serves num_heads // num_key_heads value heads. Choose num_key_heads among 1, 2, 4 (Qwen3-Next: 16 key heads for 32 value heads).
    """
    named = dict(d_in=d_in, num_heads=num_heads, key_dim=key_dim, value_dim=value_dim, conv_size=conv_size,
                 chunk_size=chunk_size)
    sizes = {name: validate_positive_int(name, value) for name, value in named.items()}
    num_key_heads, heads = validate_positive_int("num_key_heads", num_key_heads), sizes["num_heads"]
    if heads % num_key_heads:
        divisors = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0)
        raise ValueError(f"num_key_heads ({num_key_heads}) must divide num_heads ({heads}): each query/key head "
                         "serves num_heads // num_key_heads value heads. Choose num_key_heads among "
                         f"{divisors} (Qwen3-Next: 16 key heads for 32 value heads).")
    return (sizes["d_in"], sizes["num_heads"], num_key_heads, sizes["key_dim"], sizes["value_dim"],
            sizes["conv_size"], sizes["chunk_size"])


class GatedDeltaNet(nn.Module):
    """A Gated DeltaNet layer: ``(batch, num_tokens, d_in) -> (batch, num_tokens, d_in)``.

    Args:
        d_in: width of each token vector, in and out.
        num_heads: value heads, each with a ``(key_dim, value_dim)`` state.
        num_key_heads: query/key heads; must divide ``num_heads``.
        key_dim: width of a query or key head (the state's rows).
        value_dim: width of a value head (the state's columns).
        conv_size: tokens the short causal convolution spans (Qwen3-Next: 4).
        chunk_size: tokens per chunk of the chunked form (64).
        eps: the RMSNorm's epsilon.

    Attributes:
        W_query, W_key: ``nn.Linear(d_in, num_key_heads * key_dim)``; ``W_value`` and ``W_gate``:
            ``nn.Linear(d_in, num_heads * value_dim)``; ``W_beta``, ``W_decay``: ``nn.Linear(d_in,
            num_heads)``; all without bias.
        conv: ``nn.Conv1d`` over the queries', keys' and values' channels, one filter of
            ``conv_size`` each, no bias.
        A_log, dt_bias: ``(num_heads,)``, the decay's parameters. norm_weight: ``(value_dim,)``.
        out_proj: ``nn.Linear(num_heads * value_dim, d_in)``, no bias.

    ``forward(x, cache=None, attention_mask=None)``: ``attention_mask`` ``(batch, cached + new)``
    is 1 for a real token and 0 for padding, as for the course's attention modules. Padded tokens
    are zeroed before the projections, as transformers does, and their outputs are 0; pad on the
    left, as generation does, and each sequence gets what it gets alone.

    Example:
        >>> layer = GatedDeltaNet(16, num_heads=4, num_key_heads=2, key_dim=8, value_dim=6)
        >>> layer(torch.rand(2, 10, 16)).shape
        torch.Size([2, 10, 16])
    """

    def __init__(self, d_in, num_heads, num_key_heads, key_dim, value_dim,
                 conv_size=4, chunk_size=64, eps=1e-6):
        super().__init__()
        (self.d_in, self.num_heads, self.num_key_heads, self.key_dim,
         self.value_dim, self.conv_size, self.chunk_size) = checked_sizes(
            d_in, num_heads, num_key_heads, key_dim, value_dim, conv_size,
            chunk_size)
        self.eps, self.form = eps, "chunked"
        keys, values = num_key_heads * key_dim, num_heads * value_dim
        self.W_query = nn.Linear(d_in, keys, bias=False)
        self.W_key = nn.Linear(d_in, keys, bias=False)
        self.W_value = nn.Linear(d_in, values, bias=False)
        self.W_gate = nn.Linear(d_in, values, bias=False)  # z: output gate
        self.W_beta = nn.Linear(d_in, num_heads, bias=False)  # beta from b
        self.W_decay = nn.Linear(d_in, num_heads, bias=False)  # g from a
        channels = 2 * keys + values  # queries, keys, values
        self.conv = nn.Conv1d(channels, channels, conv_size,
                              groups=channels, bias=False)  # one per channel
        decay_rate = torch.empty(num_heads).uniform_(0.01, 16)
        self.A_log = nn.Parameter(decay_rate.log())
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.norm_weight = nn.Parameter(torch.ones(value_dim))
        self.out_proj = nn.Linear(values, d_in, bias=False)

    def forward(self, x, cache=None, attention_mask=None):
        """Gated DeltaNet: ``(B, T, d_in) -> (B, T, d_in)``, continuing ``cache`` if given."""
        validate_input(x, self.d_in, None, like=self.W_query.weight)
        num_tokens = x.shape[1]
        start = cache_start(cache, self, num_tokens, None)
        real = self._real_tokens(attention_mask, x, start)  # (B, T, 1)
        if real is not None:
            x = x * real  # padding in: zeros, as transformers does
        mixed = torch.cat([self.W_query(x), self.W_key(x), self.W_value(x)], -1)
        mixed = self._short_conv(mixed, cache)  # (B, T, channels), SiLU'd
        keys, values = self.num_key_heads * self.key_dim, self.value_dim
        q, k, v = mixed.split([keys, keys, self.num_heads * values], -1)
        r = self.num_heads // self.num_key_heads  # value heads per key head
        q, k = (split_heads(t, self.num_key_heads) for t in (q, k))
        q = l2_normalise(q).repeat_interleave(r, 1) * self.key_dim**-0.5
        k = l2_normalise(k).repeat_interleave(r, 1)  # (B, h, T, d_k)
        v = split_heads(v, self.num_heads)  # (B, h, T, d_v)
        beta = torch.sigmoid(self.W_beta(x)).transpose(1, 2)  # (B, h, T)
        a = self.W_decay(x) + self.dt_bias  # (B, T, h)
        g = (-self.A_log.exp() * F.softplus(a)).transpose(1, 2)  # (B, h, T)
        rule = [t.to(score_dtype(x.dtype)) for t in (q, k, v, g, beta)]
        state = None if cache is None else cache.states.get("state")
        if self.form == "recurrent" or num_tokens == 1:
            out, state = recurrent_gated_delta_rule(*rule, state)
        else:
            out, state = chunked_gated_delta_rule(*rule, state,
                                                  self.chunk_size)
        if cache is not None:
            cache.hold(state=state, new_positions=num_tokens)
        z = self.W_gate(x).unflatten(-1, (-1, values))  # (B, T, h, d_v)
        out = out.to(x.dtype).transpose(1, 2)  # (B, T, h, d_v)
        out = gated_rms_norm(out, z, self.norm_weight, self.eps)
        out = self.out_proj(out.flatten(-2))  # (B, T, d_in)
        return out if real is None else out * real  # padding out: zeros

    @property
    def form(self) -> str:
        """How a call of several tokens is computed, ``"chunked"`` (the default) or ``"recurrent"``.

        Example:
            >>> layer = GatedDeltaNet(16, num_heads=4, num_key_heads=2, key_dim=8, value_dim=6)
            >>> layer.form = "recurrent"  # one token at a time, as decoding runs
            >>> layer.form
            'recurrent'
        """
        return self._form

    @form.setter
    def form(self, value: str) -> None:
        if value not in FORMS:
            raise ValueError(f"form must be one of {', '.join(map(repr, FORMS))}, got {value!r}: "
                             "'chunked' runs a prompt in chunks of matrix products, 'recurrent' one token at a time.")
        self._form = value

    def _short_conv(self, mixed: torch.Tensor, cache) -> torch.Tensor:
        """The causal convolution over the last ``conv_size`` tokens, then SiLU: ``(B, T, C)`` in and out.

        The ``conv_size - 1`` inputs before ``x`` come from the cache (zeros at a sequence's start),
        and the last ``conv_size - 1`` inputs go back into it.
        """
        mixed = mixed.transpose(1, 2)  # (B, C, T): channels first, as Conv1d wants
        held = None if cache is None else cache.states.get("conv_inputs")
        if held is None:
            held = mixed.new_zeros(*mixed.shape[:2], self.conv_size - 1)
        window = torch.cat([held, mixed], dim=-1)  # (B, C, conv_size - 1 + T)
        if cache is not None:
            kept = window.shape[-1] - (self.conv_size - 1)
            cache.hold(conv_inputs=window[..., kept:])  # the last inputs
        return F.silu(self.conv(window)).transpose(1, 2)  # (B, T, C)

    def _real_tokens(self, attention_mask, x: torch.Tensor, start: int) -> torch.Tensor | None:
        """``(B, T, 1)``: 1 for x's real tokens, 0 for its padding; ``None`` without a mask."""
        if attention_mask is None:
            return None
        real = validate_attention_mask(attention_mask, len(x), start + x.shape[1], x.device)
        return real[:, start:, None].to(x.dtype)

    def extra_repr(self) -> str:
        return (f"d_in={self.d_in}, num_heads={self.num_heads}, num_key_heads={self.num_key_heads}, "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}, conv_size={self.conv_size}, "
                f"chunk_size={self.chunk_size}, form={self.form!r}")


__all__ = ["GatedDeltaNet", "gated_rms_norm", "checked_sizes", "FORMS"]
