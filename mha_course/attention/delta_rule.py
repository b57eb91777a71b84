"""The gated delta rule: a ``d_k x d_v`` state that is corrected, not only added to, and forgets.

Linear attention (:mod:`.linear`) adds ``k v^T`` to its state for every token, so the state only
grows and two keys that point alike blur each other's values. The *delta rule* (Schlag et al. 2021;
DeltaNet, Yang et al. 2024) writes only the error: the state predicts ``S^T k`` for the key ``k``,
and the write is ``beta * k (v - S^T k)^T``, with ``beta`` in ``(0, 1)`` the strength of the
update. With ``|k| = 1`` and ``beta = 1`` the key then reads back exactly ``v``. The *gated* delta
rule (Yang et al. 2025, "Gated Delta Networks"), which Qwen3-Next uses, also shrinks the whole
state by a decay ``alpha = exp(g)`` in ``(0, 1]`` before each token, so old content fades:

    S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T,   o_t = S_t^T q_t

Two forms compute it. :func:`recurrent_gated_delta_rule` takes one token at a time
(:func:`gated_delta_step`), as decoding does. :func:`chunked_gated_delta_rule` cuts a prompt into
chunks of 64 tokens: within a chunk, matrix products and one triangular solve; between chunks,
the state. The two are the same function, not an approximation of each other: the triangular
solve is the recurrence's own forward substitution, written as a matrix (see that function).

Shapes follow the course: ``(B, h, T, d)``; ``log_decay`` (``g``, at most 0) and ``beta`` are
``(B, h, T)``; the state is ``(B, h, d_k, d_v)``. Nothing here holds a buffer that grows with
the context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2_normalise(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(|x|^2 + eps)`` along the last dimension, as Qwen3-Next normalises queries and keys.

    Example:
        >>> [round(x, 6) for x in l2_normalise(torch.tensor([3.0, 4.0])).tolist()]
        [0.6, 0.8]
    """
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_rule_step(state, key, value, beta):
    """The delta rule without a gate: write ``beta * (v - S^T k)`` at ``k``. ``state`` ``(..., d_k, d_v)``,
    ``key`` ``(..., d_k)``, ``value`` ``(..., d_v)``, ``beta`` ``(...)``.

    Example:
        >>> k, v = torch.tensor([0.6, 0.8]), torch.tensor([1.0, -2.0, 3.0])
        >>> state = delta_rule_step(torch.zeros(2, 3), k, v, torch.tensor(1.0))
        >>> torch.allclose(k @ state, v)  # a unit key reads back its value
        True
    """
    predicted = (key[..., None, :] @ state).squeeze(-2)  # S^T k: (..., d_v)
    error = beta[..., None] * (value - predicted)
    return state + key[..., :, None] * error[..., None, :]  # + k e^T


