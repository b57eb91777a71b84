"""The one table helper: aligned text for nbval and terminals, HTML for the book, human units."""

from __future__ import annotations

import pytest

from mha_course.tables import Table, format_bytes, format_number, format_time


def test_text_aligns_numbers_right_and_text_left():
    table = Table(["name", "count", "ratio"], [["a", 1234, 1.0], ["bbb", 5, 0.5]], formats={"ratio": ".2f"})
    assert str(table).splitlines() == [
        "name  count  ratio",
        "----  -----  -----",
        "a     1,234   1.00",
        "bbb       5   0.50",
    ]
    assert repr(table) == str(table)
    assert table.column("count") == [1234, 5]


def test_title_notes_missing_values_and_strings_in_a_number_column():
    table = Table(["implementation", "median"], [["fast", 0.0021], ["torch_mha", "skipped"], ["x", None]],
                  title="forward", formats={"median": "time"}, notes=["skipped: needs d_in == d_out"])
    assert str(table).splitlines() == [
        "forward",
        "implementation   median",
        "--------------  -------",
        "fast            2.10 ms",
        "torch_mha       skipped",
        "x                     -",
        "skipped: needs d_in == d_out",
    ]


@pytest.mark.parametrize("seconds,text", [
    (2.9204, "2.92 s"), (0.0009997, "1.00 ms"), (0.000999, "999 µs"), (1.5e-7, "150 ns"), (123.4, "123 s"),
    (0.0, "0 s"), (None, "-"),
])
def test_times_read_in_human_units_never_in_exponent_notation(seconds, text):
    assert format_time(seconds) == text
    assert "e+" not in format_time(seconds) and "e-" not in format_time(seconds)


@pytest.mark.parametrize("seconds,text", [
    (0.0015346, "1.535 ms"), (0.09772, "97.72 ms"), (0.10198, "102.0 ms"), (0.00099996, "1.000 ms"),
    (0.0009999, "999.9 µs"),
])
def test_times_to_four_significant_digits_when_asked(seconds, text):
    assert format_time(seconds, digits=4) == text


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (300 * 2**20, "300 MiB"), (int(2.5 * 2**30), "2.50 GiB"),
    (384 * 2**20, "384 MiB"), (None, "-"),
])
def test_sizes_read_in_binary_units(n, text):
    assert format_bytes(n) == text


def test_default_number_formats():
    assert [format_number(v) for v in (2360064, 0.12345, 9.996, 12345.6, True, "x", None)] == [
        "2,360,064", "0.123", "10.0", "12,346", "True", "x", "-"]


def test_html_is_escaped_and_only_the_table_scrolls_in_its_own_labelled_focusable_box():
    rendered = Table(["<x>", "n"], [["a & b", 3]], title="T<1>", notes=["n & m"])._repr_html_()
    assert rendered.startswith('<div class="mha-table-block"><p class="mha-table-title">T&lt;1&gt;</p>'
                               '<div class="mha-table" role="region" aria-label="T&lt;1&gt;" tabindex="0" '
                               'style="overflow-x:auto"><table>')
    assert rendered.endswith('</table></div><p class="mha-table-note">n &amp; m</p></div>')
    assert '<th scope="col">&lt;x&gt;</th><th scope="col" class="num">n</th>' in rendered
    assert '<tr><th scope="row">a &amp; b</th><td class="num">3</td></tr>' in rendered
    untitled = Table(["a", "b"], [[1, 2]])._repr_html_()
    assert 'aria-label="table: a, b"' in untitled and "mha-table-title" not in untitled


def test_bad_tables_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"row 1 has 1 cells but the table has 2 columns \(a, b\)"):
        Table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(KeyError, match="no column 'c'; the columns are 'a', 'b'"):
        Table(["a", "b"], [[1, 2]]).column("c")
    with pytest.raises(KeyError, match=r"formats names \['c'\], which are not columns"):
        Table(["a", "b"], [[1, 2]], formats={"c": ".2f"})
    with pytest.raises(ValueError, match="align\\['a'\\] must be 'left' or 'right', got 'centre'"):
        Table(["a"], [[1]], align={"a": "centre"})
    with pytest.raises(ValueError):
        Table(["a"], [[1]], formats={"a": "not a spec"})
