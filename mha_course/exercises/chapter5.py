"""Exercises of chapter 5, why several heads: the task's labels, and head scores from attention maps.

The reference for both is the chapter's own package module, :mod:`mha_course.experiments.specialisation`: the
labels of :func:`~mha_course.experiments.specialisation.difference_task` for 5.1, and
:func:`~mha_course.experiments.specialisation.head_scores` of seeded untrained models for 5.2.
"""

from __future__ import annotations

import torch

from ..device import get_device
from ..experiments.specialisation import TinyAttentionModel, difference_task, head_scores, mean_attention_maps
from .framework import (Check, Exercise, Failed, Mistake, Recorder, describe, expect_close, expect_shape,
                        plain, same, tensor_of, value_of)

LABELS = ("sequence",)


def _device_check(key: str, what: str):
    def run(record):
        asked = plain(record["device_asked"])
        got = value_of(record, key, what)
        if got.get("kind") != "tensor":
            raise Failed("a torch.Tensor", describe(got))
        if torch.device(got["device"]).type != torch.device(asked).type:
            raise Failed(f"an output on {asked}, where the input is", f"one on {got['device']}",
                         "Compute with slices and operations of the given tensor: a tensor built anew "
                         "(torch.tensor, torch.zeros) lands on the CPU unless you pass its device.")
    return run


# ----------------------------------------------------------------------------------------------
# 5.1 The labels, by hand

# (batch, num_tokens, vocab_size, seed). "square" has batch = num_tokens - 1, the one size where
# tokens[:, 0] (shape (batch,)) broadcasts against tokens[:, :-1] without an error, to wrong numbers.
DIFFERENCE_CASES = {"book": (4, 8, 8, 41), "square": (7, 8, 8, 42), "other": (3, 5, 12, 43)}


def difference_case(key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, expected)`` of one case: the package's labels turned back into differences."""
    batch, num_tokens, vocab_size, seed = DIFFERENCE_CASES[key]
    tokens, labels = difference_task(batch, num_tokens, vocab_size, seed=seed)  # (B, T) each
    return tokens, labels[:, 1:] - (vocab_size - 1)  # (B, T-1): class index back to x_0 - x_(t-1)


def _probe_differences(first_minus_previous, rec: Recorder) -> None:
    for key in DIFFERENCE_CASES:
        tokens, _ = difference_case(key)
        rec.call(key, first_minus_previous, tokens)
        if key == "book":
            rec.note("book_tokens_after", tokens)  # the answer's own input, after the call
    device = get_device()
    rec.note("device_asked", str(device))
    rec.call("on_device", first_minus_previous, difference_case("book")[0].to(device))


def _call(key: str) -> str:
    batch, num_tokens, _, _ = DIFFERENCE_CASES[key]
    return f"first_minus_previous on {batch} sequences of {num_tokens} tokens"


def _difference_shape(record):
    tokens, expected = difference_case("book")
    expect_shape(tensor_of(record, "book", _call("book")), tuple(expected.shape))


def _difference_values(key: str):
    def run(record):
        _, expected = difference_case(key)
        expect_close(tensor_of(record, key, _call(key)), expected, labels=LABELS)
    return run


def _difference_dtype(record):
    got = tensor_of(record, "book", _call("book"))
    if got.is_floating_point() or got.is_complex() or got.dtype == torch.bool:
        raise Failed("whole numbers (an integer dtype, like the tokens)", f"dtype {str(got.dtype).removeprefix('torch.')}",
                     "Differences of token ids are whole numbers: subtract the token tensors themselves, "
                     "without .float() or a division.")


def _tokens_unchanged(record):
    tokens, _ = difference_case("book")
    after = plain(record["book_tokens_after"])
    if not torch.equal(after, tokens):
        raise Failed("the tokens passed in left as they were", "tokens changed by the call",
                     "An in-place operation (-=, sub_, an assignment into a slice) wrote into the "
                     "tokens you were given. Compute a new tensor: first - previous.")


def _difference_like(fn, key: str = "book"):
    """A detector: the answer on case ``key`` equals ``fn(tokens, expected)``."""
    def detect(record):
        tokens, expected = difference_case(key)
        return same(record[key]["value"], fn(tokens, expected))
    return detect


def _batch_axis_lost(record) -> bool:
    # tokens[:, 0] has shape (B,), which broadcasts against the position axis of (B, T-1): an error
    # for most sizes, silently wrong numbers when B == T-1.
    errors = [record[key] for key in ("book", "other")]
    if any(e["kind"] == "error" and "must match the size" in e["message"] for e in errors):
        return True
    tokens, _ = difference_case("square")
    return same(record["square"]["value"], tokens[:, 0] - tokens[:, :-1])


def _length_fixed(record) -> bool:
    _, expected = difference_case("book")
    _, other = difference_case("other")
    got = record["other"]
    return same(record["book"]["value"], expected) and (
        got["kind"] == "error" or tuple(got["value"].shape) != tuple(other.shape))


