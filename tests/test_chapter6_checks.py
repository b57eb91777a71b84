"""Chapter 6's checks: the learner's own work, and messages that show the inputs.

tests/test_checks.py runs every check on the answers of tests/chapter6_answers.py once, and
tests/test_checks_over_seeds.py over many fixed seeds (with the tests that the inputs change from
run to run and that the judge needs only the record). Here: what is particular to chapter 6.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

from chapter6_answers import WRONG
from mha_course import GroupedQueryAttention, KVCache, cost
from mha_course.exercises import EXERCISES, run_check
from mha_course.exercises import chapter6
from mha_course.exercises.framework import SEED_ENV_VAR
from mha_course.exercises.shortcuts import CallWatch
from test_checks_over_seeds import SEEDS


def test_a_number_copied_from_a_failure_message_fails_the_next_run(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "1")
    line = run_check("6.3", WRONG[("6.3", "query-heads")]).line
    copied = int(re.search(r"expected ([\d,]+) bytes", line).group(1).replace(",", ""))
    same_run = run_check("6.3", lambda *args: copied)  # the same inputs: right for that model only
    assert same_run.checks_passed == 3 and same_run.failed_check == "the cache of another grouped-query model"
    monkeypatch.setenv(SEED_ENV_VAR, "2")
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


@pytest.mark.parametrize("seed", SEEDS[6])
def test_failure_messages_show_the_input_and_both_results(seed, monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, str(seed))
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
    # Counted from 1 as the book counts, with the tensor's own index beside it.
    found = re.search(r"expected the new token's output sequence (\d), token 1 \(index \[(\d), 0\]\) = \[.+\] "
                      r"from .+, got \[.+\]", line)
    assert found and int(found[1]) == int(found[2]) + 1, line


@pytest.mark.parametrize("seed", SEEDS[6])
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


def test_the_listings_repeat_interleave_is_refused_last_with_a_hint():
    """6.1 asks for another way than the chapter's listing: right numbers from repeat_interleave
    (method or function) pass every other check and fail the last one, which says why."""
    from chapter6_answers import expand_by_repeat_interleave

    for answer in (expand_by_repeat_interleave,
                   lambda kv, num_heads: torch.repeat_interleave(kv, num_heads // kv.shape[1], dim=1)):
        result = run_check("6.1", answer)
        assert (result.status, result.failed_check) == ("failed", "written without repeat_interleave"), result.line
        assert "expand stretches an axis of size 1" in result.line, result.line
