"""The experiment's results: how the whole run makes them, writes and reads them, and tabulates them."""

from __future__ import annotations

import json
import numbers
import statistics
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

import torch

from ...attention._validation import validate_positive_int
from ...notebook_files import find_data
from ...tables import Table
from .evaluation import SOLVED_ACCURACY, evaluate, head_role, rounded
from .task import SpecialisationConfig, validate_config, validate_head_count
from .training import train, with_progress

#: Where ``python -m mha_course specialise`` writes its results by default (from the repository root).
DEFAULT_RESULTS_PATH = Path("book") / "data" / "specialisation.json"


def validate_experiment_arguments(seeds, heads: Sequence[int] = (1, 2, 4), config: SpecialisationConfig | None = None,
                                  long_budget_factor=4) -> tuple[int, list[int], SpecialisationConfig]:
    """Check the arguments of :func:`run_experiment` (the command line checks them here too, before training).

    Example:
        >>> validate_experiment_arguments(0)
        Traceback (most recent call last):
            ...
        ValueError: seeds must be a positive integer, got 0. Pass a whole number of at least 1.
    """
    config = validate_config(config)
    seeds = validate_positive_int("seeds", seeds)
    heads = list(heads)
    if not heads:
        raise ValueError("heads is empty; pass the head counts to compare, e.g. heads=(1, 2, 4).")
    for num_heads in heads:
        validate_head_count(num_heads, config.d_model)
    if isinstance(long_budget_factor, bool) or not isinstance(long_budget_factor, numbers.Integral) \
            or long_budget_factor < 0 or long_budget_factor == 1:
        raise ValueError(f"long_budget_factor must be 0 (skip the longer one-head runs) or a whole number "
                         f">= 2 (how many times the common budget), got {long_budget_factor!r}.")
    return seeds, heads, config


def run_experiment(seeds: int = 8, heads: Sequence[int] = (1, 2, 4), config: SpecialisationConfig | None = None,
                   *, long_budget_factor: int = 4, progress: bool = True) -> dict:
    """Train every head count on every seed with the same budget, and score them all.

    Also trains one head for ``long_budget_factor`` times the steps on every seed (0 skips it), to
    see whether one head fails for lack of time or for lack of a way.

    Returns:
        A JSON-ready dict: ``config``, ``seeds``, ``heads``, ``long_budget_factor``, ``runs`` (one
        entry per model: ``num_heads``, ``head_dim``, ``seed``, ``steps``, ``final_loss`` and the keys
        of :func:`evaluate`) and ``command``, the command that regenerates it.
    """
    seeds, heads, config = validate_experiment_arguments(seeds, heads, config, long_budget_factor)
    jobs = [(num_heads, seed, config) for num_heads in heads for seed in range(seeds)]
    if long_budget_factor:
        longer = replace(config, steps=config.steps * long_budget_factor)
        jobs += [(1, seed, longer) for seed in range(seeds)]
    runs = []
    for num_heads, seed, job_config in with_progress(jobs, "training models", progress):
        run = train(num_heads, seed, job_config)
        runs.append({"num_heads": num_heads, "head_dim": config.d_model // num_heads, "seed": seed,
                     "steps": job_config.steps, "final_loss": rounded(run.losses[-1]), **evaluate(run)})
    command = f"python -m mha_course specialise --seeds {seeds}"
    return {"command": command, "torch": torch.__version__.split("+")[0], "config": asdict(config),
            "seeds": seeds, "heads": heads, "long_budget_factor": long_budget_factor, "runs": runs}


def select_runs(results: dict, num_heads: int, steps: int | None = None) -> list[dict]:
    """The runs of ``results`` with ``num_heads`` heads (and the book's budget unless ``steps`` is given)."""
    steps = results["config"]["steps"] if steps is None else steps
    chosen = [r for r in results["runs"] if r["num_heads"] == num_heads and r["steps"] == steps]
    if not chosen:
        raise ValueError(f"no runs with num_heads={num_heads} and steps={steps} in these results; "
                         f"they hold head counts {results['heads']}.")
    return chosen


