"""Do several heads pay off? A tiny model trained on a task that needs two lookups at once.

The source texts claim that independent heads can attend to the input in different ways and that
the merged output carries those differences on. This module tests the claim on a CPU in seconds.

**The task, "first minus previous".** A sequence holds random numbers ``0 .. vocab_size - 1``. At
every position ``t >= 1`` the label is ``x[0] - x[t-1]``: the first number minus the previous one, a
whole number from ``-(vocab_size - 1)`` to ``vocab_size - 1``, stored as the class index
``x[0] - x[t-1] + vocab_size - 1``. Position 0 has no previous token and carries no label
(:data:`IGNORE_INDEX`); at position 1 the previous token *is* the first token, so its label is 0.

**Why one head should struggle.** The model is embeddings, one causal :class:`MultiHeadAttention`
layer and a linear read-out. Suppose one head always splits its attention the same way: ``w`` on
the first token ``a`` and ``1 - w`` on the previous token ``b``. The read-out then sees
``w * v(a) + (1 - w) * v(b)`` plus a constant, with one value map ``v`` for both. When ``a == b``
(label 0) that is ``v(a)`` plus the constant; every other pair lands on the segment between two such
points, inside the cloud of label-0 points. A linear read-out gives each label a convex region, so if
it labels every ``a == b`` pair 0 it labels every mixture 0 as well: a fixed split cannot be right
everywhere. Two heads can each copy one token into their own slice of the output, and the read-out
subtracts one slice from the other. The model width ``d_model`` is the same for every head count
(``head_dim = d_model // num_heads``), so any difference comes from the heads, not from extra
parameters.

**The escape we measured.** One head has another way out: the split ``w`` itself can depend on the
two tokens, ``w = sigmoid(s(a) - s(b) + c)``, and that *is* a function of the difference.
:func:`first_share_by_difference` shows whether a trained head took it.

Everything here is seeded and runs single-threaded on the CPU, so the same seed gives the same
model, bit for bit. ``python -m mha_course specialise`` reruns the whole experiment
(:func:`run_experiment`) and writes the JSON file that the book's chapter 5 loads.

One concern per module: :mod:`~.task` (the task, its settings, the model, and the checks of their
arguments), :mod:`~.training`, :mod:`~.evaluation` (with the checks of a trained model and of its own arguments),
:mod:`~.results` (the whole run, the check of its arguments, its file and its tables) and
:mod:`~.plots`. Everything public is importable from here.
"""

from .evaluation import (EVAL_SEED, OTHER_BELOW, ROLE_THRESHOLD, SOLVED_ACCURACY, accuracy, evaluate, evaluation_data,
                         first_share_by_difference, head_role, head_scores, mean_attention_maps, one_token_accuracy)
from .plots import plot_accuracy_by_heads, plot_first_share_by_difference
from .results import (DEFAULT_RESULTS_PATH, accuracy_by_heads, validate_experiment_arguments, load_results,
                      roles_table, run_experiment, save_results, select_runs, summary_table)
from .task import IGNORE_INDEX, SpecialisationConfig, TinyAttentionModel, difference_task
from .training import TrainingRun, train

__all__ = [
    "IGNORE_INDEX", "SpecialisationConfig", "TinyAttentionModel", "difference_task", "TrainingRun", "train",
    "EVAL_SEED", "SOLVED_ACCURACY", "evaluation_data", "accuracy", "head_scores", "mean_attention_maps",
    "first_share_by_difference", "one_token_accuracy", "head_role", "ROLE_THRESHOLD", "OTHER_BELOW", "evaluate", "DEFAULT_RESULTS_PATH",
    "validate_experiment_arguments", "run_experiment", "select_runs", "accuracy_by_heads", "save_results",
    "load_results", "summary_table", "roles_table", "plot_accuracy_by_heads", "plot_first_share_by_difference",
]
