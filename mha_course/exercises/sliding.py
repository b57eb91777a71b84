"""Exercises 11.1 and 11.2 of chapter 11: the sliding window's mask, and decoding through a ring cache.

11.1 asks for ``window_mask(num_tokens, window, start=0)``: the boolean mask, ``True`` where a query
may not look, of ``num_tokens`` new tokens at positions ``start, start + 1, ...`` against every key
up to the last of them, ``(num_tokens, start + num_tokens)``, under the causal mask and a sliding
window: key ``j`` is visible from query ``i`` when ``0 <= i - j < window``. The reference is the
package's :func:`~mha_course.causal_mask` with ``window`` (whose columns start at the first key a
window's cache holds: the reference adds the hidden ones before them).

11.2 asks for ``ring_decode(layer, x)``: the outputs of a windowed, rotary
:class:`~mha_course.GroupedQueryAttention` for the tokens ``x``, decoded one at a time through a
ring of ``layer.window`` slots, token ``t``'s key and value written into slot ``t % window``. The
reference is the layer run on the whole sequence at once.

chapter11 lists both in its ``EXERCISES``.
"""

from __future__ import annotations

import copy

import torch

from ..attention.grouped_query import GroupedQueryAttention
from ..attention.kv_cache import KVCache
from ..attention.masking import causal_mask
from .framework import Check, Exercise, Mistake
from .probes import case_seed, chooser, device_check, generator, probe_devices, probe_on_devices
from .records import Failed, Recorder, describe, expect_close, expect_close_from, format_shape, plain, same, seed_of, tensor_of, \
    value_of
from .shortcuts import package

# ----------------------------------------------------------------------------------------------
# 11.1 The window's mask

MASK_CASES = ("readable", "cached", "wide")


def mask_case(seed: int, key: str) -> tuple[int, int, int]:
    """``(num_tokens, window, start)`` of one case of 11.1: ``readable``, six tokens through a window
    of 3; ``cached``, a few new tokens after more cached ones than the window; ``wide``, a window
    wider than the sequence (the causal mask alone)."""
    draw = chooser(seed, f"11.1 {key}")
    if key == "readable":
        return 6, 3, 0
    if key == "cached":
        window = draw.randint(2, 4)
        return draw.randint(2, 4), window, draw.randint(window + 2, window + 6)
    return draw.randint(3, 5), draw.randint(8, 12), draw.randint(0, 2)


def mask_variant(num_tokens, window, start=0, *, inclusive=False, rows=False, causal=True, same_keys=False):
    """11.1 written with a chosen mistake; the defaults give the right mask."""
    positions = torch.arange(num_tokens)[:, None] + (0 if rows else start)  # the queries
    keys = torch.arange(start + num_tokens)
    gap = positions - keys
    hidden = gap > window if inclusive else gap >= window
    if same_keys:  # the last `window` keys of the call for every query
        hidden = (keys < start + num_tokens - window).expand(num_tokens, -1)
    if causal:
        hidden = hidden | (keys > torch.arange(start, start + num_tokens)[:, None])
    return hidden


def reference_mask(num_tokens: int, window: int, start: int = 0) -> torch.Tensor:
    """The package's :func:`~mha_course.causal_mask` with ``window``, against every key from position 0:
    its columns start where a window's cache does, and the positions before them are hidden."""
    hidden = causal_mask(num_tokens, start=start, window=window)  # (T, keys held + T)
    before = torch.ones(num_tokens, start + num_tokens - hidden.shape[1], dtype=torch.bool)
    return torch.cat([before, hidden], dim=1)  # (T, start + T)


def _describe_mask(seed: int, key: str) -> str:
    num_tokens, window, start = mask_case(seed, key)
    return f"window_mask({num_tokens}, window={window}, start={start})"


def _probe_mask(window_mask, rec: Recorder) -> None:
    for key in MASK_CASES:
        num_tokens, window, start = mask_case(rec.seed, key)
        rec.call(key, window_mask, num_tokens, window, start)
    rec.call("default-start", window_mask, 5, 2)
    num_tokens, window, start = mask_case(rec.seed, "cached")
    probe_on_devices(rec, "on", lambda device: window_mask(num_tokens, window, start, device=device))


def _mask_check(key: str):
    def run(record):
        what = _describe_mask(seed_of(record), key)
        got = tensor_of(record, key, what)
        if got.dtype != torch.bool:
            raise Failed(f"a bool tensor from {what}", f"a {got.dtype} tensor",
                         "Return True where a query may not look (a bool tensor), as the course's masks do.")
        num_tokens, window, start = mask_case(seed_of(record), key)
        expect_close_from(got, reference_mask(num_tokens, window, start), what, ("query",))
    return run


def _start_defaults_to_zero(record):
    got = tensor_of(record, "default-start", "window_mask(5, 2)")
    expect_close(got.bool() if got.dtype != torch.bool else got, reference_mask(5, 2), labels=("query",))


