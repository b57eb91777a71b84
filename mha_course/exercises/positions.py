"""Exercises 9.1 and 9.2 of chapter 9: Llama's rotation of queries and keys, and a padded batch.

9.1 asks for ``rotate_by_position(queries, keys, values, start, rope_theta)``: the three tensors as
Llama's layer uses them, queries and keys turned by their positions ``start, start + 1, ...``
(half-split pairs), values as they are. The reference is the package's
:class:`~mha_course.RotaryEmbedding`.

9.2 asks for ``padded_attention(queries, keys, values, attention_mask)``: causal attention over a
padded batch, where ``attention_mask`` is 1 for real tokens and 0 for padding. The reference is the
package's :func:`~mha_course.with_padding`; each real token must get what its sequence gives alone,
and no output may be NaN.

chapter9 lists both in its ``EXERCISES``.
"""

from __future__ import annotations

import torch

from ..attention.grouped_query import GroupedQueryAttention
from ..attention.masking import causal_mask, with_padding
from ..attention.rotary import RotaryEmbedding, inverse_frequencies, rotate_half
from .framework import Check, Exercise, Mistake
from .probes import chooser, device_check, generator, probe_on_devices
from .records import Failed, Recorder, describe, expect_close, expect_close_from, format_shape, plain, same, seed_of, value_of
from .shortcuts import package

# ----------------------------------------------------------------------------------------------
# 9.1 Rotate queries and keys by position

ROTATE_CASES = ("readable", "cached", "grouped")


def rotate_case(seed: int, key: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, float]:
    """``(queries, keys, values, start, rope_theta)`` of one case of 9.1, drawn from ``seed``.

    ``readable``: one sequence, one head of width 4, two tokens from position 0; ``cached``: the
    tokens that follow ``start`` cached ones; ``grouped``: more query heads than key/value heads.
    """
    draw, g = chooser(seed, f"9.1 {key}"), generator(seed, f"9.1 {key}")
    if key == "readable":
        batch, heads, groups, tokens, head_dim, start, theta = 1, 1, 1, 2, 4, 0, 100.0
    elif key == "cached":
        batch, heads, groups, tokens, head_dim = 2, 2, 2, draw.randint(1, 3), draw.choice([4, 6])
        start, theta = draw.randint(3, 9), 10000.0
    else:
        groups = draw.choice([1, 2])
        batch, heads, tokens, head_dim = 1, 2 * groups, draw.randint(3, 5), draw.choice([6, 8])
        start, theta = draw.randint(1, 4), draw.choice([500.0, 10000.0])
    queries = torch.randn(batch, heads, tokens, head_dim, generator=g)
    keys, values = (torch.randn(batch, groups, tokens, head_dim, generator=g) for _ in range(2))
    return queries, keys, values, start, theta


def _describe_rotate(seed: int, key: str) -> str:
    queries, keys, _, start, theta = rotate_case(seed, key)
    return (f"rotate_by_position(queries {format_shape(queries.shape)}, keys and values "
            f"{format_shape(keys.shape)}, start={start}, rope_theta={theta:g})")


