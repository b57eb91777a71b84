"""Shapes, causality, determinism and the mask buffer, for all three attention classes."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CAUSAL_KINDS, CUDA, KINDS, build
from mha_course import random_batch


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 6), (3, 4)])
def test_output_shape(kind, batch, tokens):
    module = build(kind, d_in=5, head_dim=3, num_heads=4, context_length=6)
    out = module(random_batch(batch, tokens, 5))
    width = {"causal": 3, "wrapper": 12, "batched": 12}[kind]
    assert out.shape == (batch, tokens, width)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_weights_shape_and_rows_sum_to_one(kind):
    module = build(kind, num_heads=3, context_length=8)
    weights = module.attention_weights(random_batch(2, 5, 3))
    expected = (2, 5, 5) if kind == "causal" else (2, 3, 5, 5)
    assert weights.shape == expected
    torch.testing.assert_close(weights.sum(-1), torch.ones(expected[:-1]))
    # Nothing above the diagonal: no weight on a future token.
    assert torch.all(weights.triu(diagonal=1) == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_weights_leave_forward_unchanged(kind):
    module = build(kind).eval()
    x = random_batch(2, 6, 3)
    before = module(x)
    module.attention_weights(x)
    torch.testing.assert_close(module(x), before)


@settings(max_examples=50, deadline=None)
@given(
    kind=st.sampled_from(CAUSAL_KINDS),
    d_in=st.integers(1, 6),
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 4),
    tokens=st.integers(2, 9),
    t=st.integers(0, 8),
    seed=st.integers(0, 2**16),
)
def test_future_tokens_never_change_the_past(kind, d_in, head_dim, num_heads, tokens, t, seed):
    """Changing tokens after position t leaves outputs up to t unchanged (and does change the rest)."""
    t = t % (tokens - 1)
    torch.manual_seed(seed)
    module = build(kind, d_in=d_in, head_dim=head_dim, num_heads=num_heads, context_length=tokens).eval()
    x = random_batch(2, tokens, d_in, seed=seed)
    changed = x.clone()
    changed[:, t + 1 :] = random_batch(2, tokens - t - 1, d_in, seed=seed + 1) * 3
    out, out_changed = module(x), module(changed)
    torch.testing.assert_close(out_changed[:, : t + 1], out[:, : t + 1], rtol=1e-5, atol=1e-6)
    # ...while the changed positions do change: the test can fail.
    assert not torch.allclose(out_changed[:, t + 1 :], out[:, t + 1 :], atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_later_tokens_do_see_earlier_ones(kind):
    """The converse of causality: changing token 0 changes every later output."""
    module = build(kind).eval()
    x = random_batch(1, 6, 3)
    changed = x.clone()
    changed[:, 0] += 1.0
    difference = (module(changed) - module(x)).abs().amax(dim=-1)[0]
    assert torch.all(difference > 1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_eval_mode_is_deterministic_with_dropout(kind):
    module = build(kind, dropout=0.5).eval()
    x = random_batch(2, 6, 3)
    torch.testing.assert_close(module(x), module(x))


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_acts_in_training_mode(kind):
    module = build(kind, dropout=0.5).train()
    x = random_batch(2, 6, 3)
    assert not torch.allclose(module(x), module(x))


@pytest.mark.parametrize("kind", KINDS)
def test_mask_is_a_saved_buffer_and_survives_state_dict_round_trip(kind):
    module = build(kind, context_length=5)
    state = module.state_dict()
    mask_keys = [key for key in state if key.endswith("mask")]
    assert mask_keys, "the causal mask must be a registered (persistent) buffer"
    assert not any(name.endswith("mask") for name, _ in module.named_parameters())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = build(kind, context_length=5)
    fresh.load_state_dict(torch.load(buffer))
    x = random_batch(1, 5, 3)
    torch.testing.assert_close(fresh.eval()(x), module.eval()(x))
    for key in mask_keys:
        assert torch.equal(fresh.state_dict()[key], torch.triu(torch.ones(5, 5, dtype=torch.bool), 1))


@pytest.mark.parametrize("kind", KINDS)
def test_mask_moves_with_to(kind):
    module = build(kind).to(torch.float64)
    # dtype moves apply to floating buffers only; the boolean mask must stay boolean.
    for name, buf in module.named_buffers():
        assert buf.dtype == torch.bool, name
    out = module(random_batch(1, 6, 3).double())
    assert out.dtype == torch.float64


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_every_parameter(kind):
    module = build(kind, qkv_bias=True)
    module(random_batch(2, 6, 3)).sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_heads_do_not_share_weights():
    wrapper = build("wrapper", num_heads=3)
    pointers = {head.W_query.weight.data_ptr() for head in wrapper.heads}
    assert len(pointers) == 3
    assert not torch.equal(wrapper.heads[0].W_query.weight, wrapper.heads[1].W_query.weight)


def test_wrapper_output_is_concatenation_of_heads():
    wrapper = build("wrapper", num_heads=3).eval()
    x = random_batch(2, 6, 3)
    expected = torch.cat([head(x) for head in wrapper.heads], dim=-1)
    torch.testing.assert_close(wrapper(x), expected)


def test_causal_attention_matches_hand_computation():
    head = build("causal", d_in=3, head_dim=2).eval()
    x = random_batch(1, 4, 3)
    q, k, v = head.W_query(x), head.W_key(x), head.W_value(x)
    scores = q @ k.transpose(1, 2) / 2**0.5
    scores = scores + torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)
    expected = torch.softmax(scores, dim=-1) @ v
    torch.testing.assert_close(head(x), expected)


@CUDA
@pytest.mark.parametrize("kind", KINDS)
def test_runs_on_cuda(kind):
    module = build(kind).to("cuda")
    assert module.mask.device.type == "cuda" if kind != "wrapper" else module.heads[0].mask.is_cuda
    x = random_batch(2, 6, 3)
    out = module(x.cuda())
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), module.cpu()(x), rtol=1e-4, atol=1e-5)
