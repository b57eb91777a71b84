"""The state benchmark (``bench --deltanet``): what it computes, records and writes. Never a timing assertion."""

from __future__ import annotations

import csv
import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from mha_course import bench  # noqa: E402
from mha_course.bench.deltanet import QUICK_DELTANET_CONFIGS, mode_of  # noqa: E402
from mha_course.bench.deltanet_steps import (DECODE_IMPLEMENTATIONS, DECODE_MODE, PROMPT_IMPLEMENTATIONS,  # noqa: E402
                                             PROMPT_MODE, decode_calls, prompt_calls)
from mha_course.bench.machine import cpu_memory_unsupported_reason  # noqa: E402
from mha_course.bench.results import DELTANET_CSV_FIELDS  # noqa: E402
from mha_course.cli import main as cli  # noqa: E402

CONFIGS = list(QUICK_DELTANET_CONFIGS.values())


@pytest.fixture(scope="module")
def results():
    return bench.run_deltanet_benchmark(bench.DeltaNetSettings(
        configs=CONFIGS, min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32,
        memory=cpu_memory_unsupported_reason() is None))


def test_every_size_has_a_row_for_each_way(results):
    expected = [(c.name, name, mode_of(c)) for c in CONFIGS
                for name in (PROMPT_IMPLEMENTATIONS if mode_of(c) == PROMPT_MODE else DECODE_IMPLEMENTATIONS)]
    assert [(r["config"], r["implementation"], r["mode"]) for r in results["rows"]] == expected
    assert results["meta"]["benchmark"] == "deltanet" and results["meta"]["threads"] == 1
    assert results["implementations"] == {**PROMPT_IMPLEMENTATIONS, **DECODE_IMPLEMENTATIONS}


def test_prompt_rows_hold_ratios_memory_and_the_forms_agreement(results):
    by_name = bench.deltanet_rows(results, PROMPT_MODE)
    for name, rows in by_name.items():
        for row, sdpa in zip(rows, by_name["sdpa"]):
            assert row["vs_sdpa"] == pytest.approx(row["median_s"] / sdpa["median_s"])
            assert row["median_s"] > 0 and row["runs"] == 1
            assert ("max_abs_diff" in row) == (name == "chunked")
            if cpu_memory_unsupported_reason() is None:
                assert row["peak_bytes"] >= 0 and row["peak_method"]
    assert max(r["max_abs_diff"] for r in by_name["chunked"]) < 1e-4


def test_decode_rows_hold_the_bytes_each_cache_holds(results):
    by_name = bench.deltanet_rows(results, DECODE_MODE)
    states = {r["cache_bytes"] for r in by_name["state"]}
    assert len(states) == 1  # the state does not grow with the tokens before it
    for row in by_name["kv_cache"]:  # a key and a value per token, 2 heads of 8, float32
        assert row["cache_bytes"] == 2 * 2 * 8 * 4 * row["num_tokens"]
    for a, b in zip(by_name["kv_cache"], by_name["state"]):
        assert b["vs_kv_cache"] == pytest.approx(b["median_s"] / a["median_s"]) and a["vs_kv_cache"] == 1


def test_the_calls_compute_what_they_say():
    config = bench.BenchConfig("small", 1, 70, 16, 2, 8, "")
    calls = prompt_calls(config)
    torch.testing.assert_close(calls["chunked"](), calls["recurrent"](), rtol=0, atol=1e-5)
    assert not torch.allclose(calls["sdpa"](), calls["chunked"](), atol=1e-2)  # another function
    steps, caches = decode_calls(bench.BenchConfig("small", 1, 12, 16, 2, 8, ""))
    first = {name: step() for name, step in steps.items()}
    again = {name: step() for name, step in steps.items()}
    assert all(torch.equal(first[name], again[name]) for name in steps)  # the cache put back each call
    assert len(caches["kv_cache"]) == len(caches["state"]) == 12


def test_crossing_reads_where_the_lines_cross():
    def rows(times):
        return {"rows": [{"implementation": n, "mode": DECODE_MODE, "num_tokens": t, "median_s": s}
                         for t, a, b in times for n, s in (("kv_cache", a), ("state", b))]}
    assert bench.crossing(rows([(16, 1, 3), (64, 2, 3), (256, 5, 3)]), DECODE_MODE, "kv_cache", "state") == (64, 256)
    assert bench.crossing(rows([(16, 1, 3), (64, 2, 3)]), DECODE_MODE, "kv_cache", "state") is None
    assert bench.crossing(rows([(16, 4, 3), (64, 5, 3)]), DECODE_MODE, "kv_cache", "state") is None  # ahead from the start
    # a lead lost again does not count: the crossing is where it stays ahead
    assert bench.crossing(rows([(16, 4, 3), (64, 2, 3), (256, 5, 3)]), DECODE_MODE, "kv_cache", "state") == (64, 256)


def test_the_files_tables_and_figure(results, tmp_path):
    paths = bench.write_results(results, tmp_path)
    assert [p.name for p in paths] == ["bench-deltanet-cpu.json", "bench-deltanet-cpu.csv", "bench-deltanet-cpu.png"]
    assert json.loads(paths[0].read_text(encoding="utf-8"))["meta"]["benchmark"] == "deltanet"
    with paths[1].open(encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == DELTANET_CSV_FIELDS and len(list(reader)) == len(results["rows"])
    text = bench.deltanet_summary(results)
    assert "chunked time" in text and "state bytes" in text
    fig = bench.plot_deltanet(results)
    assert len(fig.axes) == 2


def test_the_command_line_runs_it_and_refuses_what_does_not_apply(tmp_path, capsys):
    assert cli(["bench", "--deltanet", "--quick", "--no-progress", "--no-memory", "--no-plot",
                "--configs", "deltanet-prompt-tiny-16,deltanet-decode-tiny-8", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench-deltanet-cpu-quick.json").exists()
    assert cli(["bench", "--deltanet", "--tiled", "--quick"]) != 0
    assert "--tiled and --deltanet are two different benchmarks" in capsys.readouterr().err
    assert cli(["bench", "--deltanet", "--implementations", "sdpa"]) != 0
    assert "--implementations does not apply to --deltanet" in capsys.readouterr().err
