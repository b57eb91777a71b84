"""Exercises of chapter 11, looking at fewer keys: the sink column (11.3) and the indexer's top-k (11.4).

11.3 asks for ``attend_with_sinks(queries, keys, values, sinks, mask)``: scaled dot-product
attention whose softmax has one more column per head, the sink logit ``sinks[h]``, which takes
probability and gives no value (gpt-oss). ``mask`` is ``True`` where a query may not look. The
reference is :func:`~mha_course.attention.sinks.softmax_with_sinks` times the values.

11.4 asks for ``top_k_visible(scores, hidden, k)``: the mask of keys a query may not look at once
each query keeps only its ``k`` best visible keys (DeepSeek-V3.2's indexer). ``scores`` and
``hidden`` are ``(B, T, S)``; the result is ``hidden`` plus every visible key outside a query's
top ``k``. The reference is :func:`~mha_course.attention.sparse.keep_top_k`, which the package's
:class:`~mha_course.attention.sparse.LightningIndexer` calls.

chapter11 lists them in its ``EXERCISES``.
"""

from __future__ import annotations

import torch

from ..attention.sinks import softmax_with_sinks
from ..attention.sparse import LightningIndexer, SparseLatentAttention, keep_top_k
from .framework import Check, Exercise, Mistake
from .probes import chooser, device_check, generator, probe_on_devices
from .records import Failed, Recorder, describe, expect_close_from, format_shape, plain, same, seed_of, value_of
from .shortcuts import package

# ----------------------------------------------------------------------------------------------
# 11.3 The sink column

SINK_CASES = ("readable", "window", "padded")


def sink_case(seed: int, key: str):
    """``(queries, keys, values, sinks, mask)`` of one case of 11.3, drawn from ``seed``.

    ``readable``: one sequence, two heads, three causal tokens; ``window``: new tokens after cached
    ones under a sliding window, sinks of both signs; ``padded``: a left-padded batch whose first
    query sees no key at all.
    """
    draw, g = chooser(seed, f"11.3 {key}"), generator(seed, f"11.3 {key}")
    if key == "readable":
        batch, heads, new, cached, head_dim, window = 1, 2, 3, 0, 4, None
    elif key == "window":
        batch, heads, new, cached, head_dim, window = 2, 3, draw.randint(2, 3), draw.randint(3, 6), 4, 3
    else:
        batch, heads, new, cached, head_dim, window = 2, 2, 5, 0, draw.choice([4, 6]), None
    total = cached + new
    rows, cols = torch.arange(cached, total)[:, None], torch.arange(total)
    mask = (cols > rows) | ((rows - cols >= window) if window else torch.zeros((), dtype=torch.bool))
    if key == "padded":
        real = torch.ones(batch, total, dtype=torch.bool)
        real[1, :2] = False  # the second sequence is left-padded by two tokens
        mask = mask | ~real[:, None, None, :]  # (B, 1, T, S)
    queries = torch.randn(batch, heads, new, head_dim, generator=g)
    keys, values = (torch.randn(batch, heads, total, head_dim, generator=g) for _ in range(2))
    sinks = torch.randn(heads, generator=g) * 1.5
    return queries, keys, values, sinks, mask


def reference_sinks(queries, keys, values, sinks, mask):
    """The package's sink column (:func:`~mha_course.attention.sinks.softmax_with_sinks`) times the values."""
    scores = queries @ keys.transpose(-2, -1) * queries.shape[-1] ** -0.5
    return softmax_with_sinks(scores, sinks, mask) @ values


def sinks_variant(queries, keys, values, sinks, mask, *, sink: str = "column", scale: bool = True):
    """11.3 written with a chosen mistake (``sink="none"``: a plain softmax; ``"first"``: the sink's
    share given to the first visible key's value); the defaults give the right answer."""
    scores = queries @ keys.transpose(-2, -1) * (queries.shape[-1] ** -0.5 if scale else 1.0)
    scores = scores.masked_fill(mask, float("-inf"))
    if sink == "none":
        return torch.softmax(scores, dim=-1) @ values
    column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)
    weights, share = weights[..., :-1], weights[..., -1:]
    if sink == "first":  # StreamingLLM's sink token: the share lands on the first key the query sees
        first = (~mask.expand_as(scores)).int().argmax(dim=-1, keepdim=True)
        weights = weights.scatter_add(-1, first, share)
    return weights @ values