def _position_zero_kept(record) -> bool:
    tokens, expected = difference_case("book")
    got = record["book"]["value"]
    return tuple(got.shape) == tuple(tokens.shape) and (same(got[:, 1:], expected) or same(got[:, :-1], expected))


DIFFERENCES = Exercise(
    id="5.1",
    title="the labels of the difference task",
    answer_name="first_minus_previous",
    signature="first_minus_previous(tokens)",
    probe=_probe_differences,
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "book", _call("book"))),
        Check("shape (4, 7) for 4 sequences of 8 tokens", _difference_shape),
        Check("x_0 - x_(t-1) for 4 sequences of 8 tokens", _difference_values("book")),
        Check("7 sequences of 8 tokens", _difference_values("square")),
        Check("3 sequences of 5 tokens from 0..11", _difference_values("other")),
        Check("whole numbers", _difference_dtype),
        Check("the tokens are left unchanged", _tokens_unchanged),
        Check("output on the input's device", _device_check("on_device", "the call on the device")),
    ),
    mistakes=(
        Mistake("sign-flipped",
                "Every difference has the wrong sign: you computed previous - first. The task is the "
                "first token minus the previous one, tokens[:, :1] - tokens[:, :-1].",
                _difference_like(lambda tokens, expected: -expected)),
        Mistake("current-not-previous",
                "You subtracted the token at position t itself. Position t's answer uses the token "
                "before it, x_(t-1): the previous tokens are tokens[:, :-1], not tokens[:, 1:].",
                _difference_like(lambda tokens, expected: tokens[:, :1] - tokens[:, 1:])),
        Mistake("class-indices",
                "Your numbers are the class indices difference + 7 that the labels store. The exercise "
                "asks for the plain differences, from -7 to 7: leave out the + (vocab_size - 1).",
                _difference_like(lambda tokens, expected: expected + 7)),
        Mistake("position-zero-kept",
                "One column too many: position 0 has no previous token, so there are num_tokens - 1 "
                "answers, one for each t = 1 .. T-1, and the last token is nobody's previous token. "
                "Subtract tokens[:, :-1].",
                _position_zero_kept),
        Mistake("batch-axis-lost",
                "tokens[:, 0] has shape (batch,), and broadcasting lines it up with the last axis (the "
                "positions), not with the batch. Keep the axis so that each sequence uses its own "
                "first token: tokens[:, :1] (shape (batch, 1)) or tokens[:, 0].unsqueeze(1).",
                _batch_axis_lost),
        Mistake("length-fixed",
                "Right for 8 tokens, wrong for 5: the length is written into your code. Slice with "
                "tokens[:, :-1] so that any sequence length works.",
                _length_fixed),
    ),
)

# ----------------------------------------------------------------------------------------------
# 5.2 Head scores from attention maps

# (num_heads, num_tokens, seed): the chapter's two heads of 8 tokens, then other sizes. Only the
# 1-head, 3-token case has a single query position (t = 2) with two distinct lookups.
MAP_CASES = {"book": (2, 8, 51), "wide": (4, 6, 52), "short": (1, 3, 53)}
SHARPEN = 6.0  # query weights scaled up so that an untrained model's maps are far from uniform


