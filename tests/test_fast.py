"""The fast path computes what the textbook batched module computes, causally, on any device."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CUDA, build
from mha_course import FastMultiHeadAttention, MultiHeadAttention, random_batch, sdpa_forward
from mha_course.cost import count_parameters


def _pair(d_in=5, d_out=8, num_heads=2, context_length=8, dropout=0.0, qkv_bias=False):
    mha = MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=qkv_bias)
    return mha, FastMultiHeadAttention.from_multihead(mha)


@settings(max_examples=25, deadline=None)
@given(
    d_in=st.integers(1, 8),
    head_dim=st.integers(1, 6),
    num_heads=st.integers(1, 5),
    tokens=st.integers(1, 9),
    qkv_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_equal_to_textbook_module_after_transfer(d_in, head_dim, num_heads, tokens, qkv_bias, seed):
    torch.manual_seed(seed)
    mha, fast = _pair(d_in, num_heads * head_dim, num_heads, context_length=9, qkv_bias=qkv_bias)
    mha.eval(), fast.eval()
    x = random_batch(2, tokens, d_in, seed=seed)
    expected = mha(x)
    torch.testing.assert_close(fast(x), expected, rtol=1e-5, atol=1e-6)
    fast.use_sdpa = False
    torch.testing.assert_close(fast(x), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast.attention_weights(x), mha.attention_weights(x), rtol=1e-5, atol=1e-6)


def test_agreement_is_the_transfers_doing():
    """A freshly initialised fast module disagrees; after the transfer it agrees."""
    mha = MultiHeadAttention(4, 8, 6, 0.0, 2).eval()
    fresh = FastMultiHeadAttention(4, 8, 6, 0.0, 2).eval()
    x = random_batch(2, 6, 4)
    assert not torch.allclose(fresh(x), mha(x), atol=1e-3)
    torch.testing.assert_close(FastMultiHeadAttention.from_multihead(mha)(x), mha(x))


def test_gradients_equal_after_transfer():
    mha, fast = _pair(qkv_bias=True)
    x = random_batch(2, 7, 5)
    mha(x).square().sum().backward()
    fast(x).square().sum().backward()
    fused_grad = torch.cat([mha.W_query.weight.grad, mha.W_key.weight.grad, mha.W_value.weight.grad])
    torch.testing.assert_close(fast.qkv.weight.grad, fused_grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast.out_proj.weight.grad, mha.out_proj.weight.grad, rtol=1e-5, atol=1e-6)


def test_matches_raw_sdpa_on_the_same_projections():
    mha, fast = _pair(d_in=6, d_out=12, num_heads=3, context_length=10)
    x = random_batch(3, 10, 6)
    torch.testing.assert_close(fast(x), sdpa_forward(mha, x), rtol=1e-5, atol=1e-6)


def test_same_parameter_count_as_textbook_module():
    for qkv_bias in (False, True):
        mha, fast = _pair(qkv_bias=qkv_bias)
        assert count_parameters(fast) == count_parameters(mha)


# Causality of both code paths is tested with the other modules in test_attention_modules.py.


def test_attention_weights_are_causal_rows_that_sum_to_one():
    fast = FastMultiHeadAttention(3, 6, 8, 0.5, 3).train()
    weights = fast.attention_weights(random_batch(2, 5, 3))
    assert weights.shape == (2, 3, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_dropout_only_in_training():
    fast = FastMultiHeadAttention(3, 4, 6, 0.5, 2)
    x = random_batch(2, 6, 3)
    fast.train()
    assert not torch.allclose(fast(x), fast(x))
    fast.eval()
    torch.testing.assert_close(fast(x), fast(x))


def test_no_mask_buffer_and_state_dict_round_trip():
    fast = FastMultiHeadAttention(3, 4, 6, 0.0, 2)
    state = fast.state_dict()
    assert sorted(state) == ["out_proj.bias", "out_proj.weight", "qkv.weight"]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = FastMultiHeadAttention(3, 4, 6, 0.0, 2)
    fresh.load_state_dict(torch.load(buffer))
    x = random_batch(1, 6, 3)
    torch.testing.assert_close(fresh.eval()(x), fast.eval()(x))


def test_shorter_input_than_context_and_other_dtypes():
    mha, fast = _pair(context_length=16)
    mha, fast = mha.double().eval(), FastMultiHeadAttention.from_multihead(mha.double()).eval()
    assert fast.qkv.weight.dtype == torch.float64
    x = random_batch(2, 3, 5).double()
    out = fast(x)
    assert out.dtype == torch.float64 and out.shape == (2, 3, 8)
    torch.testing.assert_close(out, mha(x))


def test_from_multihead_follows_training_mode_and_dropout():
    mha = MultiHeadAttention(3, 4, 6, 0.25, 2).eval()
    fast = FastMultiHeadAttention.from_multihead(mha)
    assert not fast.training and fast.dropout.p == 0.25


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match=r"d_out \(6\) must be divisible by num_heads \(4\)"):
        FastMultiHeadAttention(3, 6, 8, 0.0, 4)
    with pytest.raises(ValueError, match="dropout must be in"):
        FastMultiHeadAttention(3, 4, 8, 1.0, 2)
    with pytest.raises(TypeError, match="num_heads must be a positive integer"):
        FastMultiHeadAttention(3, 4, 8, 0.0, 2.0)
    fast = FastMultiHeadAttention(3, 4, 6, 0.0, 2)
    with pytest.raises(ValueError, match="context_length=6"):
        fast(random_batch(1, 7, 3))
    with pytest.raises(ValueError, match=r"unsqueeze\(0\)"):
        fast(torch.rand(6, 3))
    with pytest.raises(ValueError, match="d_in=3"):
        fast(random_batch(1, 6, 5))
    with pytest.raises(TypeError, match="floating-point"):
        fast(torch.ones(1, 6, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"mha must be a MultiHeadAttention, got MultiHeadAttentionWrapper\. Convert it "
                                        r"first: FastMultiHeadAttention\.from_multihead\(MultiHeadAttention\.from_wrapper"
                                        r"\(wrapper\)\)\.$"):
        FastMultiHeadAttention.from_multihead(build("wrapper"))


@CUDA
def test_runs_on_cuda_and_matches_cpu():
    mha, fast = _pair()
    mha, fast = mha.eval(), fast.eval()
    x = random_batch(2, 8, 5)
    expected = mha(x)
    fast_cuda = FastMultiHeadAttention.from_multihead(mha.cuda())
    out = fast_cuda(x.cuda())
    assert out.is_cuda and fast_cuda.qkv.weight.is_cuda
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-5)
    assert fast_cuda.attention_weights(x.cuda()).is_cuda


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_empty_sequence_gives_an_empty_result_on_both_paths(use_sdpa):
    fast = FastMultiHeadAttention(3, 4, 6, 0.0, 2).eval()
    fast.use_sdpa = use_sdpa
    x = torch.rand(2, 0, 3)
    assert fast(x).shape == (2, 0, 4)
    assert fast.attention_weights(x).shape == (2, 2, 0, 0)
