"""Chapter 12's checks: what is particular to them (tests/test_checks.py and test_checks_over_seeds.py run
the answers of tests/chapter12_answers.py on every check and catalogued mistake)."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from chapter12_answers import CORRECT, WRONG
from mha_course import GatedDeltaNet
from mha_course.exercises import run_check
from mha_course.exercises.framework import SEED_ENV_VAR


def _chunk_with_a_general_solver(state, queries, keys, values, log_decay, beta):
    """The chunked form with torch.linalg.solve and an explicit inverse of the decays: right numbers."""
    size = queries.shape[-2]
    G = log_decay.cumsum(-1)
    D = torch.exp(G[..., :, None] - G[..., None, :]) * torch.ones(size, size, device=keys.device).tril()
    kb = keys * beta[..., None]
    system = torch.eye(size, device=keys.device) + (kb @ keys.transpose(-1, -2) * D).tril(-1)
    u = torch.linalg.solve(system, (values - (keys * G.exp()[..., None]) @ state) * beta[..., None])
    out = (queries * G.exp()[..., None]) @ state + (queries @ keys.transpose(-1, -2) * D) @ u
    end = torch.exp(G[..., -1:] - G)[..., None]
    return out, G[..., -1, None, None].exp() * state + (keys * end).transpose(-1, -2) @ u


def test_a_chunk_solved_with_a_general_solver_passes():
    assert run_check("12.3", _chunk_with_a_general_solver).passed


def test_the_step_messages_name_the_order_of_the_rule(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "5")
    line = run_check("12.2", WRONG[("12.2", "decay-after-write")]).line
    assert re.search(r"gated_delta_step\(state \(1, 1, 2, 2\), query and key \(1, 1, 2\), value \(1, 1, 2\)", line), line
    assert "multiplied by decay before anything is read" in line
    assert "beta scales only the error" in run_check("12.2", WRONG[("12.2", "beta-on-key")]).line


def test_the_linear_check_names_the_normaliser_and_runs_on_any_form():
    line = run_check("12.1", WRONG[("12.1", "no-normaliser")]).line
    assert "without its normaliser" in line

    def in_float64(queries, keys, values):  # right, computed in another dtype and returned in it
        return CORRECT["12.1"](queries.double(), keys.double(), values.double())
    assert run_check("12.1", in_float64).passed


def test_an_answer_that_builds_the_packages_layer_is_refused():
    def through_the_layer(state, query, key, value, decay, beta):
        GatedDeltaNet(4, 1, 1, 2, 2)
        return F.linear(query, torch.eye(2)), state
    result = run_check("12.2", through_the_layer)
    assert result.failed_check == "written by you" and "GatedDeltaNet" in result.line
