"""The course's example inputs: small, fixed and reproducible.

* The three-token example of the source texts: tokens labelled 1, 2 and 3.
* The running sentence "Your journey starts with one step", embedded in three dimensions, shared
  with the canonical book chapter the course follows.
* Seeded random batches of any size.
"""

from __future__ import annotations

import torch

from .attention._validation import validate_positive_int

#: The six words of the running example, in order.
RUNNING_WORDS = ("Your", "journey", "starts", "with", "one", "step")

_RUNNING_EMBEDDINGS = [
    [0.43, 0.15, 0.89],  # Your
    [0.55, 0.87, 0.66],  # journey
    [0.57, 0.85, 0.64],  # starts
    [0.22, 0.58, 0.33],  # with
    [0.77, 0.25, 0.10],  # one
    [0.05, 0.80, 0.55],  # step
]

#: Labels of the three-token example.
THREE_TOKEN_LABELS = ("1", "2", "3")

# Three embedded tokens, each three numbers wide; chosen to be distinct and easy to read.
_THREE_TOKEN_EMBEDDINGS = [
    [0.9, 0.1, 0.4],
    [0.2, 0.8, 0.3],
    [0.5, 0.5, 0.9],
]


def running_example(batch: bool = False) -> torch.Tensor:
    """The six embedded tokens of "Your journey starts with one step": shape ``(6, 3)``.

    Row ``i`` embeds word ``RUNNING_WORDS[i]`` in three dimensions, small enough to print.

    Args:
        batch: add a leading batch dimension, giving ``(1, 6, 3)``, the shape the attention
            modules take.

    Example:
        >>> x = running_example(batch=True)
        >>> x.shape
        torch.Size([1, 6, 3])
        >>> RUNNING_WORDS[1], [round(v, 2) for v in x[0, 1].tolist()]
        ('journey', [0.55, 0.87, 0.66])
    """
    x = torch.tensor(_RUNNING_EMBEDDINGS, dtype=torch.float32)
    return x.unsqueeze(0) if batch else x


def three_token_example(batch: bool = False) -> torch.Tensor:
    """The three embedded tokens 1, 2, 3 of the source texts' diagrams: shape ``(3, 3)``.

    Args:
        batch: add a leading batch dimension, giving ``(1, 3, 3)``.

    Example:
        >>> three_token_example().shape, three_token_example(batch=True).shape
        (torch.Size([3, 3]), torch.Size([1, 3, 3]))
        >>> THREE_TOKEN_LABELS
        ('1', '2', '3')
    """
    x = torch.tensor(_THREE_TOKEN_EMBEDDINGS, dtype=torch.float32)
    return x.unsqueeze(0) if batch else x


def random_batch(batch: int, num_tokens: int, d_in: int, seed: int = 0, device=None) -> torch.Tensor:
    """A reproducible ``(batch, num_tokens, d_in)`` tensor of standard-normal numbers.

    The same seed gives the same numbers on every run, without touching the global RNG.

    Args:
        batch: number of sequences.
        num_tokens: tokens per sequence.
        d_in: width of each token vector.
        seed: seed of the private random generator.
        device: where to put the result (default: the CPU, where it is drawn).

    Example:
        >>> x = random_batch(2, 4, 8, seed=1)
        >>> x.shape, torch.equal(x, random_batch(2, 4, 8, seed=1))
        (torch.Size([2, 4, 8]), True)
    """
    batch = validate_positive_int("batch", batch)
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    d_in = validate_positive_int("d_in", d_in)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, num_tokens, d_in, generator=generator)
    return x.to(device) if device is not None else x
