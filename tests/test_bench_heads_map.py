"""The heads map (``bench --heads-map``) and the cache sizes it records: what it computes, records and
writes, and what the stored run says. Never a timing assertion."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from mha_course import bench  # noqa: E402
from mha_course.bench.machine import cache_sizes  # noqa: E402
from mha_course.bench.results import HEADS_MAP_CSV_FIELDS  # noqa: E402
from mha_course.cli import main as cli  # noqa: E402
from mha_course.cost import class_d_out, multiply_adds  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "book" / "data"
CELLS = [bench.BenchConfig(f"map-test-T{t}-h{h}", 2, t, 8, h, 8 // h, "a test cell") for t in (3, 6) for h in (1, 4)]


@pytest.fixture(scope="module")
def results():
    return bench.run_heads_map(bench.HeadsMapSettings(
        configs=CELLS, min_run_time=0.002, rounds=1, threads=1, progress=False, ceiling_size=32))


def test_every_cell_has_a_stacked_and_a_batched_row(results):
    assert [(r["config"], r["implementation"], r["mode"]) for r in results["rows"]] == [
        (c.name, name, "forward") for c in CELLS for name in ("stacked", "batched")]
    meta = results["meta"]
    assert meta["benchmark"] == "heads-map" and meta["format_version"] == bench.FORMAT_VERSION
    assert meta["threads"] == 1 and set(meta["load"]) == {"start", "end"}
    assert meta["caches"]["source"] in ("sysfs", "lscpu", "unavailable")
    assert list(results["implementations"]) == ["stacked", "batched"]


def test_rows_hold_the_ratio_the_verdict_and_the_score_sizes(results):
    for config in CELLS:
        stacked = bench.lookup(results, config.name, "forward", "stacked")
        batched = bench.lookup(results, config.name, "forward", "batched")
        assert batched["vs_stacked"] == pytest.approx(batched["median_s"] / stacked["median_s"])
        assert batched["verdict"] == bench.compare_times(results, config.name, "forward", "batched", "stacked")["verdict"]
        assert "vs_stacked" not in stacked
        b, t, h = config.batch, config.num_tokens, config.num_heads
        for row, kind in ((stacked, "wrapper"), (batched, "batched")):
            # The two computed the same function before either was timed.
            assert row["max_abs_diff"] < 1e-5
            assert row["score_bytes_one"] == b * t * t * 4 and row["score_bytes_all"] == h * b * t * t * 4
            assert row["multiply_adds"] == multiply_adds(kind, b, t, 8, class_d_out(kind, h, 8 // h), h).total
    assert set(bench.heads_map_cells(results)) == {(t, h) for t in (3, 6) for h in (1, 4)}


def test_table_and_figure_read_the_map(results):
    text = str(bench.heads_map_table(results))
    assert "1 head" in text and "4 heads" in text and "tokens T" in text
    fig = bench.plot_heads_map(results)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["3", "6"]
    cells = bench.heads_map_cells(results)
    shown = [t.get_text() for t in ax.texts]
    assert shown == [f"{cells[(t, h)]['vs_stacked']:.2f}" + ("\ntie" if cells[(t, h)]["verdict"] == "tie" else "")
                     for t in (3, 6) for h in (1, 4)]
    matplotlib.pyplot.close(fig)


def test_the_map_needs_heads_map_rows():
    with pytest.raises(ValueError, match="no heads-map cells.*bench --heads-map"):
        bench.heads_map_cells({"rows": []})


def test_written_files_round_trip(results, tmp_path):
    paths = bench.write_results(results, tmp_path, label="test")
    assert [p.name for p in paths] == ["bench-heads-map-cpu-test.json", "bench-heads-map-cpu-test.csv",
                                       "bench-heads-map-cpu-test.png"]
    assert bench.load_results(paths[0]) == results
    with paths[1].open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == HEADS_MAP_CSV_FIELDS and len(rows) == 2 * len(CELLS)


def test_settings_are_checked():
    with pytest.raises(ValueError, match=r"unknown configs \['small-4'\]: choose from map-T32-h1"):
        bench.HeadsMapSettings.for_command(configs=["small-4"])
    settings = bench.HeadsMapSettings.for_command()
    assert {c.num_heads * c.head_dim for c in settings.configs} == {256}  # one model width
    assert {c.batch for c in settings.configs} == {8}
    # The cell of the full run's small-4 is on the map, with its sizes.
    small = bench.CONFIGS["small-4"]
    cell = bench.HEADS_MAP_CONFIGS["map-T256-h4"]
    assert (cell.batch, cell.num_tokens, cell.d_in, cell.num_heads, cell.head_dim) == (
        small.batch, small.num_tokens, small.d_in, small.num_heads, small.head_dim)
    assert not set(bench.ALL_HEADS_MAP_CONFIGS) & (set(bench.ALL_CONFIGS) | set(bench.ALL_DECODE_CONFIGS))
    with pytest.raises(TypeError, match="settings must be a HeadsMapSettings, got BenchSettings"):
        bench.run_heads_map(bench.BenchSettings(configs=[bench.CONFIGS["textbook"]]))


def test_quick_command_writes_json_csv_and_plot(tmp_path, capsys):
    assert cli(["bench", "--heads-map", "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "batched ÷ stacked" in out and "caches:" in out and "bench-heads-map-cpu-quick.json" in out
    results = bench.load_results(tmp_path / "bench-heads-map-cpu-quick.json")
    assert results["meta"]["quick"] and len(results["configs"]) == len(bench.QUICK_HEADS_MAP_CONFIGS)
    assert (tmp_path / "bench-heads-map-cpu-quick.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--implementations", "batched"], "--implementations does not apply to --heads-map"),
    (["--decode"], "--decode and --heads-map are two different benchmarks"),
])
def test_command_refuses_options_that_do_not_apply(args, message, tmp_path, capsys):
    assert cli(["bench", "--heads-map", "--quick", *args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------------------------
# The cache sizes: from sysfs, from lscpu where sysfs is absent, and nothing where neither is
# --------------------------------------------------------------------------------------------

def _fake_sysfs(root: Path) -> Path:
    for index, (level, kind, size, shared) in enumerate([(1, "Data", "48K", "0"), (1, "Instruction", "64K", "0"),
                                                         (2, "Unified", "2048K", "0"),
                                                         (3, "Unified", "32768K", "0-1")]):
        folder = root / "cpu0" / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (folder / name).write_text(f"{value}\n", encoding="utf-8")
    return root


def test_cache_sizes_from_sysfs(tmp_path):
    found = cache_sizes(_fake_sysfs(tmp_path))
    assert found == {"source": "sysfs", "caches": [
        {"name": "L1d", "level": 1, "bytes": 48 * 2**10, "shared_by": 1},
        {"name": "L2", "level": 2, "bytes": 2 * 2**20, "shared_by": 1},
        {"name": "L3", "level": 3, "bytes": 32 * 2**20, "shared_by": 2}]}


def test_cache_sizes_fall_back_to_lscpu_then_to_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    lscpu = ("NAME ONE-SIZE ALL-SIZE WAYS TYPE LEVEL SETS PHY-LINE COHERENCY-SIZE\n"
             "L1d 49152 98304 12 Data 1 64 1 64\n"
             "L1i 65536 131072 16 Instruction 1 64 1 64\n"
             "L2 1048576 2097152 16 Unified 2 2048 1 64\n"
             "L3 33554432 33554432 16 Unified 3 32768 1 64\n")
    found = cache_sizes(tmp_path / "no-sysfs", lscpu=lscpu)
    assert found["source"] == "lscpu"
    assert [(c["name"], c["bytes"], c["shared_by"]) for c in found["caches"]] == [
        ("L1d", 49152, 1), ("L2", 2**20, 1), ("L3", 32 * 2**20, 2)]
    assert cache_sizes(tmp_path / "no-sysfs", lscpu="lscpu: not found") == {"source": "unavailable", "caches": []}


# --------------------------------------------------------------------------------------------
# The stored run (book/data/bench-heads-map-cpu.json, read by chapter 3)
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stored():
    return bench.load_results(DATA / "bench-heads-map-cpu.json")


def test_stored_map_is_a_full_one_thread_run_with_its_caches(stored):
    meta = stored["meta"]
    assert meta["benchmark"] == "heads-map" and meta["threads"] == 1 and not meta["quick"]
    assert [c["name"] for c in stored["configs"]] == list(bench.HEADS_MAP_CONFIGS)
    assert set(bench.heads_map_cells(stored)) == {(t, h) for t in bench.sizes.HEADS_MAP_TOKENS
                                                   for h in bench.sizes.HEADS_MAP_HEADS}
    assert meta["caches"]["source"] != "unavailable" and any(c["level"] == 2 for c in meta["caches"]["caches"])
    assert all(row["max_abs_diff"] < 1e-4 for row in stored["rows"])
