"""The experiment's figures: accuracy by head count, and attention on the first token by difference.

Both are drawn in the book's house style (:func:`mha_course.plots.house_style`), the book's column
wide; matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math

from .evaluation import SOLVED_ACCURACY, one_token_accuracy
from .results import accuracy_by_heads, select_runs
from .task import SpecialisationConfig

def plot_accuracy_by_heads(results: dict, ax=None):
    """Held-out accuracy against head count: one dot per seed, the mean with a bar from the lowest
    seed's accuracy to the highest (a range that, unlike mean +- std, stays between 0 and 1).

    The dashed line is what a model that reads only one of the two tokens can reach
    (:func:`one_token_accuracy`). The title gives the training steps of the groups not marked
    otherwise under their label (one head with ``long_budget_factor`` times the steps).
    """
    import matplotlib.pyplot as plt

    from ...plots import NEUTRAL, OKABE_ITO, book_figsize, house_style

    rows = accuracy_by_heads(results)
    with house_style():
        if ax is None:
            _, ax = plt.subplots(figsize=book_figsize(1.0, aspect=0.52))
        labels = []
        for x, row in enumerate(rows):
            accuracies = [r["accuracy"] for r in select_runs(results, row["num_heads"], row["steps"])]
            offsets = [(i - (len(accuracies) - 1) / 2) * 0.04 for i in range(len(accuracies))]  # spread dots
            ax.scatter([x + 0.18 + o for o in offsets], accuracies, s=14, color=NEUTRAL, alpha=0.65,
                       label="one seed" if x == 0 else None, zorder=3)
            spread = [[row["mean"] - row["min"]], [row["max"] - row["mean"]]]  # down to the lowest, up to the highest
            ax.errorbar(x, row["mean"], yerr=spread, fmt="o", color=OKABE_ITO[0], capsize=5, markersize=7,
                        label="mean; bar: lowest to highest seed" if x == 0 else None, zorder=4)
            budget = ("" if row["steps"] == results["config"]["steps"]
                      else f"\n{row['steps'] // results['config']['steps']}× steps")
            labels.append(f"{row['num_heads']} head{'s' if row['num_heads'] > 1 else ''}\n"
                          f"(head_dim {row['head_dim']}){budget}")
        ax.axhline(one_token_accuracy(SpecialisationConfig(**results["config"])), color=OKABE_ITO[5],
                   linestyle="--", linewidth=1.2, label="reads one token only")
        ax.set_xticks(range(len(rows)), labels)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("held-out accuracy")
        steps = results["config"]["steps"]
        budget = (f"{steps} steps each" if all(row["steps"] == steps for row in rows)
                  else f"{steps} steps unless marked")
        ax.set_title(f"Same width (d_model = {results['config']['d_model']}), {results['seeds']} seeds, {budget}")
        ax.legend(loc="center")
        ax.figure.tight_layout()
    return ax.figure


def plot_first_share_by_difference(results: dict, num_heads: int = 1, steps: int | None = None, ax=None):
    """For every seed's model, each head's attention on the first token against ``first - previous``.

    Solved models are drawn in colour, each seed with its own colour, marker and dashes (so that
    two seeds are told apart in greyscale and where their lines overlap); the others in grey.
    """
    import matplotlib.pyplot as plt

    from ...plots import NEUTRAL, book_figsize, house_style, line_style

    runs = select_runs(results, num_heads, steps)
    vocab_size = results["config"]["vocab_size"]
    differences = list(range(-(vocab_size - 1), vocab_size))
    with house_style():
        if ax is None:
            _, ax = plt.subplots(figsize=book_figsize(1.0, aspect=0.52))
        solved_runs = [run for run in runs if run["accuracy"] >= SOLVED_ACCURACY]
        for run in runs:
            solved = run in solved_runs
            style = (dict(line_style(solved_runs.index(run)), markersize=5, alpha=0.9) if solved
                     else dict(color=NEUTRAL, marker="o", linestyle="-", markersize=3, alpha=0.3))
            for head, row in enumerate(run["first_share_by_difference"]):
                ax.plot(differences, [math.nan if v is None else v for v in row], **style,
                        label=f"seed {run['seed']} (solved)" if solved and head == 0 else None)
        ax.set_xlabel("first token − previous token")
        ax.set_ylabel("attention on the first token")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xticks(differences[::2])
        steps = runs[0]["steps"]
        ax.set_title(f"{num_heads} head{'s' if num_heads > 1 else ''}, {steps} steps: grey = not solved")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="center left", handlelength=3)
        ax.figure.tight_layout()
    return ax.figure
