"""The grouped benchmark (``bench --grouped``): what it computes, records and writes. Never a timing assertion."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from mha_course import bench
from mha_course.bench.grouped import (GROUPED_CONFIGS, QUICK_GROUPED_CONFIGS, REFERENCE, GroupedConfig, heads_calls,
                                      llama_calls)
from mha_course.bench.results import GROUPED_CSV_FIELDS
from mha_course.cli import main as cli

pytest.importorskip("transformers")

CONFIGS = tuple(QUICK_GROUPED_CONFIGS.values())


@pytest.fixture(scope="module")
def results():
    return bench.run_grouped_benchmark(bench.GroupedSettings(
        configs=CONFIGS, min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32))


def test_every_size_has_a_pair_of_rows(results):
    assert [(r["config"], r["implementation"]) for r in results["rows"]] == [
        ("llama-tiny-prompt-16", "course"), ("llama-tiny-prompt-16", "transformers"),
        ("llama-tiny-decode-16", "course"), ("llama-tiny-decode-16", "transformers"),
        ("tiny-heads", "grouped"), ("tiny-heads", "fast")]
    assert results["meta"]["benchmark"] == "grouped" and results["implementations"] == bench.GROUPED_IMPLEMENTATIONS


def test_rows_hold_consistent_measurements(results):
    for row, reference in bench.grouped_pairs(results):
        assert REFERENCE[row["implementation"]] == reference["implementation"] == row["reference"]
        assert row["vs_reference"] == pytest.approx(row["median_s"] / reference["median_s"])
        assert reference["vs_reference"] == 1.0
        assert row["multiply_adds"] == reference["multiply_adds"] > 0  # the quick pairs: the same work
        assert row["flops_per_s"] == pytest.approx(2 * row["multiply_adds"] / row["median_s"])
        assert row["max_abs_diff"] < 1e-5  # the pairs compute the same function


def test_the_decode_row_counts_one_token_after_the_cache(results):
    decode = [r for r in results["rows"] if r["config"] == "llama-tiny-decode-16"]
    assert {(r["num_tokens"], r["num_cached"], r["num_kv_groups"]) for r in decode} == {(1, 16, 2)}


@pytest.mark.parametrize("name", ["llama-tiny-prompt-16", "llama-tiny-decode-16"])
def test_the_converted_layer_and_transformers_agree_call_after_call(name):
    """Each call puts the cache back, so repeated calls generate the same token."""
    calls = llama_calls(QUICK_GROUPED_CONFIGS[name])
    first = calls["course"]()
    torch.testing.assert_close(calls["course"](), first)
    torch.testing.assert_close(calls["transformers"](), first, rtol=1e-5, atol=1e-6)


def test_the_fast_path_is_counted_with_a_key_value_head_per_query_head():
    config = GroupedConfig("tiny-groups-2", 2, 8, 16, 4, 4, "", num_kv_groups=2)
    results = bench.run_grouped_benchmark(bench.GroupedSettings(
        configs=(config,), min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32))
    grouped, fast = bench.grouped_pairs(results)[0]
    assert grouped["multiply_adds"] < fast["multiply_adds"]  # narrower key and value projections
    from mha_course.cost import grouped_query_multiply_adds

    assert fast["multiply_adds"] == grouped_query_multiply_adds(2, 8, 16, 16, 4, 4).total


def test_fewer_key_value_heads_are_checked_against_the_explicit_path():
    config = GroupedConfig("tiny-groups-2", 2, 8, 16, 4, 4, "", num_kv_groups=2)
    calls = heads_calls(config)
    torch.testing.assert_close(calls["grouped"](), calls["grouped_explicit"](), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(calls["grouped"](), calls["fast"](), atol=1e-3)  # pooled: another function


def test_the_full_sizes_are_the_ones_the_book_reads():
    prompt, decode = GROUPED_CONFIGS["llama-prompt-1024"], GROUPED_CONFIGS["llama-decode-1024"]
    assert (prompt.d_in, prompt.num_heads, prompt.num_kv_groups, prompt.num_tokens) == (2048, 32, 8, 1024)
    assert (decode.num_tokens, decode.num_cached) == (1, 1024)
    heads = GROUPED_CONFIGS["gpt2-heads"]
    assert (heads.batch, heads.num_tokens, heads.d_in, heads.num_heads, heads.num_kv_groups) == (4, 1024, 768, 12, 12)


def test_results_files_and_table(results, tmp_path):
    paths = bench.write_results(results, tmp_path, plot=True)
    assert [p.name for p in paths] == ["bench-grouped-cpu.json", "bench-grouped-cpu.csv"]  # no figure
    assert json.loads(paths[0].read_text(encoding="utf-8"))["rows"] == results["rows"]
    with paths[1].open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == GROUPED_CSV_FIELDS and len(rows) == len(results["rows"])
    table = str(bench.grouped_table(results))
    assert "course   transformers" in table and "ratio" in table and "spread" in table


def test_grouped_pairs_refuses_incomplete_results(results):
    with pytest.raises(ValueError, match="no complete pair for tiny-heads"):
        bench.grouped_pairs({"rows": [r for r in results["rows"] if r["implementation"] != "fast"]})
    with pytest.raises(ValueError, match="no grouped rows"):
        bench.grouped_pairs({"rows": []})


@pytest.mark.parametrize("argv,message", [
    (["bench", "--grouped", "--tiled"], "--tiled and --grouped are two different benchmarks: choose one"),
    (["bench", "--grouped", "--implementations", "fast"], "--implementations does not apply to --grouped"),
    (["bench", "--grouped", "--configs", "small-4"], "unknown configs ['small-4']"),
])
def test_command_errors(argv, message, capsys, tmp_path):
    assert cli([*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_the_quick_command_writes_its_files(tmp_path, capsys):
    assert cli(["bench", "--grouped", "--quick", "--no-progress", "--min-run-time", "0.002", "--rounds", "1",
                "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"bench-grouped-cpu-quick.json", "bench-grouped-cpu-quick.csv"}
    assert "GroupedQueryAttention and what it replaces" in capsys.readouterr().out
