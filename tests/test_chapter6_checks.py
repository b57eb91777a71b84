"""Chapter 6's checks: fresh inputs on every run, the learner's own work, and messages that show the inputs.

tests/test_checks.py runs every check on the correct answers, on one wrong answer per catalogued
mistake and on hostile answers, once (with whatever seed the run draws). Here the same answers
run over many fixed seeds, so that no draw of the inputs lets a mistake through or hides its
message, and the properties that randomised checks rely on are tested directly.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

from chapter6_answers import ALSO_CORRECT, CORRECT, WRONG
from mha_course import GroupedQueryAttention, KVCache, cost
from mha_course.exercises import EXERCISES, run_check
from mha_course.exercises import chapter6
from mha_course.exercises.framework import SEED_ENV_VAR, judge, probe
from mha_course.exercises.records import seed_of
from mha_course.exercises.shortcuts import CallWatch

SEEDS = [0, 1, 2, 7, 12345, 999_999]


@pytest.fixture
def seeded(monkeypatch):
    """Run the checks with a chosen seed instead of a fresh one."""
    def use(seed):
        monkeypatch.setenv(SEED_ENV_VAR, str(seed))
    return use


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("exercise_id", ["6.1", "6.2", "6.3"])
def test_correct_answers_pass_whatever_the_inputs(exercise_id, seed, seeded):
    seeded(seed)
    for answer in [CORRECT[exercise_id], *ALSO_CORRECT.get(exercise_id, [])]:
        result = run_check(exercise_id, answer)
        assert result.passed, result.line


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("key", sorted(WRONG), ids=[f"{e}-{m}" for e, m in sorted(WRONG)])
def test_every_mistake_gets_its_message_whatever_the_inputs(key, seed, seeded):
    seeded(seed)
    exercise_id, mistake = key
    result = run_check(exercise_id, WRONG[key])
    assert result.status == "failed" and result.mistake == mistake, result.line


def test_the_inputs_change_from_run_to_run():
    records = [probe(EXERCISES["6.3"], CORRECT["6.3"]) for _ in range(3)]
    seeds = {seed_of(r) for r in records}
    assert len(seeds) == 3
    arguments = {chapter6.size_case(seed, "model") for seed in seeds}
    assert len(arguments) == 3


def test_a_number_copied_from_a_failure_message_fails_the_next_run(seeded):
    seeded(1)
    line = run_check("6.3", WRONG[("6.3", "query-heads")]).line
    copied = int(re.search(r"expected ([\d,]+) bytes", line).group(1).replace(",", ""))
    same_run = run_check("6.3", lambda *args: copied)  # the same inputs: right for that model only
    assert same_run.checks_passed == 3 and same_run.failed_check == "the cache of another grouped-query model"
    seeded(2)
    result = run_check("6.3", lambda *args: copied)
    assert result.status == "failed" and result.failed_check == "the cache of a grouped-query model"


def test_only_the_package_answers_are_refused():
    """Other package code (split_heads, the layers, the cache's other methods) is the learner's to use."""
    from mha_course import merge_heads, split_heads

    gqa = GroupedQueryAttention(4, 8, 6, 0.0, num_heads=4, num_kv_groups=2)
    with CallWatch(EXERCISES["6.2"].all_shortcuts()) as watch:
        merge_heads(split_heads(gqa.W_query(torch.randn(1, 3, 4)), 4))
        KVCache().reset()
    assert watch.seen == []
    with CallWatch(EXERCISES["6.2"].all_shortcuts()) as watch:
        gqa(torch.randn(1, 3, 4), cache=KVCache())
    assert watch.seen == ["mha_course's own GroupedQueryAttention", "mha_course's own KVCache.append"]


def test_watching_leaves_a_profiler_in_place():
    calls = []

    def profiler(frame, event, arg):
        calls.append(event)

    sys.setprofile(profiler)
    try:
        with CallWatch(EXERCISES["6.2"].all_shortcuts()):
            pass
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize("seed", SEEDS)
def test_failure_messages_show_the_input_and_both_results(seed, seeded):
    seeded(seed)
    line = run_check("6.1", WRONG[("6.1", "repeat")]).line
    kv, num_heads = chapter6.expand_case(seed, "readable")
    a, b = (f"{v:g}" for v in kv.flatten().tolist())
    r = num_heads // 2
    assert f"from key/value heads [{a}, {b}] (expand_kv_heads(kv of shape (1, 2, 1, 1), num_heads={num_heads}))" in line
    assert f"read [{', '.join([a] * r + [b] * r)}]" in line and f"got [{', '.join([a, b] * r)}]" in line
    line = run_check("6.3", WRONG[("6.3", "one-layer")]).line
    args = chapter6.size_case(seed, "model")
    expected = cost.kv_cache_bytes(args[0], args[2], args[3], args[4], args[5], args[6])
    assert f"expected {expected:,} bytes from kv_cache_size(num_layers={args[0]}, num_heads={args[1]}," in line
    assert f"got {expected // args[0]:,}." in line
    line = run_check("6.2", WRONG[("6.2", "no-scale")]).line
    gqa, x, cached = chapter6.step_case(seed, "grouped")
    assert f"from decode_step on {x.shape[0]} sequence" in line and f"with {cached} cached tokens" in line
    assert f"({gqa.num_heads} query heads in {gqa.num_kv_groups} groups, head_dim {gqa.head_dim})" in line
    assert re.search(r"expected the new token's output sequence \d, token 0 = \[.+\] from .+, got \[.+\]", line)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_variants_default_to_the_package(seed):
    for key in chapter6.STEP_CASES:
        gqa, x, cached = chapter6.step_case(seed, key)
        inputs = chapter6.step_inputs(gqa, x, cached)
        for got, expected in zip(chapter6.step_variant(gqa, *inputs), chapter6.step_expected(gqa, x, cached)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for key in chapter6.SIZE_CASES:
        args = chapter6.size_case(seed, key)
        assert chapter6.size_variant(*args) == cost.kv_cache_bytes(args[0], args[2], args[3], args[4], args[5],
                                                                   args[6])
    for key in chapter6.EXPAND_CASES:
        kv, num_heads = chapter6.expand_case(seed, key)
        gqa = GroupedQueryAttention(1, num_heads * kv.shape[-1], 4, 0.0, num_heads, kv.shape[1])
        assert chapter6.reference_expand(kv, num_heads).shape == (kv.shape[0], gqa.num_heads, *kv.shape[2:])


def test_the_mistakes_of_6_3_give_numbers_of_their_own():
    for seed in range(200):
        for key in ("model", "another model"):
            args = chapter6.size_case(seed, key)
            numbers = [chapter6.size_variant(*args)] + [chapter6.size_variant(*args, mistake=m)
                                                        for m in chapter6.SIZE_MISTAKES]
            assert len(set(numbers)) == len(numbers)


def test_the_judge_needs_only_the_record(seeded):
    """The grader judges in another process: the seed in the record is all it needs to rebuild the inputs."""
    seeded(5)
    record = probe(EXERCISES["6.2"], WRONG[("6.2", "no-scale")])
    seeded(6)  # a later draw does not change the verdict on that record
    assert judge(EXERCISES["6.2"], record).mistake == "no-scale"
    assert seed_of(record) == 5
