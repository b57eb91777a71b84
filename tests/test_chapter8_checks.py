"""Chapter 8's check: messages that show the module and the input, and its variant.

tests/test_checks.py runs the check on the answers of tests/chapter8_answers.py once, and
tests/test_checks_over_seeds.py over several fixed seeds (with the tests that the inputs change
from run to run and that the judge needs only the record). Here: what is particular to chapter 8.
"""

from __future__ import annotations

import re

import pytest
import torch

import mha_course
from chapter8_answers import CORRECT, WRONG
from mha_course.exercises import chapter8, run_check
from mha_course.exercises.framework import SEED_ENV_VAR

pytest.importorskip("transformers")


def test_the_message_shows_the_module_and_the_input(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "5")
    line = run_check("8.1", WRONG[("8.1", "not-transposed")]).line
    assert re.search(r"for mha = MultiHeadAttention\(\d+, \d+, \d+, 0.0, \d+, qkv_bias=True\) on "
                     r"random_batch\(2, \d+, \d+, seed=\d+\)", line), line


def test_the_variant_defaults_invert_the_package_conversion():
    """GPT-2 loaded with the variant's state dict converts back, through from_gpt2_attention, to mha."""
    mha = chapter8.course_module(3, "small")
    layer = chapter8.gpt2_layer(3, "small")
    layer.load_state_dict(chapter8.state_variant(mha))
    back = mha_course.from_gpt2_attention(layer).state_dict()
    for name, value in mha.state_dict().items():
        assert value.equal(back[name]), name


def test_the_exercise_module_and_gpt2_layer_start_apart():
    """Without the answer, GPT-2's layer computes something else: the output check can fail."""
    mha, layer = chapter8.course_module(4, "small"), chapter8.gpt2_layer(4, "small")
    x = torch.randn(2, 5, mha.d_in)
    with torch.no_grad():
        assert not torch.allclose(mha(x), chapter8.gpt2_output(layer, x), atol=1e-3)


def test_a_missing_name_is_named():
    line = run_check("8.1", WRONG[("8.1", "bias-left-out")]).line
    assert "got a dict without c_attn.bias, c_proj.bias." in line, line


def test_a_consistent_permutation_of_heads_passes_the_output_but_not_the_values():
    """Heads swapped in q, k, v and out_proj alike give GPT-2 the same function: the values check sees it."""
    def swapped(mha):
        state = CORRECT["8.1"](mha)
        h, d = mha.num_heads, mha.d_out
        d_h = d // h
        heads = torch.arange(h).roll(1)
        index = (heads[:, None] * d_h + torch.arange(d_h)).flatten()  # (d,): head order rolled
        columns = torch.cat([index + i * d for i in range(3)])
        state["c_attn.weight"] = state["c_attn.weight"][:, columns]
        state["c_attn.bias"] = state["c_attn.bias"][columns]
        state["c_proj.weight"] = state["c_proj.weight"][index]
        return state

    result = run_check("8.1", swapped)
    assert result.failed_check == "each tensor holds mha's numbers where GPT-2 reads them", result.line
