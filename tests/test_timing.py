"""The one timing policy: interleaved rotated rounds, the median over rounds, slow calls timed twice.

The measurements are faked, so these tests check the policy, never a wall-clock time.
"""

from __future__ import annotations

import pytest

from mha_course import timing
from mha_course.timing import SLOW_CALL_S, SLOW_ROUNDS, Timing, summarise_samples, time_interleaved


@pytest.fixture
def fake_measure(monkeypatch):
    """Replace torch.utils.benchmark by a script: each call of name n in round r takes times[n][r]."""
    calls = []

    def install(times):
        def seconds(fn) -> float:
            name = fn()
            calls.append(name)
            return times[name][calls.count(name) - 1]

        monkeypatch.setattr(timing, "measure", lambda fn, *args, **kwargs: Timing(seconds(fn), 0.0, 1))
        monkeypatch.setattr(timing, "time_once", lambda fn: (seconds(fn), None))
        return calls

    return install


def test_rounds_rotate_the_order_and_report_the_median_over_rounds(fake_measure):
    calls = fake_measure({"a": [5.0, 3.0, 4.0], "b": [9.0, 12.0, 8.0], "c": [1.0, 1.0, 7.0]})
    timings = time_interleaved({n: (lambda n=n: n) for n in "abc"}, rounds=3, min_run_time=0.3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each round starts one call later
    assert {n: t.median for n, t in timings.items()} == {"a": 4.0, "b": 9.0, "c": 1.0}
    assert timings["c"].iqr == pytest.approx(3.0) and timings["a"].runs == 3


def test_a_burst_of_load_in_one_round_barely_moves_the_median(fake_measure):
    fake_measure({"a": [1.0, 10.0, 1.1, 0.9, 1.0]})
    assert time_interleaved({"a": lambda: "a"}, rounds=5, min_run_time=0.5)["a"].median == 1.0


def test_slow_calls_are_timed_once_in_the_first_rounds_only(fake_measure):
    calls = fake_measure({"slow": [2.0, 2.2], "quick": [0.1, 0.1, 0.1, 0.1]})
    timings = time_interleaved({"slow": lambda: "slow", "quick": lambda: "quick"}, rounds=4, min_run_time=1.0,
                               call_seconds={"slow": SLOW_CALL_S, "quick": 0.1})
    assert calls.count("slow") == SLOW_ROUNDS and calls.count("quick") == 4
    assert timings["slow"].median == pytest.approx(2.1) and timings["slow"].runs == SLOW_ROUNDS


def test_slow_calls_run_on_the_threads_asked_for(monkeypatch):
    import torch

    before = torch.get_num_threads()
    seen = []
    monkeypatch.setattr(timing, "measure", lambda fn, *args, num_threads=None, **kwargs: Timing(0.1, 0.0, 1))
    monkeypatch.setattr(timing, "time_once", lambda fn: (seen.append(torch.get_num_threads()) or 2.0, None))
    time_interleaved({"slow": print}, rounds=2, num_threads=before + 1, call_seconds={"slow": SLOW_CALL_S})
    assert seen == [before + 1] * SLOW_ROUNDS and torch.get_num_threads() == before  # set, then restored
    time_interleaved({"slow": print}, rounds=1, call_seconds={"slow": SLOW_CALL_S})
    assert seen[-1] == before  # None: torch's current setting


def test_progress_is_reported_before_each_measurement(fake_measure):
    fake_measure({"a": [1.0, 1.0], "b": [1.0, 1.0]})
    seen = []
    time_interleaved({"a": lambda: "a", "b": lambda: "b"}, rounds=2, min_run_time=0.1,
                     on_call=lambda r, name: seen.append((r, name)))
    assert seen == [(0, "a"), (0, "b"), (1, "b"), (1, "a")]


def test_bad_arguments():
    with pytest.raises(ValueError, match="rounds must be a positive integer, got 0"):
        time_interleaved({"a": print}, rounds=0)
    with pytest.raises(TypeError, match=r"rounds must be a positive integer, got 2\.0"):
        time_interleaved({"a": print}, rounds=2.0)
    with pytest.raises(ValueError, match="calls is empty"):
        time_interleaved({})
    with pytest.raises(ValueError, match="samples is empty"):
        summarise_samples([])
    assert summarise_samples([2.0]) == Timing(2.0, 0.0, 1)


def test_measure_reports_positive_median_and_rejects_bad_time():
    import torch

    result = timing.measure(torch.mm, torch.ones(16, 16), torch.ones(16, 16), min_run_time=0.01)
    assert result.median > 0 and result.runs >= 1
    with pytest.raises(ValueError, match="min_run_time must be positive seconds, got 0"):
        timing.measure(torch.mm, torch.ones(2, 2), torch.ones(2, 2), min_run_time=0)


def test_what_the_chapters_import_leaves_torchs_benchmark_unloaded():
    """torch.utils.benchmark loads torch's C++ extension builder, which warns on stderr where a CUDA build of
    torch finds a CUDA toolkit but no GPU (a stderr output that strict nbval refuses). The modules the
    chapters import load it only when something is timed."""
    import subprocess
    import sys

    modules = ["mha_course", "mha_course.compare", "mha_course.cost", "mha_course.display", "mha_course.plots",
               "mha_course.tables", "mha_course.timing", "mha_course.reading", "mha_course.bench",
               "mha_course.bench.results", "mha_course.bench.plots", "mha_course.bench.tiled",
               "mha_course.bench.tiled_steps", "mha_course.experiments.specialisation"]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch.utils.benchmark', 'torch.utils.cpp_extension'))))\n"
            "from mha_course.timing import measure\nimport torch\nmeasure(torch.mm, torch.ones(2, 2), torch.ones(2, 2), min_run_time=0.001)\n"
            "print('torch.utils.benchmark' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split("\n")[:2] == ["[]", "True"], run.stdout
