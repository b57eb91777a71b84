"""Exercises 12.1 to 12.3 of chapter 12: causal linear attention, one step of the gated delta rule, and one
chunk of its chunked form.

12.1 asks for ``causal_linear_attention(queries, keys, values)``: ``phi(x) = elu(x) + 1`` on queries and
keys, each query reading the values of the keys up to itself, weighted by ``phi(q) . phi(k)`` and divided
by the sum of those weights. The reference is the package's
:func:`~mha_course.linear_attention_recurrent`.

12.2 asks for ``gated_delta_step(state, query, key, value, decay, beta)``: one token of the gated delta
rule, returning ``(output, new_state)``. The reference is the package's
:func:`~mha_course.gated_delta_step`.

12.3 asks for ``chunk_step(state, queries, keys, values, log_decay, beta)``: the outputs of one chunk of
tokens and the state after it, computed with matrix products and one triangular solve. The reference is
the package's :func:`~mha_course.chunked_gated_delta_rule`, with the chunk as one chunk.

The catalogues name the usual slips: the normaliser forgotten, the future summed in; the decay applied
after the write, the error read from the state before its decay, beta put on the key; and the masks
inside a chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.delta_rule import (chunked_gated_delta_rule, delta_rule_step, gated_delta_step, l2_normalise,
                                    recurrent_gated_delta_rule)
from ..attention.gated_deltanet import GatedDeltaNet
from ..attention.linear import linear_attention_quadratic, linear_attention_recurrent
from .framework import Check, Exercise, Mistake
from .probes import chooser, device_check, generator, probe_on_devices
from .records import Failed, Recorder, describe, expect_close_from, format_shape, plain, same, seed_of, value_of
from .shortcuts import package

_PACKAGE_RULE = package(linear_attention_recurrent, linear_attention_quadratic, gated_delta_step, delta_rule_step,
                        recurrent_gated_delta_rule, chunked_gated_delta_rule, GatedDeltaNet,
                        why="This is the package's own delta rule: write it yourself.")

# ----------------------------------------------------------------------------------------------
# 12.1 Causal linear attention

LINEAR_CASES = ("readable", "batched")


def linear_case(seed: int, key: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(queries, keys, values)`` of one case of 12.1, drawn from ``seed``: ``readable`` is one sequence,
    one head, 3 tokens of width 2; ``batched`` two sequences, two heads, 4 to 7 tokens, other widths."""
    draw, g = chooser(seed, f"12.1 {key}"), generator(seed, f"12.1 {key}")
    if key == "readable":
        b, h, t, d_k, d_v = 1, 1, 3, 2, 2
    else:
        b, h, t, d_k, d_v = 2, 2, draw.randint(4, 7), draw.choice([3, 4]), draw.choice([2, 5])
    return (torch.randn(b, h, t, d_k, generator=g), torch.randn(b, h, t, d_k, generator=g),
            torch.randn(b, h, t, d_v, generator=g))


def linear_variant(queries, keys, values, *, normalise: bool = True, causal: bool = True, features: bool = True):
    """12.1 written with a chosen mistake; the defaults give the right answer."""
    q, k = (F.elu(queries) + 1, F.elu(keys) + 1) if features else (queries, keys)
    weights = q @ k.transpose(-2, -1)  # (B, h, T, T)
    if causal:
        weights = weights.tril()
    out = weights @ values
    return out / weights.sum(-1, keepdim=True) if normalise else out


def _describe_linear(seed: int, key: str) -> str:
    q, _, v = linear_case(seed, key)
    return (f"causal_linear_attention(queries and keys {format_shape(q.shape)}, values "
            f"{format_shape(v.shape)})")


def _probe_linear(causal_linear_attention, rec: Recorder) -> None:
    for key in LINEAR_CASES:
        rec.call(key, causal_linear_attention, *linear_case(rec.seed, key))
    case = linear_case(rec.seed, "batched")
    probe_on_devices(rec, "on", lambda device: causal_linear_attention(*(t.to(device) for t in case)))


def _tensor(record, key: str, what: str) -> torch.Tensor:
    got = value_of(record, key, what)
    if got.get("kind") != "tensor":
        raise Failed(f"a tensor from {what}", describe(got))
    return plain(got)


def _linear_check(key: str):
    def run(record):
        what = _describe_linear(seed_of(record), key)
        expected = linear_attention_recurrent(*linear_case(seed_of(record), key))
        expect_close_from(_tensor(record, key, what), expected, what, ("sequence", "head", "token"))
    return run


