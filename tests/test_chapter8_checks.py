"""Chapter 8's check: messages that show the layer and the input, and its variant.

tests/test_checks.py runs the check on the answers of tests/chapter8_answers.py once, and
tests/test_checks_over_seeds.py over several fixed seeds (with the tests that the inputs change
from run to run and that the judge needs only the record). Here: what is particular to chapter 8.
"""

from __future__ import annotations

import re

import pytest

import mha_course
from chapter8_answers import CORRECT, TRICKS, WRONG
from mha_course.exercises import run_check
from mha_course.exercises import chapter8
from mha_course.exercises.framework import SEED_ENV_VAR

pytest.importorskip("transformers")


def test_the_message_shows_the_layer_and_the_input(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "5")
    line = run_check("8.1", WRONG[("8.1", "not-transposed")]).line
    assert re.search(r"for attention = GPT2Attention\(GPT2Config\(n_embd=\d+, n_head=\d+\)\) on "
                     r"random_batch\(2, \d+, \d+, seed=\d+\)", line), line


def test_the_variant_defaults_are_the_package_conversion():
    attention = chapter8.gpt2_layer(3, "small")
    mha = chapter8.course_module(3, "small")
    expected = mha_course.from_gpt2_attention(attention).state_dict()
    for name, value in chapter8.mapping_variant(attention, mha).items():
        assert value.equal(expected[name]), name


@pytest.mark.parametrize("name", sorted(TRICKS))
def test_an_answer_that_fakes_the_output_fails_on_the_weights_or_the_forward(name):
    result = run_check("8.1", TRICKS[name])
    assert result.status == "failed", result.line
    assert result.failed_check == "mha computes with its own class and forward", result.line


def test_an_answer_that_copies_nothing_but_calls_gpt2_fails():
    result = run_check("8.1", WRONG[("8.1", "forward-replaced")])
    assert result.status == "failed" and result.mistake == "forward-replaced", result.line
    assert "exercise asks for GPT-2's weights in mha's own parameters" in result.line


def test_forgetting_return_mha_fails_with_the_fix():
    result = run_check("8.1", WRONG[("8.1", "no-return")])
    assert result.failed_check == "returns mha" and "end it with return mha" in result.line, result.line


def test_the_weights_check_names_the_first_parameter_that_differs():
    from mha_course.exercises.framework import judge
    from mha_course.exercises.records import Recorder

    recorder = Recorder(seed=3)
    chapter8.MAPPING.probe(CORRECT["8.1"], recorder)
    record = dict(recorder.record)
    state = dict(record["small_mha_state"]["value"])
    key = state["W_value.bias"]["value"].clone()
    state["W_value.bias"] = {**state["W_value.bias"], "value": key + 1.0}
    record["small_mha_state"] = {**record["small_mha_state"], "value": state}
    result = judge(chapter8.MAPPING, record)
    assert result.failed_check == "mha's parameters hold GPT-2's weights", result.line
    assert "mha.W_value.bias to hold GPT-2's values" in result.line
