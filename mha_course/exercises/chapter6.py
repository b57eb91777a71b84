"""Exercises of chapter 6, sharing keys and values: expand key/value heads, one cached step, a cache's size.

The references are the package's: ``repeat_interleave`` as :class:`~mha_course.GroupedQueryAttention`
uses it (6.1, which asks for another way and refuses ``repeat_interleave``), the module itself with a :class:`~mha_course.KVCache` (6.2) and
:func:`mha_course.cost.kv_cache_bytes` (6.3). An answer that calls the module, the cache's
``append`` or the cost formulas is refused (see :mod:`~mha_course.exercises.shortcuts`).
"""

from __future__ import annotations

import copy

import torch

from .. import cost
from ..attention.grouped_query import GroupedQueryAttention
from ..attention.heads import merge_heads, split_heads
from ..attention.kv_cache import KVCache
from .framework import Check, Exercise, Mistake
from .guard import names_in
from .probes import agrees, case_seed, chooser, device_check, error_on_device, generator, probe_on_devices
from .records import (Failed, Recorder, describe, expect_close, expect_close_from, expect_shape, format_shape, int_of, number, number_text, plain,
                      raised, same, seed_of, tensor_of, value_of)
from .shortcuts import attention_modules, package

DEVICE_HINT = ("Build new tensors from the inputs (torch.cat, expand, the module's layers): a tensor "
               "made anew (torch.zeros, torch.tensor) lands on the CPU unless you pass its device.")


# ----------------------------------------------------------------------------------------------
# 6.1 Expand the key/value heads to the query heads


def expand_case(seed: int, key: str) -> tuple[torch.Tensor, int]:
    """``(kv, num_heads)`` of one case of 6.1, drawn from ``seed``.

    ``readable``: two key/value heads of one number each, easy to follow in a message;
    ``grouped``: 2 or 3 key/value heads serving a different number of query heads each;
    ``multi-query``: one key/value head; ``multi-head``: as many as query heads.
    """
    draw, g = chooser(seed, f"6.1 {key}"), generator(seed, f"6.1 {key}")
    if key == "readable":
        values = draw.sample(range(1, 10), 2)
        return torch.tensor(values, dtype=torch.float32).view(1, 2, 1, 1), 2 * draw.randint(2, 4)
    if key == "grouped":
        groups = draw.choice([2, 3])
        size = draw.choice([r for r in (2, 3, 4) if r != groups])  # repeating by the groups would give other shapes
        batch, tokens, head_dim = draw.randint(1, 2), draw.randint(1, 4), draw.randint(1, 3)
        return torch.randn(batch, groups, tokens, head_dim, generator=g), groups * size
    if key == "multi-query":
        return torch.randn(draw.randint(1, 2), 1, draw.randint(1, 4), 2, generator=g), draw.randint(2, 6)
    heads = draw.randint(2, 4)
    return torch.randn(1, heads, draw.randint(1, 4), 3, generator=g), heads


EXPAND_CASES = ("readable", "grouped", "multi-query", "multi-head")