def _mask_like(keys=MASK_CASES, **how):
    def detect(record):
        for key in keys:
            got = plain(record.get(key))
            if not same(got, mask_variant(*mask_case(seed_of(record), key), **how)):
                return False
        return True
    return detect


def _inverted(record) -> bool:
    return all(same(plain(record.get(key)), ~mask_variant(*mask_case(seed_of(record), key))) for key in MASK_CASES)


WINDOW_MASK = Exercise(
    id="11.1",
    title="the sliding window's mask",
    answer_name="window_mask",
    signature="window_mask(num_tokens, window, start=0, device=None)",
    probe=_probe_mask,
    checks=(
        Check("returns a tensor", lambda record: tensor_of(record, "readable", _describe_mask(seed_of(record),
                                                                                             "readable"))),
        Check("six tokens through a window of 3", _mask_check("readable")),
        Check("new tokens after a cache longer than the window", _mask_check("cached")),
        Check("a window wider than the sequence: the causal mask alone", _mask_check("wide")),
        Check("start defaults to 0", _start_defaults_to_zero),
        Check("mask on the requested device", device_check("on", "window_mask(..., device=...)")),
    ),
    mistakes=(
        Mistake("off-by-one",
                "Each query sees window + 1 keys: you hid a key when i - j > window. A token sees itself and the "
                "window - 1 before it, so a key is hidden once i - j >= window (transformers' convention: "
                "visible when 0 <= i - j < window).",
                _mask_like(inclusive=True)),
        Mistake("window-on-query-rows",
                "You measured the window from each query's row in this call (0, 1, ...), not from its position: "
                "after start cached tokens, row r is the query at position start + r, and keys older than "
                "start + r - window + 1 must be hidden.",
                _mask_like(keys=("cached",), rows=True)),
        Mistake("no-causal",
                "The window is right but the future is visible: a sliding window is a band below the diagonal, "
                "the causal mask (j > i hidden) as well as the window (i - j >= window hidden).",
                _mask_like(causal=False)),
        Mistake("same-keys-for-all",
                "Every query sees the same last window keys of the call: that is what a cache of the last "
                "window positions holds for one new token, but in a prompt each query's window ends at itself. "
                "Compare each query's position with each key's.",
                _mask_like(keys=("readable", "cached"), same_keys=True)),
        Mistake("inverted",
                "Your mask is True where a query may look. The course's masks are True where attention is "
                "forbidden (the convention of masked_fill): return the complement.",
                _inverted),
    ),
    shortcuts=package(causal_mask, why="This is the package's own mask: write the comparison of positions yourself."),
)

# ----------------------------------------------------------------------------------------------
# 11.2 Decoding through a ring of window slots

RING_CASES = ("short", "wrapped", "grouped")


def ring_case(seed: int, key: str) -> tuple[GroupedQueryAttention, torch.Tensor]:
    """``(layer, x)`` of one case of 11.2: a seeded windowed layer with rotary positions in eval mode
    and the tokens to decode. ``short``: fewer tokens than the window (the ring never wraps);
    ``wrapped``: more than three windows' worth; ``grouped``: two query heads per key/value head, biases."""
    draw = chooser(seed, f"11.2 {key}")
    if key == "short":
        window, tokens, heads, groups, d, bias = 5, 4, 2, 2, 8, False
    elif key == "wrapped":
        window = draw.randint(2, 4)
        tokens, heads, groups, d, bias = 3 * window + draw.randint(1, window), 2, 2, 8, False
    else:
        window = draw.randint(3, 4)
        tokens, heads, groups, d, bias = 2 * window + 1, 4, 2, 16, True
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case_seed(seed, f"11.2 {key} weights"))
        layer = GroupedQueryAttention(d, d, tokens, 0.0, heads, groups, qkv_bias=bias, rope_theta=100.0,
                                      window=window)
    x = torch.randn(2, tokens, d, generator=generator(seed, f"11.2 {key} x"))
    return layer.eval(), x


