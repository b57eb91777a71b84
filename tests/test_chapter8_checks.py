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


def _c_attn_replaced(weight_of):
    """The right state dict but for c_attn.weight, which ``weight_of(mha)`` writes."""
    def answer(mha):
        state = CORRECT["8.1"](mha)
        with torch.no_grad():
            state["c_attn.weight"] = weight_of(mha)
        return state
    return answer


@pytest.mark.parametrize("weight_of", [
    # the roles in another order and not transposed: two slips at once
    lambda mha: torch.cat([mha.W_key.weight, mha.W_query.weight, mha.W_value.weight], dim=1),
    # nn.Linear's stack (3d, d_in) viewed as (d_in, 3d): the right shape, not a transpose
    lambda mha: torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight]).view(mha.d_in, -1),
    # transposed once, as a whole, after joining along the columns
    lambda mha: torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight], dim=1)
    .T.reshape(mha.d_in, -1),
], ids=["order-and-transpose", "view-not-transpose", "transposed-as-a-whole"])
def test_a_c_attn_of_the_right_shape_in_the_wrong_layout_gets_its_likely_cause(weight_of):
    result = run_check("8.1", _c_attn_replaced(weight_of))
    assert (result.status, result.mistake) == ("failed", "c-attn-layout"), result.line
    assert "not transposed for GPT-2's Conv1D" in result.line, result.line


def test_other_numbers_in_c_attn_get_no_layout_hint():
    """The hint needs mha's own numbers, moved: a c_attn.weight of other numbers gets expected and got alone."""
    result = run_check("8.1", _c_attn_replaced(lambda mha: torch.zeros(mha.d_in, 3 * mha.d_out)))
    assert result.status == "failed" and result.mistake != "c-attn-layout", result.line
