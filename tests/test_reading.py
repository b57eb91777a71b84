"""Excerpts of a library's source for the page: the lines asked for, fitted to the code column."""

from __future__ import annotations

import pytest

from mha_course.reading import source_excerpt


def _long(x):
    total = x + 1  # a comment long enough to push this line well past the eighty characters of the column
    return total


def test_an_excerpt_runs_from_start_at_to_end_at_dedented():
    assert source_excerpt(_long, start_at="return", end_at="return") == "return total"
    assert source_excerpt(_long).splitlines()[0] == "def _long(x):"


def test_a_long_line_is_broken_at_a_space_and_marked():
    lines = source_excerpt(_long, start_at="total =", end_at="total =").splitlines()
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines)
    assert lines[0].endswith(" \\") and lines[1].startswith("    ")
    assert " ".join(part.rstrip(" \\").strip() for part in lines).split() == (
        "total = x + 1  # a comment long enough to push this line well past the eighty characters of the "
        "column").split()


def test_a_marker_that_is_not_there_is_named():
    with pytest.raises(ValueError, match=r"start_at='nowhere' is not in the source of _long"):
        source_excerpt(_long, start_at="nowhere")
    with pytest.raises(ValueError, match=r"end_at='nowhere' is not in the source of _long after start_at"):
        source_excerpt(_long, end_at="nowhere")


def test_operators_run_names_the_kernel_and_the_backward_pass():
    import torch
    import torch.nn.functional as F

    from mha_course.reading import operators_run

    q = torch.randn(1, 2, 8, 4)
    forward = operators_run(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert "aten::scaled_dot_product_attention" in forward
    assert not any(name.endswith("_backward") for name in forward)
    leaf = q.clone().requires_grad_()
    both = operators_run(lambda: F.scaled_dot_product_attention(leaf, leaf, leaf, is_causal=True), backward=True)
    assert any(name.endswith("_backward") for name in both) and leaf.grad is not None


def test_operators_run_restores_grad_mode_and_stderr(capfd):
    import torch

    from mha_course.reading import operators_run

    with torch.no_grad():
        operators_run(lambda: torch.ones(2, requires_grad=True) * 2, backward=True)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
    operators_run(lambda: torch.ones(2) + 1)
    assert "profiler_start" not in capfd.readouterr().err
    print("still here", file=__import__("sys").stderr)
    assert "still here" in capfd.readouterr().err
