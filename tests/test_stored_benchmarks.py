"""What the benchmark results stored with the book say, checked: the course's acceptance checks.

Chapter 4 and the memory deep dive read ``book/data/bench-cpu*.json``; the engineering goals set
for the implementations are checked here, over the same files, never in the book's text. Each
test asserts what the stored run says today, so a new run (``python -m mha_course bench``, see
``book/data/README.md``) that says the same passes and one that says otherwise fails by name.
Goals a stored run does not meet are strict ``xfail``, with the measured number in the reason:
they fail loudly the day a run meets them, so that the marker is removed then.

Most tests check both stored runs, with one thread (``bench-cpu.json``) and with two
(``bench-cpu-2threads.json``; its tests are skipped when it is not stored). The two allocator
variants of the memory deep dive (``bench-cpu-mmap-off.json``, ``bench-cpu-malloc-reuse.json``)
are checked at the end for being the runs it describes.

What a sentence of the book reads from one of these files is asserted in a hidden cell beside the
sentence (strict nbval runs it). Claims the book makes of one run alone are asserted there only;
the tests here that run over both stored runs check them the same way, so that a new run of either
is held to what the book says of the machine.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mha_course import bench  # noqa: E402
from mha_course.bench.plots import plot_relative_times  # noqa: E402
from mha_course.bench.results import size_table, threads_table, versus_table  # noqa: E402
from mha_course.cost import batched_forward_peak_bytes, score_memory_bytes  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "book" / "data"
RUNS = {"1 thread": ("bench-cpu.json", 1), "2 threads": ("bench-cpu-2threads.json", 2)}
SIZES = ("textbook", "small-4", "small-16", "gpt2-small")
IMPLEMENTATIONS = ("stacked", "batched", "fused_qkv", "fast", "raw_sdpa", "torch_mha_weights", "torch_mha")


def _load(run: str) -> dict:
    name, _ = RUNS[run]
    path = DATA / name
    if not path.exists():
        if run == "1 thread":
            pytest.fail(f"{path} is missing: chapter 4 reads it. See book/data/README.md.")
        pytest.skip(f"{name} is not stored yet (book/data/README.md has the command)")
    return bench.load_results(path)


@pytest.fixture(params=list(RUNS), scope="module")
def run(request):
    return request.param, _load(request.param)


def _time(results, config, mode, name):
    return bench.lookup(results, config, mode, name)["median_s"]


def _peak(results, config, mode, name):
    return bench.lookup(results, config, mode, name)["peak_bytes"]


# --- The files are what the book says they are ------------------------------------------------------

def test_stored_run_is_a_full_cpu_run_with_the_threads_its_name_says(run):
    label, results = run
    meta = results["meta"]
    assert meta["device"] == "cpu" and not meta["quick"] and meta["memory_measured"]
    assert meta["threads"] == RUNS[label][1]
    assert meta["malloc_env"] == {}  # the allocator's defaults: the variants are other files
    assert [c["name"] for c in results["configs"]] == list(SIZES)
    assert list(results["implementations"]) == list(IMPLEMENTATIONS)
    for config in SIZES:
        for mode in bench.MODES:
            measured = {r["implementation"] for r in bench.select(results, config, mode)}
            expected = set(IMPLEMENTATIONS) - ({"torch_mha", "torch_mha_weights"} if config == "textbook" else set())
            assert measured == expected, (config, mode)


def test_every_implementation_computed_the_same_function(run):
    _, results = run
    worst = max(r["max_abs_diff"] for r in bench.select(results))
    assert worst < 1e-3, f"an implementation's output differed from the textbook module's by {worst}"


def test_two_thread_run_measures_the_same_machine_and_sizes_as_the_one_thread_run():
    one, two = _load("1 thread"), _load("2 threads")
    for key in ("device_name", "torch", "cpu_count"):
        assert one["meta"][key] == two["meta"][key], key
    assert one["configs"] == two["configs"]


STORED_RUNS = ("bench-cpu.json", "bench-cpu-2threads.json", "bench-cpu-mmap-off.json",
               "bench-cpu-malloc-reuse.json", "bench-decode-cpu.json", "bench-heads-map-cpu.json",
               "bench-tiled-cpu.json", "bench-grouped-cpu.json", "bench-latent-cpu.json",
               "bench-deltanet-cpu.json", "bench-window-cpu.json")


@pytest.mark.parametrize("name", STORED_RUNS)
def test_stored_run_held_still(name):
    # The book reads these runs as measurements of a quiet machine: the bench command found
    # neither its matmul ceiling nor the other programs' load moving during any of them.
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{name} is not stored (book/data/README.md has the command)")
    # The command warns when either moved by more than 10 % (bench.machine.stability_warnings).
    meta = bench.load_results(path)["meta"]
    assert meta["stability_warnings"] == [], meta["stability_warnings"]


# --- The fast path --------------------------------------------------------------------------------

def test_fast_path_stays_close_to_raw_sdpa(run):
    # The fused projection changes little next to the kernel: within 1.1x at GPT-2 small and
    # within 1.3x at every size, in both modes.
    _, results = run
    for config in SIZES:
        for mode in bench.MODES:
            ratio = _time(results, config, mode, "fast") / _time(results, config, mode, "raw_sdpa")
            assert ratio <= (1.1 if config == "gpt2-small" else 1.3), (config, mode, ratio)


@pytest.mark.parametrize("label", [
    "1 thread",
    pytest.param("2 threads", marks=pytest.mark.xfail(
        strict=True, raises=AssertionError,
        reason="goal not met by the two-thread run: fast is 1.055x raw SDPA at gpt2-small, forward")),
])
def test_goal_fast_path_within_5_percent_of_raw_sdpa_everywhere(label):
    results = _load(label)
    worst = max((_time(results, config, mode, "fast") / _time(results, config, mode, "raw_sdpa"), config, mode)
                for config in SIZES for mode in bench.MODES)
    assert worst[0] <= 1.05, worst


def test_fast_path_at_least_twice_as_fast_as_torch_module_returning_weights(run):
    _, results = run
    ratio = _time(results, "gpt2-small", "forward", "torch_mha_weights") / _time(
        results, "gpt2-small", "forward", "fast")
    assert ratio >= 2.0, ratio


def test_fast_path_is_faster_than_the_textbook_module_at_every_size(run):
    _, results = run
    for config in SIZES:
        for mode in bench.MODES:
            assert _time(results, config, mode, "fast") < _time(results, config, mode, "batched"), (config, mode)


def test_fast_path_peak_memory_matches_raw_sdpa_at_gpt2_small(run):
    _, results = run
    for mode in bench.MODES:
        ratio = _peak(results, "gpt2-small", mode, "fast") / _peak(results, "gpt2-small", mode, "raw_sdpa")
        assert ratio <= 1.2, (mode, ratio)


def test_four_to_sixteen_heads_at_fixed_width_cost_the_fast_path_little(run):
    # The score tensor grows 4x; a kernel that does not store it pays neither in memory nor
    # (much) in time, where the batched module's peak grows with the score tensor.
    _, results = run
    for mode in bench.MODES:
        time_ratio = _time(results, "small-16", mode, "fast") / _time(results, "small-4", mode, "fast")
        assert time_ratio <= 1.3, (mode, time_ratio)
    fast_peak = _peak(results, "small-16", "forward", "fast") / _peak(results, "small-4", "forward", "fast")
    batched_peak = _peak(results, "small-16", "forward", "batched") / _peak(results, "small-4", "forward", "batched")
    assert fast_peak <= 1.25 and batched_peak >= 2.0, (fast_peak, batched_peak)


# --- Memory: the score tensor ----------------------------------------------------------------------

def _config(results, name):
    return next(c for c in results["configs"] if c["name"] == name)


@pytest.mark.parametrize("config", ["small-16", "gpt2-small"])
def test_fused_kernel_never_held_a_whole_score_tensor_on_this_cpu(run, config):
    _, results = run
    c = _config(results, config)
    one_tensor = score_memory_bytes(c["batch"], c["num_heads"], c["num_tokens"])
    for name in ("fast", "raw_sdpa"):
        assert _peak(results, config, "forward", name) < one_tensor, name


@pytest.mark.parametrize("config", ["small-4", "small-16", "gpt2-small"])
def test_batched_peak_is_two_score_tensors_and_the_projections(run, config):
    _, results = run
    c = _config(results, config)
    predicted = batched_forward_peak_bytes(c["batch"], c["num_tokens"], c["num_heads"], c["head_dim"])
    measured = _peak(results, config, "forward", "batched")
    assert 0.85 <= measured / predicted <= 1.25, measured / predicted


# --- Stacked heads against the batched module ------------------------------------------------------

def _batched_over_stacked(results) -> dict:
    return {(config, mode): bench.compare_times(results, config, mode, "batched", "stacked")["ratio"]
            for config in SIZES for mode in bench.MODES}


def test_which_of_batched_and_stacked_is_ahead_changes_with_size_and_mode(run):
    _, results = run
    ratios = _batched_over_stacked(results).values()
    assert min(ratios) < 1 < max(ratios), sorted(ratios)


def test_with_two_threads_the_batched_module_falls_more_than_twice_behind_only_at_small_16_forward():
    # The second thread sped the batched module's small-16 forward pass up by only 1.36x, where
    # the stacked heads gained 1.81x: there it ends at 2.45x the stacked heads' time.
    ratios = _batched_over_stacked(_load("2 threads"))
    outside = {key: ratio for key, ratio in ratios.items() if not 0.5 <= ratio <= 2.0}
    assert set(outside) == {("small-16", "forward")}, outside
    assert outside[("small-16", "forward")] < 2.5, outside


@pytest.mark.parametrize("label", [
    pytest.param("1 thread", marks=pytest.mark.xfail(
        strict=True, raises=AssertionError,
        reason="goal not met by the one-thread run: the stacked heads are faster beyond the spread at small-4 "
               "(batched 1.75x their time forward, 1.19x training), small-16 (1.84x, 1.87x) and gpt2-small "
               "training (1.07x)")),
    pytest.param("2 threads", marks=pytest.mark.xfail(
        strict=True, raises=AssertionError,
        reason="goal not met by the two-thread run: the stacked heads are faster beyond the spread at small-4 "
               "(batched 1.92x their time forward, 1.29x training) and small-16 (2.45x, 1.89x)")),
])
def test_goal_batched_no_slower_than_stacked_anywhere(label):
    results = _load(label)
    behind = {}
    for config in SIZES:
        for mode in bench.MODES:
            duel = bench.compare_times(results, config, mode, "batched", "stacked")
            if duel["verdict"] == "stacked":
                behind[config, mode] = round(duel["ratio"], 2)
    assert not behind, behind


# --- The allocator variants of the memory deep dive -------------------------------------------------

def _variant(label: str) -> dict:
    return bench.load_results(DATA / f"bench-cpu-{label}.json")


def test_allocator_variants_are_the_runs_the_deep_dive_describes():
    off, reuse = _variant("mmap-off"), _variant("malloc-reuse")
    assert off["meta"]["malloc_env"] == {"MALLOC_MMAP_MAX_": "0"}
    assert reuse["meta"]["malloc_env"] == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000"}
    for results in (off, reuse):
        assert [c["name"] for c in results["configs"]] == ["small-16", "gpt2-small"]
        assert {r["mode"] for r in results["rows"]} == {"forward"}


def _allocator_runs() -> dict:
    return {"default": _load("1 thread"), "mmap-off": _variant("mmap-off"), "malloc-reuse": _variant("malloc-reuse")}


def test_allocator_runs_can_be_compared_with_each_other():
    # The deep dive sets the three runs' times side by side: one machine, in one state.
    runs = _allocator_runs()
    ceilings = [r["meta"]["matmul_ceiling"][f"flops_per_s_{when}"] for r in runs.values() for when in ("start", "end")]
    assert max(ceilings) <= 1.05 * min(ceilings), ceilings
    for key in ("device_name", "torch", "cpu_count", "threads"):
        assert len({r["meta"][key] for r in runs.values()}) == 1, key


# --- The chapter's tables and figure over the stored run -------------------------------------------

def test_size_table_has_one_row_per_implementation_and_flags_fused_kernels():
    results = _load("1 thread")
    table = size_table(results, "gpt2-small")
    assert table.column("implementation") == list(IMPLEMENTATIONS)
    assert table.columns[2] == table.columns[4] == "× batched"
    batched = dict(zip(table.column("implementation"), table.rows))["batched"]
    assert batched[2] == batched[4] == 1.0  # the batched module against itself, both modes
    assert any("fast, raw_sdpa: a fused kernel that may skip masked tiles" in note for note in table.notes)
    textbook = size_table(results, "textbook")
    assert textbook.column("forward")[-1] == "skipped"
    assert any(note.startswith("skipped: torch.nn.MultiheadAttention needs d_in == d_out") for note in textbook.notes)


def test_versus_table_puts_the_formula_beside_the_clock():
    results = _load("1 thread")
    table = versus_table(results, "batched", "stacked")
    assert table.column("size") == list(SIZES)
    assert table.columns == ["size", "heads", "multiply-adds", "forward", "faster", "training", "faster"]
    work = table.column("multiply-adds")
    assert all(1.1 < w < 1.3 for w in work)  # the output projection: about a fifth more work
    verdicts = {row[4] for row in table.rows} | {row[6] for row in table.rows}
    assert verdicts <= {"batched", "stacked", "tie"}
    for row in table.rows:
        duel = bench.compare_times(results, row[0], "forward+backward", "batched", "stacked")
        assert row[5:] == [duel["ratio"], duel["verdict"]]


def test_threads_table_needs_two_thread_counts():
    results = _load("1 thread")
    with pytest.raises(ValueError, match="both runs used 1 thread"):
        threads_table(results, results)
    two = dict(results, meta=dict(results["meta"], threads=2))
    table = threads_table(results, two, implementations=("batched",))
    assert table.columns[2:5] == ["forward, 1", "forward, 2", "speed-up"]
    assert [row[4] for row in table.rows] == [row[7] for row in table.rows] == [1.0] * len(SIZES)


def test_relative_times_figure_draws_both_modes_from_the_line_at_one():
    results = _load("1 thread")
    fig = plot_relative_times(results, ["small-4", "gpt2-small"])
    assert [ax.get_title() for ax in fig.axes] == ["small-4", "gpt2-small"]
    ax = fig.axes[1]
    bars = [p for p in ax.patches]
    assert len(bars) == 2 * len(IMPLEMENTATIONS)
    assert all(bar.get_x() == 1.0 for bar in bars)  # every bar starts at "as fast as batched"
    ends = sorted(round(bar.get_x() + bar.get_width(), 6) for bar in bars)
    expected = sorted(round(_time(results, "gpt2-small", m, n) / _time(results, "gpt2-small", m, "batched"), 6)
                      for m in bench.MODES for n in IMPLEMENTATIONS)
    assert ends == expected
    plt.close(fig)


# --- The tiled loop in training ---------------------------------------------------------------------

def test_stored_tiled_run_in_training_keeps_memory_in_proportion_to_t():
    # A run with the forward-and-backward rows: what autograd keeps for the tiled loop and for the
    # fused kernel grows as T (about twice per doubling) and stays within 1.5 times the kernel's,
    # while the explicit scores' grows towards T squared (3.2 to 3.7 times per doubling from 256 on); the forward loop peaks within 1.2 times the
    # kernel at the longest length. A run from before those rows existed has none to check.
    from mha_course.bench.tiled import has_training_rows
    from mha_course.bench.tiled_steps import TRAINING_MODE

    path = DATA / "bench-tiled-cpu.json"
    results = bench.load_results(path)
    if not has_training_rows(results):
        pytest.skip(f"{path.name} holds no training rows yet (book/data/README.md has the command)")
    by_name = bench.tiled_rows(results, TRAINING_MODE)
    saved = {name: [r["saved_bytes"] for r in rows] for name, rows in by_name.items()}
    for earlier, later in zip(range(len(saved["sdpa"]) - 1), range(1, len(saved["sdpa"]))):
        assert 1.8 < saved["tiled"][later] / saved["tiled"][earlier] < 2.2
        assert 3 < saved["scores"][later] / saved["scores"][earlier] < 4.5
    assert all(t <= 1.5 * s for t, s in zip(saved["tiled"], saved["sdpa"]))
    forward = bench.tiled_rows(results)
    assert forward["tiled"][-1]["peak_bytes"] <= 1.2 * forward["sdpa"][-1]["peak_bytes"]


# --- Grouped-query attention on the fused kernel ----------------------------------------------------

def _grouped_ratios() -> dict[str, tuple[float, float]]:
    """Config -> (the layer's time over its reference's, the larger relative spread of the two)."""
    path = DATA / "bench-grouped-cpu.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: chapter 6 reads it. See book/data/README.md.")
    return {row["config"]: (row["vs_reference"], max(row["iqr_s"] / row["median_s"],
                                                     reference["iqr_s"] / reference["median_s"]))
            for row, reference in bench.grouped_pairs(bench.load_results(path))}


def test_stored_grouped_run_compared_layers_that_compute_the_same_function():
    results = bench.load_results(DATA / "bench-grouped-cpu.json")
    assert results["meta"]["threads"] == 2 and not results["meta"]["quick"]
    assert {row["config"] for row in results["rows"]} == set(bench.GROUPED_CONFIGS)
    assert all(row["max_abs_diff"] < 1e-4 for row in results["rows"])


@pytest.mark.parametrize("config", ["llama-prompt-1024", "llama-decode-1024"])
def test_goal_the_converted_llama_layer_within_5_percent_of_transformers(config):
    # GroupedQueryAttention made by from_llama_attention against transformers' LlamaAttention (sdpa), both
    # handed the rotation as a model hands it: a 1,024-token prompt, and one token after 1,024 cached.
    ratio, spread = _grouped_ratios()[config]
    assert ratio <= 1.05, (ratio, spread)


def test_goal_grouped_query_attention_within_5_percent_of_the_fast_path_at_equal_heads():
    ratio, spread = _grouped_ratios()["gpt2-heads"]
    assert ratio <= 1.05, (ratio, spread)


def test_fewer_key_value_heads_make_the_grouped_module_faster_than_the_fast_path():
    # 4 key/value heads for 12 query heads: narrower key and value projections, the same kernel.
    ratio, _ = _grouped_ratios()["gpt2-groups-4"]
    assert ratio < 1, ratio


# --- The gated delta rule against softmax attention (chapter 12) ---------------------------------------

def test_stored_state_run_chunked_equals_recurrent_and_the_state_does_not_grow():
    path = DATA / "bench-deltanet-cpu.json"
    if not path.exists():
        pytest.skip("bench-deltanet-cpu.json is not stored (book/data/README.md has the command)")
    results = bench.load_results(path)
    prompt = bench.deltanet_rows(results, "deltanet-prompt")
    assert [r["num_tokens"] for r in prompt["sdpa"]][-1] == 16384  # prompts up to 16k tokens
    assert all(r["max_abs_diff"] < 1e-4 for r in prompt["chunked"])  # the same function, computed two ways
    decode = bench.deltanet_rows(results, "deltanet-decode")
    assert len({r["cache_bytes"] for r in decode["state"]}) == 1
    kv = [r["cache_bytes"] / r["num_tokens"] for r in decode["kv_cache"]]
    assert len(set(kv)) == 1  # a key and a value per token, every token kept
    # the chunked form keeps nothing quadratic in the length: its peak grows as T, not T^2
    peaks = [r["peak_bytes"] for r in prompt["chunked"]]
    assert all(b / a < 6 for a, b in zip(peaks, peaks[1:]))  # lengths x4 apart


# --- Attention under a sliding window (chapter 11) ----------------------------------------------------

def test_stored_window_run_the_loop_skips_tiles_and_its_time_falls_with_the_window():
    # The tiled loop with a window computes the same function as the fused kernel given the window's
    # mask; at the longest length its time falls with the window (the tiles it computes grow as the
    # window does), below the causal loop's for every window, and it never holds a score tensor,
    # where the kernel given a (T, T) mask holds one.
    from mha_course.bench.window import window_rows

    path = DATA / "bench-window-cpu.json"
    if not path.exists():
        pytest.skip("bench-window-cpu.json is not stored (book/data/README.md has the command)")
    results = bench.load_results(path)
    assert all(r["max_abs_diff"] < 1e-4 for r in results["rows"])
    longest = max(r["num_tokens"] for r in results["rows"])
    assert longest == 16384
    rows = window_rows(results, num_tokens=longest)
    tiled = [r for r in rows if r["implementation"] == "tiled"]
    windowed = [r for r in tiled if r["window"] is not None]
    assert [r["tiles"] for r in windowed] == sorted(r["tiles"] for r in windowed)
    assert [r["median_s"] for r in windowed] == sorted(r["median_s"] for r in windowed)
    assert all(r["vs_full"] < 1 for r in windowed)
    sdpa = {r["window"]: r for r in rows if r["implementation"] == "sdpa"}
    for r in windowed:
        assert sdpa[r["window"]]["peak_bytes"] > 10 * r["peak_bytes"]

