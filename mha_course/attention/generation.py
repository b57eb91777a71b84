"""Generating a padded batch: a small stack of the course's attention layers, decoded token by token.

Chapter 9 shows that a batch of prompts of different lengths, padded on the left, generates what each
prompt generates alone. :class:`TinyDecoder` is the smallest model that makes the point: token
embeddings, a stack of :class:`~mha_course.GroupedQueryAttention` layers with rotary positions, each
added to its input (a residual connection), and a projection back to the vocabulary. It has no
feed-forward layers or normalisation: attention is what padding can break. :func:`left_pad` builds the
padded batch and its ``attention_mask``; :func:`generate` decodes greedily with one
:class:`~mha_course.KVCache` per layer.
"""

from __future__ import annotations

import torch
from torch import nn

from .grouped_query import GroupedQueryAttention
from .kv_cache import KVCache


class TinyDecoder(nn.Module):
    """Embeddings, ``num_layers`` residual attention layers with rotary positions, and an unembedding.

    Example:
        >>> model = TinyDecoder(vocab_size=11, d_model=8, num_layers=2, context_length=12)
        >>> model(torch.tensor([[1, 2, 3]])).shape  # (B, T, vocab_size): logits
        torch.Size([1, 3, 11])
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, context_length: int,
                 num_heads: int = 2, num_kv_groups: int = 1, rope_theta: float = 10000.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            GroupedQueryAttention(d_model, d_model, context_length, 0.0, num_heads, num_kv_groups,
                                  rope_theta=rope_theta) for _ in range(num_layers))
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids, caches=None, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)`` for token ids ``(B, T)``; ``caches``: one KVCache per layer.

        The rotation's cos and sin are computed once per call, for the positions of ``ids``, and
        handed to every layer, as transformers' Llama does: the layers' frequencies are the same.
        """
        x = self.embed(ids)  # (B, T, d_model)
        caches = caches if caches is not None else [None] * len(self.layers)
        if position_ids is None:  # the new tokens follow the cached ones
            start = 0 if caches[0] is None else len(caches[0])
            position_ids = torch.arange(start, start + ids.shape[1], device=ids.device)[None]  # (1, T)
        rotation = self.layers[0].rotary.cos_sin(position_ids, x.dtype)  # (cos, sin): (B or 1, T, d_h)
        for layer, cache in zip(self.layers, caches, strict=True):
            x = x + layer(x, cache=cache, attention_mask=attention_mask, position_embeddings=rotation)
        return self.unembed(x)


def left_pad(prompts, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)``, both ``(B, T_longest)``: each prompt right-aligned, padding first.

    Example:
        >>> ids, mask = left_pad([[5, 6, 7], [8]])
        >>> ids.tolist(), mask.tolist()
        ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty lists of token ids.")
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, longest - len(prompt):] = torch.as_tensor(prompt, dtype=torch.long)
        mask[i, longest - len(prompt):] = 1
    return ids, mask


@torch.no_grad()
def generate(model: TinyDecoder, prompts, num_new: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy decoding of ``num_new`` tokens for a left-padded batch of ``prompts``.

    Returns the new token ids of each prompt and the logits of every decoded step
    ``(B, num_new, vocab_size)``. Positions count from each prompt's first real token
    (``attention_mask.cumsum(-1) - 1``), so padding shifts nothing.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = TinyDecoder(vocab_size=11, d_model=8, num_layers=2, context_length=12).eval()
        >>> batched, _ = generate(model, [[1, 2, 3], [4]], num_new=3)
        >>> batched == [generate(model, [p], num_new=3)[0][0] for p in ([1, 2, 3], [4])]
        True
    """
    ids, mask = left_pad(prompts)
    caches = [KVCache() for _ in model.layers]
    # positions from each prompt's first real token: 0, 1, ... (0 on padding)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    logits = model(ids, caches, mask, positions)[:, -1]  # (B, vocab)
    new, steps = [], []
    for _ in range(num_new):
        steps.append(logits)
        token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        new.append(token)
        # the new token is real, one position past each sequence's last
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        positions = mask.sum(-1, keepdim=True) - 1  # (B, 1)
        logits = model(token, caches, mask, positions)[:, -1]
    return torch.cat(new, dim=1).tolist(), torch.stack(steps, dim=1)