def rotation_variant(queries, keys, values, start, rope_theta, *, sign: int = 1, interleaved: bool = False,
                     offset: bool = True, rotate_values: bool = False, exponent_i_over_d: bool = False):
    """The three tensors after a rotation written with a chosen mistake; the defaults give the right one."""
    head_dim, tokens = queries.shape[-1], queries.shape[2]
    positions = torch.arange(tokens) + (start if offset else 0)
    frequencies = (rope_theta ** (-torch.arange(head_dim // 2).float() / head_dim) if exponent_i_over_d
                   else inverse_frequencies(head_dim, rope_theta))
    angles = positions[:, None].float() * frequencies  # (T, d_h / 2)
    cos, sin = angles.cos(), sign * angles.sin()

    def turn(x):
        if interleaved:  # pairs (2c, 2c + 1)
            a, b = x[..., 0::2], x[..., 1::2]
            out = torch.empty_like(x)
            out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
            return out
        cos2, sin2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        return x * cos2 + rotate_half(x) * sin2

    return turn(queries), turn(keys), turn(values) if rotate_values else values


def reference_rotation(queries, keys, values, start, rope_theta):
    """The package's rotation: :class:`~mha_course.RotaryEmbedding` on queries and keys."""
    q, k = RotaryEmbedding(queries.shape[-1], rope_theta)(queries, keys, start)
    return q, k, values


def _probe_rotate(rotate_by_position, rec: Recorder) -> None:
    for key in ROTATE_CASES:
        rec.call(key, rotate_by_position, *rotate_case(rec.seed, key))
    queries, keys, values, start, theta = rotate_case(rec.seed, "cached")
    probe_on_devices(rec, "on", lambda device: rotate_by_position(
        queries.to(device), keys.to(device), values.to(device), start, theta)[0])


def _three(record, key: str) -> list[torch.Tensor]:
    what = _describe_rotate(seed_of(record), key)
    got = value_of(record, key, what)
    items = plain(got) if got.get("kind") == "sequence" else None
    if not (isinstance(items, list) and len(items) == 3 and all(isinstance(t, torch.Tensor) for t in items)):
        raise Failed(f"three tensors (queries, keys, values) from {what}", describe(got))
    return items


def _rotate_check(key: str, roles: tuple[int, ...] = (0, 1, 2)):
    names = ("queries", "keys", "values")

    def run(record):
        got = _three(record, key)
        expected = reference_rotation(*rotate_case(seed_of(record), key))
        for i in roles:
            expect_close_from(got[i], expected[i], _describe_rotate(seed_of(record), key), ("sequence", "head", "token"),
                              names[i])
    return run


def _rotation_like(keys=("readable", "cached"), **how):
    def detect(record):
        for key in keys:
            got, case = plain(record.get(key)), rotate_case(seed_of(record), key)
            if not isinstance(got, list) or len(got) != 3:
                return False
            if not all(same(g, e) for g, e in zip(got, rotation_variant(*case, **how))):
                return False
        return True
    return detect


_VALUES = "values come back as they are"

ROTATE = Exercise(
    id="9.1",
    title="rotate queries and keys by position",
    answer_name="rotate_by_position",
    signature="rotate_by_position(queries, keys, values, start, rope_theta)",
    probe=_probe_rotate,
    checks=(
        Check("returns queries, keys and values", lambda record: _three(record, "readable")),
        Check("queries and keys turned by position, half-split pairs", _rotate_check("readable", (0, 1))),
        Check(_VALUES, _rotate_check("readable", (2,))),
        Check("after a cache: positions start, start + 1, ...", _rotate_check("cached")),
        Check("more query heads than key/value heads, other widths", _rotate_check("grouped")),
        Check("queries on the inputs' device", device_check("on", "rotate_by_position(...)[0]")),
    ),
    mistakes=(
        Mistake("sign",
                "Each pair is turned the wrong way: rotate_half(x) is (-x2, x1), the second half negated "
                "and put first. With (x2, -x1) every angle changes sign.",
                _rotation_like(sign=-1)),
        Mistake("interleaved",
                "You paired neighbours (0, 1), (2, 3), ..., the interleaved convention of the original "
                "paper. Llama pairs number c with number c + head_dim / 2: split the head into halves.",
                _rotation_like(interleaved=True)),
        Mistake("no-offset",
                "The positions start at 0 for the new tokens, but start tokens are already cached: the new "
                "ones are at positions start, start + 1, ... (torch.arange(start, start + T)).",
                _rotation_like(keys=("cached",), offset=False)),
        Mistake("values-rotated",
                "Queries and keys are right, but the values were turned too. Only the scores need the "
                "positions: return the values as they came.",
                _rotation_like(rotate_values=True), (_VALUES,)),
        Mistake("exponent-i-over-d",
                "Your frequencies are rope_theta ** (-i / d_h) for pair i; Llama's are rope_theta ** (-2i / d_h) "
                "(torch.arange(0, d_h, 2) / d_h), so every pair after the first turns too slowly.",
                _rotation_like(exponent_i_over_d=True)),
    ),
    shortcuts=package(RotaryEmbedding, rotate_half, GroupedQueryAttention,
                      why="This is the package's own rotation: write it yourself."),
)

# ----------------------------------------------------------------------------------------------
# 9.2 Attention over a padded batch

PAD_CASES = ("left", "right")


def pad_case(seed: int, key: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(queries, keys, values, attention_mask)`` of one case of 9.2, drawn from ``seed``: three
    sequences of different lengths padded on the ``key`` side (one of them padding only on "left")."""
    draw, g = chooser(seed, f"9.2 {key}"), generator(seed, f"9.2 {key}")
    tokens, heads, head_dim = draw.randint(4, 6), draw.randint(1, 2), draw.choice([2, 3])
    lengths = [tokens, draw.randint(1, tokens - 1), 0 if key == "left" else draw.randint(1, tokens - 1)]
    real = torch.zeros(len(lengths), tokens, dtype=torch.long)
    for i, n in enumerate(lengths):
        if key == "left":
            real[i, tokens - n:] = 1
        else:
            real[i, :n] = 1
    queries, keys, values = (torch.randn(len(lengths), heads, tokens, head_dim, generator=g) for _ in range(3))
    return queries, keys, values, real


def reference_padded(queries, keys, values, attention_mask):
    """The package's way: causal and padding masks combined by :func:`~mha_course.with_padding`."""
    mask = with_padding(causal_mask(queries.shape[2]), attention_mask, len(queries))
    scores = (queries * queries.shape[-1] ** -0.5) @ keys.transpose(2, 3)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ values


def padded_variant(queries, keys, values, attention_mask, *, on_queries: bool = False, guard: bool = True,
                   padding: bool = True, causal: bool = True, scale: float = -0.5, fill: float = float("-inf")):
    """9.2 written with a chosen mistake (``scale``: the power of d_h the scores are multiplied by;
    ``fill``: what hidden scores become); the defaults give the right answer."""
    real = attention_mask.bool()
    mask = causal_mask(queries.shape[2]).expand(len(queries), 1, -1, -1) & causal
    if padding:
        mask = mask | (~real[:, None, :, None] if on_queries else ~real[:, None, None, :])
    if guard:
        mask = mask & ~mask.all(dim=-1, keepdim=True)
    scores = (queries * queries.shape[-1] ** scale) @ keys.transpose(2, 3)
    return torch.softmax(scores.masked_fill(mask, fill), dim=-1) @ values


def _probe_padded(padded_attention, rec: Recorder) -> None:
    for key in PAD_CASES:
        rec.call(key, padded_attention, *pad_case(rec.seed, key))
    case = pad_case(rec.seed, "left")
    probe_on_devices(rec, "on", lambda device: padded_attention(*(t.to(device) for t in case)))


def _describe_padded(seed: int, key: str) -> str:
    queries, _, _, real = pad_case(seed, key)
    return (f"padded_attention(queries of shape {format_shape(queries.shape)}, ..., attention_mask="
            f"{real.tolist()})")


def _padded_got(record, key: str) -> torch.Tensor:
    what = _describe_padded(seed_of(record), key)
    got = value_of(record, key, what)
    if got.get("kind") != "tensor":
        raise Failed(f"a tensor from {what}", describe(got))
    return plain(got)


def _real_tokens_check(key: str):
    def run(record):
        case = pad_case(seed_of(record), key)
        got, expected = _padded_got(record, key), reference_padded(*case)
        real = case[3].bool()[:, None, :, None].expand_as(expected)
        try:
            expect_close(torch.where(real, got, 0.0) if got.shape == expected.shape else got,
                         torch.where(real, expected, 0.0), labels=("sequence", "head", "token"))
        except Failed as failure:
            raise Failed(f"{failure.expected} for the real tokens of {_describe_padded(seed_of(record), key)}",
                         failure.got) from None
    return run


def _finite(record):
    got = _padded_got(record, "left")
    if not bool(torch.isfinite(got).all()):
        where = (~torch.isfinite(got)).nonzero()[0].tolist()
        raise Failed(f"finite numbers everywhere, padding too ({_describe_padded(seed_of(record), 'left')})",
                     f"nan at sequence {where[0] + 1}, head {where[1] + 1}, token {where[2] + 1} "
                     f"(index {where[:3]})")


def _padded_like(keys=PAD_CASES, **how):
    def detect(record):
        for key in keys:
            case = pad_case(seed_of(record), key)
            got, expected = plain(record.get(key)), padded_variant(*case, **how)
            if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                return False
            real = case[3].bool()[:, None, :, None].expand_as(expected)
            if not same(torch.where(real, got, 0.0), torch.where(real, expected, 0.0)):
                return False
        return True
    return detect


def _masked_queries(record) -> bool:
    """Real rows as if only the causal mask applied, padded rows not: the padding mask hit the queries."""
    if not _padded_like(keys=("left",), on_queries=True)(record):
        return False
    got = plain(record.get("left"))
    return not same(got, padded_variant(*pad_case(seed_of(record), "left"), padding=False))


def _nan_rows(record) -> bool:
    got = plain(record.get("left"))
    return isinstance(got, torch.Tensor) and bool(torch.isnan(got).any()) and _padded_like(guard=False)(record)


_FINITE = "no NaN, not even for a token that sees only padding"

PADDED = Exercise(
    id="9.2",
    title="attention over a padded batch",
    answer_name="padded_attention",
    signature="padded_attention(queries, keys, values, attention_mask)",
    probe=_probe_padded,
    checks=(
        Check("returns the context vectors, one per query", lambda record: _padded_got(record, "left")),
        Check("left padding: each real token as its sequence alone", _real_tokens_check("left")),
        Check("right padding too", _real_tokens_check("right")),
        Check(_FINITE, _finite),
        Check("output on the inputs' device", device_check("on", "padded_attention")),
    ),
    mistakes=(
        Mistake("masked-queries",
                "You masked the rows of the padded queries, not the columns of the padded keys: a real token "
                "still reads the padding. attention_mask says which KEYS exist (1 real, 0 padding): "
                "(attention_mask == 0)[:, None, None, :], True where a key is padding, (batch, 1, 1, keys), "
                "broadcasts over heads and queries.",
                _masked_queries),
        Mistake("no-padding-mask",
                "The real tokens read the padding: only the causal mask was applied. Hide the keys where "
                "attention_mask is 0 as well.",
                _padded_like(keys=("left",), padding=False)),
        Mistake("nan-rows",
                "A padded token at the start of a left-padded sequence sees no key at all: its scores are "
                "all -inf and softmax gives 0/0 = NaN, which the next layer spreads to every token. Leave "
                "such rows unmasked (mask & ~mask.all(-1, keepdim=True)), or fill with "
                "torch.finfo(scores.dtype).min instead of -inf, as transformers does.",
                _nan_rows, (_FINITE,)),
        Mistake("no-causal-mask",
                "Your real tokens read the real tokens after them: only the padding was hidden. Padding does "
                "not replace the causal mask: hide the future keys (triu(1)) and the padded ones, joined with |.",
                _padded_like(causal=False)),
        Mistake("scaled-by-d",
                "You divided the scores by d_h; scaled dot-product attention divides them by its square root, "
                "queries.shape[-1] ** 0.5.",
                _padded_like(scale=-1.0)),
        Mistake("filled-with-zero",
                "You filled the hidden scores with 0, but exp(0) = 1: softmax still gives those keys weight. "
                "Fill them with float('-inf'), whose exp is 0 (or torch.finfo(scores.dtype).min).",
                _padded_like(fill=0.0)),
    ),
    shortcuts=package(with_padding, GroupedQueryAttention,
                      why="This is the package's own padding mask: write it yourself."),
)

__all__ = ["ROTATE", "PADDED", "rotate_case", "rotation_variant", "reference_rotation", "pad_case",
           "reference_padded", "padded_variant"]
