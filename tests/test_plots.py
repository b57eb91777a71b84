"""The plotting functions draw what they are given and reject shapes they cannot draw."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from mha_course.plots import plot_attention, plot_visibility  # noqa: E402


def test_plot_visibility_marks_lower_triangle():
    fig = plot_visibility(3, labels=["1", "2", "3"])
    marks = [t.get_text() for t in fig.axes[0].texts]
    assert marks == ["✓", "✗", "✗", "✓", "✓", "✗", "✓", "✓", "✓"]
    plt.close(fig)


def test_plot_attention_one_panel_per_head():
    weights = torch.softmax(torch.randn(3, 4, 4), dim=-1)
    fig = plot_attention(weights, labels=list("abcd"))
    assert len(fig.axes) == 3 and [ax.get_title() for ax in fig.axes] == ["Head 1", "Head 2", "Head 3"]
    assert fig.axes[0].texts[0].get_text() == format(float(weights[0, 0, 0]), ".2f")
    plt.close(fig)


def test_plot_attention_leaves_the_masked_upper_triangle_empty():
    scores = torch.randn(2, 4, 4).masked_fill(torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    fig = plot_attention(weights)
    # numbers on and below the diagonal only: 4 + 3 + 2 + 1 per head
    assert [len(ax.texts) for ax in fig.axes] == [10, 10]
    assert fig.axes[0].texts[1].get_text() == format(float(weights[0, 1, 0]), ".2f")
    plt.close(fig)
    # a weight of 0 on or below the diagonal is still shown
    fig = plot_attention(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert [t.get_text() for t in fig.axes[0].texts] == ["1.00", "0.00", "1.00"]
    plt.close(fig)


def test_plot_attention_without_numbers_draws_a_colour_bar():
    fig = plot_attention(torch.softmax(torch.randn(4, 4), dim=-1), fmt=None)
    assert len(fig.axes[0].texts) == 0 and len(fig.axes) == 2  # the panel and its colour bar
    assert fig.axes[1].get_ylabel() == "attention weight"
    plt.close(fig)


def test_plot_attention_rejects_batch_dimension():
    with pytest.raises(ValueError, match=r"weights must have shape \(T, T\) or \(num_heads, T, T\), got \(1, 2, 4, 4\)"):
        plot_attention(torch.rand(1, 2, 4, 4))
    with pytest.raises(ValueError, match="labels has 2 entries but there are 4 tokens"):
        plot_attention(torch.rand(4, 4), labels=["a", "b"])


# --- The flow of heads and the cost regimes ---------------------------------------------------------

from mha_course.plots import plot_cost_regimes, plot_head_flow  # noqa: E402


def _texts(fig):
    return [t.get_text() for t in fig.axes[0].texts]


@pytest.mark.parametrize("num_heads", [1, 2, 3])
def test_head_flow_draws_one_path_per_head(num_heads):
    fig = plot_head_flow(num_heads, num_tokens=3, d_in=3, head_dim=2)
    texts = _texts(fig)
    assert sum(t.startswith("Head ") for t in texts) == num_heads
    assert [t for t in texts if t.startswith("$Z_")] == [f"$Z_{{{h}}}$" for h in range(1, num_heads + 1)]
    assert texts.count("(3, 2)") == num_heads  # every Z_m is (T, head_dim)
    merged = "concatenate\nside by side" in texts
    assert merged == (num_heads > 1)
    if num_heads > 1:
        assert "$Z$" in texts and f"(3, {2 * num_heads})" in texts
    else:
        assert "nothing to merge:\n$Z = Z_1$" in texts
    plt.close(fig)


def test_head_flow_elides_middle_heads_and_draws_the_batched_module():
    fig = plot_head_flow(12, batched=True, max_heads_drawn=4)
    texts = _texts(fig)
    assert [t.split("\n")[0] for t in texts if t.startswith("Head ")] == ["Head 1", "Head 2", "Head 3", "Head 12"]
    assert texts.count(r"$\vdots$") == 2
    assert any("out_proj" in t for t in texts)
    assert "project, then\nsplit into heads" in texts  # the batched module does split its projections
    assert any("\nslice 12 of" in t for t in texts)
    assert r"($T$, $12\,d_h$)" in texts  # the book's notation: T tokens, h heads of width d_h
    assert fig.axes[0].get_title() == "12 heads, batched in one module"
    plt.close(fig)


def test_stacked_heads_fan_out_the_whole_input_rather_than_split_it():
    fig = plot_head_flow(3)
    texts = _texts(fig)
    assert "fan out\nto heads" in texts and "process per head" in texts and "merge" in texts
    assert not any("split" in t for t in texts)  # every stacked head reads all of X
    assert r"($T$, $d_\mathrm{in}$)" in " ".join(texts) and texts.count("($T$, $d_h$)") == 3
    plt.close(fig)


def test_head_flow_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got 0"):
        plot_head_flow(0)
    with pytest.raises(ValueError, match="max_heads_drawn must be at least 2"):
        plot_head_flow(5, max_heads_drawn=1)


def test_cost_regimes_plots_ratios_to_the_fewest_heads():
    from mha_course.compare import head_count_sweep

    points = head_count_sweep((1, 2, 4), d_in=8, head_dim=2, d_model=8, batch=1, num_tokens=3, measure_time=False)
    fig = plot_cost_regimes(points)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["parameters", "multiply-adds", "score memory"]  # no time panel when untimed
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    assert list(lines["head width fixed, stacked heads"].get_ydata()) == [1.0, 2.0, 4.0]
    assert list(lines["model width fixed, stacked heads"].get_ydata()) == [1.0, 1.0, 1.0]
    scores = {line.get_label(): line for line in fig.axes[2].lines}
    for regime in ("head width fixed", "model width fixed"):  # every head has its own T x T scores
        assert list(scores[f"{regime}, stacked heads"].get_ydata()) == [1.0, 2.0, 4.0]
    # The two regimes coincide in the score panel: they must differ in marker and line width.
    head_line, model_line = scores["head width fixed, stacked heads"], scores["model width fixed, stacked heads"]
    assert head_line.get_marker() != model_line.get_marker()
    assert head_line.get_linewidth() > model_line.get_linewidth()
    plt.close(fig)
    with pytest.raises(ValueError, match="points is empty"):
        plot_cost_regimes([])


def test_cost_regimes_adds_the_time_panel_when_timed():
    from mha_course.compare import head_count_sweep

    points = head_count_sweep((1, 2), regimes=["model_width_fixed"], d_in=4, d_model=4, batch=1, num_tokens=3,
                              min_run_time=0.005, rounds=1)
    fig = plot_cost_regimes(points)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["parameters", "multiply-adds", "score memory", "forward time (measured)"]
    assert _panel_rows(fig) == 2  # four panels: two rows of two
    plt.close(fig)


# --- At most two heat maps per row, numbers only where they fit ---------------------------------
# (Every book figure's text size as shown is measured in tests/test_figure_style.py.)

def _panel_rows(fig) -> int:
    return len({round(ax.get_position().y0, 3) for ax in fig.axes if ax.get_label() != "<colorbar>"})


def test_attention_maps_put_at_most_two_panels_in_a_row():
    fig = plot_attention(torch.softmax(torch.randn(3, 6, 6), dim=-1))
    assert len(fig.axes) == 3 and _panel_rows(fig) == 2
    left = sorted({round(ax.get_position().x0, 3) for ax in fig.axes})
    assert len(left) == 2
    plt.close(fig)


def test_attention_numbers_only_where_they_fit():
    fig = plot_attention(torch.softmax(torch.randn(2, 40, 40), dim=-1))  # cells far too small for "0.03"
    assert not fig.axes[0].texts, "numbers were written into cells too small to read them"
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes), "without numbers the panels need a colour bar"
    plt.close(fig)


def test_visibility_marks_mean_the_same_as_the_printed_tables():
    """✓ is allowed and ✗ forbidden, as in chapter 1's tables; no third mark."""
    fig = plot_visibility(4)
    marks = _texts(fig)
    assert set(marks) == {"✓", "✗"} and marks.count("✓") == 10
    plt.close(fig)


