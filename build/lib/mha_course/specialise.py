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
"""

from __future__ import annotations

import json
import math
import numbers
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from ._validation import check_divisible, check_positive_int
from .multihead import MultiHeadAttention

#: Label of positions that have nothing to predict; ``cross_entropy`` skips it.
IGNORE_INDEX = -100

#: Seed of the held-out sequences every model is scored on (never a training seed in the book).
EVAL_SEED = 2**31 - 1

#: Where ``python -m mha_course specialise`` writes its results by default (from the repository root).
DEFAULT_RESULTS_PATH = Path("book") / "data" / "specialisation.json"

#: A model counts as having solved the task from this held-out accuracy up.
SOLVED_ACCURACY = 0.99


@dataclass(frozen=True)
class SpecialisationConfig:
    """Sizes and training budget of the experiment; the defaults are the book's.

    Example:
        >>> SpecialisationConfig().num_classes
        15
        >>> SpecialisationConfig(steps=0)
        Traceback (most recent call last):
            ...
        ValueError: steps must be a positive integer, got 0. Pass a whole number of at least 1.
    """

    vocab_size: int = 8  # tokens are the numbers 0..7, so differences run from -7 to 7
    num_tokens: int = 8  # sequence length; positions 1..7 are labelled
    d_model: int = 16  # model width, the same for 1, 2 and 4 heads
    steps: int = 500  # optimiser steps: the training budget, equal for every head count
    batch_size: int = 64  # fresh random sequences per step
    learning_rate: float = 1e-2  # Adam
    eval_size: int = 2000  # held-out sequences for accuracy and attention scores

    def __post_init__(self):
        for name in ("vocab_size", "num_tokens", "d_model", "steps", "batch_size", "eval_size"):
            check_positive_int(name, getattr(self, name))
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}: with one token "
                             "every difference is 0 and there is nothing to learn.")
        if self.num_tokens < 3:
            raise ValueError(f"num_tokens must be at least 3, got {self.num_tokens}: position 2 is the first "
                             "whose previous token is not the first token, so shorter sequences need one lookup only.")
        rate = self.learning_rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not (0 < rate < 1 and math.isfinite(rate)):
            raise ValueError(f"learning_rate must be a number between 0 and 1, got {rate!r}. The book uses 1e-2.")

    @property
    def num_classes(self) -> int:
        """How many labels there are: differences ``-(vocab_size - 1) .. vocab_size - 1``."""
        return 2 * self.vocab_size - 1


def _check_config(config) -> SpecialisationConfig:
    if config is None:
        return SpecialisationConfig()
    if not isinstance(config, SpecialisationConfig):
        raise TypeError(f"config must be a SpecialisationConfig, got {type(config).__name__}. "
                        "Build one with SpecialisationConfig(steps=..., ...) or pass None for the book's.")
    return config


def _generator(seed) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative whole number or a torch.Generator, got {seed!r}.")
    return torch.Generator().manual_seed(int(seed))


def difference_task(batch_size: int, num_tokens: int = 8, vocab_size: int = 8,
                    seed: int | torch.Generator = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences and their "first minus previous" labels.

    Args:
        batch_size: how many sequences.
        num_tokens: length of each sequence (at least 3).
        vocab_size: tokens are the numbers ``0 .. vocab_size - 1``.
        seed: a whole number, or a ``torch.Generator`` to draw from (training draws a fresh batch
            from one generator at every step). The global random state is not touched.

    Returns:
        ``(tokens, labels)``, both ``(batch_size, num_tokens)`` int64. ``labels[:, t]`` is
        ``tokens[:, 0] - tokens[:, t-1] + vocab_size - 1`` for ``t >= 1`` and :data:`IGNORE_INDEX`
        at position 0.

    Example:
        >>> tokens, labels = difference_task(1, num_tokens=5, vocab_size=8, seed=3)
        >>> tokens.tolist(), labels.tolist()
        ([[2, 0, 1, 3, 0]], [[-100, 7, 9, 8, 6]])
        >>> [label - 7 for label in labels[0, 1:].tolist()]  # first minus previous: 2-2, 2-0, 2-1, 2-3
        [0, 2, 1, -1]
    """
    batch_size = check_positive_int("batch_size", batch_size)
    num_tokens = check_positive_int("num_tokens", num_tokens)
    vocab_size = check_positive_int("vocab_size", vocab_size)
    if num_tokens < 3:
        raise ValueError(f"num_tokens must be at least 3, got {num_tokens}: position 2 is the first whose "
                         "previous token is not the first token.")
    generator = _generator(seed)
    tokens = torch.randint(0, vocab_size, (batch_size, num_tokens), generator=generator)  # (B, T)
    labels = torch.full_like(tokens, IGNORE_INDEX)  # (B, T)
    first = tokens[:, :1]  # (B, 1), broadcast over positions
    previous = tokens[:, :-1]  # (B, T-1): the previous token of positions 1..T-1
    labels[:, 1:] = first - previous + (vocab_size - 1)
    return tokens, labels


