"""Attention sinks: one learned logit per head that takes probability mass and gives no value (gpt-oss).

A softmax has to give all of its mass to the keys a query sees, even when none of them is useful.
Trained models find a way out: Xiao et al. (2024, StreamingLLM) saw heads pour most of their
attention onto the first tokens, whatever those tokens are, as onto a *sink*. Drop those first
keys, as a plain sliding window does once the sequence outgrows it, and the model falls apart;
keep the first four keys beside the window and it recovers. They also pre-trained with a
dedicated learned sink token, which then did the job alone.

gpt-oss (OpenAI 2025) takes the cheap version of that idea: no token at all, one learned logit
``s_h`` per head, a column added to every row of scores before the softmax and dropped after it:

    weights[i, j] = exp(scores[i, j]) / (sum_k exp(scores[i, k]) + exp(s_h)).

The sink has no value, so the mass it takes is simply missing from the output: a head can say
"nothing here" with a weight sum below 1, in every layer, windowed or full, at the cost of one
number per head and one extra column in the softmax. A row that sees no key at all (padding) gives
all its mass to the sink: weights 0, context 0, the course's rule for such a row, with no special case.
"""

from __future__ import annotations

import torch

from .heads import score_dtype


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The softmax over each row of ``scores`` and its head's sink logit, the sink's column dropped.

    Args:
        scores: ``(B, h, T, S)`` scaled scores.
        sinks: ``(h,)``, one logit per head.
        mask: ``True`` where a query may not look, broadcastable to ``scores`` (``(T, S)`` or
            ``(B, 1, T, S)``), or ``None``.

    Returns:
        ``(B, h, T, S)`` weights, in float32 for half-precision scores; each row sums to
        ``1 - p_sink``, the probability its sink took.

    Example:
        >>> scores = torch.zeros(1, 2, 1, 3)  # two heads, one query, three keys of equal score
        >>> weights = softmax_with_sinks(scores, torch.tensor([float("-inf"), 0.0]))
        >>> weights[0, :, 0].tolist()  # no sink: 1/3 each; a sink of logit 0: 1/4 each, 1/4 to the sink
        [[0.3333333432674408, 0.3333333432674408, 0.3333333432674408], [0.25, 0.25, 0.25]]
        >>> softmax_with_sinks(scores, torch.zeros(2), torch.ones(1, 3, dtype=torch.bool))[0, 0, 0]
        tensor([0., 0., 0.])
    """
    dtype = score_dtype(scores.dtype)  # float32 for half precision
    scores = scores.to(dtype)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    # one more column per row: the head's sink logit, (B, h, T, 1)
    sink = sinks.to(dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)
    return weights[..., :-1]  # the sink's column dropped: it has no value
