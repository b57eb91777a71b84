"""The exercise checks: correct answers pass, every catalogued mistake gets its own message,
and ``check`` never raises, prints exactly one line and leaves the caller's state alone.

The wrong answers below are written the way a learner would write them, independently of the
catalogue's own detectors, so a test passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import io
import sys

import pytest
import torch
from torch import nn

import chapter6_answers
from mha_course import CausalAttention, MultiHeadAttention, check
from mha_course.exercises import EXERCISES, run_check
from mha_course.exercises.chapter1 import head_variant, reference_head
from mha_course.exercises.framework import judge, probe

# ----------------------------------------------------------------------------------------------
# Correct answers


def build_causal_mask(num_tokens, device=None):
    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)


def causal_attention_forward(x, W_query, W_key, W_value):
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    scores = queries @ keys.transpose(1, 2)
    mask = build_causal_mask(x.shape[1], device=x.device)
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")) / keys.shape[-1] ** 0.5, dim=-1)
    return weights @ values


def visible_positions(position, num_tokens):
    return list(range(position + 1))


class StackedHeads(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads))

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


def count_trainable_parameters(module):
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def wrapper_parameter_count(d_in, d_out, num_heads, qkv_bias=False):
    return num_heads * 3 * (d_in * d_out + (d_out if qkv_bias else 0))


def split_heads(x, num_heads):
    batch, num_tokens, d_out = x.shape
    return x.view(batch, num_tokens, num_heads, d_out // num_heads).transpose(1, 2)


def merge_heads(x):
    batch, num_heads, num_tokens, head_dim = x.shape
    return x.transpose(1, 2).contiguous().view(batch, num_tokens, num_heads * head_dim)


def _copy_roles(wrapper, mha, order=None, roles=None, biases=True):
    heads = list(wrapper.heads) if order is None else order(list(wrapper.heads))
    roles = roles or {"W_query": "W_query", "W_key": "W_key", "W_value": "W_value"}
    for target, source in roles.items():
        getattr(mha, target).weight.copy_(torch.cat([getattr(h, source).weight for h in heads], dim=0))
        if biases and getattr(mha, target).bias is not None:
            getattr(mha, target).bias.copy_(torch.cat([getattr(h, source).bias for h in heads], dim=0))


def transfer_heads(wrapper, mha):
    with torch.no_grad():
        _copy_roles(wrapper, mha)
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))
        mha.out_proj.bias.zero_()
    return mha


def attention_layer_size(d_model, num_heads, context_length, qkv_bias=True):
    layer = MultiHeadAttention(d_model, d_model, context_length, 0.0, num_heads, qkv_bias=qkv_bias)
    return {"head_dim": layer.head_dim, "parameters": count_trainable_parameters(layer),
            "attention_weights_mib": num_heads * context_length**2 * 4 / 2**20}


def attention_share(num_tokens, d_in, d_out):
    attention = 2 * num_tokens**2 * d_out
    projections = 3 * num_tokens * d_in * d_out + num_tokens * d_out**2
    return attention / (attention + projections)


def predicted_forward_peak(batch, num_heads, num_tokens, d_out):
    return 4 * (2 * batch * num_heads * num_tokens**2 + 3 * batch * num_tokens * d_out)


def first_minus_previous(tokens):
    return tokens[:, :1] - tokens[:, :-1]


def scores_from_maps(maps):
    queries = torch.arange(2, maps.shape[-1])
    on_first = maps[:, queries, 0].mean(dim=1)
    on_previous = maps[:, queries, queries - 1].mean(dim=1)
    return torch.stack([on_first, on_previous], dim=1)


CORRECT = {
    "1.1": build_causal_mask,
    "1.2": causal_attention_forward,
    "1.3": visible_positions,
    "2.1": StackedHeads,
    "2.2": count_trainable_parameters,
    "2.3": wrapper_parameter_count,
    "3.1": split_heads,
    "3.2": merge_heads,
    "3.3": transfer_heads,
    "3.4": attention_layer_size,
    "4.1": attention_share,
    "4.2": predicted_forward_peak,
    "5.1": first_minus_previous,
    "5.2": scores_from_maps,
}

# ----------------------------------------------------------------------------------------------
# Wrong answers, one per catalogue entry: (exercise, mistake key) -> answer


def _head(x, W_query, W_key, W_value, *, diagonal=1, fill=float("-inf"), dim=-1, scale=None, mix=None,
          transposed=False, zero_after=False, use_mask=True):
    q, k, v = x @ W_query, x @ W_key, x @ W_value
    scores = k @ q.transpose(1, 2) if transposed else q @ k.transpose(1, 2)
    n = x.shape[1]
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=diagonal)
    if not use_mask:
        mask = torch.zeros_like(mask)
    divisor = k.shape[-1] ** 0.5 if scale is None else scale(x, W_key)
    if zero_after:
        weights = torch.softmax(scores / divisor, dim=dim).masked_fill(mask, 0.0)
    else:
        weights = torch.softmax(scores.masked_fill(mask, fill) / divisor, dim=dim)
    return weights @ (v if mix is None else mix(x, k))


class _PlainList(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        nn.Module.__init__(self)
        self.heads = [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]


class _OwnHeads(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.proj = nn.Linear(d_in, d_out * num_heads, bias=qkv_bias)

    def forward(self, x):
        return self.proj(x)


class _RepeatedHead(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        nn.Module.__init__(self)
        head = CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
        self.heads = nn.ModuleList([head] * num_heads)


class _TotalWidth(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out // num_heads, context_length, dropout, num_heads, qkv_bias)


class _CatTokens(StackedHeads):
    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=1)


class _Stacked(StackedHeads):
    def forward(self, x):
        return torch.stack([head(x) for head in self.heads], dim=2)


class _Summed(StackedHeads):
    def forward(self, x):
        return sum(head(x) for head in self.heads)


class _OneHead(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.head = CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)

    def forward(self, x):
        return self.head(x)


class _BiasIgnored(StackedHeads):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads)


def _transfer_without_no_grad(wrapper, mha):
    _copy_roles(wrapper, mha)


def _transfer_columns(wrapper, mha):
    with torch.no_grad():
        for role in ("W_query", "W_key", "W_value"):
            getattr(mha, role).weight.copy_(torch.cat([getattr(h, role).weight for h in wrapper.heads], dim=1))


def _transfer_new_module(wrapper, mha):
    return MultiHeadAttention.from_wrapper(wrapper)


def _transfer_qkv_only(wrapper, mha):
    with torch.no_grad():
        _copy_roles(wrapper, mha)


def _transfer_keeps_out_bias(wrapper, mha):
    with torch.no_grad():
        _copy_roles(wrapper, mha)
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))


def _transfer_with(**how):
    def transfer(wrapper, mha):
        with torch.no_grad():
            _copy_roles(wrapper, mha, **how)
            mha.out_proj.weight.copy_(torch.eye(mha.d_out))
            mha.out_proj.bias.zero_()
    return transfer


def _transfer_first_head(wrapper, mha):
    with torch.no_grad():
        for role in ("W_query", "W_key", "W_value"):
            getattr(mha, role).weight[: mha.head_dim] = getattr(wrapper.heads[0], role).weight
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))
        mha.out_proj.bias.zero_()


def _size(**changes):
    def size(d_model, num_heads, context_length, qkv_bias=True):
        answer = attention_layer_size(d_model, num_heads, context_length, qkv_bias)
        return {**answer, **{key: rule(d_model, num_heads, context_length, qkv_bias)
                             for key, rule in changes.items()}}
    return size


def _scores_loop(maps, start=2, on_self=False, total=False):
    # A learner's loop over heads and positions; the keyword arguments make the usual slips.
    rows = []
    for head in range(maps.shape[0]):
        first = previous = 0.0
        positions = range(start, maps.shape[-1])
        for t in positions:
            first = first + maps[head, t, 0]
            previous = previous + maps[head, t, t if on_self else t - 1]
        count = 1 if total else len(positions)
        rows.append(torch.stack([first / count, previous / count]))
    return torch.stack(rows)


def _scores_fixed_size(maps):
    on_first = maps[:, 2:8, 0].mean(dim=1)
    on_previous = torch.stack([maps[:, t, t - 1] for t in range(2, 8)], dim=1).mean(dim=1)
    return torch.stack([on_first, on_previous], dim=1)


def _lost_batch_axis(tokens):
    return tokens[:, 0] - tokens[:, :-1]


WRONG = {
    ("1.1", "diagonal-masked"): lambda n, device=None: torch.ones(n, n, device=device).triu().bool(),
    ("1.1", "transposed"): lambda n, device=None: torch.ones(n, n, dtype=torch.bool, device=device).tril(-1),
    ("1.1", "visibility-table"): lambda n, device=None: torch.tril(torch.ones(n, n, device=device)) == 1,
    ("1.1", "nothing-masked"): lambda n, device=None: torch.zeros(n, n, dtype=torch.bool, device=device),
    ("1.1", "additive-mask"): lambda n, device=None: torch.full((n, n), float("-inf"), device=device).triu(1),
    ("1.1", "not-bool"): lambda n, device=None: torch.triu(torch.ones(n, n, device=device), diagonal=1),
    ("1.1", "device-ignored"): None,  # needs a GPU; tested in test_device_ignored_on_gpu
    ("1.2", "no-mask"): lambda x, q, k, v: _head(x, q, k, v, use_mask=False),
    ("1.2", "mask-diagonal"): lambda x, q, k, v: _head(x, q, k, v, diagonal=0),
    ("1.2", "mask-fill-zero"): lambda x, q, k, v: _head(x, q, k, v, fill=0.0),
    ("1.2", "zero-after-softmax"): lambda x, q, k, v: _head(x, q, k, v, zero_after=True),
    ("1.2", "softmax-axis"): lambda x, q, k, v: _head(x, q, k, v, dim=1),
    ("1.2", "scores-transposed"): lambda x, q, k, v: _head(x, q, k, v, transposed=True),
    ("1.2", "no-scale"): lambda x, q, k, v: _head(x, q, k, v, scale=lambda x, w: 1.0),
    ("1.2", "scale-d-in"): lambda x, q, k, v: _head(x, q, k, v, scale=lambda x, w: x.shape[-1] ** 0.5),
    ("1.2", "scale-no-sqrt"): lambda x, q, k, v: _head(x, q, k, v, scale=lambda x, w: w.shape[1]),
    ("1.2", "weights-times-inputs"): lambda x, q, k, v: _head(x, q, k, v, mix=lambda x, keys: x),
    ("1.2", "weights-times-keys"): lambda x, q, k, v: _head(x, q, k, v, mix=lambda x, keys: keys),
    ("1.3", "excludes-itself"): lambda i, n: list(range(i)),
    ("1.3", "forbidden-positions"): lambda i, n: [j for j in range(n) if j > i],
    ("1.3", "sees-the-future"): lambda i, n: list(range(i, n)),
    ("1.3", "sees-everything"): lambda i, n: list(range(n)),
    ("1.3", "counts-from-one"): lambda i, n: [j + 1 for j in range(i + 1)],
    ("2.1", "plain-list"): _PlainList,
    ("2.1", "own-heads"): _OwnHeads,
    ("2.1", "repeated-head"): _RepeatedHead,
    ("2.1", "d-out-as-total"): _TotalWidth,
    ("2.1", "concatenated-tokens"): _CatTokens,
    ("2.1", "stacked"): _Stacked,
    ("2.1", "summed"): _Summed,
    ("2.1", "one-head"): _OneHead,
    ("2.1", "qkv-bias-ignored"): _BiasIgnored,
    ("2.2", "counted-tensors"): lambda m: len(list(m.parameters())),
    ("2.2", "counted-buffers"): lambda m: sum(t.numel() for t in m.state_dict().values()),
    ("2.2", "counted-frozen"): lambda m: sum(p.numel() for p in m.parameters()),
    ("2.2", "weights-only"): lambda m: sum(p.numel() for n, p in m.named_parameters() if "bias" not in n
                                           and p.requires_grad),
    ("2.2", "counted-bytes"): lambda m: sum(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad),
    ("2.3", "no-heads-factor"): lambda d_in, d_out, h, qkv_bias=False: 3 * (d_in + qkv_bias) * d_out,
    ("2.3", "one-projection"): lambda d_in, d_out, h, qkv_bias=False: h * (d_in + qkv_bias) * d_out,
    ("2.3", "output-projection"): lambda d_in, d_out, h, qkv_bias=False: (
        wrapper_parameter_count(d_in, d_out, h, qkv_bias) + (h * d_out) * (h * d_out + 1)),
    ("2.3", "bias-ignored"): lambda d_in, d_out, h, qkv_bias=False: 3 * h * d_in * d_out,
    ("2.3", "bias-always"): lambda d_in, d_out, h, qkv_bias=False: 3 * h * (d_in + 1) * d_out,
    ("3.1", "view-without-transpose"): lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
    ("3.1", "no-transpose"): lambda x, h: x.view(x.shape[0], x.shape[1], h, -1),
    ("3.1", "interleaved"): lambda x, h: x.unflatten(-1, (-1, h)).permute(0, 3, 1, 2),
    ("3.1", "head-dim-first"): lambda x, h: x.view(x.shape[0], x.shape[1], -1, h).transpose(1, 2),
    ("3.1", "wrong-axes"): lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).transpose(2, 3),
    ("3.2", "needs-contiguous"): lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1),
    ("3.2", "no-transpose"): lambda x: x.contiguous().view(x.shape[0], x.shape[2], -1),
    ("3.2", "interleaved"): lambda x: x.permute(0, 2, 3, 1).flatten(2),
    ("3.2", "stopped-early"): lambda x: x.transpose(1, 2),
    ("3.3", "needs-no-grad"): _transfer_without_no_grad,
    ("3.3", "rows-not-columns"): _transfer_columns,
    ("3.3", "not-in-place"): _transfer_new_module,
    ("3.3", "out-proj-left-random"): _transfer_qkv_only,
    ("3.3", "out-proj-bias"): _transfer_keeps_out_bias,
    ("3.3", "heads-reversed"): _transfer_with(order=lambda heads: heads[::-1]),
    ("3.3", "roles-swapped"): _transfer_with(roles={"W_query": "W_key", "W_key": "W_query", "W_value": "W_value"}),
    ("3.3", "first-head-only"): _transfer_first_head,
    ("3.3", "bias-forgotten"): _transfer_with(biases=False),
    ("3.4", "head-dim-is-d-model"): _size(head_dim=lambda d, h, t, b: d),
    ("3.4", "no-qkv-bias"): _size(parameters=lambda d, h, t, b: 4 * d * d + d),
    ("3.4", "no-biases"): _size(parameters=lambda d, h, t, b: 4 * d * d),
    ("3.4", "no-out-proj"): _size(parameters=lambda d, h, t, b: 3 * d * (d + b)),
    ("3.4", "d-model-per-head"): _size(parameters=lambda d, h, t, b: h * 3 * d * (d + b)),
    ("3.4", "one-head"): _size(attention_weights_mib=lambda d, h, t, b: t * t * 4 / 2**20),
    ("3.4", "bytes-not-mib"): _size(attention_weights_mib=lambda d, h, t, b: h * t * t * 4),
    ("3.4", "float64"): _size(attention_weights_mib=lambda d, h, t, b: h * t * t * 8 / 2**20),
    ("3.4", "lower-triangle-only"): _size(attention_weights_mib=lambda d, h, t, b: h * t * (t + 1) / 2 * 4 / 2**20),
    ("4.1", "one-attention-product"): lambda t, d_in, d_out: t * t * d_out / (t * t * d_out + 3 * t * d_in * d_out + t * d_out**2),
    ("4.1", "no-out-proj"): lambda t, d_in, d_out: 2 * t * t * d_out / (2 * t * t * d_out + 3 * t * d_in * d_out),
    ("4.1", "ratio-not-share"): lambda t, d_in, d_out: 2 * t * t * d_out / (3 * t * d_in * d_out + t * d_out**2),
    ("4.1", "widths-swapped"): lambda t, d_in, d_out: attention_share(t, d_out, d_in),
    ("4.2", "one-score-tensor"): lambda b, h, t, d: 4 * (b * h * t * t + 3 * b * t * d),
    ("4.2", "no-activations"): lambda b, h, t, d: 2 * 4 * b * h * t * t,
    ("4.2", "numbers-not-bytes"): lambda b, h, t, d: 2 * b * h * t * t + 3 * b * t * d,
    ("4.2", "heads-ignored"): lambda b, h, t, d: 4 * (2 * b * t * t + 3 * b * t * d),
    ("4.2", "float64"): lambda b, h, t, d: 8 * (2 * b * h * t * t + 3 * b * t * d),
    ("5.1", "sign-flipped"): lambda tokens: tokens[:, :-1] - tokens[:, :1],
    ("5.1", "current-not-previous"): lambda tokens: tokens[:, :1] - tokens[:, 1:],
    ("5.1", "class-indices"): lambda tokens: tokens[:, :1] - tokens[:, :-1] + 7,
    ("5.1", "position-zero-kept"): lambda tokens: tokens[:, :1] - tokens,
    ("5.1", "batch-axis-lost"): _lost_batch_axis,
    ("5.1", "length-fixed"): lambda tokens: tokens[:, 0:1] - tokens[:, 0:7],
    ("5.2", "returned-pair"): lambda maps: (scores_from_maps(maps)[:, 0], scores_from_maps(maps)[:, 1]),
    ("5.2", "from-position-1"): lambda maps: _scores_loop(maps, start=1),
    ("5.2", "every-position"): lambda maps: torch.stack(
        [maps[:, :, 0].mean(dim=1), maps.diagonal(offset=-1, dim1=1, dim2=2).mean(dim=-1)], dim=1),
    ("5.2", "diagonal"): lambda maps: _scores_loop(maps, on_self=True),
    ("5.2", "columns-swapped"): lambda maps: scores_from_maps(maps).flip(1),
    ("5.2", "transposed"): lambda maps: scores_from_maps(maps).T,
    ("5.2", "queries-as-columns"): lambda maps: scores_from_maps(maps.transpose(1, 2)),
    ("5.2", "summed"): lambda maps: _scores_loop(maps, total=True),
    ("5.2", "size-fixed"): _scores_fixed_size,
    ("3.4", "bias-always"): _size(parameters=lambda d, h, t, b: 4 * d * d + 4 * d),
}

# Chapter 6's answers live in their own module (its checks draw fresh inputs on every run).
CORRECT.update(chapter6_answers.CORRECT)
WRONG.update(chapter6_answers.WRONG)

CATALOGUE = [(exercise.id, mistake) for exercise in EXERCISES.values() for mistake in exercise.mistakes]


def test_every_catalogue_entry_has_a_wrong_answer_here():
    assert {(eid, m.key) for eid, m in CATALOGUE} == set(WRONG)


def test_every_exercise_has_a_correct_answer_and_at_least_three_per_chapter():
    assert set(CORRECT) == set(EXERCISES)
    for chapter in (1, 2, 3):
        assert sum(e.chapter == chapter for e in EXERCISES.values()) >= 3


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_correct_answer_passes(exercise_id, capsys):
    result = check(exercise_id, CORRECT[exercise_id])
    total = len(EXERCISES[exercise_id].checks)
    assert capsys.readouterr().out == f"✓ {exercise_id} passed ({total} checks)\n"
    assert result.passed and result.checks_passed == total == result.checks_total


@pytest.mark.parametrize("exercise_id,mistake", CATALOGUE, ids=[f"{e}-{m.key}" for e, m in CATALOGUE])
def test_mistake_gets_its_message(exercise_id, mistake, capsys):
    answer = WRONG[(exercise_id, mistake.key)]
    if answer is None:
        pytest.skip("this mistake only shows on a GPU")
    result = check(exercise_id, answer)
    line = capsys.readouterr().out
    assert result.status == "failed"
    assert result.mistake == mistake.key, line
    assert line == result.line + "\n" and line.count("\n") == 1
    assert line.startswith(f"✗ {exercise_id}: {result.failed_check}: expected ")
    assert mistake.message in line


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
def test_device_ignored_on_gpu():
    result = run_check("1.1", lambda n, device=None: torch.triu(torch.ones(n, n, dtype=torch.bool), 1))
    assert result.mistake == "device-ignored"
    # A forward pass whose mask stays on the CPU fails on the GPU with an error, not a wrong pass.
    result = run_check("1.2", lambda x, q, k, v: _head(x, q, k, v))
    assert result.status == "failed" and result.failed_check == "output on the input's device"


def test_head_variant_defaults_are_the_package_reference():
    x = torch.randn(2, 5, 4)
    weights = [torch.randn(4, 3) for _ in range(3)]
    assert torch.allclose(head_variant(x, *weights), reference_head(x, *weights), atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Not implemented, unknown, hostile answers


def _stub(*args, **kwargs):
    raise NotImplementedError("Replace this line with your solution.")


class _StubModule(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        raise NotImplementedError


class _HalfDone(StackedHeads):
    def forward(self, x):
        raise NotImplementedError


@pytest.mark.parametrize("exercise_id", list(CORRECT))
@pytest.mark.parametrize("answer", [None, ..., _stub], ids=["None", "Ellipsis", "stub"])
def test_not_implemented(exercise_id, answer, capsys):
    result = check(exercise_id, answer)
    assert capsys.readouterr().out == f"○ {exercise_id} not implemented yet\n"
    assert result.status == "not implemented" and not result


@pytest.mark.parametrize("answer", [_StubModule, _HalfDone])
def test_class_stubs_are_not_implemented(answer):
    assert run_check("2.1", answer).status == "not implemented"


def test_unknown_exercise_is_reported_not_raised(capsys):
    result = check("9.9", build_causal_mask)
    assert result.status == "error"
    assert capsys.readouterr().out.startswith("✗ 9.9: no exercise has this id; the exercises are 1.1, 1.2")


def _exits(*args, **kwargs):
    sys.exit(3)


def _recurses(*args, **kwargs):
    return _recurses(*args, **kwargs)


class _Weird:
    def __eq__(self, other):
        raise RuntimeError("no comparing me")

    def __len__(self):
        raise RuntimeError("no measuring me")


def _prints_and_warns(*args, **kwargs):
    import warnings

    print("debugging output")
    warnings.warn("a warning", stacklevel=2)
    return _Weird()


HOSTILE = [_exits, _recurses, _prints_and_warns, lambda *a, **k: [_Weird()], lambda *a, **k: {"a": _Weird()},
           lambda *a, **k: torch.tensor(float("nan")), 42, "not a function", StackedHeads]


@pytest.mark.parametrize("exercise_id", list(CORRECT))
@pytest.mark.parametrize("answer", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_check_never_raises_and_prints_one_line(exercise_id, answer, capsys):
    if answer is StackedHeads and exercise_id == "2.1":
        pytest.skip("the correct answer")
    result = check(exercise_id, answer)
    out = capsys.readouterr()
    assert result.status == "failed", result.line
    assert out.out == result.line + "\n" and out.out.count("\n") == 1
    assert out.err == ""
    assert result.line.startswith(f"✗ {exercise_id}: ")


def test_check_leaves_the_random_state_and_grad_mode_alone():
    torch.manual_seed(5)
    state = torch.get_rng_state()
    with torch.no_grad():
        check("2.1", StackedHeads)  # builds modules, which draws random numbers
        check("1.2", causal_attention_forward)
        assert not torch.is_grad_enabled()
    assert torch.equal(torch.get_rng_state(), state)


def test_gradient_checks_run_even_under_no_grad(capsys):
    with torch.no_grad():
        assert run_check("1.2", causal_attention_forward).passed


def test_result_displays_nothing_in_a_notebook():
    result = run_check("1.3", visible_positions)
    assert result._ipython_display_() is None
    assert result.to_dict()["status"] == "passed"


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_records_survive_serialisation(exercise_id, tmp_path):
    # The grader moves records from the notebook's kernel to its own process with torch.save and
    # torch.load(weights_only=True): the verdict must be the same on the other side.
    exercise = EXERCISES[exercise_id]
    for answer in (CORRECT[exercise_id], *[WRONG[(exercise_id, m.key)] for m in exercise.mistakes][:2]):
        record = probe(exercise, answer)
        torch.save(record, tmp_path / "record.pt")
        loaded = torch.load(tmp_path / "record.pt", weights_only=True)
        assert judge(exercise, loaded) == judge(exercise, record)


def test_answer_output_is_swallowed(capsys):
    def noisy(position, num_tokens):
        print("looking at", position, file=io.StringIO())
        print("debug", position)
        return list(range(position + 1))

    check("1.3", noisy)
    assert capsys.readouterr().out == "✓ 1.3 passed (5 checks)\n"
