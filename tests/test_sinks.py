"""The softmax with attention sinks (gpt-oss): one learned logit per head takes a share of every row's
probability and gives no value. Its rows sum to one minus the sink's share, it is the plain softmax when
the sinks are minus infinity, it equals transformers' gpt-oss computation, a row that sees no key gives
weights 0 with finite gradients, and the sinks learn."""

from __future__ import annotations

import pytest
import torch

from mha_course.attention.sinks import softmax_with_sinks


def test_each_row_gives_the_sink_its_share_and_the_keys_the_rest():
    scores = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    sinks = torch.tensor([-1.0, 0.5, 3.0])
    weights = softmax_with_sinks(scores, sinks)
    share = torch.sigmoid(sinks.view(1, 3, 1) - scores.logsumexp(-1))  # exp(s) / (sum exp + exp(s))
    torch.testing.assert_close(weights.sum(-1), 1 - share)
    torch.testing.assert_close(weights / weights.sum(-1, keepdim=True), scores.softmax(-1))  # same proportions
    assert (weights.sum(-1)[:, 2] < weights.sum(-1)[:, 0]).all()  # a larger sink takes more


def test_sinks_of_minus_infinity_give_the_plain_softmax_and_masks_hide_keys():
    scores = torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    weights = softmax_with_sinks(scores, torch.full((2,), float("-inf")), causal)
    torch.testing.assert_close(weights, scores.masked_fill(causal, float("-inf")).softmax(-1))


def test_it_is_what_transformers_gpt_oss_computes():
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=generator) for _ in range(3))
    sinks = torch.randn(4, generator=generator)
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    module = SimpleNamespace(num_key_value_groups=1, sinks=sinks, training=False)
    additive = torch.zeros(6, 6).masked_fill(causal, torch.finfo(torch.float32).min)
    expected, their_weights = eager_attention_forward(module, q, k, v, additive, scaling=8**-0.5)
    weights = softmax_with_sinks(q @ k.mT * 8**-0.5, sinks, causal)
    torch.testing.assert_close(weights, their_weights)
    torch.testing.assert_close((weights @ v).transpose(1, 2), expected)


def test_a_row_that_sees_no_key_gives_zero_and_finite_gradients():
    scores = torch.randn(1, 2, 3, 3, requires_grad=True)
    sinks = torch.zeros(2, requires_grad=True)
    mask = torch.tensor([[True, True, True], [False, True, True], [False, False, True]])
    weights = softmax_with_sinks(scores, sinks, mask)
    assert torch.equal(weights[0, :, 0], torch.zeros(2, 3))
    (weights * torch.randn(weights.shape)).sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.isfinite(sinks.grad).all()
    assert sinks.grad.abs().sum() > 0  # the sinks learn


def test_half_precision_scores_are_weighed_in_float32():
    weights = softmax_with_sinks(torch.randn(1, 1, 2, 2).half(), torch.zeros(1))
    assert weights.dtype == torch.float32
