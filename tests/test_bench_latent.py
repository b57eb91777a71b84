"""The latent decoding benchmark (``bench --latent``): what it computes, records and writes, and the
stored run the chapter reads. Never a timing assertion."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from mha_course import bench  # noqa: E402
from mha_course.bench.latent import QUICK_LATENT_CONFIGS, latent_layers, latent_steps  # noqa: E402
from mha_course.bench.results import LATENT_CSV_FIELDS  # noqa: E402
from mha_course.cli import main as cli  # noqa: E402

STORED = Path(__file__).resolve().parents[1] / "book" / "data" / "bench-latent-cpu.json"
CONFIGS = list(QUICK_LATENT_CONFIGS.values())


@pytest.fixture(scope="module")
def results():
    return bench.run_latent_benchmark(bench.LatentSettings(
        configs=CONFIGS, min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32))


def test_every_length_has_a_row_for_each_way(results):
    assert [(r["config"], r["implementation"]) for r in results["rows"]] == [
        (c.name, name) for c in CONFIGS for name in bench.LATENT_IMPLEMENTATIONS]
    assert results["meta"]["benchmark"] == "latent" and results["implementations"] == bench.LATENT_IMPLEMENTATIONS


def test_rows_hold_consistent_measurements(results):
    by_name = bench.latent_rows(results)
    for name, rows in by_name.items():
        for row, grouped in zip(rows, by_name["grouped_query"], strict=True):
            assert row["vs_grouped_query"] == pytest.approx(row["median_s"] / grouped["median_s"])
            assert row["flops_per_s"] == pytest.approx(2 * row["multiply_adds"] / row["median_s"])
            assert ("max_abs_diff" in row) == (name == "latent_absorbed")
    for rows in zip(*by_name.values()):
        cached = rows[0]["num_tokens"] + 1  # the new token is in
        multi, grouped, latent, absorbed = (r["cache_bytes"] for r in rows)
        assert grouped == latent == absorbed == cached * (16 + 4) * 4  # the same budget: latent + rotated key
        assert multi == cached * 2 * 4 * 8 * 4
        assert rows[3]["max_abs_diff"] < 1e-4
        assert rows[2]["multiply_adds"] > rows[3]["multiply_adds"]  # expanding costs more than absorbing


def test_the_absorbed_and_expanded_layers_share_their_weights_and_the_grouped_one_its_budget():
    layers = latent_layers(CONFIGS[0], "cpu")
    assert all(torch.equal(a, b) for a, b in zip(layers["latent"].state_dict().values(),
                                                  layers["latent_absorbed"].state_dict().values()))
    assert layers["latent_absorbed"].absorb and not layers["latent"].absorb
    grouped = layers["grouped_query"]
    assert 2 * grouped.num_kv_groups * grouped.head_dim == 16 + 4
    steps, caches = latent_steps(CONFIGS[0], "cpu")
    first = steps["latent"]()
    assert torch.equal(steps["latent"](), first) and len(caches["latent"]) == CONFIGS[0].num_tokens + 1


def test_table_summary_and_figure(results):
    table = str(bench.latent_table(results))
    assert "grouped-query" in table and "latent absorbed" in table and "cache held after 33 tokens" in table
    assert bench.latent_summary(results).startswith(results["meta"]["device_name"])
    fig = bench.plot_latent(results)
    assert len(fig.axes[0].lines) == len(fig.axes[1].lines) == 4


def test_incomplete_results_are_refused_by_name():
    with pytest.raises(ValueError, match=r"no complete latent rows .* bench --latent"):
        bench.latent_rows({"rows": []})


def test_the_command_writes_json_csv_and_png(tmp_path, capsys):
    assert cli(["bench", "--latent", "--quick", "--min-run-time", "0.002", "--rounds", "1", "--no-progress",
                "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "bench-latent-cpu-quick.json").read_text(encoding="utf-8"))
    assert written["meta"]["benchmark"] == "latent" and written["meta"]["quick"]
    with (tmp_path / "bench-latent-cpu-quick.csv").open(encoding="utf-8", newline="") as handle:
        assert next(csv.reader(handle)) == LATENT_CSV_FIELDS
    assert (tmp_path / "bench-latent-cpu-quick.png").stat().st_size > 0
    assert "latent absorbed" in capsys.readouterr().out


def test_the_command_refuses_two_benchmarks_at_once(capsys):
    assert cli(["bench", "--latent", "--decode", "--quick"]) != 0
    assert "--decode and --latent are two different benchmarks" in capsys.readouterr().err


# --- The stored run ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stored():
    if not STORED.exists():
        pytest.skip("book/data/bench-latent-cpu.json is not stored (book/data/README.md has the command)")
    return bench.load_results(STORED)


def test_the_stored_run_is_the_full_one_up_to_16k_cached_tokens_on_one_thread(stored):
    meta = stored["meta"]
    assert meta["device"] == "cpu" and not meta["quick"] and meta["threads"] == 1
    assert [c["name"] for c in stored["configs"]] == list(bench.LATENT_CONFIGS)
    assert max(r["num_tokens"] for r in stored["rows"]) == 16384
    assert meta["stability_warnings"] == []


def test_in_the_stored_run_the_absorbed_layer_computed_the_expanded_function(stored):
    assert max(r["max_abs_diff"] for r in bench.select(stored, implementation="latent_absorbed")) < 1e-3


def test_in_the_stored_run_latent_and_grouped_query_hold_the_same_cache_a_seventh_of_multi_heads(stored):
    by_name = bench.latent_rows(stored)
    for multi, grouped, latent, absorbed in zip(*by_name.values()):
        assert grouped["cache_bytes"] == latent["cache_bytes"] == absorbed["cache_bytes"]
        assert multi["cache_bytes"] / latent["cache_bytes"] == pytest.approx(4096 / 576)
