"""The benchmark command: structure of its results, ratios, files. Never a timing assertion."""

from __future__ import annotations

import csv
import itertools
import json
import os
import types

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from conftest import CPU_MEMORY
from mha_course import bench
from mha_course.bench.machine import MachineState
from mha_course.cli import main as cli
from mha_course.cost import multiply_adds

# Small, but with a score tensor (2 x 8 heads x 128 x 128 floats = 1 MiB) that dominates memory.
TINY = bench.BenchConfig("tiny", 2, 128, 16, 8, 2, "a test size")
SCORE_BYTES = 2 * 8 * 128 * 128 * 4
NAMES = ["stacked", "batched", "fast", "raw_sdpa", "torch_mha"]


@pytest.fixture(scope="module")
def results():
    """One small run, with the memory probe, shared by the tests below."""
    return bench.run_benchmark(bench.BenchSettings(
        configs=[TINY], implementations=NAMES, min_run_time=0.002, rounds=1, memory=True, memory_calls=1,
        threads=1, progress=False, ceiling_size=32))


def test_every_implementation_and_mode_has_a_row(results):
    assert [(r["implementation"], r["mode"]) for r in results["rows"]] == [
        (name, mode) for mode in bench.MODES for name in NAMES
    ]
    assert results["configs"] == [dict(name="tiny", batch=2, num_tokens=128, d_in=16, num_heads=8, head_dim=2,
                                       description="a test size")]
    meta = results["meta"]
    assert meta["device"] == "cpu" and meta["threads"] == 1 and meta["torch"] == torch.__version__
    assert meta["format_version"] == bench.FORMAT_VERSION and meta["matmul_ceiling"]["flops_per_s"] > 0
    # The stability check's observations are stored: the ceiling and the load at both ends of the run.
    ceiling = meta["matmul_ceiling"]
    assert ceiling["flops_per_s"] == max(ceiling["flops_per_s_start"], ceiling["flops_per_s_end"])
    assert set(meta["load"]) == {"start", "end"}
    assert len(meta["load"]["start"]) == 3 if hasattr(os, "getloadavg") else meta["load"]["start"] is None
    assert isinstance(meta["stability_warnings"], list)


def test_rows_hold_consistent_measurements(results):
    for row in results["rows"]:
        assert row["median_s"] > 0 and row["iqr_s"] >= 0 and row["runs"] >= 1
        kind = "wrapper" if row["implementation"] == "stacked" else "batched"
        macs = multiply_adds(kind, 2, 128, 16, 2 if kind == "wrapper" else 16, 8)
        assert row["multiply_adds"] == (macs.total if row["mode"] == "forward" else macs.forward_backward)
        assert row["flops_per_s"] == pytest.approx(2 * row["multiply_adds"] / row["median_s"])
        ceiling = results["meta"]["matmul_ceiling"]["flops_per_s"]
        assert row["ceiling_fraction"] == pytest.approx(row["flops_per_s"] / ceiling)
        # Every implementation computed the textbook module's output before it was timed.
        assert row["max_abs_diff"] < 1e-5


@CPU_MEMORY
def test_rows_hold_the_peak_memory_of_each_call(results):
    for row in results["rows"]:
        assert row["peak_bytes"] >= 0 and row["minor_faults_per_call"] >= 0
        assert row["peak_method"] in ("VmHWM growth", "ru_maxrss growth")


def test_ratios_divide_by_the_reference_of_the_same_mode(results):
    for mode in bench.MODES:
        rows = {r["implementation"]: r for r in bench.select(results, "tiny", mode)}
        assert rows["batched"]["vs_batched"] == 1.0 and rows["raw_sdpa"]["vs_raw_sdpa"] == 1.0
        for row in rows.values():
            assert row["vs_batched"] == pytest.approx(row["median_s"] / rows["batched"]["median_s"])
            assert row["vs_raw_sdpa"] == pytest.approx(row["median_s"] / rows["raw_sdpa"]["median_s"])


@CPU_MEMORY
def test_batched_module_holds_the_score_tensor_and_the_fast_path_does_not(results):
    """The fresh-process peak shows the score tensor where the code builds it, and only there."""
    batched = bench.lookup(results, "tiny", "forward", "batched")
    fast = bench.lookup(results, "tiny", "forward", "fast")
    assert batched["peak_bytes"] >= 1.5 * SCORE_BYTES  # scores and softmax output live together
    assert fast["peak_bytes"] < 0.5 * SCORE_BYTES