def reference_expand(kv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What :class:`~mha_course.GroupedQueryAttention` does: each key/value head repeated for its group."""
    return kv.repeat_interleave(num_heads // kv.shape[1], dim=1)  # (B, h, T, d_h)


#: The record key that says whether 6.1's answer called repeat_interleave, the listing's own way.
REPEAT_INTERLEAVE_KEY = "called repeat_interleave"


def _probe_expand(expand_kv_heads, rec: Recorder) -> None:
    for key in EXPAND_CASES:
        rec.call(key, expand_kv_heads, *expand_case(rec.seed, key))
    rec.note(REPEAT_INTERLEAVE_KEY, "repeat_interleave" in names_in(expand_kv_heads))
    kv, num_heads = expand_case(rec.seed, "grouped")
    probe_on_devices(rec, "on", lambda device: expand_kv_heads(kv.to(device), num_heads))


def _expand_got(record, key: str):
    """``(the answer's tensor, the reference's, the call)`` of case ``key``."""
    kv, num_heads = expand_case(seed_of(record), key)
    call = f"expand_kv_heads(kv of shape {format_shape(kv.shape)}, num_heads={num_heads})"
    return tensor_of(record, key, call), reference_expand(kv, num_heads), call


def _expand_check(key: str, values: bool = True):
    """The shape of case ``key`` and, with ``values``, its numbers."""
    def run(record):
        got, expected, call = _expand_got(record, key)
        try:
            expect_shape(got, tuple(expected.shape))
            if values:
                expect_close(got, expected, labels=("sequence", "head", "token"))
        except Failed as failure:
            raise Failed(f"{failure.expected} from {call}", failure.got) from None
    return run


def _readable_values(record):
    got, expected, call = _expand_got(record, "readable")
    if not same(got, expected):
        def show(t):
            return "[" + ", ".join(f"{v:g}" for v in t.reshape(-1).tolist()) + "]"
        kv, num_heads = expand_case(seed_of(record), "readable")
        raise Failed(f"query heads 1..{num_heads} to read {show(expected)} from key/value heads {show(kv)} "
                     f"({call})", show(got))


def _no_repeat_interleave(record):
    if plain(record.get(REPEAT_INTERLEAVE_KEY)):
        raise Failed("a way of your own, without repeat_interleave", "a call to repeat_interleave",
                     "repeat_interleave is the chapter's listing, line for line: the exercise asks for another way. "
                     "Work out where a new axis of size num_heads // num_kv_groups must go so that each key/value "
                     "head's copies come right after it; expand stretches an axis of size 1 without copying.")


def _expand_like(fn, keys=("readable", "grouped")):
    """A detector: on every case of ``keys`` the answer returned ``fn(kv, num_heads)``."""
    def detect(record):
        return all(same(plain(record[key]), fn(*expand_case(seed_of(record), key))) for key in keys)
    return detect


def _expand_only_for_one_group(record) -> bool:
    # kv.expand(-1, num_heads, -1, -1) stretches an axis of size 1 only: right for multi-query, an error otherwise.
    return raised(record, "grouped", "expanded size") and _expand_like(reference_expand, keys=("multi-query",))(record)


EXPAND = Exercise(
    id="6.1",
    title="expand the key/value heads",
    answer_name="expand_kv_heads",
    signature="expand_kv_heads(kv, num_heads)",
    probe=_probe_expand,
    checks=(
        Check("returns a tensor", lambda r: _expand_got(r, "readable"), gate=True),
        Check("one head per query head, shape (batch, num_heads, num_tokens, head_dim)",
              _expand_check("readable", values=False)),
        Check("each query head reads the key/value head of its group", _readable_values),
        Check("shape with 2 or 3 key/value heads", _expand_check("grouped", values=False)),
        Check("values with 2 or 3 key/value heads", _expand_check("grouped")),
        Check("multi-query: one key/value head for every query head", _expand_check("multi-query")),
        Check("multi-head: as many key/value heads as query heads", _expand_check("multi-head")),
        Check("output on the input's device", device_check("on", "expand_kv_heads", DEVICE_HINT)),
        Check("written without repeat_interleave", _no_repeat_interleave),
    ),
    mistakes=(
        Mistake("repeat",
                "You tiled the key/value heads (KV1 KV2 KV1 KV2 ...), which is what Tensor.repeat does: the "
                "second query head then reads the second key/value head, although it belongs to the "
                "first group. Each key/value head serves the num_heads // num_kv_groups CONSECUTIVE query heads of its "
                "group (KV1 KV1 KV2 KV2 ...): each key/value head's copies must come right after it.",
                _expand_like(lambda kv, h: kv.repeat(1, h // kv.shape[1], 1, 1))),
        Mistake("repeated-num-heads",
                "You repeated every key/value head num_heads times, which gives num_kv_groups * num_heads "
                "heads. Each one serves only the query heads of its group: repeat it "
                "num_heads // num_kv_groups times (num_kv_groups = kv.shape[1]).",
                _expand_like(lambda kv, h: kv.repeat_interleave(h, dim=1), keys=("grouped",))),
        Mistake("repeated-num-groups",
                "You repeated every key/value head num_kv_groups times. The number of copies is the size "
                "of a group, num_heads // num_kv_groups: the two only agree when the groups are as many "
                "as the heads in each.",
                _expand_like(lambda kv, h: kv.repeat_interleave(kv.shape[1], dim=1), keys=("grouped",))),
        Mistake("token-axis",
                "You repeated along the token axis (dim=2). The heads are axis 1 of "
                "(batch, num_kv_groups, num_tokens, head_dim): repeat them along that axis.",
                _expand_like(lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=2))),
        Mistake("feature-axis",
                "You repeated along the last axis, the head's features (dim=-1). The heads are axis 1 of "
                "(batch, num_kv_groups, num_tokens, head_dim): repeat them along that axis.",
                _expand_like(lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=-1))),
        Mistake("expand-one-group",
                "Tensor.expand stretches only an axis of size 1, so it works for multi-query attention "
                "(one key/value head) and fails for more. Give each key/value head a new axis of size 1 "
                "to stretch, right after the head axis, then fold the two axes into one with reshape.",
                _expand_only_for_one_group),
        Mistake("index-on-cpu",
                "Your tensor of head indices was made on the CPU (torch.arange without a device), while kv "
                "may be on a GPU, which refuses to index with it in index_select or gather. Make it where "
                "kv is: torch.arange(num_heads, device=kv.device).",
                lambda record: bool(plain(record.get("on@meta:mixed"))), ("output on the input's device",)),
    ),
    # The module repeats inline, with repeat_interleave: the last check refuses that call, not a package function.
    shortcuts=(),
)

# ----------------------------------------------------------------------------------------------
# 6.2 One cached decoding step

#: The cases of 6.2: grouped-query with biases, multi-query, multi-head, and the first token.
STEP_CASES = ("grouped", "multi-query", "multi-head", "first")


def step_case(seed: int, key: str):
    """``(gqa, x, num_cached)`` of one case of 6.2, drawn from ``seed``: a seeded module in eval mode
    and a ``(batch, num_cached + 1, d_in)`` sequence whose last token is the new one."""
    draw = chooser(seed, f"6.2 {key}")
    groups, size, bias, cached = {  # key/value heads, query heads per key/value head, qkv_bias, cached tokens
        "grouped": lambda: (draw.choice([2, 3]), draw.choice([2, 3]), True, draw.randint(2, 6)),
        "multi-query": lambda: (1, draw.randint(2, 4), False, draw.randint(1, 5)),
        "multi-head": lambda: (draw.randint(2, 3), 1, False, draw.randint(1, 5)),
        "first": lambda: (2, 2, True, 0)}[key]()
    batch, head_dim, d_in = draw.randint(1, 2), draw.randint(2, 4), draw.randint(3, 6)
    heads = groups * size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case_seed(seed, f"6.2 {key} weights"))
        gqa = GroupedQueryAttention(d_in, heads * head_dim, cached + 1, 0.0, heads, groups, qkv_bias=bias).eval()
    x = torch.randn(batch, cached + 1, d_in, generator=generator(seed, f"6.2 {key} x"))
    return gqa, x, cached


def step_inputs(gqa: GroupedQueryAttention, x: torch.Tensor, num_cached: int):
    """``(x_new, past_keys, past_values)``: the last token, and the keys and values of the ones before it."""
    with torch.no_grad():
        past = [split_heads(layer(x[:, :num_cached]), gqa.num_kv_groups)  # (B, g, T, d_h)
                for layer in (gqa.W_key, gqa.W_value)]
    return x[:, num_cached:], *past


def step_expected(gqa: GroupedQueryAttention, x: torch.Tensor, num_cached: int):
    """``(output, keys, values)`` of the step, from the package: recompute the whole sequence."""
    cache = KVCache()
    with torch.no_grad():
        output = gqa(x, cache=cache)[:, -1:]  # (B, 1, d_out)
    return output, cache.keys, cache.values


@torch.no_grad()
def step_variant(gqa: GroupedQueryAttention, x_new, past_keys, past_values, *, expand: str = "interleave",
                 scale: bool | str = True, attend_new: bool = True, new_first: bool = False, out_proj: bool = True,
                 biases: tuple[str, ...] = ("qkv", "out"), softmax_dim: int = -1, first_position_only: bool = False,
                 append: bool = True):
    """``decode_step`` written out with a chosen mistake (the catalogue of 6.2); the defaults give the correct step."""
    def project(layer, t, which="qkv"):
        return t @ layer.weight.T + (layer.bias if which in biases and layer.bias is not None else 0)

    queries = split_heads(project(gqa.W_query, x_new), gqa.num_heads)  # (B, h, 1, d_h)
    new_keys = split_heads(project(gqa.W_key, x_new), gqa.num_kv_groups)  # (B, g, 1, d_h)
    new_values = split_heads(project(gqa.W_value, x_new), gqa.num_kv_groups)  # (B, g, 1, d_h)
    parts = (lambda past, new: [new, past]) if new_first else (lambda past, new: [past, new])
    keys = torch.cat(parts(past_keys, new_keys), dim=2)  # (B, g, start + 1, d_h)
    values = torch.cat(parts(past_values, new_values), dim=2)  # (B, g, start + 1, d_h)
    read_keys, read_values = (keys, values) if attend_new else (past_keys, past_values)
    r = gqa.group_size
    if expand == "interleave":  # KV1 KV1 KV2 KV2 ...: (B, h, start + 1, d_h)
        read_keys, read_values = (t.repeat_interleave(r, dim=1) for t in (read_keys, read_values))
    else:  # "repeat": KV1 KV2 KV1 KV2 ...
        read_keys, read_values = (t.repeat(1, r, 1, 1) for t in (read_keys, read_values))
    scores = queries @ read_keys.transpose(2, 3)  # (B, h, 1, start + 1)
    if scale:
        scores = scores / (gqa.d_out if scale == "d_out" else gqa.head_dim)**0.5
    if first_position_only:
        scores[..., 1:] = float("-inf")
    weights = torch.softmax(scores, dim=softmax_dim)
    context = merge_heads(weights @ read_values)  # (B, 1, d_out)
    output = project(gqa.out_proj, context, "out") if out_proj else context
    return (output, keys, values) if append else (output, past_keys, past_values)


def _probe_step(decode_step, rec: Recorder) -> None:
    for key in STEP_CASES:
        gqa, x, cached = step_case(rec.seed, key)
        x_new, past_keys, past_values = step_inputs(gqa, x, cached)
        rec.call(key, decode_step, gqa, x_new, past_keys.clone(), past_values.clone())
    gqa, x, cached = step_case(rec.seed, "grouped")
    inputs = step_inputs(gqa, x, cached)
    probe_on_devices(rec, "on", lambda device: decode_step(copy.deepcopy(gqa).to(device),
                                                           *(t.to(device) for t in inputs))[0])


def _step_call(gqa, x, cached) -> str:
    shared = (f"{gqa.num_heads} query heads in {gqa.num_kv_groups} group{'s' if gqa.num_kv_groups > 1 else ''}"
              f", head_dim {gqa.head_dim}")
    return (f"decode_step on {x.shape[0]} sequence{'s' if x.shape[0] > 1 else ''} with {cached} cached "
            f"token{'s' if cached != 1 else ''} ({shared})")


def _step_parts(record, key: str):
    """The learner's ``(output, keys, values)`` for case ``key``; a :class:`Failed` unless it is three tensors."""
    gqa, x, cached = step_case(seed_of(record), key)
    summary = value_of(record, key, _step_call(gqa, x, cached))
    parts = summary.get("value") if summary.get("kind") == "sequence" else None
    if not parts or len(parts) != 3 or any(p.get("kind") != "tensor" for p in parts):
        raise Failed("a tuple (output, keys, values) of three tensors", describe(summary))
    return [p["value"] for p in parts], (gqa, x, cached)


def _step_shapes(record):
    (output, keys, values), (gqa, x, cached) = _step_parts(record, "grouped")
    expected = step_expected(gqa, x, cached)
    for name, got, want in zip(("output", "keys", "values"), (output, keys, values), expected):
        if tuple(got.shape) != tuple(want.shape):
            raise Failed(f"{name} of shape {format_shape(want.shape)} from {_step_call(gqa, x, cached)}",
                         f"{name} of shape {format_shape(got.shape)}")


def _step_part(index: int, key: str, name: str, labels: tuple[str, ...]):
    """The check of part ``index`` of the answer (0 the output, 1 the keys, 2 the values) on case ``key``."""
    def run(record):
        parts, (gqa, x, cached) = _step_parts(record, key)
        expect_close_from(parts[index], step_expected(gqa, x, cached)[index], _step_call(gqa, x, cached), labels, name)
    return run


_CACHE_LABELS, _TOKEN_LABELS = ("sequence", "key/value head", "position"), ("sequence", "token")


def _step_like(part: int = 0, key: str = "grouped", **how):
    """A detector: part ``part`` of the answer on case ``key`` equals the variant with mistake ``how``."""
    def detect(record):
        gqa, x, cached = step_case(seed_of(record), key)
        got = plain(record[key])[part]
        return same(got, step_variant(gqa, *step_inputs(gqa, x, cached), **how)[part])
    return detect


def _appended_twice(record) -> bool:
    gqa, x, cached = step_case(seed_of(record), "grouped")
    keys = plain(record["grouped"])[1]
    return isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.shape[2] == cached + 2


STEP = Exercise(
    id="6.2",
    title="one cached decoding step",
    answer_name="decode_step",
    signature="decode_step(gqa, x_new, past_keys, past_values)",
    probe=_probe_step,
    checks=(
        Check("returns (output, keys, values)", lambda r: _step_parts(r, "grouped")),
        Check("shapes: output (batch, 1, d_out), keys and values (batch, num_kv_groups, start + 1, head_dim)",
              _step_shapes),
        Check("keys: the cached ones, then the new token's", _step_part(1, "grouped", "keys", _CACHE_LABELS)),
        Check("values: the cached ones, then the new token's", _step_part(2, "grouped", "values", _CACHE_LABELS)),
        *(Check(f"the new token's output, {kind}", _step_part(0, key, "the new token's output", _TOKEN_LABELS))
          for key, kind in (("grouped", "grouped-query"), ("multi-query",) * 2, ("multi-head",) * 2)),
        Check("the first token of a sequence (an empty cache)",
              _step_part(0, "first", "the new token's output", _TOKEN_LABELS)),
        Check("output on the input's device", device_check("on", "decode_step", DEVICE_HINT)),
    ),
    mistakes=(
        Mistake("keys-not-appended",
                "You returned the cached keys as they were: the next step must find this token's key and "
                "value too. Return torch.cat([past_keys, new_keys], dim=2) and the same for values.",
                _step_like(1, append=False)),
        Mistake("appended-twice",
                "Your keys and values hold the new token twice: start + 2 positions where the cache should "
                "grow by one. Append the new key and value once, torch.cat([past_keys, new_keys], dim=2), "
                "and return that same tensor.",
                _appended_twice),
        Mistake("new-token-first",
                "Your keys and values put the new token first. The cache keeps positions in order, so "
                "the new token goes last: torch.cat([past_keys, new_keys], dim=2).",
                _step_like(1, new_first=True)),
        Mistake("new-token-not-attended",
                "The new token attended only to the cached tokens, not to itself. Append its key and "
                "value to the cache BEFORE the scores: a token sees itself and everything before it.",
                _step_like(attend_new=False)),
        Mistake("repeat-not-interleave",
                "Your key/value heads are paired with the wrong query heads: Tensor.repeat tiles them "
                "(KV1 KV2 KV1 KV2 ...), but each one serves the consecutive query heads of its group "
                "(KV1 KV1 KV2 KV2 ...). Use repeat_interleave(gqa.group_size, dim=1).",
                _step_like(expand="repeat")),
        Mistake("no-scale",
                "The scores are not scaled: divide them by sqrt(head_dim) before the softmax, "
                "gqa.head_dim ** 0.5.",
                _step_like(scale=False)),
        Mistake("scale-d-out",
                "You divided the scores by sqrt(d_out), the width of all heads together. Each head's "
                "scores are divided by the square root of its own width: gqa.head_dim ** 0.5.",
                _step_like(scale="d_out")),
        Mistake("no-out-proj",
                "You returned the merged heads without the output projection: finish with "
                "gqa.out_proj(context).",
                _step_like(out_proj=False)),
        Mistake("bias-ignored",
                "Your projections leave out the biases (this layer has qkv_bias=True). Call the layers "
                "themselves, gqa.W_query(x_new), rather than multiplying by their weights.",
                lambda r: _step_like(biases=())(r) or _step_like(biases=("out",))(r)),  # out_proj called itself
        Mistake("softmax-over-queries",
                "The softmax ran over the query axis, which has one entry, so every weight became 1. "
                "Normalise over the keys, the last axis: torch.softmax(scores, dim=-1).",
                _step_like(softmax_dim=-2)),
        Mistake("mask-row-of-first-token",
                "You masked the scores with the first row of the causal mask, which lets the new token "
                "see only the first position. The new token is the LAST position: it sees every cached position "
                "and itself, so one new token needs no mask at all.",
                _step_like(first_position_only=True)),
        Mistake("cpu-tensor",
                "Your step makes a tensor on the CPU (torch.zeros, torch.tensor, torch.arange... without a "
                "device) and uses it with the inputs, which may be on a GPU. Make it where the inputs are, "
                "device=x_new.device, or build it from the inputs.",
                lambda record: bool(plain(record.get("on@meta:mixed")))
                or error_on_device(record, "on", "same device", "expected device", "Expected all tensors"),
                ("output on the input's device",)),
    ),
    shortcuts=attention_modules(keep=(GroupedQueryAttention,))
    + package(GroupedQueryAttention, why="Calling gqa (or its attention_weights) runs the module's own attention. "
              "Compute the step from its layers: gqa.W_query(x_new), gqa.W_key, gqa.W_value, then gqa.out_proj.")
    + package(KVCache.append, why="KVCache.append is the package's cache. Append the new token's keys and "
              "values yourself: torch.cat([past_keys, new_keys], dim=2)."),
)

# ----------------------------------------------------------------------------------------------
# 6.3 Predict a model's cache size

#: The argument names of 6.3, in order.
SIZE_ARGUMENTS = ("num_layers", "num_heads", "num_kv_groups", "head_dim", "num_tokens", "batch_size",
                  "bytes_per_number")


def size_variant(num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number, *,
                 mistake: str | None = None) -> float:
    """``kv_cache_size`` with a chosen mistake (``None``: the right number of bytes)."""
    kv_heads = {"query-heads": num_heads, "group-size": num_heads // num_kv_groups}.get(mistake, num_kv_groups)
    size = (1 if mistake == "keys-only" else 2) * kv_heads * head_dim * bytes_per_number
    size *= 1 if mistake == "one-layer" else num_layers
    size *= 1 if mistake == "batch-ignored" else batch_size
    size *= {"per-token": 1, "tokens-squared": num_tokens**2}.get(mistake, num_tokens)
    size *= 8 if mistake == "bits" else 1
    return size / 2**20 if mistake == "mib" else size


#: The catalogue of 6.3, each mistake's message (:func:`size_variant` gives its number).
SIZE_MESSAGES = {
    "mib": "You returned MiB; the exercise asks for bytes. Leave out the division by 2**20.",
    "keys-only": "Half the right size: the cache holds a key AND a value for every token, head and layer "
        "(the factor 2).",
    "query-heads": "You counted the query heads. Queries are never cached, and the key/value heads are "
        "num_kv_groups, not num_heads: that is the whole saving of grouped-query attention.",
    "group-size": "You used num_heads // num_kv_groups, the query heads that share one key/value head. The "
        "cache holds one key and one value per group: num_kv_groups heads.",
    "one-layer": "That is one layer's cache. Every attention layer keeps its own: multiply by num_layers.",
    "batch-ignored": "That is one sequence's cache. Every sequence of the batch has its own: multiply by "
        "batch_size.",
    "per-token": "That is the cache of one token. It grows with every token held: multiply by num_tokens.",
    "tokens-squared": "You multiplied by num_tokens squared, as for a score tensor. The cache holds one key "
        "and one value per token: it grows in proportion to num_tokens, not its square.",
    "bits": "Eight times too much: you counted bits. bytes_per_number is already in bytes "
        "(2 for float16, 4 for float32).",
}
SIZE_MISTAKES = tuple(SIZE_MESSAGES)
SIZE_CASES = ("model", "another model", "multi-query", "multi-head")


def size_case(seed: int, key: str) -> tuple[int, ...]:
    """The arguments of one call of 6.3, drawn from ``seed``; for ``model`` and ``another model``
    every catalogued mistake gives a number of its own."""
    draw = chooser(seed, f"6.3 {key}")
    while True:
        heads = draw.choice([8, 12, 16, 24, 32, 40, 48, 64])
        groups = {"multi-query": 1, "multi-head": heads}.get(
            key, draw.choice([g for g in range(2, heads) if heads % g == 0]))
        args = (draw.randint(2, 48), heads, groups, draw.choice([32, 64, 80, 96, 128]), draw.randint(100, 32768),
                draw.randint(2, 16), draw.choice([1, 2, 4]))
        if key not in ("model", "another model"):
            return args
        numbers = [size_variant(*args)] + [size_variant(*args, mistake=m) for m in SIZE_MISTAKES]
        if len(set(numbers)) == len(numbers):
            return args


def _size_call(args) -> str:
    return "kv_cache_size(" + ", ".join(f"{n}={v}" for n, v in zip(SIZE_ARGUMENTS, args)) + ")"


def _probe_size(kv_cache_size, rec: Recorder) -> None:
    for key in SIZE_CASES:
        rec.call(key, kv_cache_size, *size_case(rec.seed, key))


def _size_check(key: str, value: bool = True):
    """A whole number of bytes for case ``key`` and, with ``value``, the right one."""
    def run(record):
        args = size_case(seed_of(record), key)
        try:
            got = int_of(record, key, _size_call(args))
        except Failed as failure:
            raise Failed(f"a whole number of bytes from {_size_call(args)}", failure.got) from None
        expected = cost.kv_cache_bytes(args[0], args[2], args[3], args[4], args[5], args[6])
        if value and got != expected:
            raise Failed(f"{expected:,} bytes from {_size_call(args)}", number_text(record[key]))
    return run


def _size_like(mistake: str):
    def detect(record):
        return all(agrees(number(record[key]), size_variant(*size_case(seed_of(record), key), mistake=mistake),
                          relative=1e-9) for key in ("model", "another model"))
    return detect


SIZE = Exercise(
    id="6.3",
    title="predict a model's cache size",
    answer_name="kv_cache_size",
    signature="kv_cache_size(" + ", ".join(SIZE_ARGUMENTS) + ")",
    probe=_probe_size,
    checks=(
        Check("returns a whole number of bytes", _size_check("model", value=False), gate=True),
        Check("the cache of a grouped-query model", _size_check("model")),
        Check("the cache of another grouped-query model", _size_check("another model")),
        Check("multi-query: one key/value head", _size_check("multi-query")),
        Check("multi-head: a key/value head per query head", _size_check("multi-head")),
    ),
    mistakes=tuple(Mistake(key, message, _size_like(key)) for key, message in SIZE_MESSAGES.items()),
    shortcuts=package(cost.kv_cache_bytes_per_token, cost.kv_cache_bytes, cost.kv_cache_sizes),
)

EXERCISES = (EXPAND, STEP, SIZE)

__all__ = ["EXERCISES", "expand_case", "reference_expand", "step_case", "step_inputs", "step_expected", "step_variant",
           "size_case", "size_variant"]
