"""Chapter 7's checks: fresh inputs on every run, the learner's own work, and messages that show the inputs.

tests/test_checks.py runs every check on the correct answers, on one wrong answer per catalogued
mistake and on hostile answers, once (with whatever seed the run draws). Here the same answers
run over many fixed seeds, so that no draw of the inputs lets a mistake through or hides its
message, and the properties that randomised checks rely on are tested directly.
"""

from __future__ import annotations

import re

import pytest
import torch

from chapter7_answers import ALSO_CORRECT, CORRECT, WRONG
from mha_course.exercises import EXERCISES, run_check
from mha_course.exercises import chapter7
from mha_course.exercises.framework import SEED_ENV_VAR, judge, probe
from mha_course.exercises.records import seed_of
from mha_course.tiled import tile_kind

SEEDS = [0, 1, 2, 7, 12345, 999_999]


@pytest.fixture
def seeded(monkeypatch):
    """Run the checks with a chosen seed instead of a fresh one."""
    def use(seed):
        monkeypatch.setenv(SEED_ENV_VAR, str(seed))
    return use


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("exercise_id", ["7.1", "7.2"])
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
    seeds = {seed_of(probe(EXERCISES["7.2"], CORRECT["7.2"])) for _ in range(3)}
    assert len(seeds) == 3
    assert len({chapter7.tile_case(seed, "aligned") for seed in range(20)}) > 3
    tiles = [chapter7.update_case(seed, "grows")[0][1] for seed in (1, 2)]
    assert tiles[0].shape != tiles[1].shape or not torch.equal(tiles[0], tiles[1])


@pytest.mark.parametrize("seed", SEEDS)
def test_the_variants_default_to_the_package(seed):
    from mha_course import tiled_attention

    for key in chapter7.TILE_CASES:
        num_tokens, block_size = chapter7.tile_case(seed, key)
        assert chapter7.tile_grid(chapter7.tile_variant, num_tokens, block_size) == chapter7.tile_grid(
            tile_kind, num_tokens, block_size)
    for key in ("whole", "large"):
        tiles, values = chapter7.update_case(seed, key)
        _, row_sum, acc = chapter7.run_updates(chapter7.update_variant, tiles, values)
        expected = torch.softmax(torch.cat(tiles, -1), -1) @ torch.cat(values, -2)
        torch.testing.assert_close(acc / row_sum, expected, rtol=1e-5, atol=1e-5)
    # The package's loop is the same update: one query block, every key block (non-causal).
    q, k, v = torch.randn(3, 1, 1, 6, 4, generator=torch.Generator().manual_seed(seed)).unbind(0)
    scores = (q * 4**-0.5) @ k.transpose(2, 3)
    _, row_sum, acc = chapter7.run_updates(chapter7.update_variant, list(scores.split(2, -1)), list(v.split(2, -2)))
    torch.testing.assert_close(acc / row_sum, tiled_attention(q, k, v, block_size=6, causal=False))


def test_the_cases_cover_what_the_checks_need():
    for seed in range(100):
        tokens, block = chapter7.tile_case(seed, "ragged")
        assert tokens % block >= 2  # a shorter last block that is still cut on the diagonal
        tokens, block = chapter7.tile_case(seed, "one left")
        assert tokens % block == 1
        tiles, _ = chapter7.update_case(seed, "large")
        assert not torch.isfinite(torch.exp(torch.cat(tiles, -1))).all()  # the raw exp overflows
        tiles, values = chapter7.update_case(seed, "grows")
        first, second = (t.amax(-1) for t in tiles)
        assert (second > first).any() and (second < first).any()  # some rows' maximum grows, others' not


@pytest.mark.parametrize("seed", SEEDS)
def test_failure_messages_show_the_input_and_both_results(seed, seeded):
    seeded(seed)
    line = run_check("7.2", WRONG[("7.2", "diagonal-skipped")]).line
    tokens, block = chapter7.tile_case(seed, "aligned")
    assert f'expected "cut" for the tile of query block 0 and key block 0 ({tokens} tokens in blocks of {block}' in line
    assert 'got "skipped"' in line
    line = run_check("7.1", WRONG[("7.1", "acc-not-rescaled")]).line
    assert re.search(r"acc row \d = \[.+\] after a second tile \(scores \(\d+, \d+\), values \(\d+, \d+\)\) that "
                     r"raises the maximum of rows 0, 2, \.\.\., got \[.+\]", line), line


def test_the_judge_needs_only_the_record(seeded):
    seeded(5)
    record = probe(EXERCISES["7.1"], WRONG[("7.1", "rescale-inverted")])
    seeded(6)
    assert judge(EXERCISES["7.1"], record).mistake == "rescale-inverted"
