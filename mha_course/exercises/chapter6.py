"""Exercises of chapter 6, sharing keys and values: expand key/value heads, one cached step, a cache's size.

Every check draws its inputs afresh (a seed per run, written into the record so that the judge,
in another process, rebuilds the same inputs), so a number copied from a failure message does
not pass the next run. Each failure names the call, the learner's input and both results.

The references are the package's: ``repeat_interleave`` as :class:`~mha_course.GroupedQueryAttention`
uses it (6.1), the module itself with a :class:`~mha_course.KVCache` (6.2) and
:func:`mha_course.cost.kv_cache_bytes` (6.3). An answer that calls those for the exercise it is
asked to write (the module's forward, the cache's ``append``, the cost formulas) is refused: the
probe watches which functions run while the answer does, and compares their code with the
package's (:func:`package_calls`).
"""

from __future__ import annotations

import contextlib
import random
import secrets
import sys
from pathlib import Path

import torch

from .. import cost
from ..device import get_device
from ..grouped_query import GroupedQueryAttention
from ..heads import merge_heads, split_heads
from ..kv_cache import KVCache
from .framework import (Check, Exercise, Failed, Mistake, Recorder, describe, expect_close, expect_shape,
                        format_shape, plain, same, tensor_of, value_of)

# ----------------------------------------------------------------------------------------------
# What every exercise of the chapter shares: a seed per run, and the package calls it refuses


def draw_seed() -> int:
    """A fresh seed for one run of a check (not the global random state, which checks leave alone)."""
    return secrets.randbelow(2**31)


#: The package's functions that do an exercise's work: (file, qualified name) -> how a message names it.
PACKAGE_ANSWERS = {
    ("grouped_query.py", "GroupedQueryAttention.forward"): "GroupedQueryAttention's forward (calling the module)",
    ("grouped_query.py", "GroupedQueryAttention._weights_and_values"): "GroupedQueryAttention's attention",
    ("grouped_query.py", "GroupedQueryAttention.attention_weights"): "GroupedQueryAttention.attention_weights",
    ("kv_cache.py", "KVCache.append"): "KVCache.append",
    ("cost.py", "kv_cache_bytes_per_token"): "mha_course.cost.kv_cache_bytes_per_token",
    ("cost.py", "kv_cache_bytes"): "mha_course.cost.kv_cache_bytes",
    ("cost.py", "kv_cache_sizes"): "mha_course.cost.kv_cache_sizes",
}
_PACKAGE_CODE = {fn.__code__ for fn in (GroupedQueryAttention.forward, GroupedQueryAttention._weights_and_values,
                                        GroupedQueryAttention.attention_weights.__wrapped__, KVCache.append,
                                        cost.kv_cache_bytes_per_token, cost.kv_cache_bytes, cost.kv_cache_sizes)}


def package_answer(code) -> str | None:
    """How a message names ``code`` if it is one of :data:`PACKAGE_ANSWERS`, else ``None``.

    Matched by the code object itself or by its file and qualified name, so a second copy of the
    package (the grader's) counts too.
    """
    path = Path(code.co_filename)
    name = PACKAGE_ANSWERS.get((path.name, code.co_qualname))
    if name is not None and (code in _PACKAGE_CODE or path.parent.name == "mha_course"):
        return name
    return None


@contextlib.contextmanager
def package_calls():
    """Collect, while the block runs, the names of the package functions of :data:`PACKAGE_ANSWERS` it calls.

    Example:
        >>> with package_calls() as seen:
        ...     _ = cost.kv_cache_bytes(2, 2, 4, num_tokens=3)
        >>> seen
        ['mha_course.cost.kv_cache_bytes', 'mha_course.cost.kv_cache_bytes_per_token']
    """
    seen: list[str] = []
    previous = sys.getprofile()

    def watch(frame, event, arg):
        if event == "call":
            name = package_answer(frame.f_code)
            if name is not None and name not in seen:
                seen.append(name)

    sys.setprofile(watch)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def _call_watched(rec: Recorder, key: str, fn, *args):
    """``rec.call`` with the package calls it made recorded under ``key + ":package"``."""
    with package_calls() as seen:
        result = rec.call(key, fn, *args)
    rec.note(f"{key}:package", seen)
    return result