# --- Sharing keys and values (chapter 6) ----------------------------------------------------------

from mha_course.plots import plot_kv_cache_growth, plot_kv_sharing  # noqa: E402


@pytest.mark.parametrize("num_heads,kv_groups", [(8, (8, 2, 1)), (6, (3,)), (4, (4, 1))])
def test_kv_sharing_joins_each_query_head_to_its_groups_key_value_head(num_heads, kv_groups):
    fig = plot_kv_sharing(num_heads, kv_groups)
    assert len(fig.axes) == len(kv_groups)
    for ax, groups in zip(fig.axes, kv_groups):
        texts = [t.get_text() for t in ax.texts]
        assert [t for t in texts if t.startswith("Q")] == [f"Q{q + 1}" for q in range(num_heads)]
        assert [t for t in texts if t.startswith("KV")] == [f"KV{g + 1}" for g in range(groups)]
        size = num_heads // groups  # consecutive query heads share a key/value head: repeat_interleave
        assert [line.get_gid() for line in ax.lines] == [f"Q{q + 1}-KV{q // size + 1}" for q in range(num_heads)]
        assert f"cache: {groups}/{num_heads} of multi-head" in texts
        colours = {line.get_gid().split("-")[1]: line.get_color() for line in ax.lines}
        assert len({tuple(c) for c in colours.values()}) == groups  # one colour per key/value head
    plt.close(fig)