def accuracy_by_heads(results: dict) -> list[dict]:
    """Accuracy per head count across seeds: mean, standard deviation, min, max, and how many solved it.

    One row per head count at the common budget, then (if present) one row for one head with
    ``long_budget_factor`` times the steps. ``std`` is the sample standard deviation across seeds.
    """
    budgets = [(h, results["config"]["steps"]) for h in results["heads"]]
    if results.get("long_budget_factor"):
        budgets.append((1, results["config"]["steps"] * results["long_budget_factor"]))
    rows = []
    for num_heads, steps in budgets:
        accuracies = [r["accuracy"] for r in select_runs(results, num_heads, steps)]
        rows.append({
            "num_heads": num_heads,
            "head_dim": results["config"]["d_model"] // num_heads,
            "steps": steps,
            "mean": statistics.fmean(accuracies),
            "std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
            "min": min(accuracies),
            "max": max(accuracies),
            "solved": sum(a >= SOLVED_ACCURACY for a in accuracies),
            "seeds": len(accuracies),
        })
    return rows


def save_results(results: dict, path: str | Path = DEFAULT_RESULTS_PATH) -> Path:
    """Write ``results`` as JSON, one run per line (parent folders are created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {key: value for key, value in results.items() if key != "runs"}
    lines = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in header.items()]
    runs = ",\n".join(f"  {json.dumps(run)}" for run in results.get("runs", []))
    path.write_text("{\n" + "\n".join(lines) + '\n "runs": [\n' + runs + "\n ]\n}\n", encoding="utf-8")
    return path


def load_results(path: str | Path = DEFAULT_RESULTS_PATH) -> dict:
    """Read results written by :func:`save_results` (or ``python -m mha_course specialise``); a
    path under ``data/`` that is not there is read from the package's copy of the book's
    (:func:`mha_course.notebook_files.find_data`)."""
    path = find_data(path)
    if not path.is_file():
        raise FileNotFoundError(f"no results at {path}. Regenerate them from the repository root with "
                                f"`python -m mha_course specialise --out {path}`.")
    results = json.loads(path.read_text(encoding="utf-8"))
    missing = {"config", "heads", "runs", "seeds"} - set(results)
    if missing:
        raise ValueError(f"{path} is not a results file of run_experiment: it lacks {sorted(missing)}.")
    return results




def summary_table(results: dict) -> Table:
    """The accuracy of :func:`accuracy_by_heads` as a table, one row per head count and budget."""
    columns = ["heads", "head_dim", "steps", "mean", "std", "min", "max", "solved"]
    rows = [[r["num_heads"], r["head_dim"], r["steps"], r["mean"], r["std"], r["min"], r["max"],
             f"{r['solved']}/{r['seeds']}"] for r in accuracy_by_heads(results)]
    return Table(columns, rows, key_columns=3, align={"solved": "right"},
                 formats={name: ".3f" for name in ("mean", "std", "min", "max")})


def roles_table(results: dict, num_heads: int, steps: int | None = None) -> Table:
    """One row per seed: accuracy, then each head's role (:func:`head_role`) with its two shares.

    Each head shows ``role first/previous``: its share of attention on the first token and on the
    previous token, rounded to two decimals (the role is named from the rounded shares).
    """
    runs = select_runs(results, num_heads, steps)

    def describe(first: float, previous: float) -> str:
        first, previous = round(first, 2), round(previous, 2)  # name the role from the shares shown
        return f"{head_role(first, previous):<14} {first:.2f}/{previous:.2f}"

    columns = ["seed", "accuracy"] + [f"head {h + 1}" for h in range(num_heads)]
    rows = [[run["seed"], run["accuracy"]] + [describe(*pair) for pair in run["head_scores"]] for run in runs]
    return Table(columns, rows, formats={"accuracy": ".3f"})

