"""The three stages compute the same function: weight transfer, SDPA and torch.nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import build
from mha_course import (
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    random_batch,
    sdpa_forward,
    to_torch_multihead,
    torch_multihead_forward,
    transfer_weights,
)


@settings(max_examples=20, deadline=None)
@given(
    d_in=st.integers(1, 8),
    head_dim=st.integers(1, 5),
    num_heads=st.integers(1, 5),
    tokens=st.integers(1, 7),
    qkv_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_wrapper_and_batched_module_agree_after_weight_transfer(d_in, head_dim, num_heads, tokens, qkv_bias, seed):
    torch.manual_seed(seed)
    wrapper = build("wrapper", d_in=d_in, head_dim=head_dim, num_heads=num_heads, context_length=7,
                    qkv_bias=qkv_bias).eval()
    mha = MultiHeadAttention.from_wrapper(wrapper).eval()
    x = random_batch(2, tokens, d_in, seed=seed)
    torch.testing.assert_close(mha(x), wrapper(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mha.attention_weights(x), wrapper.attention_weights(x), rtol=1e-5, atol=1e-6)


def test_transfer_weights_changes_outputs_from_random_init():
    """Without the transfer the two modules disagree, so the agreement above is the transfer's doing."""
    wrapper = build("wrapper").eval()
    mha = MultiHeadAttention(3, 4, 6, 0.0, 2).eval()
    x = random_batch(1, 6, 3)
    assert not torch.allclose(mha(x), wrapper(x), atol=1e-3)
    transfer_weights(wrapper, mha)
    torch.testing.assert_close(mha(x), wrapper(x))


def test_transfer_weights_rejects_mismatched_sizes():
    wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)
    with pytest.raises(ValueError, match=r"mha\.head_dim is 1 but the wrapper needs 2.*d_out=4"):
        transfer_weights(wrapper, MultiHeadAttention(3, 2, 6, 0.0, num_heads=2))
    with pytest.raises(ValueError, match="qkv_bias differs"):
        transfer_weights(wrapper, MultiHeadAttention(3, 4, 6, 0.0, num_heads=2, qkv_bias=True))
    with pytest.raises(TypeError, match="wrapper must be a MultiHeadAttentionWrapper"):
        MultiHeadAttention.from_wrapper(MultiHeadAttention(3, 4, 6, 0.0, 2))


@pytest.mark.parametrize("num_heads,head_dim,tokens", [(1, 8, 5), (2, 4, 7), (4, 2, 16), (8, 1, 3)])
def test_batched_module_matches_scaled_dot_product_attention(num_heads, head_dim, tokens):
    mha = build("batched", d_in=6, head_dim=head_dim, num_heads=num_heads, context_length=16).eval()
    x = random_batch(3, tokens, 6)
    torch.testing.assert_close(mha(x), sdpa_forward(mha, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_batched_module_matches_torch_multihead_attention(qkv_bias, num_heads):
    mha = MultiHeadAttention(8, 8, 10, 0.0, num_heads, qkv_bias=qkv_bias).eval()
    torch_mha = to_torch_multihead(mha).eval()
    x = random_batch(2, 10, 8)
    torch.testing.assert_close(torch_multihead_forward(torch_mha, x), mha(x), rtol=1e-5, atol=1e-6)


def test_to_torch_multihead_needs_square_projection():
    with pytest.raises(ValueError, match="needs d_in == d_out.*d_in=3 and d_out=4"):
        to_torch_multihead(MultiHeadAttention(3, 4, 6, 0.0, 2))
