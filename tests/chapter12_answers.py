"""Answers to the exercises of chapter 12 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detectors
(:func:`mha_course.exercises.state.linear_variant`, ``step_variant`` and ``chunk_variant``), so a test
passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mha_course

# ----------------------------------------------------------------------------------------------
# 12.1


def causal_linear_attention(queries, keys, values):
    q, k = F.elu(queries) + 1, F.elu(keys) + 1
    weights = torch.tril(q @ k.transpose(-2, -1))
    return weights @ values / weights.sum(dim=-1, keepdim=True)


def _linear_as_a_recurrence(queries, keys, values):  # also correct: the state, token by token
    q, k = F.elu(queries) + 1, F.elu(keys) + 1
    S = torch.zeros(*k.shape[:2], k.shape[-1], values.shape[-1], device=k.device)
    z = torch.zeros(*k.shape[:2], k.shape[-1], device=k.device)
    out = []
    for t in range(k.shape[2]):
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], values[:, :, t])
        z = z + k[:, :, t]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S) / (q[:, :, t] * z).sum(-1, keepdim=True))
    return torch.stack(out, dim=2)


def _linear_with_cumsum(queries, keys, values):  # also correct: prefix sums of k v^T
    q, k = F.elu(queries) + 1, F.elu(keys) + 1
    S = torch.cumsum(k[..., :, None] * values[..., None, :], dim=2)  # (B, h, T, d_k, d_v)
    z = torch.cumsum(k, dim=2)
    return (q[..., None, :] @ S).squeeze(-2) / (q * z).sum(-1, keepdim=True)


def _linear_without_normaliser(queries, keys, values):
    q, k = F.elu(queries) + 1, F.elu(keys) + 1
    return torch.tril(q @ k.transpose(-2, -1)) @ values


def _linear_over_every_key(queries, keys, values):
    q, k = F.elu(queries) + 1, F.elu(keys) + 1
    weights = q @ k.transpose(-2, -1)
    return weights @ values / weights.sum(dim=-1, keepdim=True)


def _linear_without_features(queries, keys, values):
    weights = torch.tril(queries @ keys.transpose(-2, -1))
    return weights @ values / weights.sum(dim=-1, keepdim=True)


def _linear_by_the_package(queries, keys, values):
    return mha_course.linear_attention_recurrent(queries, keys, values)


# ----------------------------------------------------------------------------------------------
# 12.2


def gated_delta_step(state, query, key, value, decay, beta):
    state = state * decay[..., None, None]
    predicted = torch.einsum("bhk,bhkv->bhv", key, state)
    error = (value - predicted) * beta[..., None]
    state = state + torch.einsum("bhk,bhv->bhkv", key, error)
    return torch.einsum("bhk,bhkv->bhv", query, state), state


def _step_with_matmul(state, query, key, value, decay, beta):  # also correct: as (I - beta k k^T) S + beta k v^T
    a, b = decay[..., None, None], beta[..., None, None]
    k = key.unsqueeze(-1)  # (B, h, d_k, 1)
    eye = torch.eye(key.shape[-1], device=key.device)
    new = (eye - b * k @ k.transpose(-1, -2)) @ (a * state) + b * k @ value.unsqueeze(-2)
    return (query.unsqueeze(-2) @ new).squeeze(-2), new


def _step_decay_after_write(state, query, key, value, decay, beta):
    error = (value - torch.einsum("bhk,bhkv->bhv", key, state)) * beta[..., None]
    state = (state + torch.einsum("bhk,bhv->bhkv", key, error)) * decay[..., None, None]
    return torch.einsum("bhk,bhkv->bhv", query, state), state


def _step_error_before_decay(state, query, key, value, decay, beta):
    error = (value - torch.einsum("bhk,bhkv->bhv", key, state)) * beta[..., None]
    state = state * decay[..., None, None] + torch.einsum("bhk,bhv->bhkv", key, error)
    return torch.einsum("bhk,bhkv->bhv", query, state), state


def _step_beta_on_key(state, query, key, value, decay, beta):
    state = state * decay[..., None, None]
    key = key * beta[..., None]
    error = value - torch.einsum("bhk,bhkv->bhv", key, state)
    state = state + torch.einsum("bhk,bhv->bhkv", key, error)
    return torch.einsum("bhk,bhkv->bhv", query, state), state


def _step_read_before_write(state, query, key, value, decay, beta):
    state = state * decay[..., None, None]
    output = torch.einsum("bhk,bhkv->bhv", query, state)
    error = (value - torch.einsum("bhk,bhkv->bhv", key, state)) * beta[..., None]
    return output, state + torch.einsum("bhk,bhv->bhkv", key, error)


def _step_by_the_package(state, query, key, value, decay, beta):
    return mha_course.gated_delta_step(state, query, key, value, decay, beta)


# ----------------------------------------------------------------------------------------------
# 12.3


def _chunk(state, queries, keys, values, log_decay, beta, *, read="tril", system_tril=-1):
    C = queries.shape[-2]
    G = torch.cumsum(log_decay, dim=-1)  # (B, h, C)
    D = torch.exp(G[..., :, None] - G[..., None, :])  # G_r / G_s
    kb = keys * beta[..., None]
    A = torch.tril(kb @ keys.transpose(-1, -2) * D, diagonal=system_tril)
    T = A + torch.eye(C, device=keys.device)
    U = torch.linalg.solve_triangular(T, values * beta[..., None], upper=False)
    W = torch.linalg.solve_triangular(T, kb * torch.exp(G)[..., None], upper=False)
    u = U - W @ state
    P = queries @ keys.transpose(-1, -2) * D
    if read == "tril":
        P = torch.tril(P)
    elif read == "strict":
        P = torch.tril(P, diagonal=-1)
    out = (queries * torch.exp(G)[..., None]) @ state + P @ u
    last = G[..., -1:]
    new = torch.exp(last)[..., None] * state + (keys * torch.exp(last - G)[..., None]).transpose(-1, -2) @ u
    return out, new


def chunk_step(state, queries, keys, values, log_decay, beta):
    return _chunk(state, queries, keys, values, log_decay, beta)


def _chunk_token_by_token(state, queries, keys, values, log_decay, beta):  # also correct, if not chunked
    outputs = []
    for t in range(queries.shape[-2]):
        output, state = gated_delta_step(state, queries[:, :, t], keys[:, :, t], values[:, :, t],
                                         log_decay[:, :, t].exp(), beta[:, :, t])
        outputs.append(output)
    return torch.stack(outputs, dim=2), state


def _chunk_strict_read(*args):
    return _chunk(*args, read="strict")


def _chunk_no_read_mask(*args):
    return _chunk(*args, read="none")


def _chunk_diagonal_in_system(*args):
    return _chunk(*args, system_tril=0)


def _chunk_by_the_package(state, queries, keys, values, log_decay, beta):
    return mha_course.chunked_gated_delta_rule(queries, keys, values, log_decay, beta, state,
                                               chunk_size=queries.shape[2])


CORRECT = {"12.1": causal_linear_attention, "12.2": gated_delta_step, "12.3": chunk_step}

#: More correct answers, written differently.
ALSO_CORRECT = {"12.1": [_linear_as_a_recurrence, _linear_with_cumsum], "12.2": [_step_with_matmul],
                "12.3": [_chunk_token_by_token]}

WRONG = {
    ("12.1", "no-normaliser"): _linear_without_normaliser,
    ("12.1", "not-causal"): _linear_over_every_key,
    ("12.1", "no-feature-map"): _linear_without_features,
    ("12.2", "decay-after-write"): _step_decay_after_write,
    ("12.2", "error-before-decay"): _step_error_before_decay,
    ("12.2", "beta-on-key"): _step_beta_on_key,
    ("12.2", "read-before-write"): _step_read_before_write,
    ("12.3", "strict-read-mask"): _chunk_strict_read,
    ("12.3", "no-read-mask"): _chunk_no_read_mask,
    ("12.3", "diagonal-in-system"): _chunk_diagonal_in_system,
}

#: Answers that are, or call, the package's own answer: refused, naming what they use.
#: Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "12.1 calls linear_attention_recurrent": ("12.1", _linear_by_the_package,
                                              "mha_course's own linear_attention_recurrent"),
    "12.1 is linear_attention_quadratic": ("12.1", mha_course.linear_attention_quadratic,
                                           "mha_course's own linear_attention_quadratic"),
    "12.2 calls gated_delta_step": ("12.2", _step_by_the_package, "mha_course's own gated_delta_step"),
    "12.3 calls chunked_gated_delta_rule": ("12.3", _chunk_by_the_package,
                                            "mha_course's own chunked_gated_delta_rule"),
}