class TinyAttentionModel(nn.Module):
    """Token and position embeddings, one causal attention layer, a linear read-out.

    There is no residual path and no MLP: whatever the read-out knows about other positions came
    through the attention layer, and the read-out can only add up what the heads deliver.

    Args:
        vocab_size: number of distinct tokens (labels are ``2 * vocab_size - 1`` differences).
        num_tokens: longest sequence (the attention layer's ``context_length``).
        d_model: model width; the attention layer is ``MultiHeadAttention(d_model, d_model, ...)``,
            so every head count has the same parameters and ``head_dim = d_model // num_heads``.
        num_heads: number of heads; must divide ``d_model``.

    Shapes:
        tokens ``(batch, num_tokens)`` int64 -> logits ``(batch, num_tokens, 2 * vocab_size - 1)``.

    Example:
        >>> model = TinyAttentionModel(vocab_size=8, num_tokens=8, d_model=16, num_heads=2)
        >>> model(torch.zeros(3, 8, dtype=torch.long)).shape
        torch.Size([3, 8, 15])
        >>> model.attention.head_dim
        8
    """

    def __init__(self, vocab_size: int, num_tokens: int, d_model: int, num_heads: int):
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.num_tokens = check_positive_int("num_tokens", num_tokens)
        self.num_heads = check_positive_int("num_heads", num_heads)
        check_divisible(check_positive_int("d_model", d_model), self.num_heads)
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(num_tokens, d_model)
        # d_out = d_model whatever the head count: the model width stays fixed and heads get narrower.
        self.attention = MultiHeadAttention(d_model, d_model, num_tokens, dropout=0.0, num_heads=num_heads)
        self.readout = nn.Linear(d_model, 2 * vocab_size - 1)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings, ``(batch, num_tokens, d_model)``."""
        self._check_tokens(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)  # (T,)
        return self.token_embedding(tokens) + self.position_embedding(positions)  # (B, T, d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self.attention(self.embed(tokens)))  # (B, T, num_classes)

    @torch.no_grad()
    def attention_weights(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, ``(batch, num_heads, num_tokens, num_tokens)``."""
        return self.attention.attention_weights(self.embed(tokens))

    def _check_tokens(self, tokens) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            described = (f"a {tokens.dim()}-D {tokens.dtype} tensor" if isinstance(tokens, torch.Tensor)
                         else type(tokens).__name__)
            raise TypeError(f"tokens must be a 2-D int64 tensor of token ids, shape (batch, num_tokens); "
                            f"got {described}. Use the tokens from difference_task(...).")
        if tokens.shape[1] > self.num_tokens:
            raise ValueError(f"tokens has {tokens.shape[1]} positions but the model was built with "
                             f"num_tokens={self.num_tokens}; shorten the sequences or build a longer model.")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"token ids must lie in 0..{self.vocab_size - 1} (vocab_size={self.vocab_size}), "
                             f"got values from {int(tokens.min())} to {int(tokens.max())}.")


@dataclass
class TrainingRun:
    """What :func:`train` returns: the trained model and its loss at every step."""

    model: TinyAttentionModel
    num_heads: int
    seed: int
    config: SpecialisationConfig
    losses: list[float] = field(default_factory=list)


