"""Chapter 7's checks: the cases they draw, and messages that show the inputs.

tests/test_checks.py runs every check on the answers of tests/chapter7_answers.py once, and
tests/test_checks_over_seeds.py over many fixed seeds (with the tests that the inputs change from
run to run and that the judge needs only the record). Here: what is particular to chapter 7.
"""

from __future__ import annotations

import re

import pytest
import torch

from chapter7_answers import WRONG
from mha_course.exercises import run_check
from mha_course.exercises import chapter7
from mha_course.exercises.framework import SEED_ENV_VAR
from mha_course.tiled import tile_kind
from test_checks_over_seeds import SEEDS


@pytest.mark.parametrize("seed", SEEDS[7])
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


@pytest.mark.parametrize("seed", SEEDS[7])
def test_failure_messages_show_the_input_and_both_results(seed, monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, str(seed))
    line = run_check("7.2", WRONG[("7.2", "diagonal-skipped")]).line
    tokens, block = chapter7.tile_case(seed, "aligned")
    assert f'expected "cut" for the tile of query block 0 and key block 0 ({tokens} tokens in blocks of {block}' in line
    assert 'got "skipped"' in line
    line = run_check("7.1", WRONG[("7.1", "acc-not-rescaled")]).line
    assert re.search(r"acc row \d = \[.+\] after a second tile \(scores \(\d+, \d+\), values \(\d+, \d+\)\) that "
                     r"raises the maximum of rows 0, 2, \.\.\., got \[.+\]", line), line
