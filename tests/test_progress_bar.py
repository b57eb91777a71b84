"""The progress line of the long-running commands: short in logs, redrawn on a terminal, silent when off."""

from __future__ import annotations

import io
import time

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


def test_every_write_after_the_start_holds_the_lock():
    """Worker threads of the grader set notes and count steps at once: each redraw must hold the lock."""

    class WatchedTerminal(Terminal):
        bar = None
        unlocked = []

        def write(self, text):
            if self.bar is not None and not self.bar._lock.locked():
                self.unlocked.append(text)
            return super().write(text)

    out = WatchedTerminal()
    bar = ProgressBar(2, "grade", file=out)
    out.bar = bar
    bar.set_note("chapter 1")
    bar.update()
    bar.close()
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("\n")
    assert out.unlocked == []


def test_threads_setting_notes_and_counting_steps_draw_whole_lines():
    import threading

    class SlowTerminal(Terminal):
        """Writes one character at a time, so unlocked redraws from two threads interleave."""

        def write(self, text):
            for character in text:
                super().write(character)
                time.sleep(0)
            return len(text)

    out = SlowTerminal()
    bar = ProgressBar(50, "grade", file=out)
    notes = threading.Thread(target=lambda: [bar.set_note(f"note {i:03d}") for i in range(50)])
    steps = threading.Thread(target=lambda: [bar.update() for _ in range(50)])
    notes.start(), steps.start()
    notes.join(), steps.join()
    for drawn in out.getvalue().split("\r")[1:]:
        assert drawn.rstrip().startswith("grade "), drawn


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
