"""What is particular to chapter 10's checks: an answer whose numbers are right but which expands the
cached latents fails 10.2 by its multiply-adds, and the cases exercise what the catalogue names."""

from __future__ import annotations

import torch

import chapter10_answers as answers
from mha_course import check
from mha_course.exercises.latent import CASES, absorbed_bound, latent_case, reference_compress


def test_scores_from_expanded_keys_are_right_and_refused_for_expanding(monkeypatch):
    monkeypatch.setenv("MHA_COURSE_CHECK_SEED", "7")
    result = check("10.2", answers.EXPANDED_SCORES)
    assert not result.passed and result.failed_check == "the latents never expanded into keys (its multiply-adds counted)"
    assert "W_UK" in result.line and "FLOPs" in result.line
    assert check("10.2", answers.absorbed_scores).passed


def test_the_bound_lies_between_the_absorbed_and_the_expanded_answers():
    from torch.utils.flop_counter import FlopCounterMode

    for seed in range(5):
        layer, x_all, start = latent_case(seed, "yarn")
        latent, rotated = reference_compress(layer, x_all)
        spent = {}
        for name, answer in (("absorbed", answers.absorbed_scores), ("expanded", answers.EXPANDED_SCORES)):
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                answer(layer, x_all[:, start:], start, latent, rotated)
            spent[name] = counter.get_total_flops()
        bound = absorbed_bound(layer, 1, latent.shape[1], 1)
        assert spent["absorbed"] <= bound < spent["expanded"]


def test_the_cases_hold_what_the_mistakes_need():
    for seed in range(5):
        cached, yarn = latent_case(seed, "cached"), latent_case(seed, "yarn")
        assert cached[2] > 0 and cached[0].W_latent.bias is not None  # positions after a cache, biases
        layer = yarn[0]
        assert layer.softmax_scale != (layer.qk_nope_head_dim + layer.qk_rope_head_dim) ** -0.5  # yarn's scale
        assert yarn[1].shape[1] > 40  # a long cache: expanding it costs more than the bound allows
    assert CASES == ("readable", "cached", "yarn")
