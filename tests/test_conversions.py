"""Conversions between the course's modules and PyTorch's: exact, both ways, keeping device, dtype, bias and mode."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from conftest import build
from mha_course import (
    FastMultiHeadAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    from_torch_multihead,
    random_batch,
    to_torch_multihead,
    torch_multihead_forward,
)

TOL = dict(rtol=1e-5, atol=1e-6)


def _sequence_first_forward(torch_mha: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal self-attention with a ``batch_first=False`` module, on a ``(B, T, E)`` input."""
    mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
    seq = x.transpose(0, 1)  # (T, B, E), the layout such a module reads
    out, _ = torch_mha(seq, seq, seq, attn_mask=mask, need_weights=False)
    return out.transpose(0, 1)  # (B, T, E)


# ----------------------------------------------------------------------------------------------
# Every conversion copies the training mode


@pytest.mark.parametrize("training", [False, True])
def test_from_wrapper_copies_the_training_mode(training):
    wrapper = MultiHeadAttentionWrapper(3, 2, 6, dropout=0.5, num_heads=2).train(training)
    mha = MultiHeadAttention.from_wrapper(wrapper)
    assert mha.training is training
    assert all(module.training is training for module in mha.modules())
    if not training:  # with dropout 0.5, only a module in eval mode computes what the wrapper computes
        x = random_batch(2, 6, 3)
        torch.testing.assert_close(mha(x), wrapper(x), **TOL)


@pytest.mark.parametrize("training", [False, True])
def test_every_conversion_copies_the_training_mode(training):
    mha = MultiHeadAttention(4, 4, 6, dropout=0.25, num_heads=2).train(training)
    fast = FastMultiHeadAttention.from_multihead(mha)
    torch_mha = to_torch_multihead(mha)
    converted = [fast, torch_mha, MultiHeadAttention.from_fast(fast), from_torch_multihead(torch_mha, 6)]
    for module in converted:
        assert module.training is training, type(module).__name__
        assert all(child.training is training for child in module.modules()), type(module).__name__


# ----------------------------------------------------------------------------------------------
# torch_multihead_forward refuses a sequence-first module


def test_torch_multihead_forward_refuses_a_sequence_first_module():
    torch_mha = nn.MultiheadAttention(4, 2)  # PyTorch's default layout: batch_first=False
    for batch, tokens in [(2, 5), (3, 3)]:  # B != T used to fail on a mask shape, B == T to mix the batch
        with pytest.raises(ValueError, match=r"batch_first=False.*batch_first=True.*from_torch_multihead"):
            torch_multihead_forward(torch_mha, random_batch(batch, tokens, 4))


def test_torch_multihead_forward_checks_its_arguments():
    with pytest.raises(TypeError, match=r"torch_mha must be a torch\.nn\.MultiheadAttention, got MultiHeadAttention"):
        torch_multihead_forward(MultiHeadAttention(4, 4, 6, 0.0, 2), random_batch(1, 3, 4))
    torch_mha = nn.MultiheadAttention(4, 2, batch_first=True)
    with pytest.raises(ValueError, match=r"x has 3 features per token.*d_in=4"):
        torch_multihead_forward(torch_mha, random_batch(1, 3, 3))
    with pytest.raises(ValueError, match=r"unsqueeze\(0\)"):
        torch_multihead_forward(torch_mha, torch.rand(3, 4))


# ----------------------------------------------------------------------------------------------
# from_torch_multihead: PyTorch's module -> the course's


@settings(max_examples=20, deadline=None)
@given(
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 4),
    tokens=st.integers(1, 7),
    bias=st.booleans(),
    batch_first=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_from_torch_multihead_is_exact(head_dim, num_heads, tokens, bias, batch_first, seed):
    torch.manual_seed(seed)
    embed_dim = head_dim * num_heads
    torch_mha = nn.MultiheadAttention(embed_dim, num_heads, bias=bias, batch_first=batch_first).eval()
    if bias:  # PyTorch starts its biases at zero; make them count
        with torch.no_grad():
            torch_mha.in_proj_bias.normal_()
            torch_mha.out_proj.bias.normal_()
    mha = from_torch_multihead(torch_mha, context_length=7)
    x = random_batch(2, tokens, embed_dim, seed=seed)
    expected = torch_multihead_forward(torch_mha, x) if batch_first else _sequence_first_forward(torch_mha, x)
    torch.testing.assert_close(mha(x), expected, **TOL)
    assert (mha.W_query.bias is not None) is bias
    assert (mha.d_in, mha.d_out, mha.num_heads, mha.context_length) == (embed_dim, embed_dim, num_heads, 7)


