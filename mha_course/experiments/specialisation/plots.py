"""The experiment's figures: accuracy by head count, and attention on the first token by difference."""

from __future__ import annotations

import math

from .evaluation import SOLVED_ACCURACY, one_token_accuracy
from .results import accuracy_by_heads, select_runs
from .task import SpecialisationConfig

# Okabe and Ito's colour-blind-safe palette (black left out; grey marks the unsolved models), and a
# marker per seed as well, so that two seeds of the same colour are still told apart.
_SEED_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
_SEED_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_GREY = "#777777"


def plot_accuracy_by_heads(results: dict, ax=None):
    """Held-out accuracy against head count: one dot per seed, the mean with a +-1 std bar.

    The dashed line is what a model that reads only one of the two tokens can reach
    (:func:`one_token_accuracy`).
    """
    import matplotlib.pyplot as plt

    rows = accuracy_by_heads(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.3, 3.6))
    labels = []
    for x, row in enumerate(rows):
        accuracies = [r["accuracy"] for r in select_runs(results, row["num_heads"], row["steps"])]
        offsets = [(i - (len(accuracies) - 1) / 2) * 0.04 for i in range(len(accuracies))]  # spread dots
        ax.scatter([x + 0.18 + o for o in offsets], accuracies, s=14, color=_GREY, alpha=0.8,
                   label="one seed" if x == 0 else None, zorder=3)
        ax.errorbar(x, row["mean"], yerr=row["std"], fmt="o", color="#0072B2", capsize=5, markersize=7,
                    label="mean ± std" if x == 0 else None, zorder=4)
        budget = "" if row["steps"] == results["config"]["steps"] else f"\n{row['steps'] // results['config']['steps']}× steps"
        labels.append(f"{row['num_heads']} head{'s' if row['num_heads'] > 1 else ''}\n(head_dim {row['head_dim']}){budget}")
    ax.axhline(one_token_accuracy(SpecialisationConfig(**results["config"])), color="#D55E00", linestyle="--", linewidth=1.2,
               label="reads one token only")
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"Same width (d_model = {results['config']['d_model']}), same budget, "
                 f"{results['seeds']} seeds")
    ax.legend(loc="center", fontsize=9)
    ax.figure.tight_layout()
    return ax.figure


def plot_first_share_by_difference(results: dict, num_heads: int = 1, steps: int | None = None, ax=None):
    """For every seed's model, each head's attention on the first token against ``first - previous``.

    Solved models are drawn in colour, the others in grey.
    """
    import matplotlib.pyplot as plt

    runs = select_runs(results, num_heads, steps)
    vocab_size = results["config"]["vocab_size"]
    differences = list(range(-(vocab_size - 1), vocab_size))
    if ax is None:
        _, ax = plt.subplots(figsize=(7.3, 3.6))
    for run in runs:
        solved = run["accuracy"] >= SOLVED_ACCURACY
        for head, row in enumerate(run["first_share_by_difference"]):
            ax.plot(differences, [math.nan if v is None else v for v in row],
                    marker=_SEED_MARKERS[run["seed"] % len(_SEED_MARKERS)] if solved else "o",
                    markersize=5 if solved else 3,
                    color=_SEED_COLOURS[run["seed"] % len(_SEED_COLOURS)] if solved else _GREY,
                    alpha=0.9 if solved else 0.4,
                    label=f"seed {run['seed']} (solved)" if solved and head == 0 else None)
    ax.set_xlabel("first token − previous token")
    ax.set_ylabel("attention on the first token")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(differences[::2])
    steps = runs[0]["steps"]
    ax.set_title(f"{num_heads} head{'s' if num_heads > 1 else ''}, {steps} steps: grey = not solved")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=9, loc="center left")
    ax.figure.tight_layout()
    return ax.figure