def train(num_heads: int, seed: int = 0, config: SpecialisationConfig | None = None, *,
          progress: bool = False, num_threads: int = 1) -> TrainingRun:
    """Train a :class:`TinyAttentionModel` on the difference task, reproducibly.

    The seed fixes the initial weights and every training batch; training runs on the CPU with
    ``num_threads`` torch threads (restored afterwards), so the same call gives the same model,
    bit for bit, however many cores the machine has. The global random state is left as it was.

    Args:
        num_heads: heads of the attention layer; must divide ``config.d_model``.
        seed: non-negative whole number.
        config: sizes and budget (default: the book's :class:`SpecialisationConfig`).
        progress: show a tqdm progress bar over the steps.
        num_threads: torch threads while training (1 keeps results identical on every machine).

    Example:
        >>> run = train(2, seed=0, config=SpecialisationConfig(steps=3, eval_size=10))
        >>> len(run.losses), run.model.num_heads
        (3, 2)
    """
    config = _check_config(config)
    num_heads = check_positive_int("num_heads", num_heads)
    if config.d_model % num_heads:
        raise ValueError(f"num_heads={num_heads} does not divide d_model={config.d_model}: every head gets "
                         f"d_model // num_heads columns. Use a divisor of {config.d_model}, e.g. 1, 2 or 4.")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative whole number, got {seed!r}.")
    num_threads = check_positive_int("num_threads", num_threads)

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        with torch.random.fork_rng(devices=[]):  # seed the weights without disturbing the caller's RNG
            torch.manual_seed(seed)
            model = TinyAttentionModel(config.vocab_size, config.num_tokens, config.d_model, num_heads)
        optimiser = torch.optim.Adam(model.parameters(), lr=config.learning_rate, foreach=True)
        batches = torch.Generator().manual_seed(seed)
        losses = []
        model.train()
        for _ in tqdm(range(config.steps), desc=f"{num_heads} head(s), seed {seed}", disable=not progress,
                      leave=False):
            tokens, labels = difference_task(config.batch_size, config.num_tokens, config.vocab_size, batches)
            logits = model(tokens)  # (B, T, C)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        model.eval()
    finally:
        torch.set_num_threads(previous_threads)
    return TrainingRun(model=model, num_heads=num_heads, seed=int(seed), config=config, losses=losses)