def test_add_ratios_by_hand():
    rows = [
        {"config": "a", "mode": "forward", "implementation": "batched", "median_s": 4.0, "peak_bytes": 100},
        {"config": "a", "mode": "forward", "implementation": "raw_sdpa", "median_s": 2.0, "peak_bytes": 50},
        {"config": "a", "mode": "forward", "implementation": "fast", "median_s": 1.0, "peak_bytes": 60},
        {"config": "a", "mode": "forward+backward", "implementation": "fast", "median_s": 3.0},
        {"config": "a", "mode": "forward", "implementation": "torch_mha", "skipped": "no"},
    ]
    bench.add_ratios(rows)
    assert (rows[2]["vs_batched"], rows[2]["vs_raw_sdpa"], rows[2]["memory_vs_raw_sdpa"]) == (0.25, 0.5, 1.2)
    assert rows[3]["vs_batched"] is None and rows[3]["vs_raw_sdpa"] is None  # no reference in that mode
    assert "vs_batched" not in rows[4]


def test_textbook_size_skips_torch_module_with_the_reason():
    impls, skipped = bench.build_for(bench.CONFIGS["textbook"], "cpu")
    assert set(impls) == {"stacked", "batched", "fused_qkv", "fast", "raw_sdpa"}
    assert skipped["torch_mha"].startswith("torch.nn.MultiheadAttention needs d_in == d_out")
    x = torch.rand(2, 6, 3)
    with torch.no_grad():
        expected = impls["batched"].forward(x)
        for impl in impls.values():
            torch.testing.assert_close(impl.forward(x), expected, rtol=1e-5, atol=1e-6)


def test_training_step_fills_gradients():
    impls, _ = bench.build_for(TINY, "cpu", ["fast"])
    step = bench.make_step(impls["fast"], "forward+backward", torch.rand(2, 8, 16))
    step()
    assert all(p.grad is not None for p in impls["fast"].modules[0].parameters())
    with pytest.raises(ValueError, match="mode must be one of"):
        bench.make_step(impls["fast"], "backward", torch.rand(2, 8, 16))