def test_from_torch_multihead_keeps_dtype_device_dropout_and_weights():
    torch_mha = nn.MultiheadAttention(6, 3, dropout=0.2, batch_first=True, dtype=torch.float64)
    mha = from_torch_multihead(torch_mha, context_length=5)
    assert mha.W_query.weight.dtype == torch.float64 and mha.mask.dtype == torch.bool
    assert mha.W_query.weight.device == torch_mha.in_proj_weight.device
    assert mha.dropout.p == 0.2
    assert from_torch_multihead(torch_mha, context_length=5, dropout=0.0).dropout.p == 0.0
    # The copy is a copy: training one leaves the other alone.
    with torch.no_grad():
        mha.W_query.weight.zero_()
    assert torch_mha.in_proj_weight.abs().sum() > 0


def test_a_round_trip_through_pytorch_gives_back_the_same_function():
    mha = MultiHeadAttention(8, 8, 10, 0.0, num_heads=4, qkv_bias=True).eval()
    back = from_torch_multihead(to_torch_multihead(mha), context_length=10)
    for name, tensor in mha.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, rtol=0, atol=0)
    x = random_batch(2, 10, 8)
    torch.testing.assert_close(back(x), mha(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "make,error,message",
    [
        (lambda: nn.MultiheadAttention(4, 2, kdim=3, vdim=3, batch_first=True), ValueError,
         r"kdim=3 and vdim=3, which differ from embed_dim=4.*self-attention.*kdim == vdim == embed_dim"),
        (lambda: nn.MultiheadAttention(4, 2, add_bias_kv=True, batch_first=True), ValueError,
         r"add_bias_kv=True.*add_bias_kv=False"),
        (lambda: nn.MultiheadAttention(4, 2, add_zero_attn=True, batch_first=True), ValueError,
         r"add_zero_attn=True.*add_zero_attn=False"),
        (lambda: MultiHeadAttention(4, 4, 6, 0.0, 2), TypeError,
         r"torch_mha must be a torch\.nn\.MultiheadAttention, got MultiHeadAttention.*to_torch_multihead"),
    ],
)
def test_from_torch_multihead_refuses_what_cannot_convert(make, error, message):
    with pytest.raises(error, match=message):
        from_torch_multihead(make(), context_length=6)


def test_from_torch_multihead_checks_context_length_and_dropout():
    torch_mha = nn.MultiheadAttention(4, 2, batch_first=True)
    with pytest.raises(ValueError, match="context_length must be a positive integer, got 0"):
        from_torch_multihead(torch_mha, context_length=0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1\.5"):
        from_torch_multihead(torch_mha, context_length=6, dropout=1.5)


def test_from_torch_multihead_with_a_missing_output_bias():
    """A module whose output projection lost its bias converts with a zero bias: the same function."""
    torch_mha = nn.MultiheadAttention(4, 2, batch_first=True).eval()
    torch_mha.out_proj.bias = None
    mha = from_torch_multihead(torch_mha, context_length=6)
    assert torch.equal(mha.out_proj.bias, torch.zeros(4))
    x = random_batch(2, 6, 4)
    torch.testing.assert_close(mha(x), torch_multihead_forward(torch_mha, x), **TOL)


# ----------------------------------------------------------------------------------------------
# MultiHeadAttention.from_fast: the fused module -> the textbook one


@settings(max_examples=20, deadline=None)
@given(
    d_in=st.integers(1, 6),
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 4),
    tokens=st.integers(1, 7),
    qkv_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_from_fast_is_exact(d_in, head_dim, num_heads, tokens, qkv_bias, seed):
    torch.manual_seed(seed)
    fast = build("fast", d_in=d_in, head_dim=head_dim, num_heads=num_heads, context_length=7,
                 qkv_bias=qkv_bias).eval()
    mha = MultiHeadAttention.from_fast(fast)
    x = random_batch(2, tokens, d_in, seed=seed)
    torch.testing.assert_close(mha(x), fast(x), **TOL)
    assert (mha.W_query.bias is not None) is qkv_bias
    assert (mha.d_in, mha.d_out, mha.num_heads, mha.context_length) == (fast.d_in, fast.d_out, num_heads, 7)


def test_from_fast_and_from_multihead_are_inverse():
    mha = MultiHeadAttention(5, 6, 8, 0.3, num_heads=3, qkv_bias=True).double()
    back = MultiHeadAttention.from_fast(FastMultiHeadAttention.from_multihead(mha))
    assert back.W_query.weight.dtype == torch.float64 and back.dropout.p == 0.3
    for name, tensor in mha.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_from_fast_refuses_other_modules():
    with pytest.raises(TypeError, match=r"fast must be a FastMultiHeadAttention, got MultiHeadAttentionWrapper.*from_wrapper"):
        MultiHeadAttention.from_fast(build("wrapper"))
