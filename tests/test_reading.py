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


def _wrapped(x):
    # a comment line that runs on and on, long enough to pass the eighty characters of the book's code column
    label = "a # in a string is no comment; this one is long enough to break" + str(x)
    return label


def test_a_long_trailing_comment_goes_above_its_code_on_comment_lines():
    lines = source_excerpt(_long, start_at="total =", end_at="total =").splitlines()
    assert all(len(line) <= 80 for line in lines) and lines[-1] == "total = x + 1"
    assert all(line.startswith("# ") and not line.endswith("\\") for line in lines[:-1]), lines
    assert " ".join(line.lstrip("# ") for line in lines[:-1]).split() == (
        "a comment long enough to push this line well past the eighty characters of the column").split()


def test_a_long_comment_goes_on_as_comments_and_long_code_with_a_backslash():
    lines = source_excerpt(_wrapped, start_at="# a comment", end_at="label =").splitlines()
    assert all(len(line) <= 80 for line in lines)
    comments = [line for line in lines if line.startswith("#")]
    assert len(comments) == 2 and not any(line.endswith("\\") for line in comments)
    code = lines[len(comments):]  # the "#" inside the string did not make a comment of it
    assert len(code) == 2 and code[0].endswith(" \\") and code[1].startswith("    ")


def test_a_wrapped_excerpt_is_the_same_python():
    import ast
    import inspect
    import textwrap

    for function in (_long, _wrapped):
        original = ast.dump(ast.parse(textwrap.dedent(inspect.getsource(function))))
        excerpt = source_excerpt(function)
        assert all(len(line) <= 80 for line in excerpt.splitlines())
        assert ast.dump(ast.parse(excerpt)) == original, excerpt


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
