"""The decoding benchmark (``bench --decode``): what it computes, records and writes. Never a timing assertion."""

from __future__ import annotations

import csv

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from mha_course import bench  # noqa: E402
from mha_course.bench.results import DECODE_CSV_FIELDS  # noqa: E402
from mha_course.cli import main as cli  # noqa: E402
from mha_course.cost import grouped_query_multiply_adds, kv_cache_bytes  # noqa: E402

LENGTHS = (1, 5, 12)
CONFIGS = [bench.BenchConfig(f"decode-{t}", 2, t, 12, 3, 4, f"a test layer: token {t}") for t in LENGTHS]


@pytest.fixture(scope="module")
def results():
    return bench.run_decode_benchmark(bench.DecodeSettings(
        configs=CONFIGS, min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32))


def test_every_length_has_a_row_for_each_way(results):
    assert [(r["config"], r["implementation"], r["mode"]) for r in results["rows"]] == [
        (c.name, name, "decode") for c in CONFIGS for name in ("recompute", "kv_cache")]
    meta = results["meta"]
    assert meta["benchmark"] == "decode" and meta["format_version"] == bench.FORMAT_VERSION
    assert meta["threads"] == 1 and meta["memory_measured"] is False
    assert set(meta["load"]) == {"start", "end"} and isinstance(meta["stability_warnings"], list)
    assert results["implementations"] == bench.DECODE_IMPLEMENTATIONS
    assert [c["num_tokens"] for c in results["configs"]] == list(LENGTHS)


def test_rows_hold_consistent_measurements(results):
    ceiling = results["meta"]["matmul_ceiling"]["flops_per_s"]
    for recompute, cached in bench.decode_rows(results):
        t = recompute["num_tokens"]
        assert recompute["vs_recompute"] == 1.0
        assert cached["vs_recompute"] == pytest.approx(cached["median_s"] / recompute["median_s"])
        assert recompute["multiply_adds"] == grouped_query_multiply_adds(2, t, 12, 12, 3, 3).total
        assert cached["multiply_adds"] == grouped_query_multiply_adds(2, 1, 12, 12, 3, 3, num_cached=t - 1).total
        assert recompute["multiply_adds"] == t * cached["multiply_adds"]
        for row in (recompute, cached):
            assert row["median_s"] > 0 and row["iqr_s"] >= 0 and row["runs"] >= 1
            assert row["flops_per_s"] == pytest.approx(2 * row["multiply_adds"] / row["median_s"])
            assert row["ceiling_fraction"] == pytest.approx(row["flops_per_s"] / ceiling)
            # The cached step computed the recomputed output before either was timed.
            assert row["max_abs_diff"] < 1e-5
        # One layer's cache, once the new token is in: keys and values of every position, float32.
        assert cached["cache_bytes"] == kv_cache_bytes(1, 3, 4, t, batch=2, bytes_per_number=4)


def test_the_cached_step_reads_the_cache_and_generates_the_same_token_every_call():
    steps, cache = bench.decode_steps(CONFIGS[2], "cpu")
    assert len(cache) == 11  # the tokens before the new one
    past_values = cache.values
    first = steps["kv_cache"]()
    assert len(cache) == 12 and torch.equal(steps["kv_cache"](), first)  # the cache is put back each call
    torch.testing.assert_close(first, steps["recompute"](), rtol=1e-5, atol=1e-6)
    assert first.shape == (2, 1, 12)
    with torch.no_grad():
        past_values.add_(1.0)  # what the new token reads from the cache
    assert not torch.allclose(steps["kv_cache"](), first, atol=1e-4)
    torch.testing.assert_close(steps["recompute"](), first, rtol=1e-5, atol=1e-6)  # recomputing never reads it


def test_table_reads_ratios_from_the_run(results):
    table = bench.decode_table(results)
    assert table.column("tokens T") == list(LENGTHS)
    for (recompute, cached), ratio, work in zip(bench.decode_rows(results), table.column("× faster"),
                                                table.column("× work")):
        assert ratio == recompute["median_s"] / cached["median_s"]
        assert work == recompute["num_tokens"]
    assert table.title.startswith("One generated token, a test layer: median time per token on ")
    assert "× faster" in bench.decode_summary(results)


