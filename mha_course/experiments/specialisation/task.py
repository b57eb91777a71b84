"""The task, "first minus previous", its settings, and the tiny model trained on it.

The checks of the task's and the model's arguments are written here once and used by the other
modules. A trained model and the evaluation's own arguments are checked in :mod:`~.evaluation`
(:func:`~.evaluation.validate_model`), the arguments of a whole run in :mod:`~.results`
(:func:`~.results.validate_experiment_arguments`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn

from ...attention._validation import validate_non_negative_int, validate_positive_int
from ...attention.multihead import MultiHeadAttention

#: Label of positions that have nothing to predict; ``cross_entropy`` skips it.
IGNORE_INDEX = -100


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
            validate_positive_int(name, getattr(self, name))
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}: with one token "
                             "every difference is 0 and there is nothing to learn.")
        validate_num_tokens(self.num_tokens)
        rate = self.learning_rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not (0 < rate < 1 and math.isfinite(rate)):
            raise ValueError(f"learning_rate must be a number between 0 and 1, got {rate!r}. The book uses 1e-2.")

    @property
    def num_classes(self) -> int:
        """How many labels there are: differences ``-(vocab_size - 1) .. vocab_size - 1``."""
        return 2 * self.vocab_size - 1


def validate_config(config) -> SpecialisationConfig:
    """``config``, or the book's :class:`SpecialisationConfig` for ``None``; a clear error otherwise."""
    if config is None:
        return SpecialisationConfig()
    if not isinstance(config, SpecialisationConfig):
        raise TypeError(f"config must be a SpecialisationConfig, got {type(config).__name__}. "
                        "Build one with SpecialisationConfig(steps=..., ...) or pass None for the book's.")
    return config


def validate_num_tokens(num_tokens: int) -> int:
    """Sequences need at least 3 positions for two distinct lookups."""
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    if num_tokens < 3:
        raise ValueError(f"num_tokens must be at least 3, got {num_tokens}: position 2 is the first whose "
                         "previous token is not the first token, so shorter sequences need one lookup only.")
    return num_tokens


def validate_seed(seed) -> int:
    """A seed is a non-negative whole number."""
    return validate_non_negative_int("seed", seed)


def validate_head_count(num_heads, d_model: int) -> int:
    """Return ``num_heads`` if it is a positive whole number that divides ``d_model``.

    Example:
        >>> validate_head_count(3, 16)
        Traceback (most recent call last):
            ...
        ValueError: num_heads=3 does not divide d_model=16: every head gets d_model // num_heads columns. Use a divisor of 16, e.g. 1, 2 or 4.
    """
    num_heads = validate_positive_int("num_heads", num_heads)
    if d_model % num_heads:
        raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}: every head gets "
                         f"d_model // num_heads columns. Use a divisor of {d_model}, e.g. 1, 2 or 4.")
    return num_heads


def generator(seed) -> torch.Generator:
    """``seed`` itself if it is a ``torch.Generator``, else a new generator seeded with it."""
    if isinstance(seed, torch.Generator):
        return seed
    return torch.Generator().manual_seed(validate_seed(seed))


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
    batch_size = validate_positive_int("batch_size", batch_size)
    num_tokens = validate_num_tokens(num_tokens)
    vocab_size = validate_positive_int("vocab_size", vocab_size)
    tokens = torch.randint(0, vocab_size, (batch_size, num_tokens), generator=generator(seed))  # (B, T)
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
        self.vocab_size = validate_positive_int("vocab_size", vocab_size)
        self.num_tokens = validate_positive_int("num_tokens", num_tokens)
        self.num_heads = validate_head_count(num_heads, validate_positive_int("d_model", d_model))
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(num_tokens, d_model)
        # d_out = d_model whatever the head count: the model width stays fixed and heads get narrower.
        self.attention = MultiHeadAttention(d_model, d_model, num_tokens, dropout=0.0, num_heads=num_heads)
        self.readout = nn.Linear(d_model, 2 * vocab_size - 1)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings, ``(batch, num_tokens, d_model)``."""
        self._validate_tokens(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)  # (T,)
        return self.token_embedding(tokens) + self.position_embedding(positions)  # (B, T, d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self.attention(self.embed(tokens)))  # (B, T, num_classes)

    @torch.no_grad()
    def attention_weights(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every head's attention weights, ``(batch, num_heads, num_tokens, num_tokens)``."""
        return self.attention.attention_weights(self.embed(tokens))

    def _validate_tokens(self, tokens) -> None:
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
