"""The state of the gated delta rule being written and read, token by token (chapter 12)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from ..attention.delta_rule import gated_delta_step
from .style import COLUMN_WIDTH, NEUTRAL, SEQUENTIAL_CMAP, house_style

#: The keys of the figure's tokens, as axes of the key space: the third token reuses the first's key.
KEY_ROWS = (0, 1, 0, 2)


def state_steps(decay: float = 0.9, beta: float = 0.8, value_dim: int = 5, seed: int = 0) -> list[dict]:
    """The figure's four tokens through :func:`~mha_course.gated_delta_step`: for each, its key row,
    value, the state's prediction for the key before the write, what was written, the state after and
    what a query equal to the key reads back.

    Example:
        >>> steps = state_steps()
        >>> [s["key_row"] for s in steps], tuple(steps[0]["state"].shape)
        ([0, 1, 0, 2], (4, 5))
        >>> bool(torch.allclose(steps[2]["predicted"], 0.9 * steps[1]["state"][0]))  # token 3 finds token 1's row
        True
    """
    g = torch.Generator().manual_seed(seed)
    key_dim = max(KEY_ROWS) + 2  # one row no key writes
    state = torch.zeros(1, 1, key_dim, value_dim, dtype=torch.float64)
    alpha, strength = torch.full((1, 1), decay, dtype=torch.float64), torch.full((1, 1), beta, dtype=torch.float64)
    steps = []
    for row in KEY_ROWS:
        key = torch.zeros(1, 1, key_dim, dtype=torch.float64)
        key[..., row] = 1.0
        value = torch.randn(1, 1, value_dim, generator=g, dtype=torch.float64)
        predicted = (key[..., None, :] @ (decay * state)).squeeze(-2)  # what the decayed state holds for k
        read, new = gated_delta_step(state, key, key, value, alpha, strength)
        steps.append({"key_row": row, "value": value[0, 0], "predicted": predicted[0, 0],
                      "written": (new - decay * state)[0, 0], "state": new[0, 0], "read": read[0, 0]})
        state = new
    return steps


@house_style()
def plot_state_updates(decay: float = 0.9, beta: float = 0.8):
    """Four tokens written into a delta-rule state and read back: for each token, what it writes,
    ``beta * k (v - alpha S^T k)^T`` (top), and the state after it (bottom), on one colour scale.

    The keys lie along the axes of the key space, so each token writes one row: the row of its key.
    The third token brings the first one's key again with a new value, and writes only the
    difference between that value and what the row, decayed, still held.

    Example:
        >>> fig = plot_state_updates()
        >>> len(fig.axes), fig.axes[2].get_title()  # 8 matrices and the colour bar
        (9, 'token 3\\nkey 1 again')
    """
    steps = state_steps(decay, beta)
    fig, axes = plt.subplots(2, len(steps), figsize=(COLUMN_WIDTH, 0.44 * COLUMN_WIDTH), layout="constrained",
                             sharex=True, sharey=True)
    limit = max(max(s["written"].abs().max().item(), s["state"].abs().max().item()) for s in steps)
    seen = {}
    for column, step in enumerate(steps):
        key = seen.setdefault(step["key_row"], len(seen) + 1)
        again = sum(s["key_row"] == step["key_row"] for s in steps[:column]) > 0
        axes[0, column].set_title(f"token {column + 1}\nkey {key}" + (" again" if again else ""))
        for row, name in enumerate(("written", "state")):
            ax = axes[row, column]
            image = ax.imshow(step[name].numpy(), cmap=SEQUENTIAL_CMAP, vmin=-limit, vmax=limit)
            ax.axhline(step["key_row"] - 0.5, color=NEUTRAL, lw=0.8)
            ax.axhline(step["key_row"] + 0.5, color=NEUTRAL, lw=0.8)
            ax.set_xticks([])
            ax.set_yticks(range(step[name].shape[0]), [str(i + 1) for i in range(step[name].shape[0])])
    axes[0, 0].set_ylabel("written\nkey dimension")
    axes[1, 0].set_ylabel("state after\nkey dimension")
    for ax in axes[1]:
        ax.set_xlabel("value dim.")
    fig.colorbar(image, ax=axes, shrink=0.8, label="entry")
    return fig


__all__ = ["plot_state_updates", "state_steps", "KEY_ROWS"]