def _describe_sinks(seed: int, key: str) -> str:
    queries, keys, _, sinks, mask = sink_case(seed, key)
    return (f"attend_with_sinks(queries {format_shape(queries.shape)}, keys and values "
            f"{format_shape(keys.shape)}, sinks {format_shape(sinks.shape)}, mask {format_shape(mask.shape)})")


def _probe_sinks(attend_with_sinks, rec: Recorder) -> None:
    for key in SINK_CASES:
        rec.call(key, attend_with_sinks, *sink_case(rec.seed, key))
    case = sink_case(rec.seed, "window")
    probe_on_devices(rec, "on", lambda device: attend_with_sinks(*(t.to(device) for t in case)))


def _context(record, key: str) -> torch.Tensor:
    what = _describe_sinks(seed_of(record), key)
    got = value_of(record, key, what)
    if got.get("kind") != "tensor":
        raise Failed(f"a tensor of context vectors from {what}", describe(got))
    return plain(got)


def _sinks_check(key: str):
    def run(record):
        got = _context(record, key)
        expect_close_from(got, reference_sinks(*sink_case(seed_of(record), key)), _describe_sinks(seed_of(record), key),
                          ("sequence", "head", "token"))
    return run


def _sinks_like(keys=("readable", "window"), **how):
    def detect(record):
        for key in keys:
            got = plain(record.get(key))
            expected = sinks_variant(*sink_case(seed_of(record), key), **how)
            if not same(torch.nan_to_num(got) if isinstance(got, torch.Tensor) else got, torch.nan_to_num(expected)):
                return False
        return True
    return detect


_EMPTY = "a query that sees no key: its mass all on the sink, context 0"

SINKS = Exercise(
    id="11.3",
    title="the sink column",
    answer_name="attend_with_sinks",
    signature="attend_with_sinks(queries, keys, values, sinks, mask)",
    probe=_probe_sinks,
    checks=(
        Check("returns the context vectors, (batch, heads, queries, value width)",
              lambda record: _context(record, "readable")),
        Check("three causal tokens, two heads with their own sinks", _sinks_check("readable")),
        Check("new tokens after a cache, under a sliding window", _sinks_check("window")),
        Check(_EMPTY, _sinks_check("padded")),
        Check("output on the inputs' device", device_check("on", "attend_with_sinks")),
    ),
    mistakes=(
        Mistake("no-sink",
                "Each row's weights sum to 1: this is the plain softmax, the sink left out. Add the head's sink "
                "logit as one more column of the scores (sinks.view(1, -1, 1, 1), expanded to (B, h, T, 1)), "
                "take the softmax over S + 1 columns, then drop that column: it has no value.",
                _sinks_like(sink="none")),
        Mistake("sink-to-a-value",
                "The sink's share of the probability reached the output through the first key's value: a sink "
                "has no value, so the mass it takes is simply missing from the output (the row sums to 1 - "
                "p_sink). StreamingLLM's sink was a token with a value; gpt-oss's is a logit alone.",
                _sinks_like(sink="first")),
        Mistake("unscaled",
                "The scores were not scaled by 1/sqrt(head_dim): the sink logit then competes with scores "
                "sqrt(head_dim) times too large.",
                _sinks_like(scale=False)),
    ),
    shortcuts=package(softmax_with_sinks,
                      why="This is the package's own sink column: write the softmax with its extra column yourself."),
)

# ----------------------------------------------------------------------------------------------
# 11.4 Top-k over the visible keys

TOPK_CASES = ("readable", "cached", "padded")


def topk_case(seed: int, key: str):
    """``(scores, hidden, k)`` of one case of 11.4: ``(B, T, S)`` float scores with no ties, the
    ``(B, T, S)`` mask of keys hidden (the future, padding), and ``k``.

    ``readable``: one sequence of five causal tokens, ``k = 2``; ``cached``: new tokens after cached
    ones, later keys scoring higher (the future would win every place); ``padded``: a left-padded batch.
    """
    draw, g = chooser(seed, f"11.4 {key}"), generator(seed, f"11.4 {key}")
    if key == "readable":
        batch, new, cached, k = 1, 5, 0, 2
    elif key == "cached":
        batch, new, cached, k = 2, draw.randint(2, 4), draw.randint(2, 5), draw.randint(2, 4)
    else:
        batch, new, cached, k = 2, 6, 0, draw.randint(2, 3)
    total = cached + new
    rows, cols = torch.arange(cached, total)[:, None], torch.arange(total)
    hidden = (cols > rows).expand(batch, new, total).clone()
    if key == "padded":
        hidden[1, :, :3] = True  # the second sequence is left-padded by three tokens
    scores = torch.randn(batch, new, total, generator=g)
    if key == "cached":
        scores = scores + cols  # the later a key, the higher it scores
    return scores, hidden, k


