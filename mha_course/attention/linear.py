"""Causal linear attention: a feature map in place of softmax's exponential, and a state in place of the cache.

Softmax attention gives query ``i`` the values of the keys ``j <= i``, weighted by
``exp(q_i . k_j)`` and divided by the sum of those weights. Every new query scores every earlier
key again, so a decoder keeps every key and value (the :class:`~mha_course.KVCache`), and a prompt
of ``T`` tokens costs ``T x T`` scores. Katharopoulos et al. (2020) replace ``exp(q . k)`` by a
product of features, ``phi(q) . phi(k)`` with ``phi(x) = elu(x) + 1`` (positive, so the weights
stay positive). The product regroups:

    o_i = sum_j (phi(q_i) . phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)
        = phi(q_i)^T S_i / phi(q_i)^T z_i,   S_i = sum_{j<=i} phi(k_j) v_j^T,  z_i = sum_{j<=i} phi(k_j)

``S_i`` is a ``d_k x d_v`` matrix and ``z_i`` a ``d_k`` vector, whatever ``i``: the past is summed
into a state of fixed size, updated once per token. :func:`linear_attention_quadratic` computes
the first line, with the ``(T, T)`` matrix of weights; :func:`linear_attention_recurrent` the
second, one token at a time. They give the same outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1``: ``exp(x)`` for ``x < 0``, so positive, and ``x + 1`` for ``x >= 0`` (Katharopoulos et al. 2020).

    Example:
        >>> y = elu_feature_map(torch.tensor([-3.0, 0.0, 2.0]))
        >>> round(y[0].item(), 4), y[1:].tolist()  # exp(-3) for -3
        (0.0498, [1.0, 3.0])
    """
    return F.elu(x) + 1.0


def linear_attention_quadratic(queries, keys, values,
                               feature_map=elu_feature_map):
    """Causal linear attention with the ``(T, T)`` weights: ``(B, h, T, d_k)`` twice and ``(B, h, T, d_v)``
    -> ``(B, h, T, d_v)``.

    Example:
        >>> q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 3)
        >>> linear_attention_quadratic(q, k, v).shape
        torch.Size([1, 2, 5, 3])
    """
    q, k = feature_map(queries), feature_map(keys)
    weights = (q @ k.transpose(-2, -1)).tril()  # (B, h, T, T): j <= i only
    return (weights @ values) / weights.sum(dim=-1, keepdim=True)


def linear_attention_recurrent(queries, keys, values,
                               feature_map=elu_feature_map):
    """The same outputs, one token at a time, from a ``d_k x d_v`` state and a ``d_k`` normaliser.

    Example:
        >>> q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 3)
        >>> torch.allclose(linear_attention_recurrent(q, k, v), linear_attention_quadratic(q, k, v), atol=1e-6)
        True
    """
    q, k = feature_map(queries), feature_map(keys)
    batch, heads, num_tokens, d_k = k.shape
    state = k.new_zeros(batch, heads, d_k, values.shape[-1])  # sum of k v^T
    normaliser = k.new_zeros(batch, heads, d_k)  # sum of k
    outputs = []
    for t in range(num_tokens):
        k_t, v_t, q_t = k[:, :, t], values[:, :, t], q[:, :, t]  # (B, h, d)
        state = state + k_t[..., :, None] * v_t[..., None, :]  # + k v^T
        normaliser = normaliser + k_t  # (B, h, d_k)
        read = (q_t[..., None, :] @ state).squeeze(-2)  # q^T S: (B, h, d_v)
        outputs.append(read / (q_t * normaliser).sum(-1, keepdim=True))
    return torch.stack(outputs, dim=2)  # (B, h, T, d_v)


__all__ = ["elu_feature_map", "linear_attention_quadratic", "linear_attention_recurrent"]
