"""The shared head helpers: split and merge are inverse views, QKV packing round-trips, errors name the fix."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from mha_course import merge_heads, split_heads, stack_qkv, unstack_qkv



@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 3), tokens=st.integers(0, 5), num_heads=st.integers(1, 4), head_dim=st.integers(1, 4))
def test_split_cuts_columns_into_heads_and_merge_undoes_it(batch, tokens, num_heads, head_dim):
    t = torch.rand(batch, tokens, num_heads * head_dim)
    heads = split_heads(t, num_heads)
    assert heads.shape == (batch, num_heads, tokens, head_dim)
    for h in range(num_heads):  # head h is columns [h*d_h, (h+1)*d_h) of every token
        assert torch.equal(heads[:, h], t[..., h * head_dim:(h + 1) * head_dim])
    assert torch.equal(merge_heads(heads), t)
    # Merging equals concatenating the heads' outputs, as the wrapper does.
    assert torch.equal(merge_heads(heads), torch.cat(list(heads.unbind(1)), dim=-1))


def test_split_copies_nothing_and_merge_returns_a_contiguous_tensor():
    t = torch.rand(2, 5, 12)
    heads = split_heads(t, 3)
    assert heads.data_ptr() == t.data_ptr() and not heads.is_contiguous()
    merged = merge_heads(heads)
    assert merged.is_contiguous() and merged.shape == (2, 5, 12)


def test_split_and_merge_keep_gradients():
    t = torch.rand(2, 4, 6, requires_grad=True)
    merge_heads(split_heads(t, 2)).square().sum().backward()
    torch.testing.assert_close(t.grad, 2 * t.detach())


def test_split_and_merge_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"t is 6 wide \(t\.shape\[-1\]\) but num_heads=4 does not divide it"):
        split_heads(torch.rand(1, 2, 6), 4)
    with pytest.raises(ValueError, match=r"t must be a 3-D tensor of shape \(batch, num_tokens, num_heads \* head_dim\), got shape \(2, 6\)"):
        split_heads(torch.rand(2, 6), 2)
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got 0"):
        split_heads(torch.rand(1, 2, 6), 0)
    with pytest.raises(TypeError, match="t must be a torch.Tensor.*got list"):
        split_heads([[1.0]], 1)
    with pytest.raises(ValueError, match=r"t must be a 4-D tensor of shape \(batch, num_heads, num_tokens, head_dim\), got shape \(2, 5, 12\)"):
        merge_heads(torch.rand(2, 5, 12))


def test_stack_and_unstack_qkv_round_trip_weights_biases_and_activations():
    q, k, v = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(3, 4)
    packed = stack_qkv(q.weight, k.weight, v.weight)
    assert packed.shape == (12, 3)
    fused = nn.Linear(3, 12)
    with torch.no_grad():
        fused.weight.copy_(packed)
        fused.bias.copy_(stack_qkv(q.bias, k.bias, v.bias))
    x = torch.rand(2, 5, 3)
    for part, linear in zip(unstack_qkv(fused(x), dim=-1), (q, k, v), strict=True):  # the fused output, cut by role
        torch.testing.assert_close(part, linear(x))
    for part, linear in zip(unstack_qkv(packed), (q, k, v), strict=True):
        assert torch.equal(part, linear.weight)
    assert stack_qkv(None, None, None) is None
    assert unstack_qkv(None) == (None, None, None)


def test_stack_and_unstack_qkv_errors():
    w = torch.rand(4, 3)
    with pytest.raises(ValueError, match=r"tensor for query and value but None for key.*same bias setting \(qkv_bias\)"):
        stack_qkv(w[0], None, w[1])
    with pytest.raises(ValueError, match=r"same shape.*'key': \(5, 3\)"):
        stack_qkv(w, torch.rand(5, 3), w)
    with pytest.raises(ValueError, match=r"size 7 along dim=0, not a multiple of 3"):
        unstack_qkv(torch.rand(7, 3))
    with pytest.raises(TypeError, match="packed must be a torch.Tensor or None, got list"):
        unstack_qkv([1, 2, 3])