def evaluation_data(config: SpecialisationConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out sequences every model is scored on: ``difference_task`` with :data:`EVAL_SEED`."""
    config = _check_config(config)
    return difference_task(config.eval_size, config.num_tokens, config.vocab_size, seed=EVAL_SEED)


def _check_model(model) -> TinyAttentionModel:
    if isinstance(model, TrainingRun):
        return model.model
    if not isinstance(model, TinyAttentionModel):
        raise TypeError(f"model must be a TinyAttentionModel (or the TrainingRun from train), "
                        f"got {type(model).__name__}.")
    return model


@torch.no_grad()
def accuracy(model: TinyAttentionModel, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of labelled positions where the model's most likely class is the label.

    Example:
        >>> run = train(1, config=SpecialisationConfig(steps=1))
        >>> 0.0 <= accuracy(run.model, *difference_task(4)) <= 1.0
        True
    """
    model = _check_model(model)
    if not isinstance(labels, torch.Tensor) or labels.shape != getattr(tokens, "shape", None):
        raise ValueError("labels must be a tensor with the same shape as tokens; pass both from difference_task(...).")
    predictions = model(tokens).argmax(dim=-1)  # (B, T)
    labelled = labels != IGNORE_INDEX
    return float((predictions[labelled] == labels[labelled]).float().mean())


def _attention(model, tokens) -> torch.Tensor:
    model = _check_model(model)
    weights = model.attention_weights(tokens)  # (B, h, T, T)
    if weights.shape[-1] < 3:
        raise ValueError("tokens needs at least 3 positions: scores are taken at positions 2 and later.")
    return weights


def head_scores(model: TinyAttentionModel, tokens: torch.Tensor) -> torch.Tensor:
    """What each head attends to: its share of attention on the first and on the previous token.

    Averaged over the query positions ``t >= 2`` (where the first and the previous token sit at
    different positions) and over the sequences in ``tokens``.

    Returns:
        ``(num_heads, 2)``: column 0 the share on position 0 (the first token), column 1 the share
        on position ``t - 1`` (the previous token). The rest of each head's attention went elsewhere.
    """
    weights = _attention(model, tokens)  # (B, h, T, T)
    num_tokens = weights.shape[-1]
    queries = torch.arange(2, num_tokens)  # (T-2,) query positions with two distinct lookups
    on_first = weights[:, :, 2:, 0].mean(dim=(0, 2))  # (h,)
    on_previous = weights[:, :, queries, queries - 1].mean(dim=(0, 2))  # (h,)
    return torch.stack([on_first, on_previous], dim=1)  # (h, 2)


def mean_attention_maps(model: TinyAttentionModel, tokens: torch.Tensor) -> torch.Tensor:
    """Each head's attention weights averaged over the sequences: ``(num_heads, num_tokens, num_tokens)``."""
    return _attention(model, tokens).mean(dim=0)  # (h, T, T)


def first_share_by_difference(model: TinyAttentionModel, tokens: torch.Tensor) -> torch.Tensor:
    """Each head's attention on the first token, grouped by the difference ``first - previous``.

    A head that reads the first token whatever it holds gives a flat row; one head that has found
    the escape described in the module docstring gives a row that rises like a sigmoid.

    Returns:
        ``(num_heads, 2 * vocab_size - 1)``; column ``k`` is difference ``k - (vocab_size - 1)``
        (NaN where ``tokens`` holds no such pair).
    """
    model = _check_model(model)
    weights = _attention(model, tokens)[:, :, 2:, 0]  # (B, h, T-2): share on the first token
    differences = (tokens[:, :1] - tokens[:, 1:-1]).unsqueeze(1).expand_as(weights)  # (B, h, T-2)
    rows = []
    for difference in range(-(model.vocab_size - 1), model.vocab_size):
        chosen = differences == difference  # (B, h, T-2)
        counts = chosen.sum(dim=(0, 2))  # (h,)
        total = (weights * chosen).sum(dim=(0, 2))  # (h,)
        rows.append(torch.where(counts > 0, total / counts.clamp(min=1), torch.nan))
    return torch.stack(rows, dim=1)  # (h, num_classes)


def one_token_accuracy(config: SpecialisationConfig | None = None) -> float:
    """The best accuracy of a model that reads only one of the two tokens (the dashed line of the plots).

    Position 1 is always labelled 0, so it is free; at positions ``2 .. num_tokens - 1`` knowing one
    token leaves all ``vocab_size`` values of the other equally likely.

    Example:
        >>> round(one_token_accuracy(), 4)  # (1 + 6 / 8) / 7
        0.25
    """
    config = _check_config(config)
    labelled = config.num_tokens - 1
    return (1 + (labelled - 1) / config.vocab_size) / labelled


def head_role(first: float, previous: float, threshold: float = 0.8) -> str:
    """Name what a head does from its :func:`head_scores` pair.

    ``"first"`` or ``"previous"`` when that share reaches ``threshold``; ``"other"`` when the two
    shares together are under one half (the head looks mostly elsewhere); ``"mixed"`` otherwise.

    Example:
        >>> head_role(0.97, 0.02), head_role(0.01, 0.99), head_role(0.5, 0.48), head_role(0.1, 0.2)
        ('first', 'previous', 'mixed', 'other')
    """
    if not 0.5 < threshold <= 1:
        raise ValueError(f"threshold must be in (0.5, 1], got {threshold}: a head can have at most one "
                         "share above it.")
    if first >= threshold:
        return "first"
    if previous >= threshold:
        return "previous"
    return "other" if first + previous < 0.5 else "mixed"


def _rounded(values, decimals: int = 4):
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if isinstance(values, list):
        return [_rounded(v, decimals) for v in values]
    return None if math.isnan(values) else round(float(values), decimals)


def evaluate(run: TrainingRun | TinyAttentionModel, config: SpecialisationConfig | None = None) -> dict:
    """Score a trained model on the held-out data: a JSON-ready dict of rounded numbers.

    Keys: ``accuracy``, ``head_scores`` (per head ``[first, previous]``), ``first_share_by_difference``
    (per head, see :func:`first_share_by_difference`) and ``mean_attention_maps`` (per head, ``T x T``).
    """
    model = _check_model(run)
    config = run.config if isinstance(run, TrainingRun) and config is None else _check_config(config)
    tokens, labels = evaluation_data(config)
    return {
        "accuracy": _rounded(accuracy(model, tokens, labels)),
        "head_scores": _rounded(head_scores(model, tokens)),
        "first_share_by_difference": _rounded(first_share_by_difference(model, tokens)),
        "mean_attention_maps": _rounded(mean_attention_maps(model, tokens)),
    }


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
    config = _check_config(config)
    seeds = check_positive_int("seeds", seeds)
    heads = list(heads)
    if not heads:
        raise ValueError("heads is empty; pass the head counts to compare, e.g. heads=(1, 2, 4).")
    for num_heads in heads:
        check_positive_int("num_heads", num_heads)
        if config.d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} does not divide d_model={config.d_model}; "
                             f"choose head counts that divide {config.d_model}, e.g. 1, 2, 4.")
    if isinstance(long_budget_factor, bool) or not isinstance(long_budget_factor, numbers.Integral) \
            or long_budget_factor < 0 or long_budget_factor == 1:
        raise ValueError(f"long_budget_factor must be 0 (skip the longer one-head runs) or a whole number "
                         f">= 2 (how many times the common budget), got {long_budget_factor!r}.")

    jobs = [(num_heads, seed, config) for num_heads in heads for seed in range(seeds)]
    if long_budget_factor:
        longer = SpecialisationConfig(**{**asdict(config), "steps": config.steps * long_budget_factor})
        jobs += [(1, seed, longer) for seed in range(seeds)]
    runs = []
    for num_heads, seed, job_config in tqdm(jobs, desc="training models", unit="model", disable=not progress):
        run = train(num_heads, seed, job_config)
        runs.append({"num_heads": num_heads, "head_dim": config.d_model // num_heads, "seed": seed,
                     "steps": job_config.steps, "final_loss": _rounded(run.losses[-1]), **evaluate(run)})
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


