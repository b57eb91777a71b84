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
    assert texts.count("(3, 2)") == num_heads  # every Z_i is (T, head_dim)
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
    assert any(t.startswith("out_proj") for t in texts)
    assert any("view as 12" in t for t in texts)
    assert "(T, 12·head_dim)" in texts
    assert fig.axes[0].get_title() == "12 heads, batched in one module"
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
    assert [ax.get_title() for ax in fig.axes] == ["parameters", "multiply-adds"]  # no time panel when untimed
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    assert list(lines["head width fixed, stacked heads"].get_ydata()) == [1.0, 2.0, 4.0]
    assert list(lines["model width fixed, stacked heads"].get_ydata()) == [1.0, 1.0, 1.0]
    plt.close(fig)
    with pytest.raises(ValueError, match="points is empty"):
        plot_cost_regimes([])


def test_cost_regimes_adds_the_time_panel_when_timed():
    from mha_course.compare import head_count_sweep

    points = head_count_sweep((1, 2), regimes=["model_width_fixed"], d_in=4, d_model=4, batch=1, num_tokens=3,
                              min_run_time=0.005, rounds=1)
    fig = plot_cost_regimes(points)
    assert [ax.get_title() for ax in fig.axes] == ["parameters", "multiply-adds", "forward time (measured)"]
    plt.close(fig)
