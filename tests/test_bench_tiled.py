"""The tiled benchmark (``bench --tiled``): what it computes, records and writes. Never a timing assertion."""

from __future__ import annotations

import csv
import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from mha_course import bench  # noqa: E402
from mha_course.bench.machine import cpu_memory_unsupported_reason  # noqa: E402
from mha_course.bench.results import TILED_CSV_FIELDS  # noqa: E402
from mha_course.bench.tiled import QUICK_TILED_CONFIGS  # noqa: E402
from mha_course.bench.tiled_steps import (TILED_MODE, TRAINING_MODE, explicit_attention, saved_tensor_bytes,  # noqa: E402
                                          tiled_calls, tiled_saved_bytes)
from mha_course.cli import main as cli  # noqa: E402

LENGTHS = (5, 24)
MODES = (TILED_MODE, TRAINING_MODE)
CONFIGS = [bench.BenchConfig(f"tiled-{t}", 1, t, 8, 2, 4, f"one sequence of {t} tokens, 2 heads of 4")
           for t in LENGTHS]
POSIX_MEMORY = pytest.mark.skipif(cpu_memory_unsupported_reason() is not None,
                                  reason=f"peak memory: {cpu_memory_unsupported_reason()}")


@pytest.fixture(scope="module")
def results():
    return bench.run_tiled_benchmark(bench.TiledSettings(
        configs=CONFIGS, min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32, block_size=4,
        memory=cpu_memory_unsupported_reason() is None))


def test_every_length_has_a_row_for_each_way(results):
    assert [(r["config"], r["implementation"], r["mode"]) for r in results["rows"]] == [
        (c.name, name, mode) for mode in ("tiled", "tiled-training") for c in CONFIGS
        for name in ("scores", "tiled", "sdpa")]
    meta = results["meta"]
    assert meta["benchmark"] == "tiled" and meta["block_size"] == 4 and meta["threads"] == 1
    assert set(meta["load"]) == {"start", "end"} and isinstance(meta["stability_warnings"], list)
    assert results["implementations"] == bench.TILED_IMPLEMENTATIONS


@pytest.mark.parametrize("mode", MODES)
def test_rows_hold_consistent_measurements(results, mode):
    ceiling = results["meta"]["matmul_ceiling"]["flops_per_s"]
    by_name = bench.tiled_rows(results, mode)
    passes = 3 if mode == TRAINING_MODE else 1  # the backward's four products: twice the forward's two
    for rows in by_name.values():
        for row, sdpa in zip(rows, by_name["sdpa"]):
            assert row["vs_sdpa"] == pytest.approx(row["median_s"] / sdpa["median_s"])
            t = row["num_tokens"]
            assert row["multiply_adds"] == passes * 2 * 2 * t * t * 4 and row["score_bytes"] == 2 * t * t * 4
            assert ("saved_bytes" in row) == (mode == TRAINING_MODE)
            assert row["median_s"] > 0 and row["runs"] == 1
            assert row["flops_per_s"] == pytest.approx(2 * row["multiply_adds"] / row["median_s"])
            assert row["ceiling_fraction"] == pytest.approx(row["flops_per_s"] / ceiling)
            assert row["max_abs_diff"] < 1e-5  # the three agree before anything is timed


def test_training_rows_record_what_autograd_keeps(results):
    by_name = bench.tiled_rows(results, TRAINING_MODE)
    for index, t in enumerate(LENGTHS):
        saved = {name: rows[index]["saved_bytes"] for name, rows in by_name.items()}
        # q, k, v and the output (2 heads of 4, float32), and one log-sum-exp per row
        assert saved["tiled"] == 4 * 2 * t * 4 * 4 + 2 * t * 4
        assert saved["tiled"] <= 1.5 * saved["sdpa"]
        assert saved["scores"] >= 2 * t * t * 4  # the (T, T) weights, at least


@POSIX_MEMORY
def test_peak_memory_is_measured_for_every_row(results):
    assert results["meta"]["memory_measured"] is True
    for row in results["rows"]:
        assert isinstance(row["peak_bytes"], int) and row["peak_bytes"] >= 0
        assert row["peak_method"] in ("VmHWM growth", "ru_maxrss growth")
        assert "minor_faults_per_call" not in row


