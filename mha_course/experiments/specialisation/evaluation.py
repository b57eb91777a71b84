"""Scoring trained models on held-out data: accuracy, and what each head attends to."""

from __future__ import annotations

import math

import torch

from .task import IGNORE_INDEX, SpecialisationConfig, TinyAttentionModel, validate_config, difference_task
from .training import TrainingRun

#: Seed of the held-out sequences every model is scored on (never a training seed in the book).
EVAL_SEED = 2**31 - 1

#: A model counts as having solved the task from this held-out accuracy up.
SOLVED_ACCURACY = 0.99


def evaluation_data(config: SpecialisationConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out sequences every model is scored on: ``difference_task`` with :data:`EVAL_SEED`."""
    config = validate_config(config)
    return difference_task(config.eval_size, config.num_tokens, config.vocab_size, seed=EVAL_SEED)


def validate_model(model) -> TinyAttentionModel:
    """The model itself, or the model of a :class:`TrainingRun`; a clear error otherwise."""
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
        >>> model = TinyAttentionModel(vocab_size=8, num_tokens=8, d_model=16, num_heads=2)
        >>> 0.0 <= accuracy(model, *difference_task(4)) <= 1.0
        True
    """
    model = validate_model(model)
    if not isinstance(labels, torch.Tensor) or labels.shape != getattr(tokens, "shape", None):
        raise ValueError("labels must be a tensor with the same shape as tokens; pass both from difference_task(...).")
    predictions = model(tokens).argmax(dim=-1)  # (B, T)
    labelled = labels != IGNORE_INDEX
    return float((predictions[labelled] == labels[labelled]).float().mean())


def _attention(model, tokens) -> torch.Tensor:
    model = validate_model(model)
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
    model = validate_model(model)
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
    config = validate_config(config)
    labelled = config.num_tokens - 1
    return (1 + (labelled - 1) / config.vocab_size) / labelled


#: A head *reads* the first or the previous token when at least this share of its attention is on it.
ROLE_THRESHOLD = 0.8
#: A head looks at *other* tokens when less than this share of its attention is on the two together.
OTHER_BELOW = 0.5


def head_role(first: float, previous: float, threshold: float = ROLE_THRESHOLD) -> str:
    """Name what a head does from its :func:`head_scores` pair: its shares of attention on the first
    and on the previous token (the rest, ``1 - first - previous``, is on other tokens).

    ``"first"`` or ``"previous"`` when that share reaches ``threshold``; ``"other"`` when the two
    shares together are under :data:`OTHER_BELOW`; otherwise the two of the three places (the first
    token, the previous token, the other tokens) that hold most of its attention, joined by ``+``:
    ``"first+previous"`` for a head split between the two tokens, ``"previous+other"`` for one that
    gives the first token nothing and divides the rest between the previous token and others.

    Example:
        >>> head_role(0.97, 0.02), head_role(0.01, 0.99), head_role(0.5, 0.48), head_role(0.1, 0.2)
        ('first', 'previous', 'first+previous', 'other')
        >>> head_role(0.0, 0.51), head_role(0.6, 0.05)
        ('previous+other', 'first+other')
    """
    if not 0.5 < threshold <= 1:
        raise ValueError(f"threshold must be in (0.5, 1], got {threshold}: a head can have at most one "
                         "share above it.")
    if first >= threshold:
        return "first"
    if previous >= threshold:
        return "previous"
    if first + previous < OTHER_BELOW:
        return "other"
    shares = {"first": first, "previous": previous, "other": 1 - first - previous}
    largest = sorted(shares, key=shares.get, reverse=True)[:2]
    return "+".join(place for place in shares if place in largest)


def rounded(values, decimals: int = 4):
    """Numbers (or nested lists or a tensor of them) rounded for JSON; NaN becomes ``None``."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if isinstance(values, list):
        return [rounded(v, decimals) for v in values]
    return None if math.isnan(values) else round(float(values), decimals)


def evaluate(run: TrainingRun | TinyAttentionModel, config: SpecialisationConfig | None = None) -> dict:
    """Score a trained model on the held-out data: a JSON-ready dict of rounded numbers.

    ``run`` is a :class:`TrainingRun` (scored with its own config unless ``config`` is given) or
    a :class:`TinyAttentionModel` (scored with ``config``, default the book's). Keys: ``accuracy``, ``head_scores`` (per head
    ``[first, previous]``), ``first_share_by_difference`` (per head, see
    :func:`first_share_by_difference`) and ``mean_attention_maps`` (per head, ``T x T``).
    """
    model = validate_model(run)
    config = run.config if isinstance(run, TrainingRun) and config is None else validate_config(config)
    tokens, labels = evaluation_data(config)
    return {
        "accuracy": rounded(accuracy(model, tokens, labels)),
        "head_scores": rounded(head_scores(model, tokens)),
        "first_share_by_difference": rounded(first_share_by_difference(model, tokens)),
        "mean_attention_maps": rounded(mean_attention_maps(model, tokens)),
    }