def summarise(results: dict) -> list[dict]:
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
    path.write_text("{\n" + "\n".join(lines) + '\n "runs": [\n' + runs + "\n ]\n}\n")
    return path


def load_results(path: str | Path = DEFAULT_RESULTS_PATH) -> dict:
    """Read results written by :func:`save_results` (or ``python -m mha_course specialise``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no results at {path}. Regenerate them from the repository root with "
                                f"`python -m mha_course specialise --out {path}`.")
    results = json.loads(path.read_text())
    missing = {"config", "heads", "runs", "seeds"} - set(results)
    if missing:
        raise ValueError(f"{path} is not a results file of run_experiment: it lacks {sorted(missing)}.")
    return results


# ---------------------------------------------------------------------------------------------- plots

# tab10 without its grey, which marks the unsolved models
_SEED_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                 "tab:olive", "tab:cyan")


def plot_accuracy_by_heads(results: dict, ax=None):
    """Held-out accuracy against head count: one dot per seed, the mean with a +-1 std bar.

    The dashed line is what a model that reads only one of the two tokens can reach
    (:func:`one_token_accuracy`).
    """
    import matplotlib.pyplot as plt

    rows = summarise(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    labels = []
    for x, row in enumerate(rows):
        accuracies = [r["accuracy"] for r in select_runs(results, row["num_heads"], row["steps"])]
        offsets = [(i - (len(accuracies) - 1) / 2) * 0.04 for i in range(len(accuracies))]  # spread dots
        ax.scatter([x + 0.18 + o for o in offsets], accuracies, s=14, color="tab:grey", alpha=0.8,
                   label="one seed" if x == 0 else None, zorder=3)
        ax.errorbar(x, row["mean"], yerr=row["std"], fmt="o", color="tab:blue", capsize=5, markersize=7,
                    label="mean ± std" if x == 0 else None, zorder=4)
        budget = "" if row["steps"] == results["config"]["steps"] else f"\n{row['steps'] // results['config']['steps']}× steps"
        labels.append(f"{row['num_heads']} head{'s' if row['num_heads'] > 1 else ''}\n(head_dim {row['head_dim']}){budget}")
    ax.axhline(one_token_accuracy(SpecialisationConfig(**results["config"])), color="tab:red", linestyle="--", linewidth=1,
               label="reads one token only")
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"Same width (d_model = {results['config']['d_model']}), same budget, "
                 f"{results['seeds']} seeds")
    ax.legend(loc="center", fontsize=8)
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
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    for run in runs:
        solved = run["accuracy"] >= SOLVED_ACCURACY
        for head, row in enumerate(run["first_share_by_difference"]):
            ax.plot(differences, [math.nan if v is None else v for v in row], marker="o", markersize=3,
                    color=_SEED_COLOURS[run["seed"] % len(_SEED_COLOURS)] if solved else "tab:grey",
                    alpha=0.9 if solved else 0.4,
                    label=f"seed {run['seed']} (solved)" if solved and head == 0 else None)
    ax.set_xlabel("first token − previous token")
    ax.set_ylabel("attention on the first token")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(differences[::2])
    steps = runs[0]["steps"]
    ax.set_title(f"{num_heads} head{'s' if num_heads > 1 else ''}, {steps} steps: grey = not solved")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="center left")
    ax.figure.tight_layout()
    return ax.figure


# ---------------------------------------------------------------------------------------------- command

def format_summary(results: dict) -> str:
    """The accuracy table of :func:`summarise` as aligned text, one row per head count."""
    lines = [f"{'heads':>5}  {'head_dim':>8}  {'steps':>5}  {'mean':>6}  {'std':>6}  {'min':>6}  {'max':>6}  solved"]
    for row in summarise(results):
        lines.append(f"{row['num_heads']:>5}  {row['head_dim']:>8}  {row['steps']:>5}  {row['mean']:>6.3f}  "
                     f"{row['std']:>6.3f}  {row['min']:>6.3f}  {row['max']:>6.3f}  {row['solved']}/{row['seeds']}")
    return "\n".join(lines)


def format_roles(results: dict, num_heads: int, steps: int | None = None) -> str:
    """One line per seed: accuracy, then each head's role (:func:`head_role`) with its two shares.

    Each head shows ``role first/previous``: its share of attention on the first token and on the
    previous token, rounded to two decimals (the role is named from the rounded shares).
    """
    runs = select_runs(results, num_heads, steps)

    def describe(first: float, previous: float) -> str:
        first, previous = round(first, 2), round(previous, 2)  # name the role from the shares shown
        return f"{head_role(first, previous):<8} {first:.2f}/{previous:.2f}"

    cells = [[f"{run['seed']}", f"{run['accuracy']:.3f}"] + [describe(*pair) for pair in run["head_scores"]]
             for run in runs]
    header = ["seed", "accuracy"] + [f"head {h + 1}" for h in range(num_heads)]
    widths = [max(len(row[j]) for row in cells + [header]) for j in range(len(header))]
    lines = ["  ".join(text.rjust(w) if j < 2 else text.ljust(w) for j, (text, w) in enumerate(zip(row, widths))).rstrip()
             for row in [header] + cells]
    return "\n".join(lines)


def run_cli(args) -> int:
    """``python -m mha_course specialise``: run :func:`run_experiment` and write its JSON file."""
    import sys

    def fail(message: str) -> int:
        print(f"python -m mha_course specialise: error: {message}", file=sys.stderr)
        return 2

    if args.seeds < 1:
        return fail(f"--seeds must be a whole number of at least 1, got {args.seeds}. The book uses --seeds 8.")
    out = Path(args.out)
    if out.is_dir():
        return fail(f"--out {out} is a folder; give a file name, e.g. --out {out / 'specialisation.json'}.")
    results = run_experiment(args.seeds, progress=not args.no_progress)
    try:
        save_results(results, out)
    except OSError as error:
        return fail(f"could not write --out {out}: {error.strerror or error}.")
    print(format_summary(results))
    print(f"wrote {out}")
    return 0
