"""The tiled loop with an online softmax: the same numbers and gradients as PyTorch's fused kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import FastMultiHeadAttention, MultiHeadAttention, TiledMultiHeadAttention, tiled_attention
from mha_course.attention import tiled as tiled_module
from mha_course.bench.tiled_steps import explicit_attention, saved_tensor_bytes
from mha_course.attention.tiled import COMPUTED, CUT, SKIPPED, TiledAttention, tile_kind


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


def gradients(attention, inputs, upstream):
    """The gradients of ``(attention(q, k, v) * upstream).sum()`` with respect to q, k and v."""
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    return torch.autograd.grad((attention(*twins) * upstream).sum(), twins)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 40), block_size=st.integers(1, 48), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_gradients_equal_sdpas_in_float64(tokens, block_size, causal, seed):
    inputs = qkv(2, 2, tokens, 5, dtype=torch.float64, seed=seed)
    upstream = torch.randn(2, 2, tokens, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    got = gradients(lambda q, k, v: tiled_attention(q, k, v, block_size, causal), inputs, upstream)
    expected = gradients(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), inputs, upstream)
    for name, g, e in zip("qkv", got, expected):
        assert (g - e).abs().max() < 1e-10, name


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", [1.0, 30.0])  # scores of a few units, and in the thousands
def test_gradients_equal_sdpas_in_float32_to_rounding(causal, scale):
    inputs = qkv(2, 3, 37, 8, seed=3, scale=scale)
    upstream = torch.randn(2, 3, 37, 8, generator=torch.Generator().manual_seed(9))
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    got = gradients(lambda q, k, v: tiled_attention(q, k, v, 8, causal), inputs, upstream)
    fused = gradients(sdpa, inputs, upstream)
    exact = gradients(sdpa, [t.double() for t in inputs], upstream.double())
    eps = torch.finfo(torch.float32).eps
    for g, f, e in zip(got, fused, exact):
        assert torch.isfinite(g).all()
        # Rounding: the loop is as far from the float64 gradients as the fused kernel is (scores in
        # the thousands make float32 gradients of q and k ill-conditioned for both), within a few steps.
        error, fused_error = (g.double() - e).abs().max(), (f.double() - e).abs().max()
        assert error <= 3 * fused_error + 16 * eps * e.abs().max()
        if scale == 1.0:
            assert (g - f).abs().max() <= 32 * eps * max(f.abs().max(), 1.0)


@pytest.mark.parametrize("tokens,block_size,causal", [(5, 2, True), (5, 2, False), (6, 3, True), (4, 8, True)])
def test_gradcheck(tokens, block_size, causal):
    inputs = [t.requires_grad_() for t in qkv(1, 2, tokens, 3, dtype=torch.float64, seed=4)]
    assert torch.autograd.gradcheck(lambda q, k, v: tiled_attention(q, k, v, block_size, causal), inputs)


def test_half_precision_gradients_come_back_in_the_inputs_dtype():
    inputs = [t.to(torch.bfloat16).requires_grad_() for t in qkv(1, 2, 9, 8, seed=8)]
    tiled_attention(*inputs, block_size=4).float().sum().backward()
    assert all(t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all() for t in inputs)


def test_the_backward_keeps_the_inputs_the_output_and_one_log_sum_exp_per_row():
    shapes = []

    def pack(t):
        shapes.append((tuple(t.shape), t.dtype))
        return t

    q, k, v = (t.requires_grad_() for t in qkv(2, 3, 10, 4))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = tiled_attention(q, k, v, block_size=4)
    assert shapes == [((2, 3, 10, 4), torch.float32)] * 4 + [((2, 3, 10, 1), torch.float32)]
    assert out.grad_fn.name() == "TiledAttentionBackward"


def _saved(attention, tokens):
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, tokens, 64))
    return saved_tensor_bytes(lambda: attention(q, k, v))


def test_what_autograd_saves_grows_as_t_and_stays_near_sdpas():
    """Without a backward of its own, autograd kept every tile's intermediates of the loop: more than
    the explicit (T, T) scores. With it, the inputs, the output and one number per row."""
    tiled = {t: _saved(lambda q, k, v: tiled_attention(q, k, v, 64), t) for t in (512, 1024, 2048)}
    sdpa = {t: _saved(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), t)
            for t in (1024, 2048)}
    explicit = {t: _saved(explicit_attention, t) for t in (1024, 2048)}
    for t in (1024, 2048):
        assert tiled[t] <= 1.5 * sdpa[t]
        assert tiled[t] < explicit[t] / 4  # the explicit computation keeps its (T, T) weights
        assert 1.9 < tiled[t] / tiled[t // 2] < 2.1  # in proportion to T
    assert 3.5 < explicit[2048] / explicit[1024] < 4.1  # in proportion to T squared


def test_the_backward_skips_the_same_tiles(monkeypatch):
    calls = []
    original = tiled_module.tile_scores

    def counting(q, keys, q_start, k_start, *rest):
        calls.append((q_start, k_start))
        return original(q, keys, q_start, k_start, *rest)

    monkeypatch.setattr(tiled_module, "tile_scores", counting)
    q, k, v = (t.requires_grad_() for t in qkv(1, 1, 10, 2))
    out = tiled_attention(q, k, v, block_size=4)
    forward = list(calls)
    calls.clear()
    out.sum().backward()
    assert forward == calls == [(0, 0), (4, 0), (4, 4), (8, 0), (8, 4), (8, 8)]


def test_a_row_masked_whole_in_a_tile_stays_finite():
    # The first block of keys is all -inf to positive queries (as padding would make it), so after
    # that tile the rows' running maximum is -inf: exp(-inf - (-inf)) would be NaN without the guard.
    q = torch.rand(1, 1, 6, 3, dtype=torch.float64) + 0.1
    k, v = torch.randn(2, 1, 1, 6, 3, dtype=torch.float64).unbind(0)
    k[:, :, :2] = -torch.inf
    got = tiled_attention(q, k, v, block_size=2, causal=False)
    scores = q @ k.transpose(2, 3) / 3**0.5
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.softmax(scores, -1) @ v, rtol=0, atol=1e-12)


def test_the_module_trains_through_the_loop():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 16, dropout=0.0, num_heads=2).double()
    tiled = TiledMultiHeadAttention.from_multihead(mha, block_size=3)
    x, target = torch.randn(2, 12, 8, dtype=torch.float64), torch.randn(2, 12, 8, dtype=torch.float64)
    for module in (mha, tiled):
        torch.nn.functional.mse_loss(module(x), target).backward()
    for (name, p), q in zip(tiled.named_parameters(), mha.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-12, msg=name)
    optimiser = torch.optim.SGD(tiled.parameters(), lr=0.5)
    losses = []
    for _ in range(20):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(tiled(x), target)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]


def test_large_scores_stay_finite():
    # Scores in the thousands: exp() of them overflows without the running maximum.
    q, k, v = qkv(1, 2, 20, 8, seed=5, scale=30.0)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = tiled_attention(q, k, v, block_size=6)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_float16_scores_that_overflow_stay_finite_and_return_float16():
    # q.k of about 1e6: inf in float16, so the loop computes the scores in float32, as SDPA does.
    q, k, v = (t.half() for t in qkv(1, 2, 9, 8, seed=7, scale=300.0))
    got = tiled_attention(q, k, v, block_size=4)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1.0)


def test_no_tokens_give_an_empty_result():
    q, k, v = qkv(2, 3, 0, 4)
    assert tiled_attention(q, k, v, block_size=4).shape == (2, 3, 0, 4)


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


def test_the_forward_and_the_backward_each_hold_at_most_50_lines():
    import inspect

    for method in (TiledAttention.forward, TiledAttention.backward):
        assert len(inspect.getsource(method).splitlines()) <= 50


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
    fast = FastMultiHeadAttention(4, 4, 6, 0.0, 2)
    with pytest.raises(TypeError, match=r"got FastMultiHeadAttention\. Convert it first: TiledMultiHeadAttention"
                                        r"\.from_multihead\(MultiHeadAttention\.from_fast\(fast\), block_size\)"):
        TiledMultiHeadAttention.from_multihead(fast)
    tiled = TiledMultiHeadAttention.from_multihead(MultiHeadAttention.from_fast(fast), block_size=3)
    x = torch.rand(1, 5, 4)
    torch.testing.assert_close(tiled(x), fast(x))



def test_the_modules_attention_weights_are_multihead_attentions():
    """The loop never holds a row of weights whole: they come from the explicit computation, and the
    module keeps running the loop afterwards."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(6, 8, 12, dropout=0.0, num_heads=2)
    tiled = TiledMultiHeadAttention.from_multihead(mha, block_size=3)
    x = torch.rand(2, 7, 6)
    torch.testing.assert_close(tiled.attention_weights(x), mha.attention_weights(x))
    assert tiled.tiled
    tiled.tiled = False  # the explicit computation, for comparison
    torch.testing.assert_close(tiled(x), mha(x))