def gated_delta_step(state, query, key, value, decay, beta):
    """One token of the gated delta rule: forget, predict, correct, read. Returns ``(output, state)``.

    ``state`` ``(B, h, d_k, d_v)``; ``query`` and ``key`` ``(B, h, d_k)``; ``value`` ``(B, h, d_v)``;
    ``decay`` (``alpha = exp(g)``) and ``beta`` ``(B, h)``.

    Example:
        >>> q, k, v = torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 3)
        >>> out, state = gated_delta_step(torch.zeros(1, 2, 4, 3), q, k, v, torch.ones(1, 2), torch.ones(1, 2))
        >>> out.shape, state.shape
        (torch.Size([1, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    state = decay[..., None, None] * state  # forget a little, before reading
    predicted = (key[..., None, :] @ state).squeeze(-2)  # S^T k: (B, h, d_v)
    error = beta[..., None] * (value - predicted)  # what is new, scaled
    state = state + key[..., :, None] * error[..., None, :]  # + k e^T
    output = (query[..., None, :] @ state).squeeze(-2)  # S^T q: (B, h, d_v)
    return output, state


def recurrent_gated_delta_rule(queries, keys, values, log_decay, beta,
                               state=None):
    """The gated delta rule one token at a time. Returns ``(outputs (B, h, T, d_v), final state)``.

    Example:
        >>> q, k = torch.randn(1, 2, 5, 4), l2_normalise(torch.randn(1, 2, 5, 4))
        >>> out, state = recurrent_gated_delta_rule(q, k, torch.randn(1, 2, 5, 3), -torch.rand(1, 2, 5),
        ...                                         torch.rand(1, 2, 5))
        >>> out.shape, state.shape
        (torch.Size([1, 2, 5, 3]), torch.Size([1, 2, 4, 3]))
    """
    batch, heads, num_tokens, d_k = keys.shape
    if state is None:
        state = keys.new_zeros(batch, heads, d_k, values.shape[-1])
    outputs = []
    for t in range(num_tokens):
        output, state = gated_delta_step(
            state, queries[:, :, t], keys[:, :, t], values[:, :, t],
            log_decay[:, :, t].exp(), beta[:, :, t])
        outputs.append(output)
    return torch.stack(outputs, dim=2), state


def chunked_gated_delta_rule(queries, keys, values, log_decay, beta,
                             state=None, chunk_size=64):
    """The same function, a chunk of ``chunk_size`` tokens at a time: ``(outputs, final state)``.

    Within a chunk, with ``G_r`` the decay from the chunk's start to token ``r``, the state after
    token ``r`` is ``G_r S_0 + sum_{s<=r} (G_r / G_s) k_s u_s^T``, where ``u_s = beta_s e_s`` is what
    token ``s`` writes. Each ``u_r`` depends on the earlier ``u_s`` of the chunk through its error:
    ``u_r + beta_r sum_{s<r} (G_r/G_s) (k_r . k_s) u_s = beta_r (v_r - G_r S_0^T k_r)``, a lower
    triangular system with ones on its diagonal. Solving it is the recurrence's forward
    substitution, exactly; the outputs are then two matrix products per chunk.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> q, k = torch.randn(1, 2, 9, 4), l2_normalise(torch.randn(1, 2, 9, 4))
        >>> v, g, b = torch.randn(1, 2, 9, 3), -torch.rand(1, 2, 9), torch.rand(1, 2, 9)
        >>> one, _ = recurrent_gated_delta_rule(q, k, v, g, b)
        >>> chunks, _ = chunked_gated_delta_rule(q, k, v, g, b, chunk_size=4)
        >>> torch.allclose(one, chunks, atol=1e-5)
        True
    """
    batch, heads, num_tokens, d_k = keys.shape
    size, pad = chunk_size, -num_tokens % chunk_size  # zeros at the end
    q, k, v = (F.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, size))
               for x in (queries, keys, values))  # (B, h, N, C, d)
    g, b = (F.pad(x, (0, pad)).unflatten(2, (-1, size))
            for x in (log_decay, beta))  # (B, h, N, C)
    cum = g.cumsum(-1)  # log G_r, within each chunk
    lower = torch.ones(size, size, dtype=torch.bool, device=k.device).tril()
    ratio = cum[..., :, None] - cum[..., None, :]  # log G_r / G_s
    ratio = ratio.masked_fill(~lower, float("-inf")).exp()  # 0 for s > r
    k_beta = k * b[..., None]  # (B, h, N, C, d_k)
    system = (k_beta @ k.transpose(-1, -2) * ratio).tril(-1)  # s < r
    eye = torch.eye(size, dtype=k.dtype, device=k.device)

    def solve(rhs):  # (I + system) x = rhs, row after row: exact
        return torch.linalg.solve_triangular(system + eye, rhs, upper=False)

    written = solve(v * b[..., None])  # u if the chunk started empty
    read_back = solve(k_beta * cum.exp()[..., None])  # minus this @ S_0
    scores = (q @ k.transpose(-1, -2)) * ratio  # (B, h, N, C, C): s <= r
    q_start = q * cum.exp()[..., None]  # reads S_0, decayed to r
    k_end = k * (cum[..., -1:] - cum).exp()[..., None]  # decayed to the end
    if state is None:
        state = k.new_zeros(batch, heads, d_k, v.shape[-1])
    outputs = []
    for n in range(q.shape[2]):  # the state, carried from chunk to chunk
        u = written[:, :, n] - read_back[:, :, n] @ state  # (B, h, C, d_v)
        outputs.append(q_start[:, :, n] @ state + scores[:, :, n] @ u)
        decay = cum[:, :, n, -1, None, None].exp()  # G over the chunk
        state = decay * state + k_end[:, :, n].transpose(-1, -2) @ u
    return torch.cat(outputs, dim=2)[:, :, :num_tokens], state


__all__ = ["l2_normalise", "delta_rule_step", "gated_delta_step", "recurrent_gated_delta_rule",
           "chunked_gated_delta_rule"]
