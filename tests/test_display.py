"""Matrices as tables of rounded numbers for notebooks."""

from __future__ import annotations

import pytest
import torch

from mha_course.display import matrix_table


def test_rounding_alignment_and_labels():
    text = matrix_table(torch.tensor([[1.23456, -0.0001], [float("-inf"), 10.0]]), ["a", "bb"], ["x", "long"], decimals=2)
    assert str(text).splitlines() == [
        "       x   long",
        "a   1.23   0.00",
        "bb  -inf  10.00",
    ]


def test_booleans_use_marks():
    text = matrix_table(torch.tensor([[True, False]]), ["r"], ["p", "q"], marks=("✗", "·"))
    assert str(text).splitlines()[1] == "r  ✗  ·"


def test_rejects_wrong_shapes_and_labels():
    with pytest.raises(ValueError, match=r"values must be 2-D \(rows, columns\), got shape \(1, 2, 2\)"):
        matrix_table(torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="got 1 row labels and 2 column labels for a 2 x 2 table"):
        matrix_table(torch.zeros(2, 2), ["a"], ["x", "y"])


def test_matrix_renders_as_html_with_row_headings_and_no_empty_heading():
    html = matrix_table(torch.eye(2), ["a", "b"], ["x", "y"], decimals=1)._repr_html_()
    assert "<thead><tr><td></td><th scope=\"col\" class=\"num\">x</th>" in html
    assert "<tr><th scope=\"row\">a</th><td class=\"num\">1.0</td><td class=\"num\">0.0</td></tr>" in html