def _own_work(*keys: str, what: str):
    def run(record):
        for key in keys:
            called = plain(record.get(f"{key}:package", {"kind": "sequence", "value": []})) or []
            if called:
                raise Failed(f"{what} computed by your own code", f"a call to {called[0]}",
                             "The exercise is to compute it yourself; the package's version is what the "
                             "check compares your answer with.")
    return run


def _device_check(key: str, what: str):
    def run(record):
        asked = plain(record["device_asked"])
        got = value_of(record, key, what)
        if got.get("kind") == "sequence" and got["value"]:
            got = got["value"][0]
        if got.get("kind") != "tensor":
            raise Failed("a torch.Tensor", describe(got))
        if torch.device(got["device"]).type != torch.device(asked).type:
            raise Failed(f"an output on {asked}, where the input is", f"one on {got['device']}",
                         "Build new tensors from the inputs (torch.cat, repeat_interleave, the module's "
                         "layers): a tensor made anew (torch.zeros, torch.tensor) lands on the CPU unless "
                         "you pass its device.")
    return run


def _seed(record) -> int:
    return int(plain(value_of(record, "seed", "the probe")))


# ----------------------------------------------------------------------------------------------
# 6.1 Expand the key/value heads to the query heads


def expand_case(seed: int, key: str) -> tuple[torch.Tensor, int]:
    """``(kv, num_heads)`` of one case of 6.1, drawn from ``seed``.

    ``readable``: two key/value heads of one number each, easy to follow in a message;
    ``grouped``: 2 or 3 key/value heads serving a different number of query heads each;
    ``multi-query``: one key/value head; ``multi-head``: as many as query heads.
    """
    draw = random.Random(f"6.1 {key} {seed}")
    generator = torch.Generator().manual_seed(seed)
    if key == "readable":
        values = draw.sample(range(1, 10), 2)
        return torch.tensor(values, dtype=torch.float32).view(1, 2, 1, 1), 2 * draw.randint(2, 4)
    if key == "grouped":
        groups = draw.choice([2, 3])
        size = draw.choice([r for r in (2, 3, 4) if r != groups])  # repeating by the groups would give other shapes
        batch, tokens, head_dim = draw.randint(1, 2), draw.randint(1, 4), draw.randint(1, 3)
        return torch.randn(batch, groups, tokens, head_dim, generator=generator), groups * size
    if key == "multi-query":
        return torch.randn(draw.randint(1, 2), 1, draw.randint(1, 4), 2, generator=generator), draw.randint(2, 6)
    heads = draw.randint(2, 4)
    return torch.randn(1, heads, draw.randint(1, 4), 3, generator=generator), heads


EXPAND_CASES = ("readable", "grouped", "multi-query", "multi-head")


