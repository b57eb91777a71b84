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


def test_title_names_the_table_above_it_and_to_a_screen_reader():
    table = matrix_table(torch.eye(2), ["a", "b"], ["x", "y"], decimals=1, title="head 1 W_query.weight")
    assert str(table).splitlines()[0] == "head 1 W_query.weight"
    html = table._repr_html_()
    assert 'aria-label="head 1 W_query.weight"' in html
    assert '<p class="mha-table-title">head 1 W_query.weight</p>' in html


def test_row_labels_that_are_numbers_align_right_like_numbers():
    numbered = matrix_table(torch.eye(2), ["1", "16"], ["x", "y"], decimals=1, corner="d_h")
    assert str(numbered).splitlines() == [
        "d_h    x    y",
        "  1  1.0  0.0",
        " 16  0.0  1.0",
    ]
    assert '<th scope="row" class="num">16</th>' in numbered._repr_html_()
    worded = matrix_table(torch.eye(2), ["Your", "step"], ["x", "y"], decimals=1)
    assert '<th scope="row">Your</th>' in worded._repr_html_()