def map_case(key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(maps, expected)``: a seeded model's mean attention maps ``(h, T, T)`` and its ``head_scores`` ``(h, 2)``."""
    num_heads, num_tokens, seed = MAP_CASES[key]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyAttentionModel(vocab_size=8, num_tokens=num_tokens, d_model=16, num_heads=num_heads)
    with torch.no_grad():
        model.attention.W_query.weight.mul_(SHARPEN)
    tokens, _ = difference_task(32, num_tokens, 8, seed=seed)  # (32, T)
    with torch.no_grad():
        return mean_attention_maps(model, tokens), head_scores(model, tokens)


def _probe_scores(scores_from_maps, rec: Recorder) -> None:
    for key in MAP_CASES:
        maps, _ = map_case(key)
        rec.call(key, scores_from_maps, maps)
    device = get_device()
    rec.note("device_asked", str(device))
    rec.call("on_device", scores_from_maps, map_case("book")[0].to(device))


def _maps_call(key: str) -> str:
    num_heads, num_tokens, _ = MAP_CASES[key]
    return f"scores_from_maps on {num_heads} head(s) of {num_tokens} tokens"


def _scores_shape(key: str):
    def run(record):
        _, expected = map_case(key)
        expect_shape(tensor_of(record, key, _maps_call(key)), tuple(expected.shape))
    return run


def _scores_values(key: str):
    def run(record):
        _, expected = map_case(key)
        expect_close(tensor_of(record, key, _maps_call(key)), expected, labels=("head",))
    return run


def scores_variant(maps: torch.Tensor, *, start: int = 2, previous: int = 1, reduce: str = "mean",
                   order: str = "first-previous", stack_dim: int = 1, queries_as_columns: bool = False):
    """``scores_from_maps`` written out with a chosen mistake; the defaults give the correct result.

    The catalogue of 5.2 runs these variants on the probe's maps and compares them with what the
    learner's function returned.
    """
    num_tokens = maps.shape[-1]
    queries = torch.arange(start, num_tokens)  # (Q,) query positions averaged over
    if queries_as_columns:  # maps read as [head, key, query]
        on_first, on_previous = maps[:, 0, queries], maps[:, queries - previous, queries]  # (h, Q) each
    else:
        on_first, on_previous = maps[:, queries, 0], maps[:, queries, queries - previous]  # (h, Q) each
    pool = {"mean": lambda t: t.mean(dim=1), "sum": lambda t: t.sum(dim=1)}[reduce]
    columns = [pool(on_first), pool(on_previous)]  # (h,) each
    if order == "previous-first":
        columns.reverse()
    return torch.stack(columns, dim=stack_dim)  # (h, 2), or (2, h) with stack_dim=0


def _scores_like(**how):
    def detect(record):
        return all(same(record[key]["value"], scores_variant(map_case(key)[0], **how)) for key in ("book", "wide"))
    return detect


def _first_over_every_row(record) -> bool:
    # Column 0 averaged over all T query rows (row 0 always puts 1 on key 0), whatever column 1 is.
    return all(same(record[key]["value"][:, 0], map_case(key)[0][:, :, 0].mean(dim=1)) for key in ("book", "wide"))


def _size_fixed(record) -> bool:
    # Right for the chapter's 8 tokens, an error or other numbers for 6 and 3 tokens.
    _, expected = map_case("book")
    return same(record["book"]["value"], expected) and any(
        record[key]["kind"] == "error" or not same(record[key]["value"], map_case(key)[1]) for key in ("wide", "short"))


def _returned_pair(record) -> bool:
    got = plain(record["book"])
    _, expected = map_case("book")
    return (isinstance(got, list) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
            and same(got[0], expected[:, 0]) and same(got[1], expected[:, 1]))


SCORES = Exercise(
    id="5.2",
    title="head scores from attention maps",
    answer_name="scores_from_maps",
    signature="scores_from_maps(maps)",
    probe=_probe_scores,
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "book", _maps_call("book"))),
        Check("shape (2, 2) for 2 heads of 8 tokens", _scores_shape("book")),
        Check("the scores of 2 heads of 8 tokens", _scores_values("book")),
        Check("shape (4, 2) for 4 heads of 6 tokens", _scores_shape("wide")),
        Check("the scores of 4 heads of 6 tokens", _scores_values("wide")),
        Check("the scores of 1 head of 3 tokens (one query position, t = 2)", _scores_values("short")),
        Check("output on the input's device", _device_check("on_device", "the call on the device")),
    ),
    mistakes=(
        Mistake("returned-pair",
                "You returned the two columns separately. Stack them into one (num_heads, 2) tensor, "
                "one row per head: torch.stack([on_first, on_previous], dim=1).",
                _returned_pair),
        Mistake("from-position-1",
                "You averaged from query position 1. There the previous token is the first token, so "
                "one weight counts as both lookups; the scores start at t = 2, where the two tokens sit "
                "in different places: torch.arange(2, num_tokens).",
                _scores_like(start=1)),
        Mistake("every-position",
                "You averaged over every query position, 0 included. Position 0 sees only itself and at "
                "position 1 the first and the previous token coincide: average over t = 2 .. T-1 only.",
                _first_over_every_row),
        Mistake("diagonal",
                "Your second column is each query's weight on itself, the diagonal maps[:, t, t]. The "
                "previous token of query t is key t - 1, one step below the diagonal: maps[:, t, t - 1].",
                _scores_like(previous=0)),
        Mistake("columns-swapped",
                "Your two columns are swapped: column 0 is the share on the first token (key 0), "
                "column 1 the share on the previous token (key t - 1).",
                _scores_like(order="previous-first")),
        Mistake("transposed",
                "Your result is transposed: (2, num_heads) instead of one row per head. Stack the two "
                "(num_heads,) columns with torch.stack([...], dim=1).",
                _scores_like(stack_dim=0)),
        Mistake("queries-as-columns",
                "You read the maps as [head, key, query]. maps[h, t, j] is query t's weight on key j: "
                "rows are queries, so the weight on the first token is maps[:, t, 0] (the causal mask "
                "makes maps[:, 0, t] zero for every t > 0).",
                _scores_like(queries_as_columns=True)),
        Mistake("summed",
                "You added the weights over the query positions instead of averaging them, so the "
                "shares can exceed 1. Take the mean over the positions t = 2 .. T-1.",
                _scores_like(reduce="sum")),
        Mistake("size-fixed",
                "Right for the chapter's 8 tokens, wrong for other sizes: a length or head count is "
                "written into your code. Read them from the maps: num_tokens = maps.shape[-1].",
                _size_fixed),
    ),
)

EXERCISES = (DIFFERENCES, SCORES)

__all__ = ["EXERCISES", "difference_case", "map_case", "scores_variant"]