def reference_expand(kv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What :class:`~mha_course.GroupedQueryAttention` does: each key/value head repeated for its group."""
    return kv.repeat_interleave(num_heads // kv.shape[1], dim=1)  # (B, h, T, d_h)


def _probe_expand(expand_kv_heads, rec: Recorder) -> None:
    seed = draw_seed()
    rec.note("seed", seed)
    for key in EXPAND_CASES:
        kv, num_heads = expand_case(seed, key)
        rec.call(key, expand_kv_heads, kv, num_heads)
    device = get_device()
    rec.note("device_asked", str(device))
    kv, num_heads = expand_case(seed, "grouped")
    rec.call("on_device", expand_kv_heads, kv.to(device), num_heads)


def _expand_call(kv: torch.Tensor, num_heads: int) -> str:
    return f"expand_kv_heads(kv of shape {format_shape(kv.shape)}, num_heads={num_heads})"


def _expand_shape(key: str):
    def run(record):
        kv, num_heads = expand_case(_seed(record), key)
        got = tensor_of(record, key, _expand_call(kv, num_heads))
        expected = reference_expand(kv, num_heads)
        if tuple(got.shape) != tuple(expected.shape):
            raise Failed(f"shape {format_shape(expected.shape)} from {_expand_call(kv, num_heads)}",
                         f"shape {format_shape(got.shape)}")
    return run


def _readable_values(record):
    kv, num_heads = expand_case(_seed(record), "readable")
    got = tensor_of(record, "readable", _expand_call(kv, num_heads))
    expected = reference_expand(kv, num_heads)
    expect_shape(got, tuple(expected.shape))
    if not same(got, expected):
        def show(t):
            return "[" + ", ".join(f"{v:g}" for v in t.reshape(-1).tolist()) + "]"
        raise Failed(f"query heads 1..{num_heads} to read {show(expected)} from key/value heads {show(kv)} "
                     f"({_expand_call(kv, num_heads)})", show(got))


def _expand_values(key: str):
    def run(record):
        kv, num_heads = expand_case(_seed(record), key)
        got = tensor_of(record, key, _expand_call(kv, num_heads))
        try:
            expect_close(got, reference_expand(kv, num_heads), labels=("sequence", "head", "token"))
        except Failed as failure:
            raise Failed(f"{failure.expected} from {_expand_call(kv, num_heads)}", failure.got) from None
    return run


def _expand_like(fn, keys=("readable", "grouped")):
    """A detector: on every case of ``keys`` the answer returned ``fn(kv, num_heads)``."""
    def detect(record):
        seed = _seed(record)
        return all(same(plain(record[key]), fn(*expand_case(seed, key))) for key in keys)
    return detect


def _expand_only_for_one_group(record) -> bool:
    # kv.expand(-1, num_heads, -1, -1) stretches an axis of size 1 only: right for multi-query, an error otherwise.
    grouped = record["grouped"]
    seed = _seed(record)
    return (grouped.get("kind") == "error" and "expanded size" in grouped["message"]
            and same(plain(record["multi-query"]), reference_expand(*expand_case(seed, "multi-query"))))


EXPAND = Exercise(
    id="6.1",
    title="expand the key/value heads",
    answer_name="expand_kv_heads",
    signature="expand_kv_heads(kv, num_heads)",
    probe=_probe_expand,
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "readable", _expand_call(*expand_case(_seed(r), "readable")))),
        Check("one head per query head, shape (batch, num_heads, num_tokens, head_dim)", _expand_shape("readable")),
        Check("each query head reads the key/value head of its group", _readable_values),
        Check("shape with 2 or 3 key/value heads", _expand_shape("grouped")),
        Check("values with 2 or 3 key/value heads", _expand_values("grouped")),
        Check("multi-query: one key/value head for every query head", _expand_values("multi-query")),
        Check("multi-head: as many key/value heads as query heads", _expand_values("multi-head")),
        Check("output on the input's device", _device_check("on_device", "the call on the device")),
    ),
    mistakes=(
        Mistake("repeat",
                "You tiled the key/value heads (g0 g1 g0 g1 ...), which is what Tensor.repeat does: the "
                "second query head then reads the second key/value head, although it belongs to the "
                "first group. Each key/value head serves the num_heads // num_kv_groups CONSECUTIVE query heads of its "
                "group (g0 g0 g1 g1 ...): kv.repeat_interleave(num_heads // kv.shape[1], dim=1).",
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
                "(batch, num_kv_groups, num_tokens, head_dim): repeat_interleave(..., dim=1).",
                _expand_like(lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=2))),
        Mistake("feature-axis",
                "You repeated along the last axis, the head's features (dim=-1). The heads are axis 1 of "
                "(batch, num_kv_groups, num_tokens, head_dim): repeat_interleave(..., dim=1).",
                _expand_like(lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=-1))),
        Mistake("expand-one-group",
                "Tensor.expand stretches only an axis of size 1, so it works for multi-query attention "
                "(one key/value head) and fails for more. Either repeat_interleave along dim 1, or give "
                "each group a new axis of size 1 to stretch: kv[:, :, None].expand(B, g, r, T, d_h) "
                "reshaped to (B, g * r, T, d_h).",
                _expand_only_for_one_group),
    ),
)

# ----------------------------------------------------------------------------------------------
# 6.2 One cached decoding step

#: The cases of 6.2: grouped-query with biases, multi-query, multi-head, and the first token.
STEP_CASES = ("grouped", "multi-query", "multi-head", "first")


def step_case(seed: int, key: str):
    """``(gqa, x, num_cached)`` of one case of 6.2, drawn from ``seed``: a seeded module in eval mode
    and a ``(batch, num_cached + 1, d_in)`` sequence whose last token is the new one."""
    draw = random.Random(f"6.2 {key} {seed}")
    if key == "grouped":
        groups, size, bias, cached = draw.choice([2, 3]), draw.choice([2, 3]), True, draw.randint(2, 6)
    elif key == "multi-query":
        groups, size, bias, cached = 1, draw.randint(2, 4), False, draw.randint(1, 5)
    elif key == "multi-head":
        groups, size, bias, cached = draw.randint(2, 3), 1, False, draw.randint(1, 5)
    else:
        groups, size, bias, cached = 2, 2, True, 0
    batch, head_dim, d_in = draw.randint(1, 2), draw.randint(2, 4), draw.randint(3, 6)
    heads = groups * size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gqa = GroupedQueryAttention(d_in, heads * head_dim, cached + 1, 0.0, heads, groups, qkv_bias=bias).eval()
    x = torch.randn(batch, cached + 1, d_in, generator=torch.Generator().manual_seed(seed + 1))
    return gqa, x, cached


def step_inputs(gqa: GroupedQueryAttention, x: torch.Tensor, num_cached: int):
    """``(x_new, past_keys, past_values)``: the last token and the cache of the ones before it."""
    batch = x.shape[0]
    if num_cached == 0:
        empty = torch.empty(batch, gqa.num_kv_groups, 0, gqa.head_dim, dtype=x.dtype, device=x.device)
        return x[:, -1:], empty, empty.clone()
    cache = KVCache()
    with torch.no_grad():
        gqa(x[:, :num_cached], cache=cache)
    return x[:, num_cached:], cache.keys, cache.values


def step_expected(gqa: GroupedQueryAttention, x: torch.Tensor, num_cached: int):
    """``(output, keys, values)`` of the step, from the package: recompute the whole sequence."""
    cache = KVCache()
    with torch.no_grad():
        output = gqa(x, cache=cache)[:, -1:]  # (B, 1, d_out)
    return output, cache.keys, cache.values


@torch.no_grad()
def step_variant(gqa: GroupedQueryAttention, x_new, past_keys, past_values, *, expand: str = "interleave",
                 scale: bool = True, attend_new: bool = True, new_first: bool = False, out_proj: bool = True,
                 bias: bool = True, softmax_dim: int = -1, first_position_only: bool = False):
    """``decode_step`` written out with a chosen mistake; the defaults give the correct step.

    The catalogue of 6.2 runs these variants on the probe's inputs and compares them with what the
    learner's function returned.
    """
    def project(layer, t):
        return t @ layer.weight.T + (layer.bias if bias and layer.bias is not None else 0)

    queries = split_heads(project(gqa.W_query, x_new), gqa.num_heads)  # (B, h, 1, d_h)
    new_keys = split_heads(project(gqa.W_key, x_new), gqa.num_kv_groups)  # (B, g, 1, d_h)
    new_values = split_heads(project(gqa.W_value, x_new), gqa.num_kv_groups)  # (B, g, 1, d_h)
    parts = (lambda past, new: [new, past]) if new_first else (lambda past, new: [past, new])
    keys = torch.cat(parts(past_keys, new_keys), dim=2)  # (B, g, T + 1, d_h)
    values = torch.cat(parts(past_values, new_values), dim=2)  # (B, g, T + 1, d_h)
    read_keys, read_values = (keys, values) if attend_new else (past_keys, past_values)
    if expand == "interleave":
        read_keys = read_keys.repeat_interleave(gqa.group_size, dim=1)  # (B, h, T + 1, d_h)
        read_values = read_values.repeat_interleave(gqa.group_size, dim=1)
    else:  # "repeat": g0 g1 g0 g1 ...
        read_keys = read_keys.repeat(1, gqa.group_size, 1, 1)
        read_values = read_values.repeat(1, gqa.group_size, 1, 1)
    scores = queries @ read_keys.transpose(2, 3)  # (B, h, 1, T + 1)
    if scale:
        scores = scores / gqa.head_dim**0.5
    if first_position_only:
        scores[..., 1:] = float("-inf")
    weights = torch.softmax(scores, dim=softmax_dim)
    context = merge_heads(weights @ read_values)  # (B, 1, d_out)
    output = project(gqa.out_proj, context) if out_proj else context
    return output, keys, values


def _probe_step(decode_step, rec: Recorder) -> None:
    seed = draw_seed()
    rec.note("seed", seed)
    for key in STEP_CASES:
        gqa, x, cached = step_case(seed, key)
        x_new, past_keys, past_values = step_inputs(gqa, x, cached)
        _call_watched(rec, key, decode_step, gqa, x_new, past_keys.clone(), past_values.clone())
    device = get_device()
    rec.note("device_asked", str(device))
    gqa, x, cached = step_case(seed, "grouped")
    inputs = step_inputs(gqa, x, cached)
    rec.call("on_device", decode_step, gqa.to(device), *(t.to(device) for t in inputs))


def _step_call(gqa, x, cached) -> str:
    shared = (f"{gqa.num_heads} query heads in {gqa.num_kv_groups} group{'s' if gqa.num_kv_groups > 1 else ''}"
              f", head_dim {gqa.head_dim}")
    return (f"decode_step on {x.shape[0]} sequence{'s' if x.shape[0] > 1 else ''} with {cached} cached "
            f"token{'s' if cached != 1 else ''} ({shared})")


def _step_parts(record, key: str):
    """The learner's ``(output, keys, values)`` for case ``key``; a :class:`Failed` unless it is three tensors."""
    gqa, x, cached = step_case(_seed(record), key)
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


def _step_cache(index: int, name: str):
    def run(record):
        parts, (gqa, x, cached) = _step_parts(record, "grouped")
        try:
            expect_close(parts[index], step_expected(gqa, x, cached)[index],
                         labels=("sequence", "key/value head", "position"))
        except Failed as failure:
            raise Failed(f"{name} {failure.expected} from {_step_call(gqa, x, cached)}", failure.got) from None
    return run


def _step_output(key: str):
    def run(record):
        (output, _, _), (gqa, x, cached) = _step_parts(record, key)
        try:
            expect_close(output, step_expected(gqa, x, cached)[0], labels=("sequence", "token"))
        except Failed as failure:
            raise Failed(f"the new token's output {failure.expected} from {_step_call(gqa, x, cached)}",
                         failure.got) from None
    return run


def _step_like(part: int = 0, key: str = "grouped", **how):
    """A detector: part ``part`` of the answer on case ``key`` equals the variant with mistake ``how``."""
    def detect(record):
        gqa, x, cached = step_case(_seed(record), key)
        got = plain(record[key])[part]
        return same(got, step_variant(gqa, *step_inputs(gqa, x, cached), **how)[part])
    return detect


def _keys_not_appended(record) -> bool:
    gqa, x, cached = step_case(_seed(record), "grouped")
    _, past_keys, _ = step_inputs(gqa, x, cached)
    return same(plain(record["grouped"])[1], past_keys)


def _bias_ignored(record) -> bool:
    gqa, x, cached = step_case(_seed(record), "grouped")
    inputs = step_inputs(gqa, x, cached)
    got = plain(record["grouped"])[0]
    without = step_variant(gqa, *inputs, bias=False)[0]
    return same(got, without) or same(got, without + gqa.out_proj.bias.detach())  # out_proj called itself


STEP = Exercise(
    id="6.2",
    title="one cached decoding step",
    answer_name="decode_step",
    signature="decode_step(gqa, x_new, past_keys, past_values)",
    probe=_probe_step,
    checks=(
        Check("returns (output, keys, values)", lambda r: _step_parts(r, "grouped")),
        Check("your own step, not the module's or the cache's", _own_work(*STEP_CASES, what="the step")),
        Check("shapes: output (batch, 1, d_out), keys and values (batch, num_kv_groups, T + 1, head_dim)",
              _step_shapes),
        Check("keys: the cached ones, then the new token's", _step_cache(1, "keys")),
        Check("values: the cached ones, then the new token's", _step_cache(2, "values")),
        Check("the new token's output, grouped-query", _step_output("grouped")),
        Check("the new token's output, multi-query", _step_output("multi-query")),
        Check("the new token's output, multi-head", _step_output("multi-head")),
        Check("the first token of a sequence (an empty cache)", _step_output("first")),
        Check("output on the input's device", _device_check("on_device", "the call on the device")),
    ),
    mistakes=(
        Mistake("keys-not-appended",
                "You returned the cached keys as they were: the next step must find this token's key and "
                "value too. Return torch.cat([past_keys, new_keys], dim=2) and the same for values.",
                _keys_not_appended),
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
                "(g0 g1 g0 g1 ...), but each one serves the consecutive query heads of its group "
                "(g0 g0 g1 g1 ...). Use repeat_interleave(gqa.group_size, dim=1).",
                _step_like(expand="repeat")),
        Mistake("no-scale",
                "The scores are not scaled: divide them by sqrt(head_dim) before the softmax, "
                "gqa.head_dim ** 0.5.",
                _step_like(scale=False)),
        Mistake("no-out-proj",
                "You returned the merged heads without the output projection: finish with "
                "gqa.out_proj(context).",
                _step_like(out_proj=False)),
        Mistake("bias-ignored",
                "Your projections leave out the biases (this layer has qkv_bias=True). Call the layers "
                "themselves, gqa.W_query(x_new), rather than multiplying by their weights.",
                _bias_ignored),
        Mistake("softmax-over-queries",
                "The softmax ran over the query axis, which has one entry, so every weight became 1. "
                "Normalise over the keys, the last axis: torch.softmax(scores, dim=-1).",
                _step_like(softmax_dim=-2)),
        Mistake("mask-row-of-first-token",
                "You masked the scores with the first row of the causal mask, which lets the new token "
                "see only position 0. The new token is the LAST position: it sees every cached position "
                "and itself, so one new token needs no mask at all.",
                _step_like(first_position_only=True)),
    ),
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


SIZE_MISTAKES = ("keys-only", "query-heads", "group-size", "one-layer", "batch-ignored", "per-token",
                 "tokens-squared", "bits", "mib")
SIZE_CASES = ("model", "another model", "multi-query", "multi-head")


def size_case(seed: int, key: str) -> tuple[int, ...]:
    """The arguments of one call of 6.3, drawn from ``seed``; for ``model`` and ``another model``
    every catalogued mistake gives a number of its own."""
    draw = random.Random(f"6.3 {key} {seed}")
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
    seed = draw_seed()
    rec.note("seed", seed)
    for key in SIZE_CASES:
        _call_watched(rec, key, kv_cache_size, *size_case(seed, key))


def _size_number(record, key: str):
    args = size_case(_seed(record), key)
    summary = value_of(record, key, _size_call(args))
    value = summary.get("value")
    if summary.get("kind") == "tensor" and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    elif summary.get("kind") == "float" and float(value).is_integer():
        value = int(value)
    elif summary.get("kind") != "int":
        raise Failed(f"a whole number of bytes from {_size_call(args)}", describe(summary))
    return value, args


def _size_value(key: str):
    def run(record):
        got, args = _size_number(record, key)
        expected = cost.kv_cache_bytes(args[0], args[2], args[3], args[4], args[5], args[6])
        if got != expected:
            raise Failed(f"{expected:,} bytes from {_size_call(args)}", f"{got:,}")
    return run


def _size_like(mistake: str):
    def detect(record):
        seed = _seed(record)
        for key in ("model", "another model"):
            summary = record[key]
            got = summary.get("value")
            if isinstance(got, torch.Tensor):
                got = got.item() if got.numel() == 1 else None
            if summary.get("kind") not in ("int", "float", "tensor") or got is None:
                return False
            wrong = size_variant(*size_case(seed, key), mistake=mistake)
            if abs(float(got) - wrong) > 1e-9 * max(1.0, abs(wrong)):
                return False
        return True
    return detect


SIZE = Exercise(
    id="6.3",
    title="predict a model's cache size",
    answer_name="kv_cache_size",
    signature="kv_cache_size(" + ", ".join(SIZE_ARGUMENTS) + ")",
    probe=_probe_size,
    checks=(
        Check("returns a whole number of bytes", lambda r: _size_number(r, "model")),
        Check("your own formula, not the package's", _own_work(*SIZE_CASES, what="the size")),
        Check("the cache of a grouped-query model", _size_value("model")),
        Check("the cache of another grouped-query model", _size_value("another model")),
        Check("multi-query: one key/value head", _size_value("multi-query")),
        Check("multi-head: a key/value head per query head", _size_value("multi-head")),
    ),
    mistakes=(
        Mistake("mib",
                "You returned MiB; the exercise asks for bytes. Leave out the division by 2**20.",
                _size_like("mib")),
        Mistake("keys-only",
                "Half the right size: the cache holds a key AND a value for every token, head and layer "
                "(the factor 2).",
                _size_like("keys-only")),
        Mistake("query-heads",
                "You counted the query heads. Queries are never cached, and the key/value heads are "
                "num_kv_groups, not num_heads: that is the whole saving of grouped-query attention.",
                _size_like("query-heads")),
        Mistake("group-size",
                "You used num_heads // num_kv_groups, the query heads that share one key/value head. The "
                "cache holds one key and one value per group: num_kv_groups heads.",
                _size_like("group-size")),
        Mistake("one-layer",
                "That is one layer's cache. Every attention layer keeps its own: multiply by num_layers.",
                _size_like("one-layer")),
        Mistake("batch-ignored",
                "That is one sequence's cache. Every sequence of the batch has its own: multiply by "
                "batch_size.",
                _size_like("batch-ignored")),
        Mistake("per-token",
                "That is the cache of one token. It grows with every token held: multiply by num_tokens.",
                _size_like("per-token")),
        Mistake("tokens-squared",
                "You multiplied by num_tokens squared, as for a score tensor. The cache holds one key "
                "and one value per token: it grows in proportion to num_tokens, not its square.",
                _size_like("tokens-squared")),
        Mistake("bits",
                "Eight times too much: you counted bits. bytes_per_number is already in bytes "
                "(2 for float16, 4 for float32).",
                _size_like("bits")),
    ),
)

EXERCISES = (EXPAND, STEP, SIZE)

__all__ = ["EXERCISES", "PACKAGE_ANSWERS", "package_calls", "expand_case", "reference_expand", "step_case",
           "step_inputs", "step_expected", "step_variant", "size_case", "size_variant", "draw_seed"]