def _linear_like(**how):
    def detect(record):
        return all(same(plain(record.get(key)), linear_variant(*linear_case(seed_of(record), key), **how))
                   for key in LINEAR_CASES)
    return detect


LINEAR = Exercise(
    id="12.1",
    title="causal linear attention",
    answer_name="causal_linear_attention",
    signature="causal_linear_attention(queries, keys, values)",
    probe=_probe_linear,
    checks=(
        Check("returns the outputs, one per query",
              lambda record: _tensor(record, "readable", _describe_linear(seed_of(record), "readable"))),
        Check("three tokens: weights phi(q) . phi(k) over the keys up to each query, normalised",
              _linear_check("readable")),
        Check("several sequences and heads, other widths", _linear_check("batched")),
        Check("output on the inputs' device", device_check("on", "causal_linear_attention")),
    ),
    mistakes=(
        Mistake("no-normaliser",
                "Each output is phi(q)^T S without its normaliser: divide by phi(q) . z, where z is the sum of "
                "phi(k) over the keys so far (the sum of each row of weights). Softmax divides by its sum too; "
                "without it the outputs grow with the number of tokens.",
                _linear_like(normalise=False)),
        Mistake("not-causal",
                "Every query read every key, the later ones too: the state must hold only the keys up to the "
                "query (tril() of the weights, or S and z summed token by token).",
                _linear_like(causal=False)),
        Mistake("no-feature-map",
                "The weights are q . k itself: apply the feature map phi(x) = elu(x) + 1 to queries and keys "
                "first. Without it a weight can be negative and a normaliser zero.",
                _linear_like(features=False)),
    ),
    shortcuts=_PACKAGE_RULE,
)

# ----------------------------------------------------------------------------------------------
# 12.2 One step of the gated delta rule

STEP_CASES = ("readable", "batched")


def step_case(seed: int, key: str) -> tuple[torch.Tensor, ...]:
    """``(state, query, key, value, decay, beta)`` of one case of 12.2, drawn from ``seed``: ``readable``
    is one sequence, one head, ``d_k = d_v = 2``; ``batched`` two sequences, two or three heads, other
    widths. Keys have length 1; the state holds what earlier tokens wrote."""
    draw, g = chooser(seed, f"12.2 {key}"), generator(seed, f"12.2 {key}")
    if key == "readable":
        b, h, d_k, d_v = 1, 1, 2, 2
    else:
        b, h, d_k, d_v = 2, draw.choice([2, 3]), draw.choice([3, 4]), draw.choice([2, 5])
    state = torch.randn(b, h, d_k, d_v, generator=g)
    query, key_vector = torch.randn(b, h, d_k, generator=g), l2_normalise(torch.randn(b, h, d_k, generator=g))
    value = torch.randn(b, h, d_v, generator=g)
    decay = 0.3 + 0.6 * torch.rand(b, h, generator=g)  # between 0.3 and 0.9: far from 1
    beta = 0.2 + 0.6 * torch.rand(b, h, generator=g)
    return state, query, key_vector, value, decay, beta


def step_variant(state, query, key, value, decay, beta, *, decay_after: bool = False, old_error: bool = False,
                 beta_on_key: bool = False, read_old: bool = False):
    """12.2 written with a chosen mistake; the defaults give the right answer."""
    a, b = decay[..., None, None], beta[..., None]
    decayed = state if decay_after else a * state
    if beta_on_key:
        key = key * b
    error = value - (key[..., None, :] @ (state if old_error else decayed)).squeeze(-2)
    new = decayed + key[..., :, None] * ((1 if beta_on_key else b) * error)[..., None, :]
    if decay_after:
        new = a * new
    output = (query[..., None, :] @ (decayed if read_old else new)).squeeze(-2)
    return output, new


def _describe_step(seed: int, key: str) -> str:
    state, query, _, value, _, _ = step_case(seed, key)
    return (f"gated_delta_step(state {format_shape(state.shape)}, query and key {format_shape(query.shape)}, "
            f"value {format_shape(value.shape)}, ...)")


def _probe_step(gated_delta_step_answer, rec: Recorder) -> None:
    for key in STEP_CASES:
        rec.call(key, gated_delta_step_answer, *step_case(rec.seed, key))
    case = step_case(rec.seed, "batched")
    probe_on_devices(rec, "on", lambda device: gated_delta_step_answer(*(t.to(device) for t in case))[1])


def _pair(record, key: str, what: str) -> list[torch.Tensor]:
    got = value_of(record, key, what)
    items = plain(got) if got.get("kind") == "sequence" else None
    if not (isinstance(items, list) and len(items) == 2 and all(isinstance(t, torch.Tensor) for t in items)):
        raise Failed(f"two tensors (output, new_state) from {what}", describe(got))
    return items