def test_kv_sharing_names_the_three_kinds():
    fig = plot_kv_sharing(8, (8, 2, 1))
    titles = [next(t.get_text() for t in ax.texts if ":" in t.get_text() and "cache" not in t.get_text())
              for ax in fig.axes]
    assert titles == ["multi-head: 8 key/value heads, one per query head",
                      "grouped-query: 2 key/value heads, each read by 4 query heads",
                      "multi-query: 1 key/value head for all 8 query heads"]
    plt.close(fig)


def test_kv_cache_growth_draws_the_formula():
    from mha_course.cost import MODEL_SHAPES, kv_cache_bytes

    fig = plot_kv_cache_growth(bytes_per_number=2)
    for ax, shape in zip(fig.axes, MODEL_SHAPES.values()):
        lines = {line.get_label(): line for line in ax.lines}
        assert list(lines) == ["multi-head", "grouped-query", "multi-query"]
        for kv_heads, line in zip(shape.kv_heads().values(), lines.values()):
            tokens, sizes = line.get_data()
            assert tokens[0] == 16 and tokens[-1] == shape.context_length
            assert list(sizes) == [kv_cache_bytes(shape.num_layers, kv_heads, shape.head_dim, t, 1, 2) for t in tokens]
        assert len({(line.get_linestyle(), line.get_marker()) for line in ax.lines}) == 3  # apart in greyscale
    assert [t.get_text() for t in fig.axes[1].texts] == ["4.00 GiB", "1.00 GiB", "128 MiB"]
    plt.close(fig)


def test_chapter_6_figures_reject_bad_arguments():
    with pytest.raises(ValueError, match=r"kv_groups \(3\) must divide num_heads \(8\).*1, 2, 4, 8"):
        plot_kv_sharing(8, (8, 3))
    with pytest.raises(ValueError, match="kv_groups is empty"):
        plot_kv_sharing(8, ())
    with pytest.raises(ValueError, match=r"smallest \(2048\) must be below GPT-2 small's context length \(1024\)"):
        plot_kv_cache_growth(smallest=2048)
    for empty in ([], {}):
        with pytest.raises(ValueError, match="shapes is empty: pass model shapes"):
            plot_kv_cache_growth(empty)

# --- The reshape of the batched module and the bills of chapter 4 --------------------------------

from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from mha_course.plots import (HEAD_PALETTE, plot_attention_share, plot_bills_by_heads,  # noqa: E402
                              plot_head_reshape)


def _cells(fig):
    """(facecolour rgb, number in the cell or None) of every cell of the reshape figure."""
    ax = fig.axes[0]
    numbers = {(round(t.get_position()[0] - 0.5, 3), round(t.get_position()[1] - 0.5, 3)): t.get_text()
               for t in ax.texts}
    cells = []
    for patch in ax.patches:
        if isinstance(patch, Rectangle):
            x, y = patch.get_xy()
            cells.append((tuple(round(c, 3) for c in patch.get_facecolor()[:3]),
                          numbers.get((round(x, 3), round(y, 3)))))
    return cells