def reference_topk(scores, hidden, k):
    """The package's selection, :func:`~mha_course.attention.sparse.keep_top_k`."""
    return keep_top_k(scores, hidden, k)


def topk_variant(scores, hidden, k, *, over_masked: bool = False, keep_hidden: bool = True):
    """11.4 written with a chosen mistake; the defaults give the right answer."""
    ranked = scores if over_masked else scores.masked_fill(hidden, float("-inf"))
    chosen = ranked.topk(min(k, scores.shape[-1]), dim=-1).indices
    outside = torch.ones_like(hidden).scatter(-1, chosen, False)
    return outside | hidden if keep_hidden else outside


def _describe_topk(seed: int, key: str) -> str:
    scores, hidden, k = topk_case(seed, key)
    return f"top_k_visible(scores and hidden of shape {format_shape(scores.shape)}, k={k})"


def _probe_topk(top_k_visible, rec: Recorder) -> None:
    for key in TOPK_CASES:
        rec.call(key, top_k_visible, *topk_case(rec.seed, key))
    scores, hidden, k = topk_case(rec.seed, "cached")
    probe_on_devices(rec, "on", lambda device: top_k_visible(scores.to(device), hidden.to(device), k))


def _mask(record, key: str) -> torch.Tensor:
    what = _describe_topk(seed_of(record), key)
    got = value_of(record, key, what)
    if got.get("kind") != "tensor" or plain(got).dtype != torch.bool:
        raise Failed(f"a bool tensor from {what} (True where a query may not look)", describe(got))
    return plain(got)


def _topk_check(key: str):
    def run(record):
        got = _mask(record, key)
        expect_close_from(got, reference_topk(*topk_case(seed_of(record), key)), _describe_topk(seed_of(record), key),
                          ("sequence", "query"))
    return run


def _topk_like(keys=TOPK_CASES, **how):
    def detect(record):
        return all(same(plain(record.get(key)), topk_variant(*topk_case(seed_of(record), key), **how))
                   for key in keys)
    return detect


def _inverted(record) -> bool:
    return all(same(plain(record.get(key)), ~reference_topk(*topk_case(seed_of(record), key)))
               for key in TOPK_CASES)


TOPK = Exercise(
    id="11.4",
    title="top-k over the visible keys",
    answer_name="top_k_visible",
    signature="top_k_visible(scores, hidden, k)",
    probe=_probe_topk,
    checks=(
        Check("returns a bool mask, True where a query may not look", lambda record: _mask(record, "readable")),
        Check("five causal tokens, k = 2", _topk_check("readable")),
        Check("new tokens after a cache, later keys scoring higher", _topk_check("cached")),
        Check("a left-padded batch", _topk_check("padded")),
        Check("mask on the inputs' device", device_check("on", "top_k_visible")),
    ),
    mistakes=(
        Mistake("top-k-over-masked",
                "The top k were taken over every key, hidden ones included, and the hidden ones masked "
                "afterwards: a future or padded key with a high score took one of the k places, so the "
                "query reads fewer than k keys. Fill the hidden scores with -inf before topk.",
                _topk_like(over_masked=True)),
        Mistake("hidden-forgotten",
                "Where a query sees fewer than k keys, topk also picks hidden ones (at -inf), and your mask "
                "lets it read them: the future or the padding. Return the hidden keys as hidden too: "
                "outside | hidden.",
                _topk_like(keep_hidden=False)),
        Mistake("inverted",
                "Your mask is True on the keys a query keeps. The convention of the course's masks is True "
                "where a query may NOT look; return the complement.",
                _inverted),
    ),
    shortcuts=package(keep_top_k, LightningIndexer, SparseLatentAttention,
                      why="This is the package's own selection: write the top-k yourself."),
)

__all__ = ["SINKS", "TOPK", "sink_case", "reference_sinks", "sinks_variant", "topk_case", "reference_topk",
           "topk_variant"]
