"""Chapter 8's check: messages that show the layer and the input, and its variant.

tests/test_checks.py runs the check on the answers of tests/chapter8_answers.py once, and
tests/test_checks_over_seeds.py over several fixed seeds (with the tests that the inputs change
from run to run and that the judge needs only the record). Here: what is particular to chapter 8.
"""

from __future__ import annotations

import re

import pytest

import mha_course
from chapter8_answers import WRONG
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
