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
