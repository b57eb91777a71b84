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
from mha_course.attention.tiled import tile_kind
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
    assert f'expected "cut" for tile_kind(0, 0, {block}, {tokens}), query block 1 and key block 1' in line
    assert 'got "skipped"' in line
    line = run_check("7.1", WRONG[("7.1", "acc-not-rescaled")]).line
    assert re.search(r"acc row \d \(index \[\d\]\) = \[.+\] after a second tile \(scores \(\d+, \d+\), values "
                     r"\(\d+, \d+\)\) that raises the maximum of rows 1, 3, \.\.\. \(index 0, 2, \.\.\.\), got \[.+\]",
                     line), line


@pytest.mark.parametrize("seed", SEEDS[7])
def test_the_backward_variant_defaults_to_the_packages_gradients(seed):
    from mha_course import tiled_attention

    for key in chapter7.BACKWARD_CASES:
        q, k, v, d_out = chapter7.backward_case(seed, key)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = torch.autograd.grad(tiled_attention(*leaves, block_size=3), leaves, d_out)
        got = chapter7.backward_variant(*chapter7.backward_inputs(seed, key))
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        out, row_max, row_sum = chapter7.forward_state(q, k, v)
        torch.testing.assert_close(out, tiled_attention(q, k, v, block_size=3), rtol=1e-5, atol=1e-5)


def test_the_large_backward_case_overflows_exp_without_the_maximum():
    for seed in range(100):
        q, k, _, _ = chapter7.backward_case(seed, "large")
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        assert q.dtype == torch.float64 and not torch.isfinite(torch.exp(scores.tril())).all()


@pytest.mark.parametrize("key", ["max-kept", "tile-max-only", "tile-only", "base-2", "old-max-weights",
                                 "acc-normalised", "sum-over-rows"])
def test_the_slips_of_the_update_that_showed_numbers_alone_now_get_a_hint(key):
    result = run_check("7.1", WRONG[("7.1", key)])
    assert (result.status, result.mistake) == ("failed", key), result.line


@pytest.mark.parametrize("seed", SEEDS[7][:2])
def test_backward_failure_messages_show_the_input_shape(seed, monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, str(seed))
    line = run_check("7.3", WRONG[("7.3", "grads-not-scaled")]).line
    shape = tuple(chapter7.backward_case(seed, "one")[0].shape)
    assert line.startswith("✗ 7.3: dq, through D and the scale: expected dq sequence 1, head 1, token ")
    assert f"on queries, keys and values of shape {shape}".replace(" ", "") in line.replace(" ", "")
    assert "dQ = dS K / sqrt(d_h)" in line
