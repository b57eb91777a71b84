"""Chapter 9's checks: what is particular to them (tests/test_checks.py and test_checks_over_seeds.py run
the answers of tests/chapter9_answers.py on every check and catalogued mistake)."""

from __future__ import annotations

import re

import torch

from chapter9_answers import CORRECT, WRONG
from mha_course.exercises import run_check
from mha_course.exercises.framework import SEED_ENV_VAR


def _rotate_on_the_cpu(queries, keys, values, start, rope_theta):
    """Right numbers, but the angles are made on the CPU whatever the inputs' device."""
    d, t = queries.shape[-1], queries.shape[-2]
    angles = torch.arange(start, start + t).float()[:, None] * rope_theta ** (-torch.arange(0, d, 2).float() / d)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()

    def turn(x):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    return turn(queries), turn(keys), values


def test_an_answer_that_makes_its_angles_on_the_cpu_fails_on_the_device_check():
    result = run_check("9.1", _rotate_on_the_cpu)
    assert result.failed_check == "queries on the inputs' device", result.line
    assert "a GPU refuses that" in result.line or "meta" in result.line


def test_the_messages_show_the_call_with_its_start_and_rope_theta(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "3")
    line = run_check("9.1", WRONG[("9.1", "no-offset")]).line
    assert re.search(r"rotate_by_position\(queries \(2, 2, \d, \d\), keys and values \(2, 2, \d, \d\), "
                     r"start=\d, rope_theta=10000\)", line), line
    assert "positions start, start + 1" in line


def test_the_padded_message_shows_the_mask_it_used(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "3")
    result = run_check("9.2", WRONG[("9.2", "nan-rows")])
    assert result.failed_check.startswith("no NaN"), result.line
    assert re.search(r"attention_mask=\[\[1, 1, 1, 1", result.line) and "nan at sequence 2, head 1, token 1 (index [1, 0, 0])" in result.line


def test_the_answers_pass():
    assert run_check("9.1", CORRECT["9.1"]).passed and run_check("9.2", CORRECT["9.2"]).passed


def _padded_by_nonzero_mixing_devices(queries, keys, values, attention_mask):
    """Right numbers, one sequence at a time through nonzero, but the mask is combined with a CPU tensor."""
    out = torch.zeros_like(queries)
    for b in range(len(queries)):
        real = (attention_mask[b].bool() & torch.ones(attention_mask.shape[1], dtype=torch.bool)).nonzero().flatten()
        q, k, v = queries[b][:, real], keys[b][:, real], values[b][:, real]
        future = torch.ones(len(real), len(real), dtype=torch.bool, device=q.device).triu(1)
        out[b][:, real] = torch.softmax((q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(future, float("-inf")),
                                        dim=-1) @ v
    return out


def test_an_answer_that_reads_its_numbers_is_not_called_unimplemented_and_a_device_mix_before_still_fails():
    """On the meta device nonzero has no kernel (it raises NotImplementedError): the answer ran on the CPU,
    so it is judged, never "not implemented yet"; what the meta run saw before it still counts."""
    from chapter9_answers import ALSO_CORRECT

    for answer in ALSO_CORRECT["9.2"]:
        assert run_check("9.2", answer).passed
    result = run_check("9.2", _padded_by_nonzero_mixing_devices)
    assert result.failed_check == "output on the inputs' device", result.line
    assert "cpu" in result.line and "Make every new tensor on the inputs' device" in result.line, result.line