def _pair_check(key: str, describe_case, reference, case, labels, roles=(1, 0)):
    names = ("output", "new_state")

    def run(record):
        what = describe_case(seed_of(record), key)
        got, expected = _pair(record, key, what), reference(*case(seed_of(record), key))
        for i in roles:
            expect_close_from(got[i], expected[i], what, labels[i], names[i])
    return run


def _pair_like(case, variant, keys, **how):
    def detect(record):
        for key in keys:
            got, expected = plain(record.get(key)), variant(*case(seed_of(record), key), **how)
            if not isinstance(got, list) or len(got) != 2 or not all(same(g, e) for g, e in zip(got, expected)):
                return False
        return True
    return detect


_STEP_LABELS = (("sequence", "head"), ("sequence", "head", "key row"))
_NEW_STATE, _OUTPUT = "one head: the new state", "one head: the output, read from the new state"

STEP = Exercise(
    id="12.2",
    title="one step of the gated delta rule",
    answer_name="gated_delta_step",
    signature="gated_delta_step(state, query, key, value, decay, beta)",
    probe=_probe_step,
    checks=(
        Check("returns the output and the new state",
              lambda record: _pair(record, "readable", _describe_step(seed_of(record), "readable"))),
        Check(_NEW_STATE, _pair_check("readable", _describe_step, gated_delta_step, step_case, _STEP_LABELS, (1,))),
        Check(_OUTPUT,
              _pair_check("readable", _describe_step, gated_delta_step, step_case, _STEP_LABELS, (0,))),
        Check("several sequences and heads, other widths",
              _pair_check("batched", _describe_step, gated_delta_step, step_case, _STEP_LABELS)),
        Check("new state on the inputs' device", device_check("on", "gated_delta_step(...)[1]")),
    ),
    mistakes=(
        Mistake("decay-after-write",
                "The decay came after the write: the state is multiplied by decay before anything is read from "
                "it, so the error is v - (decay * S)^T k and the new state decay * S + beta * k e^T. Decaying "
                "after the write shrinks the new token's own write too.",
                _pair_like(step_case, step_variant, STEP_CASES, decay_after=True)),
        Mistake("error-before-decay",
                "The error was computed from the state before its decay: v - S^T k. The write corrects what the "
                "decayed state predicts, v - (decay * S)^T k; otherwise a key written long ago is corrected as "
                "if it had never faded.",
                _pair_like(step_case, step_variant, STEP_CASES, old_error=True)),
        Mistake("beta-on-key",
                "beta scaled the key, and so the prediction too: the state predicts S^T k with the key itself, "
                "and beta scales only the error that is written, beta * (v - S^T k).",
                _pair_like(step_case, step_variant, STEP_CASES, beta_on_key=True)),
        Mistake("read-before-write",
                "The output was read from the state before this token's write. The token reads the state that "
                "holds its own write: output = new_state^T query.",
                _pair_like(step_case, step_variant, STEP_CASES, read_old=True), (_OUTPUT,)),
    ),
    shortcuts=_PACKAGE_RULE,
)

# ----------------------------------------------------------------------------------------------
# 12.3 One chunk of the chunked form

CHUNK_CASES = ("readable", "chunk")


def chunk_case(seed: int, key: str) -> tuple[torch.Tensor, ...]:
    """``(state, queries, keys, values, log_decay, beta)`` of one case of 12.3, drawn from ``seed``:
    ``readable`` is one sequence, one head, a chunk of 3 tokens, ``d_k = d_v = 2``; ``chunk`` two
    sequences, two heads, 5 to 8 tokens, other widths. Keys have length 1."""
    draw, g = chooser(seed, f"12.3 {key}"), generator(seed, f"12.3 {key}")
    if key == "readable":
        b, h, c, d_k, d_v = 1, 1, 3, 2, 2
    else:
        b, h, c, d_k, d_v = 2, 2, draw.randint(5, 8), draw.choice([3, 4]), draw.choice([2, 5])
    state = torch.randn(b, h, d_k, d_v, generator=g)
    queries, keys = torch.randn(b, h, c, d_k, generator=g), l2_normalise(torch.randn(b, h, c, d_k, generator=g))
    values = torch.randn(b, h, c, d_v, generator=g)
    log_decay = -0.1 - 0.9 * torch.rand(b, h, c, generator=g)
    beta = 0.2 + 0.6 * torch.rand(b, h, c, generator=g)
    return state, queries, keys, values, log_decay, beta


