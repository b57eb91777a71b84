"""Training the tiny model on the task, reproducibly: the same seed gives the same model, bit for bit."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ...attention._validation import validate_positive_int
from .task import (IGNORE_INDEX, SpecialisationConfig, TinyAttentionModel, validate_config, validate_head_count,
                   validate_seed, difference_task)


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
        progress: show a progress bar over the steps (tqdm, on standard error).
        num_threads: torch threads while training (1 keeps results identical on every machine).

    Example:
        >>> run = train(2, seed=0, config=SpecialisationConfig(steps=3, eval_size=10))
        >>> len(run.losses), run.model.num_heads
        (3, 2)
    """
    config = validate_config(config)
    num_heads = validate_head_count(num_heads, config.d_model)
    seed = validate_seed(seed)
    num_threads = validate_positive_int("num_threads", num_threads)

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
        for _ in with_progress(range(config.steps), f"{num_heads} head(s), seed {seed}", progress):
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
    return TrainingRun(model=model, num_heads=num_heads, seed=seed, config=config, losses=losses)


def with_progress(items, desc: str, enabled: bool):
    """``items`` under a progress bar (a widget in a notebook, where ipywidgets is installed)."""
    if not enabled:
        return items
    from tqdm.auto import tqdm  # here: importing tqdm.auto in a kernel without ipywidgets warns

    return tqdm(items, desc=desc)
