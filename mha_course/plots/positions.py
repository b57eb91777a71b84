"""The rotary position embedding drawn: one pair of a head turned by position, and every pair's pace (chapter 9)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from ..attention._validation import validate_positive_int
from ..attention.rotary import inverse_frequencies
from .style import NEUTRAL, OKABE_ITO, book_figsize, house_style, line_style


@house_style()
def plot_rotation(head_dim: int = 8, rope_theta: float = 10000.0, num_positions: int = 6,
                  span: int = 48):
    """Left: pair 0 of a head, the vector ``(1, 0)``, turned by position ``p`` (``p * theta_0``
    radians, ``theta_0 = 1``). Right: ``cos(p * theta_c)`` of every pair ``c`` over ``span``
    positions: the first pair turns fast, the last hardly at all.

    Example:
        >>> fig = plot_rotation(head_dim=8)
        >>> len(fig.axes[1].lines), fig.axes[0].texts[-1].get_text()
        (4, 'p = 5')
    """
    head_dim = validate_positive_int("head_dim", head_dim)
    num_positions = validate_positive_int("num_positions", num_positions)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (the numbers turn in pairs), got {head_dim}.")
    freqs = inverse_frequencies(head_dim, rope_theta).tolist()  # theta_c
    fig, (left, right) = plt.subplots(1, 2, figsize=book_figsize(1.0, aspect=0.48), layout="constrained",
                                      gridspec_kw={"width_ratios": [1, 1.5]})
    circle = [2 * math.pi * t / 200 for t in range(201)]
    left.plot([math.cos(a) for a in circle], [math.sin(a) for a in circle], color=NEUTRAL, lw=0.8)
    for p in range(num_positions):
        angle = p * freqs[0]
        colour = OKABE_ITO[p % len(OKABE_ITO)]
        left.annotate("", xy=(math.cos(angle), math.sin(angle)), xytext=(0, 0),
                      arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.6})
        left.text(1.32 * math.cos(angle), 1.32 * math.sin(angle), f"p = {p}", ha="center", va="center",
                  color=colour)
    left.set_xlim(-1.65, 1.65)
    left.set_ylim(-1.65, 1.65)
    left.set_aspect("equal")
    left.set_xticks([])
    left.set_yticks([])
    left.set_title(f"pair 0 turned by p × {freqs[0]:g} rad")
    positions = torch.arange(4 * span + 1).float() / 4  # drawn smooth; positions are the integers
    for c, freq in enumerate(freqs):  # pair c: numbers c and c + d_h / 2
        style = line_style(c)
        right.plot(positions, torch.cos(positions * freq), lw=1.4, markevery=32, markersize=4,
                   label=f"pair {c}: θ = {freq:.3g}", **style)
    right.set_xlabel("position p")
    right.set_ylabel("cos(p θ)")
    right.set_title(f"every pair, d_h = {head_dim}, rope_theta = {rope_theta:g}")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize="small")
    return fig
