"""The checks over many fixed seeds: no draw of the inputs lets a mistake through or hides its message.

tests/test_checks.py runs every check once on the answers of tests/chapterN_answers.py, with
whatever seed the run draws. Here the answers of the chapters in ``SEEDS`` run over fixed seeds,
and the properties that randomised checks rely on are tested directly: the inputs change from run
to run, and the judge needs only the record. Chapters 1 to 5 are not swept: their checks build trained
models and whole modules, and tests/test_checks.py runs their answers on a fresh seed every run.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from mha_course.exercises import (EXERCISES, chapter6, chapter7, chapter8, fewer_keys, latent, positions, run_check,
                                  sliding, state)
from mha_course.exercises.framework import SEED_ENV_VAR, judge, probe
from mha_course.exercises.records import seed_of

#: The chapters swept and their seeds; chapter 8's check builds GPT-2 layers, and takes three.
FOUR = [0, 7, 12345, 999_999]  # the first seed, two in between, the last one run_seed draws
SEEDS = {6: FOUR, 7: FOUR, 8: [0, 7, 12345], 9: FOUR, 10: FOUR, 11: FOUR, 12: FOUR}

#: What a chapter's checks need beyond the package itself.
MARKS = {8: [pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="chapter 8's check builds transformers' GPT-2 layers: "
                                       "pip install 'mha_course[transformers]'")]}

ANSWERS = {chapter: importlib.import_module(f"chapter{chapter}_answers") for chapter in SEEDS}

#: The sweep takes as long as every other check test together: make test runs it, make check leaves it out
#: (tests/test_checks.py runs every answer and mistake once there, on a fresh seed).
pytestmark = pytest.mark.sweep


def _exercises(chapter: int) -> list[str]:
    return [exercise_id for exercise_id, exercise in EXERCISES.items() if exercise.chapter == chapter]


def _param(chapter: int, *values, id: str):
    return pytest.param(*values, id=id, marks=MARKS.get(chapter, []))


@pytest.fixture
def seeded(monkeypatch):
    """Run the checks with a chosen seed instead of a fresh one."""
    def use(seed):
        monkeypatch.setenv(SEED_ENV_VAR, str(seed))
    return use


@pytest.mark.parametrize("exercise_id, seed", [
    _param(chapter, exercise_id, seed, id=f"{exercise_id}-seed{seed}")
    for chapter, seeds in SEEDS.items() for exercise_id in _exercises(chapter) for seed in seeds])
def test_correct_answers_pass_whatever_the_inputs(exercise_id, seed, seeded):
    seeded(seed)
    answers = ANSWERS[EXERCISES[exercise_id].chapter]
    for answer in [answers.CORRECT[exercise_id], *answers.ALSO_CORRECT.get(exercise_id, [])]:
        result = run_check(exercise_id, answer)
        assert result.passed, result.line


@pytest.mark.parametrize("key, seed", [
    _param(chapter, key, seed, id=f"{key[0]}-{key[1]}-seed{seed}")
    for chapter, seeds in SEEDS.items() for key in sorted(ANSWERS[chapter].WRONG) for seed in seeds])
def test_every_mistake_gets_its_message_whatever_the_inputs(key, seed, seeded):
    seeded(seed)
    exercise_id, mistake = key
    result = run_check(exercise_id, ANSWERS[EXERCISES[exercise_id].chapter].WRONG[key])
    assert result.status == "failed" and result.mistake == mistake, result.line


@pytest.mark.parametrize("chapter", [_param(chapter, chapter, id=f"chapter{chapter}") for chapter in SEEDS])
def test_each_run_draws_another_seed(chapter, monkeypatch):
    monkeypatch.delenv(SEED_ENV_VAR, raising=False)
    exercise_id = _exercises(chapter)[0]
    seeds = {seed_of(probe(EXERCISES[exercise_id], ANSWERS[chapter].CORRECT[exercise_id])) for _ in range(3)}
    # run_seed draws each seed from 1,000,000 by the system's randomness: the three are all the same
    # with odds of 1 in 10**12, where a seed that stopped changing gives one seed every time.
    assert len(seeds) > 1, seeds


def _chapter6_inputs(seed: int) -> tuple:
    return ([chapter6.size_case(seed, key) for key in chapter6.SIZE_CASES],
            [(kv.tolist(), heads) for kv, heads in (chapter6.expand_case(seed, key) for key in chapter6.EXPAND_CASES)])


def _chapter7_inputs(seed: int) -> tuple:
    return ([chapter7.tile_case(seed, key) for key in chapter7.TILE_CASES],
            [tile.tolist() for tile in chapter7.update_case(seed, "grows")[0]])


def _chapter9_inputs(seed: int) -> tuple:
    rotate = [[t.tolist() if hasattr(t, "tolist") else t for t in positions.rotate_case(seed, key)]
              for key in positions.ROTATE_CASES]
    return rotate, [[t.tolist() for t in positions.pad_case(seed, key)] for key in positions.PAD_CASES]


def _chapter10_inputs(seed: int) -> tuple:
    cases = [latent.latent_case(seed, key) for key in latent.CASES]
    return [(x.tolist(), start, layer.num_heads, layer.kv_lora_rank) for layer, x, start in cases]


def _chapter11_inputs(seed: int) -> tuple:
    masks = [sliding.mask_case(seed, key) for key in sliding.MASK_CASES]
    rings = [(layer.window, x.tolist()) for layer, x in (sliding.ring_case(seed, key) for key in sliding.RING_CASES)]
    sinks = [[t.tolist() for t in fewer_keys.sink_case(seed, key)] for key in fewer_keys.SINK_CASES]
    return masks, rings, sinks, [fewer_keys.topk_case(seed, key)[0].tolist() for key in fewer_keys.TOPK_CASES]


def _chapter12_inputs(seed: int) -> tuple:
    cases = [state.linear_case(seed, "readable"), state.step_case(seed, "readable"),
             state.chunk_case(seed, "readable")]
    return [[t.tolist() for t in case] for case in cases]


#: What a seed gives each swept chapter's checks: the sizes, and the numbers of the small cases.
INPUTS = {6: _chapter6_inputs, 7: _chapter7_inputs, 8: chapter8.mapping_cases, 9: _chapter9_inputs,
          10: _chapter10_inputs, 11: _chapter11_inputs, 12: _chapter12_inputs}


@pytest.mark.parametrize("chapter", list(SEEDS))
def test_other_seeds_give_other_inputs(chapter):
    # Over a fixed range of seeds, so the count is the same on every run: at least half of them
    # give inputs of their own (chapter 8's sizes come from 64 combinations, 64 of these 100 seeds).
    distinct = {repr(INPUTS[chapter](seed)) for seed in range(100)}
    assert len(distinct) >= 50, f"chapter {chapter}: 100 seeds gave {len(distinct)} inputs"


@pytest.mark.parametrize("exercise_id", [
    _param(chapter, exercise_id, id=exercise_id) for chapter in SEEDS for exercise_id in _exercises(chapter)])
def test_the_judge_needs_only_the_record(exercise_id, seeded):
    """The grader judges in another process: the seed in the record is all it needs to rebuild the inputs."""
    exercise, answers = EXERCISES[exercise_id], ANSWERS[EXERCISES[exercise_id].chapter]
    mistake = exercise.mistakes[0].key
    seeded(5)
    records = [probe(exercise, answers.CORRECT[exercise_id]), probe(exercise, answers.WRONG[(exercise_id, mistake)])]
    seeded(6)  # a later draw changes the verdict on neither record
    assert judge(exercise, records[0]).passed and judge(exercise, records[1]).mistake == mistake
    assert [seed_of(record) for record in records] == [5, 5]
