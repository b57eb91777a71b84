"""The tiled loop with a sliding window: the same numbers and gradients as PyTorch's fused kernel given
the same band mask, and the tiles wholly outside the window never computed, forward or backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import causal_mask, tiled_attention
from mha_course.attention import tiled as tiled_module
from mha_course.attention.tiled import COMPUTED, CUT, SKIPPED, tile_counts, tile_kind


def qkv(tokens, batch=2, heads=2, head_dim=5, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, tokens, head_dim, generator=g, dtype=dtype) for _ in range(3))


def sdpa_with_window(q, k, v, window, attention_mask=None):
    hidden = causal_mask(q.shape[2], window=window)
    if attention_mask is not None:
        hidden = hidden | (attention_mask == 0)[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~hidden)


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 40), block_size=st.integers(1, 20), window=st.integers(1, 45), seed=st.integers(0, 2**16))
def test_values_and_gradients_equal_sdpa_with_the_same_mask(tokens, block_size, window, seed):
    q, k, v = (t.double().requires_grad_() for t in qkv(tokens, seed=seed))
    ours = tiled_attention(q, k, v, block_size, window=window)
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ours_grads = torch.autograd.grad((ours * upstream).sum(), (q, k, v))
    theirs = sdpa_with_window(q, k, v, window)
    theirs_grads = torch.autograd.grad((theirs * upstream).sum(), (q, k, v))
    assert (ours - theirs).abs().max() < 1e-12
    for mine, expected in zip(ours_grads, theirs_grads):
        assert (mine - expected).abs().max() < 1e-11


def test_float32_gradients_equal_sdpas_to_rounding_and_padding_with_a_window():
    q, k, v = (t.requires_grad_() for t in qkv(37, seed=3))
    real = torch.ones(2, 37, dtype=torch.long)
    real[1, :9] = 0  # left padding longer than the window: some real queries... and padded rows see nothing
    out = tiled_attention(q, k, v, block_size=8, attention_mask=real, window=5)
    expected = sdpa_with_window(q, k, v, 5, real)
    expected = torch.where(torch.isnan(expected), 0.0, expected)  # SDPA's row with no key: NaN or 0
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


class _Tiles:
    """Counts the tiles of scores the loop computes (calls of tile_scores), forward and backward apart."""

    def __init__(self, monkeypatch):
        self.seen = []
        original = tiled_module.tile_scores

        def counting(q, keys, q_start, k_start, *rest):
            self.seen.append((q_start, k_start))
            return original(q, keys, q_start, k_start, *rest)

        monkeypatch.setattr(tiled_module, "tile_scores", counting)


@pytest.mark.parametrize("tokens,block_size,window", [(64, 8, 16), (64, 8, 1), (100, 16, 30), (37, 5, 12), (20, 4, 64)])
def test_the_loop_skips_every_tile_outside_the_window_forward_and_backward(tokens, block_size, window, monkeypatch):
    tiles = _Tiles(monkeypatch)
    q, k, v = (t.requires_grad_() for t in qkv(tokens, batch=1, heads=1))
    out = tiled_attention(q, k, v, block_size, window=window)
    forward = list(tiles.seen)
    tiles.seen.clear()
    out.sum().backward()
    starts = range(0, tokens, block_size)
    needed = [(i, j) for i in starts for j in starts if tile_kind(i, j, block_size, tokens, window) != SKIPPED]
    assert forward == tiles.seen == needed  # the same tiles both ways, and only those
    counts = tile_counts(tokens, block_size, window)
    assert len(forward) == counts[COMPUTED] + counts[CUT]
    full = tile_counts(tokens, block_size)
    if window < tokens - block_size:  # a window narrower than the sequence skips more than causality does
        assert counts[SKIPPED] > full[SKIPPED]


def test_a_skipped_tile_holds_only_hidden_scores_and_a_computed_one_none():
    tokens, block_size, window = 24, 4, 6
    hidden = causal_mask(tokens, window=window)
    for i in range(0, tokens, block_size):
        for j in range(0, tokens, block_size):
            tile = hidden[i:i + block_size, j:j + block_size]
            kind = tile_kind(i, j, block_size, tokens, window)
            assert {SKIPPED: tile.all(), COMPUTED: not tile.any(), CUT: tile.any() and not tile.all()}[kind]


def test_the_work_falls_with_the_window():
    """Tiles computed at 16k tokens in blocks of 128: they grow with T * window, not T * T."""
    counts = {w: sum(tile_counts(16384, 128, w)[kind] for kind in (COMPUTED, CUT)) for w in (256, 1024, 4096, None)}
    assert counts[256] < counts[1024] < counts[4096] < counts[None] == 128 * 129 // 2
    assert counts[256] == 128 * 3 - 3 and counts[1024] == 128 * 9 - 36  # (W / b + 1) tiles a row of blocks


def test_a_window_needs_the_causal_mask_and_a_positive_width():
    q, k, v = qkv(4)
    with pytest.raises(ValueError, match=r"window=3 needs causal=True"):
        tiled_attention(q, k, v, 2, causal=False, window=3)
    with pytest.raises(ValueError, match=r"window must be a positive integer, got 0"):
        tiled_attention(q, k, v, 2, window=0)
