"""Figures of the course: visibility tables and attention maps.

Every function draws on a matplotlib ``Axes`` (a new figure when none is given) and returns the
figure, so a notebook cell can end with ``plt.show()``.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch

from .masking import visibility


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    if labels is None:
        return [str(i + 1) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries but there are {n} tokens; pass one label per token.")
    return list(labels)


def _annotate_square(ax, values: torch.Tensor, labels: list[str], fmt: str, cmap: str, vmin=0.0, vmax=1.0):
    n = values.shape[0]
    image = ax.imshow(values.numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_xticks(range(n), labels, rotation=45 if max(map(len, labels)) > 2 else 0)
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("key position (attended to)")
    ax.set_ylabel("query position (attending)")
    if n <= 12:
        for i in range(n):
            for j in range(n):
                value = float(values[i, j])
                colour = "white" if value > (vmin + vmax) / 2 else "black"
                ax.text(j, i, format(value, fmt), ha="center", va="center", color=colour, fontsize=9)
    return image


def plot_visibility(num_tokens: int = 3, labels: Sequence[str] | None = None, ax=None):
    """Draw the causal visibility table: a tick where the query token may see the key token."""
    labels = _labels(labels, num_tokens)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.6 * num_tokens, 1.0 + 0.6 * num_tokens))
    table = visibility(num_tokens)
    ax.imshow(table.float().numpy(), cmap="Greens", vmin=-0.3, vmax=2.2)
    ax.set_xticks(range(num_tokens), labels)
    ax.set_yticks(range(num_tokens), labels)
    ax.set_xlabel("may see token")
    ax.set_ylabel("token")
    for i in range(num_tokens):
        for j in range(num_tokens):
            ax.text(j, i, "✓" if table[i, j] else "✗", ha="center", va="center",
                    color="black" if table[i, j] else "grey", fontsize=12)
    ax.set_title("Causal visibility")
    return ax.figure


def plot_attention(weights: torch.Tensor, labels: Sequence[str] | None = None,
                   titles: Sequence[str] | None = None, fmt: str = ".2f", cmap: str = "Blues"):
    """Heat maps of attention weights, one panel per head, side by side.

    Args:
        weights: ``(T, T)`` for one head, or ``(num_heads, T, T)`` for several (one batch row;
            index the batch first, e.g. ``module.attention_weights(x)[0]``).
        labels: one label per token (default ``1 .. T``).
        titles: one title per head (default ``Head 1 .. Head h``).
    """
    weights = torch.as_tensor(weights).detach().float().cpu()
    if weights.dim() == 2:
        weights = weights.unsqueeze(0)
    if weights.dim() != 3 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            f"weights must have shape (T, T) or (num_heads, T, T), got {tuple(weights.shape)}. "
            "For a batch, pick one row first: weights[0]."
        )
    num_heads, n, _ = weights.shape
    labels = _labels(labels, n)
    titles = list(titles) if titles is not None else [f"Head {h + 1}" for h in range(num_heads)]
    if len(titles) != num_heads:
        raise ValueError(f"titles has {len(titles)} entries but there are {num_heads} heads.")
    size = 1.2 + 0.55 * n
    fig, axes = plt.subplots(1, num_heads, figsize=(size * num_heads, size), squeeze=False)
    for ax, head_weights, title in zip(axes[0], weights, titles):
        _annotate_square(ax, head_weights, labels, fmt, cmap)
        ax.set_title(title)
    fig.tight_layout()
    return fig
