"""Chapter 8's check: fresh inputs on every run, the learner's own mapping, and messages that show the inputs.

tests/test_checks.py runs the check on the correct answer, on one wrong answer per catalogued
mistake and on hostile answers, once. Here the same answers run over several fixed seeds, so that
no draw of the sizes lets a mistake through or hides its message.
"""

from __future__ import annotations

import re

import pytest

import mha_course
from chapter8_answers import ALSO_CORRECT, CORRECT, WRONG
from mha_course.exercises import EXERCISES, run_check
from mha_course.exercises import chapter8
from mha_course.exercises.framework import SEED_ENV_VAR, probe
from mha_course.exercises.records import seed_of

pytest.importorskip("transformers")

SEEDS = [0, 7, 12345]


@pytest.fixture
def seeded(monkeypatch):
    def use(seed):
        monkeypatch.setenv(SEED_ENV_VAR, str(seed))
    return use


@pytest.mark.parametrize("seed", SEEDS)
def test_correct_answers_pass_whatever_the_inputs(seed, seeded):
    seeded(seed)
    for answer in [CORRECT["8.1"], *ALSO_CORRECT["8.1"]]:
        result = run_check("8.1", answer)
        assert result.passed, result.line


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("key", sorted(WRONG), ids=[m for _, m in sorted(WRONG)])
def test_every_mistake_gets_its_message_whatever_the_inputs(key, seed, seeded):
    seeded(seed)
    result = run_check(*key[:1], WRONG[key])
    assert result.status == "failed" and result.mistake == key[1], result.line


def test_the_sizes_change_from_run_to_run():
    seeds = {seed_of(probe(EXERCISES["8.1"], CORRECT["8.1"])) for _ in range(3)}
    assert len({tuple(chapter8.mapping_cases(seed).items()) for seed in seeds}) == len(seeds) == 3


def test_the_message_shows_the_layer_and_the_input(seeded):
    seeded(5)
    line = run_check("8.1", WRONG[("8.1", "not-transposed")]).line
    assert re.search(r"for attention = GPT2Attention\(GPT2Config\(n_embd=\d+, n_head=\d+\)\) on "
                     r"random_batch\(2, \d+, \d+, seed=\d+\)", line), line


def test_the_variant_defaults_are_the_package_conversion():
    attention = chapter8.gpt2_layer(3, "small")
    mha = chapter8.course_module(3, "small")
    expected = mha_course.from_gpt2_attention(attention).state_dict()
    for name, value in chapter8.mapping_variant(attention, mha).items():
        assert value.equal(expected[name]), name
