"""The window benchmark (``bench --window``): what it computes, records and writes. Never a timing assertion."""

from __future__ import annotations

import csv
import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from mha_course import bench, causal_mask  # noqa: E402
from mha_course.attention.tiled import tile_counts  # noqa: E402
from mha_course.bench.machine import cpu_memory_unsupported_reason  # noqa: E402
from mha_course.bench.results import WINDOW_CSV_FIELDS  # noqa: E402
from mha_course.bench.tiled_steps import WINDOW_MODE, WINDOW_TRAINING_MODE, window_calls  # noqa: E402
from mha_course.bench.window import QUICK_WINDOW_CONFIGS, visible_scores  # noqa: E402
from mha_course.cli import main as cli  # noqa: E402

LENGTHS, WINDOWS = (12, 24), (3, 8, None)
CONFIGS = [bench.BenchConfig(f"window-{t}", 1, t, 8, 2, 4, f"one sequence of {t} tokens, 2 heads of 4")
           for t in LENGTHS]


@pytest.fixture(scope="module")
def results():
    return bench.run_window_benchmark(bench.WindowSettings(
        configs=CONFIGS, windows=WINDOWS, min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32,
        block_size=4, memory=cpu_memory_unsupported_reason() is None))


def test_every_length_window_and_mode_has_a_row_for_each_way(results):
    keys = [(r["num_tokens"], r["window"], r["implementation"], r["mode"]) for r in results["rows"]]
    assert sorted(keys, key=str) == sorted(((t, w, n, m) for m in (WINDOW_MODE, WINDOW_TRAINING_MODE)
                                            for t in LENGTHS for w in WINDOWS for n in ("tiled", "sdpa")), key=str)
    meta = results["meta"]
    assert meta["benchmark"] == "window" and meta["block_size"] == 4 and meta["windows"] == [3, 8, None]
    assert results["implementations"] == bench.tiled_steps.WINDOW_IMPLEMENTATIONS


def test_rows_hold_consistent_measurements(results):
    index = {(r["num_tokens"], r["window"], r["implementation"], r["mode"]): r for r in results["rows"]}
    for (t, window, name, mode), row in index.items():
        assert row["vs_full"] == pytest.approx(row["median_s"] / index[(t, None, name, mode)]["median_s"])
        assert row["visible"] == int((~causal_mask(t, window=window)).sum())
        counts = tile_counts(t, 4, window)
        assert row["tiles"] == (counts["computed"] + counts["cut"] if name == "tiled" else None)
        assert row["max_abs_diff"] < 1e-5  # the two ways agree before anything is timed
        assert row["median_s"] > 0 and row["runs"] == 1
        if cpu_memory_unsupported_reason() is None:
            assert isinstance(row["peak_bytes"], int) and row["peak_bytes"] >= 0


def test_visible_scores():
    assert visible_scores(5, None) == 15 and visible_scores(5, 1) == 5 and visible_scores(5, 2) == 9
    assert visible_scores(5, 9) == 15


@pytest.mark.parametrize("mode", [WINDOW_MODE, WINDOW_TRAINING_MODE])
def test_the_two_ways_compute_the_same_and_the_window_matters(mode):
    config = QUICK_WINDOW_CONFIGS["window-tiny-64"]
    windowed, full = window_calls(config, 8, 5, mode=mode), window_calls(config, 8, None, mode=mode)
    torch.testing.assert_close(windowed["tiled"](), windowed["sdpa"](), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full["tiled"](), full["sdpa"](), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(windowed["tiled"](), full["tiled"](), atol=1e-3)


def test_window_calls_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be 'window' or 'window-training', got 'tiled'"):
        window_calls(QUICK_WINDOW_CONFIGS["window-tiny-64"], 8, 4, mode="tiled")


def test_results_files_table_and_figure(results, tmp_path):
    paths = bench.write_results(results, tmp_path, label="test")
    assert [p.name for p in paths] == ["bench-window-cpu-test.json", "bench-window-cpu-test.csv",
                                       "bench-window-cpu-test.png"]
    assert json.loads(paths[0].read_text(encoding="utf-8"))["meta"]["benchmark"] == "window"
    with paths[1].open(encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == WINDOW_CSV_FIELDS and len(list(reader)) == 24
    table = str(bench.window_table(results))
    assert "blocks of 4, forward:" in table and "tiled vs none" in table
    assert "forward and backward" in bench.window_summary(results)
    fig = bench.plot_window(results)
    assert len(fig.axes[0].get_lines()) == 4  # two ways at two lengths


def test_settings_errors():
    with pytest.raises(ValueError, match=r"windows must hold None"):
        bench.WindowSettings(configs=CONFIGS, windows=(4, 8))
    with pytest.raises(ValueError, match="window must be a positive integer, got 0"):
        bench.WindowSettings(configs=CONFIGS, windows=(0, None))
    with pytest.raises(ValueError, match="unknown configs \\['small-4'\\]"):
        bench.WindowSettings.for_command(configs=["small-4"])


def test_the_quick_command_writes_its_files(tmp_path, capsys):
    assert cli(["bench", "--window", "--quick", "--no-memory", "--no-plot", "--no-progress", "--min-run-time",
                "0.002", "--rounds", "1", "--configs", "window-tiny-64", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-window-cpu-quick.csv", "bench-window-cpu-quick.json"]
    assert "blocks of 8" in capsys.readouterr().out


def test_the_backward_is_timed_up_to_training_max_tokens_only():
    results = bench.run_window_benchmark(bench.WindowSettings(
        configs=CONFIGS, windows=(3, None), min_run_time=0.002, rounds=1, threads=1, progress=False,
        ceiling_size=32, block_size=4, memory=False, training_max_tokens=12))
    assert {(r["num_tokens"], r["mode"]) for r in results["rows"]} == {
        (12, WINDOW_MODE), (24, WINDOW_MODE), (12, WINDOW_TRAINING_MODE)}
    assert results["meta"]["training_max_tokens"] == 12