def reference_chunk(state, queries, keys, values, log_decay, beta):
    """The package's chunked form, the whole chunk as one chunk: ``(outputs, new_state)``."""
    return chunked_gated_delta_rule(queries, keys, values, log_decay, beta, state, chunk_size=queries.shape[2])


def chunk_variant(state, queries, keys, values, log_decay, beta, *, read_mask: str = "lower",
                  system_diagonal: bool = False):
    """12.3 written with a chosen mistake in a mask; the defaults give the right answer. ``read_mask`` is
    ``"lower"`` (s <= r), ``"strict"`` (s < r) or ``"none"``."""
    size = queries.shape[2]
    cum = log_decay.cumsum(-1)
    ratio = (cum[..., :, None] - cum[..., None, :]).exp()  # above the diagonal too, as a slip leaves it
    k_beta = keys * beta[..., None]
    pairs = k_beta @ keys.transpose(-1, -2) * ratio
    eye = torch.eye(size, dtype=keys.dtype, device=keys.device)
    system = (pairs.tril() if system_diagonal else pairs.tril(-1)) + eye
    written = torch.linalg.solve_triangular(system, values * beta[..., None], upper=False)
    read_back = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False)
    u = written - read_back @ state
    scores = queries @ keys.transpose(-1, -2) * ratio
    scores = {"lower": scores.tril(), "strict": scores.tril(-1), "none": scores}[read_mask]
    outputs = (queries * cum.exp()[..., None]) @ state + scores @ u
    end = (cum[..., -1:] - cum).exp()[..., None]
    return outputs, cum[..., -1, None, None].exp() * state + (keys * end).transpose(-1, -2) @ u


def _describe_chunk(seed: int, key: str) -> str:
    state, queries, _, values, _, _ = chunk_case(seed, key)
    return (f"chunk_step(state {format_shape(state.shape)}, queries and keys {format_shape(queries.shape)}, "
            f"values {format_shape(values.shape)}, ...)")


def _probe_chunk(chunk_step, rec: Recorder) -> None:
    for key in CHUNK_CASES:
        rec.call(key, chunk_step, *chunk_case(rec.seed, key))
    case = chunk_case(rec.seed, "chunk")
    probe_on_devices(rec, "on", lambda device: chunk_step(*(t.to(device) for t in case))[0])


_CHUNK_LABELS = (("sequence", "head", "token"), ("sequence", "head", "key row"))
_OUTPUTS = "three tokens: the outputs"

CHUNK = Exercise(
    id="12.3",
    title="one chunk of the chunked form",
    answer_name="chunk_step",
    signature="chunk_step(state, queries, keys, values, log_decay, beta)",
    probe=_probe_chunk,
    checks=(
        Check("returns the outputs and the new state",
              lambda record: _pair(record, "readable", _describe_chunk(seed_of(record), "readable"))),
        Check("three tokens: the state after the chunk",
              _pair_check("readable", _describe_chunk, reference_chunk, chunk_case, _CHUNK_LABELS, (1,))),
        Check(_OUTPUTS, _pair_check("readable", _describe_chunk, reference_chunk, chunk_case, _CHUNK_LABELS, (0,))),
        Check("a longer chunk, several sequences and heads",
              _pair_check("chunk", _describe_chunk, reference_chunk, chunk_case, _CHUNK_LABELS)),
        Check("outputs on the inputs' device", device_check("on", "chunk_step(...)[0]")),
    ),
    mistakes=(
        Mistake("strict-read-mask",
                "The outputs' mask left out the diagonal: token r reads the writes of the tokens s <= r of the "
                "chunk, its own write included (the recurrent step reads the state after its write). Keep the "
                "diagonal: tril(), not tril(-1).",
                _pair_like(chunk_case, chunk_variant, CHUNK_CASES, read_mask="strict")),
        Mistake("no-read-mask",
                "The outputs read the writes of later tokens of the chunk: mask the (C, C) scores to s <= r "
                "(tril()) before they weigh u.",
                _pair_like(chunk_case, chunk_variant, CHUNK_CASES, read_mask="none")),
        Mistake("diagonal-in-system",
                "The triangular system kept beta_r (k_r . k_r) on its diagonal: token r's own error is not "
                "corrected by itself, so the system is I plus the strictly lower part, tril(-1), with ones on "
                "the diagonal.",
                _pair_like(chunk_case, chunk_variant, CHUNK_CASES, system_diagonal=True)),
    ),
    shortcuts=_PACKAGE_RULE,
)

__all__ = ["LINEAR", "STEP", "CHUNK", "linear_case", "linear_variant", "step_case", "step_variant", "chunk_case",
           "chunk_variant", "reference_chunk"]