def test_decode_rows_needs_both_ways_at_every_length(results):
    with pytest.raises(ValueError, match="no complete decoding rows"):
        bench.decode_rows({"rows": []})
    rows = [r for r in results["rows"] if not (r["num_tokens"] == 5 and r["implementation"] == "kv_cache")]
    with pytest.raises(ValueError, match=r"incomplete at \[5\] tokens.*bench --decode"):
        bench.decode_rows({"rows": rows})


def test_written_files_round_trip(results, tmp_path, monkeypatch):
    monkeypatch.setattr(matplotlib, "use", lambda *args, **kwargs: pytest.fail("the backend was switched"))
    paths = bench.write_results(results, tmp_path, label="test")
    assert [p.name for p in paths] == ["bench-decode-cpu-test.json", "bench-decode-cpu-test.csv",
                                       "bench-decode-cpu-test.png"]
    assert bench.load_results(paths[0]) == results
    with paths[1].open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == DECODE_CSV_FIELDS and len(rows) == 2 * len(LENGTHS)
    assert rows[1]["implementation"] == "kv_cache" and float(rows[1]["cache_bytes"]) > 0


def test_the_figure_has_a_line_per_way(results):
    fig = bench.plot_decode(results)
    assert fig.axes[0].get_legend_handles_labels()[1] == ["no cache (recompute)", "with a KV cache"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [str(t) for t in LENGTHS]
    matplotlib.pyplot.close(fig)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="configs must be a non-empty sequence of BenchConfig"):
        bench.DecodeSettings(configs=[])
    with pytest.raises(ValueError, match="rounds must be a positive integer, got 0. Pass a whole number of at least 1."):
        bench.DecodeSettings(configs=CONFIGS, rounds=0)
    with pytest.raises(ValueError, match=r"unknown configs \['small-4'\]: choose from decode-16"):
        bench.DecodeSettings.for_command(configs=["small-4"])
    # Every size has a name of its own, full or quick, decoding or not.
    assert len(bench.ALL_DECODE_CONFIGS) == len(bench.DECODE_CONFIGS) + len(bench.QUICK_DECODE_CONFIGS)
    assert not set(bench.ALL_DECODE_CONFIGS) & set(bench.ALL_CONFIGS)
    settings = bench.DecodeSettings.for_command()
    assert [c.num_tokens for c in settings.configs] == [16, 32, 64, 128, 256, 512, 1024]
    assert all((c.d_in, c.num_heads, c.head_dim, c.batch) == (768, 12, 64, 1) for c in settings.configs)
    with pytest.raises(TypeError, match="settings must be a DecodeSettings, got BenchSettings"):
        bench.run_decode_benchmark(bench.BenchSettings(configs=[bench.CONFIGS["textbook"]]))


def test_quick_command_writes_json_csv_and_plot(tmp_path, capsys):
    assert cli(["bench", "--decode", "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "× faster" in out and "bench-decode-cpu-quick.json" in out
    results = bench.load_results(tmp_path / "bench-decode-cpu-quick.json")
    assert results["meta"]["quick"] and [c["name"] for c in results["configs"]] == ["decode-tiny-8", "decode-tiny-32"]
    assert (tmp_path / "bench-decode-cpu-quick.csv").exists() and (tmp_path / "bench-decode-cpu-quick.png").exists()


@pytest.mark.parametrize("option,value", [("--implementations", "batched"), ("--modes", "forward")])
def test_command_refuses_options_that_do_not_apply(option, value, tmp_path, capsys):
    assert cli(["bench", "--decode", "--quick", option, value, "--out", str(tmp_path)]) == 2
    assert f"{option} does not apply to --decode" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_command_names_the_decode_sizes(tmp_path, capsys):
    assert cli(["bench", "--decode", "--configs", "gpt2-small", "--out", str(tmp_path)]) == 2
    assert "unknown configs ['gpt2-small']: choose from decode-16, decode-32, decode-64" in capsys.readouterr().err
