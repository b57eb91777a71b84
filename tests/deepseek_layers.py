"""What the tests of the course's DeepSeek layers share: the yarn rotary settings the comparisons use, the
float32 tolerance, and the additive mask transformers' DeepSeek attention layers take."""

from __future__ import annotations

import torch

#: float32: the two sides differ in the order of their sums only.
FLOAT32 = {"rtol": 2e-5, "atol": 2e-5}

YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def additive(real: torch.Tensor, num_new: int) -> torch.Tensor:
    """transformers' mask for the last ``num_new`` of ``real``'s positions: 0 to see, the dtype's min not to."""
    total = real.shape[1]
    rows = torch.arange(total - num_new, total)[:, None]
    hidden = (torch.arange(total) > rows) | (real[:, None, None, :] == 0)  # (B, 1, T, S)
    return torch.zeros(hidden.shape).masked_fill(hidden, torch.finfo(torch.float32).min)
