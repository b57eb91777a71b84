"""The tiled loop with an online softmax: the same numbers and gradients as PyTorch's fused kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import MultiHeadAttention, TiledMultiHeadAttention, tiled_attention
from mha_course.tiled import COMPUTED, CUT, SKIPPED, tile_kind, tiled_loop


def qkv(batch, heads, tokens, head_dim, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return tuple(scale * torch.randn(batch, heads, tokens, head_dim, generator=g, dtype=dtype) for _ in range(3))


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), tokens=st.integers(1, 40), head_dim=st.integers(1, 9),
       block_size=st.integers(1, 48), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_equals_sdpa_for_any_shape_and_block_size(batch, heads, tokens, head_dim, block_size, causal, seed):
    q, k, v = qkv(batch, heads, tokens, head_dim, seed=seed)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(tiled_attention(q, k, v, block_size, causal), expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 33), block_size=st.integers(1, 40), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_float64_to_1e_12(tokens, block_size, causal, seed):
    q, k, v = qkv(2, 2, tokens, 5, dtype=torch.float64, seed=seed)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (tiled_attention(q, k, v, block_size, causal) - expected).abs().max() < 1e-12


@pytest.mark.parametrize("tokens,block_size", [(1, 64), (1, 1), (7, 1), (10, 3), (16, 4), (5, 5), (5, 100), (65, 64)])
@pytest.mark.parametrize("causal", [True, False])
def test_edge_lengths(tokens, block_size, causal):
    q, k, v = qkv(1, 2, tokens, 4, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(tiled_attention(q, k, v, block_size, causal), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_equal_sdpas(causal):
    inputs = [t.requires_grad_() for t in qkv(2, 3, 11, 4, dtype=torch.float64, seed=3)]
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    upstream = torch.randn(2, 3, 11, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    (tiled_attention(*inputs, block_size=4, causal=causal) * upstream).sum().backward()
    (F.scaled_dot_product_attention(*twins, is_causal=causal) * upstream).sum().backward()
    for got, expected in zip(inputs, twins):
        torch.testing.assert_close(got.grad, expected.grad, rtol=0, atol=1e-12)


def test_gradcheck():
    inputs = [t.requires_grad_() for t in qkv(1, 1, 5, 3, dtype=torch.float64, seed=4)]
    assert torch.autograd.gradcheck(lambda q, k, v: tiled_attention(q, k, v, block_size=2), inputs)


def test_large_scores_stay_finite():
    # Scores in the thousands: exp() of them overflows without the running maximum.
    q, k, v = qkv(1, 2, 20, 8, seed=5, scale=30.0)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = tiled_attention(q, k, v, block_size=6)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_values_of_another_width():
    q, k, _ = qkv(2, 2, 9, 4, seed=6)
    v = torch.randn(2, 2, 9, 7)
    torch.testing.assert_close(tiled_attention(q, k, v, 4), F.scaled_dot_product_attention(q, k, v, is_causal=True))


class _Spy:
    """Counts the score tiles the loop computes, and their shapes."""

    def __init__(self, monkeypatch):
        self.tiles = []
        original = torch.Tensor.transpose

        def transpose(t, *dims):
            if dims == (2, 3):  # the keys of one tile, turned for q @ k^T
                self.tiles.append(tuple(t.shape))
            return original(t, *dims)
        monkeypatch.setattr(torch.Tensor, "transpose", transpose)


@pytest.mark.parametrize("tokens,block_size", [(16, 4), (10, 3), (7, 7), (9, 1)])
def test_causal_loop_never_computes_a_tile_above_the_diagonal(tokens, block_size, monkeypatch):
    q, k, v = qkv(1, 1, tokens, 2)
    blocks = -(-tokens // block_size)
    spy = _Spy(monkeypatch)
    tiled_attention(q, k, v, block_size, causal=True)
    assert len(spy.tiles) == blocks * (blocks + 1) // 2  # the tiles on and below the diagonal
    kinds = [tile_kind(i * block_size, j * block_size, block_size, tokens)
             for i in range(blocks) for j in range(blocks)]
    assert kinds.count(SKIPPED) == blocks * (blocks - 1) // 2
    spy.tiles.clear()
    tiled_attention(q, k, v, block_size, causal=False)
    assert len(spy.tiles) == blocks * blocks
    assert max(shape[2] for shape in spy.tiles) <= block_size  # no tile holds more keys than block_size


def test_tile_kinds():
    assert [[tile_kind(i, j, 4, 10) for j in (0, 4, 8)] for i in (0, 4, 8)] == [
        [CUT, SKIPPED, SKIPPED], [COMPUTED, CUT, SKIPPED], [COMPUTED, COMPUTED, CUT]]
    assert tile_kind(2, 2, 1, 5) == COMPUTED  # a 1 x 1 diagonal tile: the token sees itself, nothing to mask
    assert tile_kind(8, 8, 4, 9) == COMPUTED  # the last block holds one token
    assert tile_kind(8, 8, 4, 10) == CUT


def test_the_loop_holds_at_most_50_lines():
    import inspect

    assert len(inspect.getsource(tiled_loop).splitlines()) <= 50


@pytest.mark.parametrize("block_size,error,fragment", [
    (0, ValueError, "block_size must be a positive integer, got 0."),
    (-3, ValueError, "block_size must be a positive integer, got -3."),
    (2.0, TypeError, "block_size must be a positive integer, got 2.0 (float)."),
    (True, TypeError, "block_size must be a positive integer, got True (bool)."),
    ("64", TypeError, "block_size must be a positive integer, got '64' (str)."),
    (None, TypeError, "block_size must be a positive integer, got None (NoneType)."),
])
def test_block_size_errors(block_size, error, fragment):
    q, k, v = qkv(1, 1, 3, 2)
    with pytest.raises(error) as raised:
        tiled_attention(q, k, v, block_size)
    assert fragment in str(raised.value) and "block_size=64" in str(raised.value)


def test_shape_errors():
    q, k, v = qkv(1, 2, 5, 4)
    cases = [
        ((q[0], k, v), "queries must be a 4-D tensor (batch, num_heads, num_tokens, head_dim), got shape (2, 5, 4)."),
        ((q, k[:, :, :3], v), "keys (1, 2, 3, 4) must have the shape of queries (1, 2, 5, 4)"),
        ((q, k[..., :3], v), "keys (1, 2, 5, 3) must have the shape of queries (1, 2, 5, 4)"),
        ((q, k, v[:, :1]), "values (1, 1, 5, 4) must match keys (1, 2, 5, 4) in batch, heads and num_tokens"),
        ((q, k, [[1.0]]), "values must be a 4-D tensor (batch, num_heads, num_tokens, head_dim), got list."),
    ]
    for args, message in cases:
        with pytest.raises(ValueError) as raised:
            tiled_attention(*args)
        assert message in str(raised.value)
    with pytest.raises(TypeError, match="queries, keys and values must share dtype and device"):
        tiled_attention(q, k.double(), v)
    with pytest.raises(TypeError, match="keys must be a floating-point tensor, got dtype torch.int64"):
        tiled_attention(q, k.long(), v)
    with pytest.raises(TypeError, match="causal must be True or False, got 'yes'"):
        tiled_attention(q, k, v, causal="yes")


def test_the_module_equals_multihead_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(6, 8, 12, dropout=0.0, num_heads=2, qkv_bias=True).double()
    tiled = TiledMultiHeadAttention.from_multihead(mha, block_size=5)
    x = torch.randn(3, 12, 6, dtype=torch.float64)
    assert tiled.block_size == 5 and tiled.W_query.weight.dtype == torch.float64
    torch.testing.assert_close(tiled(x), mha(x), rtol=0, atol=1e-12)
    tiled(x).sum().backward()
    assert all(p.grad is not None for p in tiled.parameters())


def test_the_module_refuses_dropout_while_training():
    tiled = TiledMultiHeadAttention(4, 4, 6, dropout=0.1, num_heads=2)
    with pytest.raises(RuntimeError, match=r"applies no dropout, but this module has dropout=0.1.*Call .eval\(\)"):
        tiled(torch.rand(1, 3, 4))
    assert tiled.eval()(torch.rand(1, 3, 4)).shape == (1, 3, 4)
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        TiledMultiHeadAttention(4, 4, 6, 0.0, 2, block_size=0)
    with pytest.raises(TypeError, match="mha must be a MultiHeadAttention, got str"):
        TiledMultiHeadAttention.from_multihead("mha")

