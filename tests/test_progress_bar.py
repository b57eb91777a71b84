"""The progress line of the long-running commands: short in logs, redrawn on a terminal, silent when off."""

from __future__ import annotations

import io

import pytest

from mha_course.progress_bar import ProgressBar, _clock, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_tenth_of_the_work_not_per_step():
    out = io.StringIO()
    list(progress(range(100), "train", file=out))
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # 0 %, 10 %, ..., 100 %
    assert lines[0].startswith("train    0/100 [....................]   0%")
    assert lines[-1].startswith("train  100/100 [####################] 100%")


def test_a_terminal_redraws_one_line_in_place_and_ends_it():
    out = Terminal()
    with ProgressBar(3, "grade", file=out) as bar:
        bar.set_note("chapter 1")
        bar.update()
    text = out.getvalue()
    assert "\n" not in text[:-1] and text.endswith("\n")
    assert text.count("\r") == 3  # the start, the note, the step
    assert "grade  1/3 [#######.............]  33%" in text and "left  chapter 1" in text


def test_disabled_writes_nothing():
    out = Terminal()
    assert list(progress("abc", "quiet", file=out, enabled=False)) == ["a", "b", "c"]
    assert out.getvalue() == ""


def test_time_left_appears_only_mid_way():
    bar = ProgressBar(4, "x", file=io.StringIO())
    assert "left" not in bar.line()
    bar.update(2)
    assert "left" in bar.line()
    bar.update(5)  # never past the total
    assert bar.done == 4 and "left" not in bar.line()


def test_clock_and_bad_total():
    assert (_clock(75.2), _clock(3723)) == ("1:15", "1:02:03")
    with pytest.raises(ValueError, match="total must be the number of steps"):
        ProgressBar(-1, "x")