def test_written_files_round_trip(results, tmp_path, monkeypatch):
    # Saving the figure leaves the backend alone: a notebook that writes results keeps its inline figures.
    monkeypatch.setattr(matplotlib, "use", lambda *args, **kwargs: pytest.fail("the backend was switched"))
    paths = bench.write_results(results, tmp_path, label="test")
    assert [p.name for p in paths] == ["bench-cpu-test.json", "bench-cpu-test.csv", "bench-cpu-test.png"]
    assert bench.load_results(paths[0]) == json.loads(json.dumps(results))
    with paths[1].open(encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(results["rows"]) and table[0]["implementation"] == "stacked"
    assert float(table[1]["vs_batched"]) == pytest.approx(1.0)
    assert paths[2].stat().st_size > 1000


def test_load_results_rejects_other_formats(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format_version": 0}, "rows": []}), encoding="utf-8")
    with pytest.raises(ValueError, match="results format 0; this package reads format 1"):
        bench.load_results(path)


def test_table_and_lookup(results):
    table = bench.results_table(results, "tiny", "forward")
    text = str(table).splitlines()
    assert text[0] == "tiny (a test size), forward"
    assert text[1].split()[:3] == ["implementation", "median", "IQR"] and text[3].startswith("stacked ")
    assert len(text) == 3 + len(NAMES)
    assert table.column("implementation") == NAMES
    assert table.column("median") == [bench.lookup(results, "tiny", "forward", n)["median_s"] for n in NAMES]
    units = ("s", "B") if results["meta"]["memory_measured"] else ("s",)  # no peak memory on Windows
    assert all(unit in text[3] for unit in units)  # human units: µs/ms/s and B/KiB/MiB
    assert "e+" not in str(table) and "e-0" not in str(table)
    assert bench.lookup(results, "tiny", "forward", "fast")["implementation"] == "fast"
    with pytest.raises(KeyError, match="no measured row for config='tiny', mode='forward', implementation='fused_qkv'"):
        bench.lookup(results, "tiny", "forward", "fused_qkv")


def test_skipped_implementations_show_in_the_table_with_the_reason():
    rows = [{"config": "c", "mode": "forward", "implementation": "batched", "median_s": 0.002, "iqr_s": 0.0001,
             "vs_batched": 1.0, "vs_raw_sdpa": None, "flops_per_s": 1e9, "ceiling_fraction": 0.5},
            {"config": "c", "mode": "forward", "implementation": "torch_mha", "skipped": "needs d_in == d_out"}]
    table = bench.results_table({"meta": {"memory_measured": False}, "rows": rows}, "c", "forward")
    assert str(table).splitlines()[3:] == [
        "batched         2.00 ms  100 µs       1.00           -     1.00            50",
        "torch_mha       skipped       -          -           -        -             -",
        "skipped: needs d_in == d_out",
    ]


def test_bad_names_are_reported():
    with pytest.raises(ValueError, match=r"unknown implementations \['fastest'\]: choose from stacked"):
        bench.BenchSettings(configs=[TINY], implementations=["fastest"])
    with pytest.raises(ValueError, match=r"unknown configs \['huge'\]: choose from textbook"):
        bench.BenchSettings.for_command(configs=["huge"])
    with pytest.raises(ValueError, match="rounds must be a positive integer, got 0. Pass a whole number of at least 1."):
        bench.BenchSettings(configs=[TINY], rounds=0)
    with pytest.raises(ValueError, match="min_run_time must be a positive number, got -1"):
        bench.BenchSettings(configs=[TINY], min_run_time=-1)
    with pytest.raises(ValueError, match="memory_calls must be a non-negative integer, got -1. Pass 0 or more."):
        bench.BenchSettings(configs=[TINY], memory_calls=-1)
    with pytest.raises(TypeError, match="settings must be a BenchSettings"):
        bench.run_benchmark([TINY])
    with pytest.raises(ValueError, match="metric must be 'median_s' or 'peak_bytes'"):
        bench.plot_results({"configs": [], "rows": [], "implementations": {}, "meta": {}}, metric="flops")


def test_quick_command_writes_json_csv_and_plot(tmp_path, capsys):
    code = cli(["bench", "--quick", "--configs", "textbook", "--no-memory", "--no-progress",
                "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "textbook (the running example" in printed and "wrote " in printed
    results = bench.load_results(tmp_path / "bench-cpu-quick.json")
    assert results["meta"]["quick"] is True and results["meta"]["threads"] == 1
    assert {r["implementation"] for r in results["rows"] if r.get("skipped")} == {"torch_mha", "torch_mha_weights"}
    assert (tmp_path / "bench-cpu-quick.csv").exists() and (tmp_path / "bench-cpu-quick.png").exists()


def test_command_rejects_missing_device(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present here")
    assert cli(["bench", "--quick", "--device", "cuda"]) == 2
    assert "asks for CUDA, but torch sees no CUDA device" in capsys.readouterr().err


def test_compare_calls_a_tie_within_the_spread():
    rows = [{"config": "c", "mode": "forward", "implementation": n, "median_s": m, "iqr_s": q}
            for n, m, q in (("a", 1.0, 0.2), ("b", 1.15, 0.2), ("c", 2.0, 0.1))]
    results = {"rows": rows}
    assert bench.compare_times(results, "c", "forward", "a", "b") == {"ratio": 1.0 / 1.15, "verdict": "tie"}
    assert bench.compare_times(results, "c", "forward", "c", "a") == {"ratio": 2.0, "verdict": "a"}


# --- Whether the machine held still: the stability check, on made-up measurements -------------------

def _state(gflops, load=None):
    return MachineState({"n": 64, "median_s": 1.0, "flops_per_s": gflops * 1e9}, load)


@pytest.mark.parametrize("start,end,expected", [
    (20.0, 21.9, []),  # +9.5 %: within 10 %
    (20.0, 22.1, ["+10%"]),  # +10.5 %
    (17.7, 57.4, ["from 17.7 to 57.4 GFLOP/s (+224%)"]),  # the busy run chapter 4 once stored
    (20.0, 17.9, ["-10%"]),
])
def test_a_ceiling_that_moved_more_than_ten_percent_is_a_warning(start, end, expected):
    warnings = bench.stability_warnings(_state(start), _state(end), threads=1, seconds=60, cpus=2)
    assert len(warnings) == len(expected)
    for warning, fragment in zip(warnings, expected):
        assert fragment in warning and "the machine's speed changed while it was being measured" in warning


@pytest.mark.parametrize("start,end,threads,seconds,warned", [
    ([0.2, 0.2, 0.2], [0.25, 0.2, 0.2], 1, 1, False),  # a short run barely lifts the 1-minute average
    ([0.2, 0.2, 0.2], [1.2, 0.6, 0.3], 1, 600, False),  # a long run's own thread is taken out
    ([0.2, 0.2, 0.2], [2.4, 1.0, 0.5], 1, 600, True),  # another program started: 1.2 more
    ([3.0, 3.0, 3.0], [2.0, 2.5, 2.8], 1, 600, True),  # a neighbour stopped: 3.0 -> 1.0
    ([3.0, 3.0, 3.0], [4.1, 3.5, 3.2], 1, 600, False),  # 3.0 -> 3.1: within 10 % (and 8 cores: not busy)
    (None, None, 1, 600, False),  # no load average on this platform (Windows)
])
def test_a_load_that_moved_more_than_ten_percent_is_a_warning(start, end, threads, seconds, warned):
    warnings = bench.stability_warnings(_state(20, start), _state(20, end), threads=threads, seconds=seconds, cpus=8)
    assert bool(warnings) is warned
    if warned:
        assert "other programs competed for the cores during the run" in warnings[0]


@pytest.mark.parametrize("load,threads,cpus,busy", [
    (0.1, 1, 2, False), (0.9, 1, 2, False), (1.5, 1, 2, True), (0.5, 2, 2, True), (5.6, 1, 2, True), (5.6, 1, 16, False),
])
def test_a_run_that_shares_its_cores_with_other_work_is_a_warning(load, threads, cpus, busy):
    steady = _state(20, [load] * 3)
    warnings = bench.stability_warnings(steady, steady, threads=threads, seconds=0, cpus=cpus)
    assert bool(warnings) is busy
    if busy:
        assert warnings[0].startswith(f"the machine was busy: other work kept {load:.2f} of its {cpus} cores busy")


@pytest.mark.parametrize("before,after,threads,expected", [
    (0.02, 0.05, 1, []),  # a quiet machine
    (0.05, 0.20, 1, []),  # a change of 0.15 cores: within 10 % of 2 cores
    (0.02, 0.60, 1, ["moved from 0.02 to 0.60 of 2"]),  # another program started during the run
    (0.90, 0.95, 2, ["the machine was busy: other work kept 0.90 of its 2 cores busy"]),
])
def test_other_work_measured_directly_is_judged_against_the_cores(before, after, threads, expected):
    # The 1-minute load averages say the opposite of the direct measure: where both exist, the direct one counts.
    start = MachineState({"flops_per_s": 20e9}, [3.0, 3.0, 3.0], before)
    end = MachineState({"flops_per_s": 20e9}, [0.1, 0.1, 0.1], after)
    warnings = bench.stability_warnings(start, end, threads=threads, seconds=120, cpus=2)
    assert len(warnings) == len(expected)
    for warning, fragment in zip(warnings, expected):
        assert fragment in warning


def test_other_work_is_measured_while_the_run_sleeps(monkeypatch):
    from mha_course.bench import machine

    busy = iter([100.0, 100.9])  # the machine's busy CPU seconds before and after the window
    own = iter([5.0, 5.1])  # of which this process's own
    monkeypatch.setattr(machine, "_busy_cpu_seconds", lambda: next(busy))
    monkeypatch.setattr(machine, "_own_cpu_seconds", lambda: next(own))
    clock = itertools.count()  # one second passes between two readings
    monkeypatch.setattr(machine, "time", types.SimpleNamespace(sleep=lambda seconds: None,
                                                                monotonic=lambda: float(next(clock))))
    assert machine.other_work_cores() == 0.8  # 0.9 busy seconds in 1 s, 0.1 of them this process's own
    monkeypatch.setattr(machine, "_busy_cpu_seconds", lambda: None)
    monkeypatch.setattr(machine, "_own_cpu_seconds", lambda: 5.0)
    assert machine.other_work_cores() is None  # no /proc/stat: the load average is judged instead


def test_the_command_stores_the_observations_and_warns_when_the_machine_moved(tmp_path, capsys, monkeypatch):
    from mha_course.bench import run

    observations = iter([_state(17.7, [0.1, 0.1, 0.1]), _state(57.4, [0.2, 0.1, 0.1])])
    monkeypatch.setattr(run, "observe", lambda *args: next(observations))
    code = cli(["bench", "--quick", "--configs", "textbook", "--implementations", "batched", "--modes", "forward",
                "--no-memory", "--no-progress", "--no-plot", "--out", str(tmp_path)])
    assert code == 0
    meta = bench.load_results(tmp_path / "bench-cpu-quick.json")["meta"]
    assert meta["load"] == {"start": [0.1, 0.1, 0.1], "end": [0.2, 0.1, 0.1]}
    assert (meta["matmul_ceiling"]["flops_per_s_start"], meta["matmul_ceiling"]["flops_per_s_end"]) == (17.7e9, 57.4e9)
    assert len(meta["stability_warnings"]) == 1
    err = capsys.readouterr().err
    assert "WARNING: this run is not trustworthy" in err and "from 17.7 to 57.4 GFLOP/s" in err
    assert "Rerun it when the machine is quiet" in err


def test_a_steady_run_prints_no_warning(tmp_path, capsys, monkeypatch):
    from mha_course.bench import run

    monkeypatch.setattr(run, "observe", lambda *args: _state(20.0, [0.1, 0.1, 0.1]))
    assert cli(["bench", "--quick", "--configs", "textbook", "--implementations", "batched", "--modes", "forward",
                "--no-memory", "--no-progress", "--no-plot", "--out", str(tmp_path)]) == 0
    assert "not trustworthy" not in capsys.readouterr().err