@pytest.mark.parametrize("mode", MODES)
def test_the_three_ways_compute_the_same(mode):
    calls = tiled_calls(QUICK_TILED_CONFIGS["tiled-tiny-64"], block_size=8, mode=mode)
    torch.testing.assert_close(calls["scores"](), calls["sdpa"](), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(calls["tiled"](), calls["sdpa"](), rtol=1e-5, atol=1e-5)
    if mode == TRAINING_MODE:  # the gradients of q, k and v, and not all zero
        assert calls["tiled"]().shape == (3, 1, 2, 64, 8) and calls["tiled"]().abs().amax((1, 2, 3, 4)).min() > 0
    q, k, v = torch.randn(3, 1, 2, 7, 4).unbind(0)
    torch.testing.assert_close(explicit_attention(q, k, v),
                               torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.ones(64, requires_grad=True)  # 256 bytes
    assert saved_tensor_bytes(lambda: x * x) == 256  # x saved twice, one storage
    assert saved_tensor_bytes(lambda: (x * 2).exp()) == 256  # exp keeps its output
    with torch.no_grad():
        assert saved_tensor_bytes(lambda: x.exp()) == 0
    saved = tiled_saved_bytes(QUICK_TILED_CONFIGS["tiled-tiny-64"], block_size=8)
    assert saved["tiled"] == saved["sdpa"] < saved["scores"]


def test_tiled_calls_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be 'tiled' or 'tiled-training', got 'backward'"):
        tiled_calls(QUICK_TILED_CONFIGS["tiled-tiny-16"], 8, mode="backward")


def test_results_files_table_and_figure(results, tmp_path):
    paths = bench.write_results(results, tmp_path, label="test")
    assert [p.name for p in paths] == ["bench-tiled-cpu-test.json", "bench-tiled-cpu-test.csv",
                                       "bench-tiled-cpu-test.png"]
    assert json.loads(paths[0].read_text(encoding="utf-8"))["meta"]["benchmark"] == "tiled"
    with paths[1].open(encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == TILED_CSV_FIELDS and len(list(reader)) == 12
    table = str(bench.tiled_table(results))
    assert "block_size 4, forward:" in table and "scores time" in table and "saved" not in table
    training = str(bench.tiled_table(results, TRAINING_MODE))
    assert "forward and backward" in training and "tiled saved" in training
    assert training in bench.tiled_summary(results)
    fig = bench.plot_tiled(results)
    assert [ax.get_xlabel() for ax in fig.axes] == ["tokens T", "tokens T"]
    assert len(fig.axes[1].get_lines()) == 6  # three ways, forward and training


def test_tiled_rows_refuses_incomplete_results(results):
    rows = [r for r in results["rows"] if not (r["implementation"] == "tiled" and r["num_tokens"] == 24)]
    with pytest.raises(ValueError, match="no complete tiled rows"):
        bench.tiled_rows({**results, "rows": rows})
    forward_only = {**results, "rows": [r for r in results["rows"] if r["mode"] == "tiled"]}
    with pytest.raises(ValueError, match="no complete tiled-training rows"):
        bench.tiled_rows(forward_only, TRAINING_MODE)
    assert "forward and backward" not in bench.tiled_summary(forward_only)  # a run from before training rows


def test_settings_errors():
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        bench.TiledSettings(configs=CONFIGS, block_size=0)
    with pytest.raises(ValueError, match="unknown configs \\['small-4'\\]"):
        bench.TiledSettings.for_command(configs=["small-4"])


@pytest.mark.parametrize("argv,message", [
    (["--tiled", "--decode"], "--decode and --tiled are two different benchmarks"),
    (["--tiled", "--modes", "forward"], "--modes does not apply to --tiled"),
    (["--block-size", "8"], "--block-size applies to --tiled and --window only"),
    (["--tiled", "--block-size", "0"], "block_size must be a positive integer, got 0"),
])
def test_command_errors(argv, message, capsys, tmp_path):
    assert cli(["bench", *argv, "--out", str(tmp_path)]) != 0
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_quick_command_writes_its_files(tmp_path, capsys):
    assert cli(["bench", "--tiled", "--quick", "--no-memory", "--no-plot", "--no-progress", "--min-run-time",
                "0.002", "--rounds", "1", "--configs", "tiled-tiny-16", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-tiled-cpu-quick.csv", "bench-tiled-cpu-quick.json"]
    assert "block_size 8" in capsys.readouterr().out