@pytest.mark.parametrize("num_heads, head_dim, num_tokens, d_in", [(2, 2, 3, 3), (3, 2, 4, 5), (4, 1, 2, 2)])
def test_head_reshape_follows_every_column_in_its_head_colour(num_heads, head_dim, num_tokens, d_in):
    fig = plot_head_reshape(num_heads, head_dim, num_tokens, d_in)
    cells = _cells(fig)
    d_out = num_heads * head_dim
    grey = [c for c in cells if c[1] is None]
    assert len(grey) == num_tokens * d_in  # the input: every feature, no head of its own
    numbered = [c for c in cells if c[1] is not None]
    # four layouts of the same projection: (B, T, d_out), (B, T, h, d_h), (B, h, T, d_h), merged
    assert len(numbered) == 4 * num_tokens * d_out
    for column in range(d_out):
        colours = {colour for colour, number in numbered if number == str(column)}
        assert colours == {tuple(round(c, 3) for c in to_rgb(HEAD_PALETTE[column // head_dim]))}
        assert sum(number == str(column) for _, number in numbered) == 4 * num_tokens
    head_colours = {colour for colour, _ in numbered}
    assert len(head_colours) == num_heads  # one colour per head, never shared
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if t.startswith("(")] == [
        "(B, T, d_in)", "(B, T, d_out)", "(B, T, h, d_h)", "(B, h, T, d_h)", "(B, T, d_out)"]
    assert f"every column\nreads all {d_in}\ninput features" in texts
    assert [t for t in texts if t.startswith("h") and t[1:].isdigit()] == [
        f"h{h}" for h in range(1, num_heads + 1)] * 2  # above the view, beside the transposed heads
    plt.close(fig)


def test_head_reshape_palette_is_the_colour_blind_safe_one():
    # Okabe and Ito's colours: no red-green pair, and each head keeps its colour in every layout.
    assert HEAD_PALETTE[:3] == ("#0072B2", "#E69F00", "#009E73")
    fig = plot_head_reshape(2, 2, 3, 3)
    colours = {colour for colour, number in _cells(fig) if number is not None}
    fill = {tuple(round(c, 3) for c in to_rgb(h)) for h in HEAD_PALETTE[:2]}
    assert colours == fill  # the palette's colours (drawn half transparent)...
    for colour, number in _cells(fig):
        if number is not None:  # ...the first head's cells bluish, the second's orange
            assert (colour[2] > colour[0]) == (int(number) // 2 == 0)
    plt.close(fig)


def test_head_reshape_rejects_sizes_it_cannot_draw():
    with pytest.raises(ValueError, match="num_heads must be at most 7 to give every head its own colour, got 8"):
        plot_head_reshape(8, 1)
    with pytest.raises(ValueError, match=r"d_out = num_heads \* head_dim \(here 16\)"):
        plot_head_reshape(2, 8)
    with pytest.raises(ValueError, match="num_tokens must be a positive integer, got 0"):
        plot_head_reshape(2, 2, 0)


def test_bills_by_heads_draws_three_bills_per_regime_relative_to_one_head():
    from mha_course.cost import HEAD_WIDTH_FIXED, MODEL_WIDTH_FIXED, cost_by_heads

    costs = {regime: cost_by_heads(regime, [1, 2, 4], batch=1, num_tokens=8, d_in=16, width=width)
             for regime, width in ((HEAD_WIDTH_FIXED, 4), (MODEL_WIDTH_FIXED, 16))}
    fig = plot_bills_by_heads(costs)
    assert [ax.get_title() for ax in fig.axes] == ["head width fixed", "model width fixed"]
    for ax in fig.axes:
        lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
        assert set(lines) == {"parameters", "multiply-adds", "score memory"}
        assert all(values[0] == 1 for values in lines.values())
        assert lines["score memory"] == [1, 2, 4]  # score memory grows with h in both regimes
    fixed = {line.get_label(): line for line in fig.axes[1].get_lines()}
    assert list(fixed["parameters"].get_ydata()) == [1, 1, 1] == list(fixed["multiply-adds"].get_ydata())
    # the two flat lines coincide: they must differ in marker and dash so both stay visible
    assert fixed["parameters"].get_marker() != fixed["multiply-adds"].get_marker()
    assert fixed["parameters"].get_linestyle() != fixed["multiply-adds"].get_linestyle()
    plt.close(fig)
    with pytest.raises(ValueError, match="costs is empty"):
        plot_bills_by_heads({})


def test_attention_share_crosses_one_half_at_t_star():
    fig = plot_attention_share(64, num_heads=4, lengths=[16, 128, 512])
    share = fig.axes[0].get_lines()[0]
    assert list(share.get_xdata()) == [16, 128, 512]
    assert share.get_ydata()[1] == pytest.approx(0.5)  # T* = (3 * 64 + 64) / 2 = 128
    assert share.get_ydata()[0] < 0.5 < share.get_ydata()[2]
    assert fig.axes[0].get_legend_handles_labels()[1] == ["T* = 128"]
    plt.close(fig)