@torch.no_grad()
def ring_variant(layer, x, *, rotate_by_slot=False, keep_oldest=False, see_empty=False):
    """11.2 written with a chosen mistake; the defaults give the right outputs."""
    batch, tokens, _ = x.shape
    window, g, d_h = layer.window, layer.num_kv_groups, layer.head_dim
    ring_k, ring_v = x.new_zeros(batch, g, window, d_h), x.new_zeros(batch, g, window, d_h)
    filled = torch.zeros(window, dtype=torch.bool)
    outputs = []
    for t in range(tokens):
        q = layer.W_query(x[:, t:t + 1]).view(batch, 1, layer.num_heads, d_h).transpose(1, 2)
        k = layer.W_key(x[:, t:t + 1]).view(batch, 1, g, d_h).transpose(1, 2)
        v = layer.W_value(x[:, t:t + 1]).view(batch, 1, g, d_h).transpose(1, 2)
        slot = t % window
        q, k = layer.rotary(q, k, slot if rotate_by_slot else t)
        if keep_oldest:  # the ring before the write, and the new token beside it: window + 1 keys
            keys, values, seen = (torch.cat([ring_k, k], 2), torch.cat([ring_v, v], 2),
                                  torch.cat([filled, torch.ones(1, dtype=torch.bool)]))
        ring_k, ring_v = ring_k.clone(), ring_v.clone()
        ring_k[:, :, slot], ring_v[:, :, slot], filled[slot] = k[:, :, 0], v[:, :, 0], True
        if not keep_oldest:
            keys, values, seen = ring_k, ring_v, filled.clone()
        if see_empty:
            seen = torch.ones_like(seen)
        r = layer.group_size
        keys, values = keys.repeat_interleave(r, 1), values.repeat_interleave(r, 1)
        scores = (q @ keys.transpose(2, 3)) * d_h**-0.5
        weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
        outputs.append(layer.out_proj((weights @ values).transpose(1, 2).reshape(batch, 1, -1)))
    return torch.cat(outputs, dim=1)


def _describe_ring(seed: int, key: str) -> str:
    layer, x = ring_case(seed, key)
    return (f"ring_decode(layer with window={layer.window}, {layer.num_heads} heads, {layer.num_kv_groups} "
            f"key/value heads, x of shape {format_shape(x.shape)})")


def _probe_ring(ring_decode, rec: Recorder) -> None:
    for key in RING_CASES:
        rec.call(key, ring_decode, *ring_case(rec.seed, key))
    layer, x = ring_case(rec.seed, "short")
    moved = {d.type: (copy.deepcopy(layer).to(d), x.to(d)) for d in probe_devices()}
    probe_on_devices(rec, "on", lambda device: ring_decode(*moved[device.type]))


def _outputs(record, key: str) -> torch.Tensor:
    what = _describe_ring(seed_of(record), key)
    got = value_of(record, key, what)
    if got.get("kind") != "tensor":
        raise Failed(f"a tensor of outputs from {what}", describe(got))
    return plain(got)


def _ring_check(key: str):
    def run(record):
        got = _outputs(record, key)
        layer, x = ring_case(seed_of(record), key)
        with torch.no_grad():
            expected = layer(x)
        try:
            expect_close(got, expected, labels=("sequence", "token"))
        except Failed as failure:
            raise Failed(f"{failure.expected} (the whole sequence at once) from "
                         f"{_describe_ring(seed_of(record), key)}", failure.got) from None
    return run


def _ring_like(keys=RING_CASES, **how):
    def detect(record):
        for key in keys:
            if not same(plain(record.get(key)), ring_variant(*ring_case(seed_of(record), key), **how)):
                return False
        return True
    return detect


RING = Exercise(
    id="11.2",
    title="decoding through a ring of window slots",
    answer_name="ring_decode",
    signature="ring_decode(layer, x)",
    probe=_probe_ring,
    checks=(
        Check("returns the outputs, (batch, tokens, d_out)", lambda record: _outputs(record, "short")),
        Check("fewer tokens than the window: the ring not yet full", _ring_check("short")),
        Check("more than three windows' worth of tokens: the ring wrapped", _ring_check("wrapped")),
        Check("two query heads per key/value head, biases", _ring_check("grouped")),
        Check("outputs on the inputs' device", device_check("on", "ring_decode")),
    ),
    mistakes=(
        Mistake("rotated-by-slot",
                "Right until the ring wraps, wrong after: the keys were turned by their slot, t % window, "
                "instead of their position t. The rotation encodes how far apart a query and a key are, "
                "so it takes the token's position; the slot only says where the key is stored.",
                _ring_like(keys=("short", "wrapped"), rotate_by_slot=True)),
        Mistake("oldest-kept",
                "Each token read window + 1 keys: the ring before the write, and the new key beside it. The "
                "new key belongs in the slot of the oldest, which has just left the window: write it first "
                "(slot t % window), then attend to the ring.",
                _ring_like(keys=("wrapped", "grouped"), keep_oldest=True)),
        Mistake("empty-slots-read",
                "The first tokens read the ring's empty slots as keys of zeros (a score of 0 each): until "
                "the ring is full, hide the slots nothing has been written to yet.",
                _ring_like(keys=("short",), see_empty=True)),
    ),
    shortcuts=package(GroupedQueryAttention.forward, KVCache,
                      why="Running the layer, or the package's cache, is the package's answer: decode with "
                      "layer.W_query, layer.W_key, layer.W_value, layer.rotary and layer.out_proj and a ring of "
                      "your own."),
)

__all__ = ["WINDOW_MASK", "RING", "mask_case", "mask_variant", "reference_mask", "ring_case", "ring_variant"]
