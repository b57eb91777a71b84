"""Greedy generation of a left-padded batch through a stack of the course's layers equals each prompt alone."""

from __future__ import annotations

import pytest
import torch

from mha_course.attention.generation import TinyDecoder, generate, left_pad

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3]]


def _model(seed=0):
    torch.manual_seed(seed)
    return TinyDecoder(vocab_size=17, d_model=16, num_layers=3, context_length=16, num_heads=4,
                       num_kv_groups=2).eval()


def test_a_padded_batch_generates_what_each_prompt_generates_alone():
    model = _model()
    batched, logits = generate(model, PROMPTS, num_new=6)
    assert logits.shape == (3, 6, 17) and torch.isfinite(logits).all()
    for i, prompt in enumerate(PROMPTS):
        alone, alone_logits = generate(model, [prompt], num_new=6)
        assert batched[i] == alone[0]
        torch.testing.assert_close(logits[i], alone_logits[0], rtol=1e-5, atol=1e-5)


def test_without_the_padding_mask_the_short_prompts_change():
    """Guards the test above: the padding tokens do change a prompt's logits when they are not masked."""
    model = _model()
    ids, mask = left_pad(PROMPTS)
    with torch.no_grad():
        masked = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))[:, -1]
        unmasked = model(ids)[:, -1]
    assert torch.allclose(masked[0], unmasked[0], atol=1e-5)  # the longest prompt has no padding
    assert not torch.allclose(masked[2], unmasked[2], atol=1e-3)


def test_left_pad_refuses_an_empty_prompt():
    with pytest.raises(ValueError, match="non-empty lists of token ids"):
        left_pad([[1], []])
