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
