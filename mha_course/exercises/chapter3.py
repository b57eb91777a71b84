"""Exercises of chapter 3, batched heads: split and merge, weight transfer, sizing a layer.

The capstone, exercise 3.5 (the whole batched module), lives in :mod:`~mha_course.exercises.capstone`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..cost import cost_by_heads, count_parameters, multiply_adds, parameter_count, score_memory_bytes
from ..data import running_example
from ..attention.heads import merge_heads, split_heads
from ..attention.multihead import MultiHeadAttention, transfer_weights
from ..attention.wrapper import MultiHeadAttentionWrapper
from .capstone import CAPSTONE
from .framework import Check, Exercise, Mistake
from .probes import (agrees, batch, connected_check, device_check, draw, probe_backward, probe_on_devices)
from .records import (Failed, Recorder, dict_of, expect_close, expect_shape, format_shape, number, number_text, plain, raised,
                      same, seed_of, summarise, tensor_of, value_of)
from .shortcuts import attention_modules, package

HEAD_LABELS = ("sequence", "head", "token")
TOKEN_LABELS = ("sequence", "token")


def _probe_reshaper(answer, rec: Recorder, cases: dict) -> None:
    """Run a split or merge answer on every case, then once for gradients and on the devices."""
    for key, (x, args, _) in cases.items():
        rec.call(key, answer, x, *args)
    x, args, _ = cases["a"]
    leaf = x.clone().requires_grad_()
    probe_backward(rec, "grad_out", rec.call("grad_out", answer, leaf, *args))
    rec.note("grad", leaf.grad)
    probe_on_devices(rec, "on", lambda device: answer(x.to(device), *args))


def _grad_check(record):
    connected_check(record, "grad_out", "Reshape with tensor methods (view, transpose, reshape), without "
                    ".detach(), torch.no_grad() or NumPy.")
    grad = plain(record["grad"])
    if not isinstance(grad, torch.Tensor) or not bool((grad == 1).all()):
        raise Failed("a gradient of 1 for every input number", "none" if grad is None else "other values")


def _sizes(seed: int, salt: str) -> dict[str, int]:
    return draw(seed, salt, {"batch": (1, 3), "tokens": (2, 7), "heads": (2, 5), "head_dim": (2, 6)})


# ----------------------------------------------------------------------------------------------
# 3.1 Split into heads


def split_cases(seed: int) -> dict:
    """``key -> (x, (num_heads,), label)``: projections ``(B, T, d_out)`` of random sizes."""
    cases = {}
    for key in ("a", "b"):
        s = _sizes(seed, f"3.1 {key}")
        x, label = batch(seed, f"3.1 {key}", s["batch"], s["tokens"], s["heads"] * s["head_dim"])
        cases[key] = (x, (s["heads"],), f"to_heads({label}, {s['heads']})")
    return cases


def _split_case(key: str):
    def run(record):
        x, (num_heads,), label = split_cases(seed_of(record))[key]
        got = tensor_of(record, key, label)
        expect_close(got, split_heads(x, num_heads), labels=HEAD_LABELS, where=f"for {label}")
    return run


def _split_shape(record):
    x, (num_heads,), label = split_cases(seed_of(record))["a"]
    got = tensor_of(record, "a", label)
    expected = (x.shape[0], num_heads, x.shape[1], x.shape[2] // num_heads)
    if tuple(got.shape) != expected:
        raise Failed(f"shape {format_shape(expected)} = (B, h, T, d_h) for {label}", f"shape {format_shape(got.shape)}")


def _split_like(fn):
    def detect(record):
        x, (num_heads,), _ = split_cases(seed_of(record))["a"]
        b, t, d = x.shape
        return same(record["a"]["value"], fn(x, num_heads, b, t, d // num_heads))
    return detect


def _split_shape_is(*rules):
    def detect(record):
        x, (h, ), _ = split_cases(seed_of(record))["a"]
        b, t, d = x.shape
        return tuple(record["a"]["value"].shape) in {rule(b, t, h, d // h) for rule in rules}
    return detect


SPLIT = Exercise(
    id="3.1",
    title="split the projections into heads",
    answer_name="to_heads",
    signature="to_heads(x, num_heads)",
    probe=lambda answer, rec: _probe_reshaper(answer, rec, split_cases(rec.seed)),
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "a", "to_heads(x, num_heads)"), gate=True),
        Check("shape (B, num_heads, T, head_dim)", _split_shape),
        Check("head m (from 1) holds columns (m - 1)*head_dim to m*head_dim - 1 of every token",
              _split_case("a")),
        Check("another size", _split_case("b")),
        Check("gradients flow back to the input", _grad_check),
        Check("output on the input's device", device_check("on", "to_heads")),
    ),
    mistakes=(
        Mistake("view-without-transpose",
                "Right shape, wrong numbers: viewing (B, T, d_out) directly as (B, num_heads, T, "
                "head_dim) cuts the memory into the wrong pieces, mixing tokens inside a head. View as "
                "(B, T, num_heads, head_dim) first, then swap tokens and heads with .transpose(1, 2).",
                _split_like(lambda x, h, b, t, hd: x.reshape(b, h, t, hd))),
        Mistake("no-transpose",
                "You stopped at (B, T, num_heads, head_dim). Bring the heads in front of the tokens "
                "with .transpose(1, 2), so that each head is a batch of (T, head_dim) matrices.",
                _split_shape_is(lambda b, t, h, hd: (b, t, h, hd))),
        Mistake("interleaved",
                "Each head got every num_heads-th column instead of a block of head_dim neighbouring "
                "columns: you viewed as (B, T, head_dim, num_heads). View as (B, T, num_heads, "
                "head_dim): head m (counting from 1) owns columns (m - 1)*head_dim to m*head_dim - 1, "
                "the ones its weights produce.",
                _split_like(lambda x, h, b, t, hd: x.view(b, t, hd, h).permute(0, 3, 1, 2))),
        Mistake("head-dim-first",
                "You viewed as (B, T, head_dim, num_heads): num_heads comes before head_dim, "
                "x.view(B, T, num_heads, head_dim).transpose(1, 2).",
                _split_shape_is(lambda b, t, h, hd: (b, hd, t, h))),
        Mistake("wrong-axes",
                "You swapped the wrong axes. After .view(B, T, num_heads, head_dim) the token axis (1) "
                "and the head axis (2) swap: .transpose(1, 2).",
                _split_shape_is(lambda b, t, h, hd: (b, t, hd, h), lambda b, t, h, hd: (b, hd, h, t))),
    ),
    shortcuts=package(split_heads) + attention_modules(),
)

# ----------------------------------------------------------------------------------------------
# 3.2 Merge the heads back


def merge_cases(seed: int) -> dict:
    """``key -> (x, (), label)``: ``(B, h, T, d_h)`` tensors laid out contiguously, as ``weights @ values`` gives them."""
    cases = {}
    for key in ("a", "b"):
        s = _sizes(seed, f"3.2 {key}")
        x, label = batch(seed, f"3.2 {key}", s["batch"], s["heads"] * s["tokens"], s["head_dim"])
        cases[key] = (x.reshape(s["batch"], s["heads"], s["tokens"], s["head_dim"]), (),
                      f"from_heads({label}.reshape({s['batch']}, {s['heads']}, {s['tokens']}, {s['head_dim']}))")
    return cases


def _merge_case(key: str):
    def run(record):
        x, _, label = merge_cases(seed_of(record))[key]
        b, h, t, hd = x.shape
        got = tensor_of(record, key, label)
        expect_shape(got, (b, t, h * hd))
        # A correct merge is undone by the package's split.
        expect_close(split_heads(got, h), x, labels=HEAD_LABELS, where=f"after splitting the result of {label}")
    return run


def _merge_shape(record):
    x, _, label = merge_cases(seed_of(record))["a"]
    b, h, t, hd = x.shape
    got = tensor_of(record, "a", label)
    if tuple(got.shape) != (b, t, h * hd):
        raise Failed(f"shape {format_shape((b, t, h * hd))} = (B, T, h * d_h) for {label}", f"shape {format_shape(got.shape)}")


def _merge_like(fn):
    def detect(record):
        x, _, _ = merge_cases(seed_of(record))["a"]
        return same(record["a"]["value"], fn(x))
    return detect


def _needs_contiguous(record) -> bool:
    return raised(record, "a", "view") and raised(record, "a", "stride", "contiguous")


MERGE = Exercise(
    id="3.2",
    title="merge the heads back",
    answer_name="from_heads",
    signature="from_heads(x)",
    probe=lambda answer, rec: _probe_reshaper(answer, rec, merge_cases(rec.seed)),
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "a", "from_heads(x)"), gate=True),
        Check("shape (B, T, num_heads * head_dim)", _merge_shape),
        Check("splitting the result gives the heads back", _merge_case("a")),
        Check("another size", _merge_case("b")),
        Check("gradients flow back to the input", _grad_check),
        Check("output on the input's device", device_check("on", "from_heads")),
    ),
    mistakes=(
        Mistake("needs-contiguous",
                ".view failed after .transpose: transposing only swaps strides, so the numbers are no "
                "longer laid out token by token in memory and view cannot glue the heads together. "
                "Call .contiguous() between them: x.transpose(1, 2).contiguous().view(B, T, -1) (or use "
                ".reshape, which copies when it must).",
                _needs_contiguous),
        Mistake("no-transpose",
                "Right shape, wrong numbers: reshaping (B, num_heads, T, head_dim) straight to (B, T, "
                "d_out) puts pieces of different tokens into one row. Swap heads and tokens first: "
                "x.transpose(1, 2), then .contiguous().view(B, T, -1).",
                _merge_like(lambda x: x.reshape(x.shape[0], x.shape[2], -1))),
        Mistake("interleaved",
                "The heads' numbers are interleaved (head 1's first number, head 2's first number, "
                "...). Each token's row must hold head 1's head_dim numbers, then head 2's: "
                "x.transpose(1, 2) gives (B, T, num_heads, head_dim), which then views as (B, T, d_out).",
                _merge_like(lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1))),
        Mistake("stopped-early",
                "You stopped at (B, T, num_heads, head_dim). Glue the last two axes together: "
                ".contiguous().view(B, T, num_heads * head_dim).",
                _merge_like(lambda x: x.transpose(1, 2))),
    ),
    shortcuts=package(merge_heads) + attention_modules(),
)

# ----------------------------------------------------------------------------------------------
# 3.3 Transfer weights from stacked heads into the batched module


def transfer_cases(seed: int) -> dict[str, tuple]:
    """Wrapper arguments ``(d_in, d_out per head, context_length, dropout, num_heads, qkv_bias)``."""
    s = draw(seed, "3.3", {"d_in": (2, 7), "d_out": (2, 4), "num_heads": (3, 5)})
    return {"two": (3, 2, 6, 0.0, 2, False), "bias": (s["d_in"], s["d_out"], 5, 0.0, s["num_heads"], True)}


def _describe_case(args) -> str:
    d_in, d_out, _, _, num_heads, qkv_bias = args
    return f"{num_heads} heads of width {d_out} on {d_in} features" + (" with qkv_bias=True" if qkv_bias else "")


def pair(seed: int, case: str) -> tuple[MultiHeadAttentionWrapper, MultiHeadAttention]:
    """The wrapper and the (differently initialised) batched module of a case, the same every time."""
    d_in, d_out, context_length, dropout, num_heads, qkv_bias = transfer_cases(seed)[case]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapper = MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        torch.manual_seed(seed + 1)
        mha = MultiHeadAttention(d_in, num_heads * d_out, context_length, dropout, num_heads, qkv_bias)
    return wrapper, mha


def _inputs(seed: int, case: str) -> dict[str, tuple[torch.Tensor, str]]:
    d_in, _, context_length, _, _, _ = transfer_cases(seed)[case]
    random = batch(seed, f"3.3 {case}", 2, context_length, d_in)
    return {"running": (running_example(batch=True), "the running example"), "random": random} if case == "two" \
        else {"random": random}


def _state(module) -> dict:
    return {name: value for name, value in module.state_dict().items() if not name.endswith("mask")}


def _parameter_kinds(module: nn.Module) -> dict[str, str]:
    """Each named parameter or tensor attribute of the projections: "trainable", "frozen" or "plain tensor"."""
    kinds = {name: "trainable" if p.requires_grad else "frozen" for name, p in module.named_parameters()}
    for role in ("W_query", "W_key", "W_value", "out_proj"):
        for attribute in ("weight", "bias"):
            value = getattr(getattr(module, role, None), attribute, None)
            name = f"{role}.{attribute}"
            if isinstance(value, torch.Tensor) and name not in kinds:
                kinds[name] = "plain tensor"
    return kinds


def _probe_transfer(transfer, rec: Recorder) -> None:
    for case in transfer_cases(rec.seed):
        wrapper, mha = pair(rec.seed, case)
        rec.call(f"{case}_call", transfer, wrapper, mha)
        rec.note(f"{case}_wrapper_state", _state(wrapper))
        rec.note(f"{case}_mha_state", _state(mha))
        rec.note(f"{case}_parameters", _parameter_kinds(mha))
        for name, (x, _) in _inputs(rec.seed, case).items():
            with torch.no_grad():
                rec.call(f"{case}_{name}", mha, x)


def _transfer_runs(case: str):
    def run(record):
        value_of(record, f"{case}_call", f"transfer_heads(wrapper, mha) with "
                 f"{_describe_case(transfer_cases(seed_of(record))[case])}")
    return run


def _wrapper_unchanged(record):
    wrapper, _ = pair(seed_of(record), "two")
    for name, value in _state(wrapper).items():
        if not same(plain(record["two_wrapper_state"]).get(name), value):
            raise Failed("the wrapper's weights untouched", f"a changed {name}",
                         "Copy from the wrapper into mha, never the other way round.")


def _same_output(case: str, name: str):
    def run(record):
        _transfer_runs(case)(record)
        seed = seed_of(record)
        wrapper, _ = pair(seed, case)
        x, label = _inputs(seed, case)[name]
        with torch.no_grad():
            expected = wrapper(x)
        expect_close(tensor_of(record, f"{case}_{name}", "mha(x) after the transfer"), expected,
                     labels=TOKEN_LABELS, where=f"(the wrapper's output) for {_describe_case(transfer_cases(seed)[case])} on {label}")
    return run


def _keeps_parameters(record):
    expected = [name for name, _ in pair(seed_of(record), "two")[1].named_parameters()]
    kinds = plain(record["two_parameters"])
    for name in expected:
        kind = kinds.get(name, "missing")
        if kind != "trainable":
            raise Failed(f"mha's {len(expected)} parameters, all still trainable nn.Parameters",
                         f"{name} {'is a ' + kind if kind == 'plain tensor' else kind}",
                         "Copy values into the existing parameters with .copy_() under torch.no_grad(), "
                         "rather than replacing them.")


def _mha_state(record, case: str = "two") -> dict:
    return plain(record[f"{case}_mha_state"])


def _expected_state(seed: int, case: str) -> dict:
    return _state(MultiHeadAttention.from_wrapper(pair(seed, case)[0]))


def _qkv_right(record, case: str = "two") -> bool:
    state, expected = _mha_state(record, case), _expected_state(seed_of(record), case)
    return all(same(state[f"{role}.weight"], expected[f"{role}.weight"]) for role in ("W_query", "W_key", "W_value"))


def _out_proj_left(record) -> bool:
    return _qkv_right(record) and not same(_mha_state(record)["out_proj.weight"], torch.eye(4))


def _out_proj_bias(record) -> bool:
    state = _mha_state(record)
    return (_qkv_right(record) and same(state["out_proj.weight"], torch.eye(4))
            and not same(state["out_proj.bias"], torch.zeros(4)))


def _not_in_place(record) -> bool:
    original = _state(pair(seed_of(record), "two")[1])
    return all(same(_mha_state(record)[name], value) for name, value in original.items())


def _reversed(record) -> bool:
    heads = list(reversed(pair(seed_of(record), "two")[0].heads))
    return same(_mha_state(record)["W_query.weight"], torch.cat([h.W_query.weight.detach() for h in heads]))


def _roles_swapped(record) -> bool:
    state, expected = _mha_state(record), _expected_state(seed_of(record), "two")
    roles = ("W_query", "W_key", "W_value")
    return any(same(state[f"{a}.weight"], expected[f"{b}.weight"]) for a in roles for b in roles if a != b)


def _first_head_only(record) -> bool:
    wrapper, mha = pair(seed_of(record), "two")
    got = _mha_state(record)["W_query.weight"]
    return same(got[:2], wrapper.heads[0].W_query.weight.detach()) and same(got[2:], mha.W_query.weight.detach()[2:])


def _bias_forgotten(record) -> bool:
    state, expected = _mha_state(record, "bias"), _expected_state(seed_of(record), "bias")
    return _qkv_right(record, "bias") and not all(
        same(state[f"{role}.bias"], expected[f"{role}.bias"]) for role in ("W_query", "W_key", "W_value"))


def _replaced(kind: str):
    return lambda record: kind in plain(record["two_parameters"]).values()


_KEEPS = "mha keeps its parameters, trainable"

TRANSFER = Exercise(
    id="3.3",
    title="transfer stacked heads into the batched module",
    answer_name="transfer_heads",
    signature="transfer_heads(wrapper, mha)",
    probe=_probe_transfer,
    checks=(
        Check("runs on a 2-head wrapper", _transfer_runs("two"), gate=True),
        Check("leaves the wrapper unchanged", _wrapper_unchanged, gate=True),
        Check("mha gives the wrapper's output on the running example", _same_output("two", "running")),
        Check("mha gives the wrapper's output on a random batch", _same_output("two", "random")),
        Check("more heads, with qkv_bias", _same_output("bias", "random")),
        Check(_KEEPS, _keeps_parameters),
    ),
    mistakes=(
        Mistake("needs-no-grad",
                "Copying into a parameter in place is an operation autograd refuses to record. Wrap the "
                "copies in `with torch.no_grad():`.",
                lambda record: raised(record, "two_call", "leaf Variable", "requires grad")),
        Mistake("rows-not-columns",
                "The shapes do not fit: nn.Linear stores its weight as (out_features, in_features), so "
                "each head owns a block of ROWS of mha's weight. Concatenate the heads' weights along "
                "dim=0.",
                lambda record: raised(record, "two_call", "must match", "size mismatch", "shape")),
        Mistake("not-in-place",
                "mha is unchanged after your function ran. Copy the weights into the module you are "
                "given (with .copy_() under torch.no_grad()), as the check uses that module.",
                _not_in_place),
        Mistake("out-proj-left-random",
                "Query, key and value are right, but out_proj still holds random weights. The wrapper "
                "merges by concatenation alone, so make out_proj do nothing: weight = identity matrix, "
                "bias = 0.",
                _out_proj_left),
        Mistake("out-proj-bias",
                "out_proj.weight is the identity, but its bias is not zero: set it with "
                "mha.out_proj.bias.zero_().",
                _out_proj_bias),
        Mistake("heads-reversed",
                "The heads are in reverse order: head m's weights (counting from 1) belong in rows "
                "(m - 1)*head_dim to m*head_dim - 1, the first head first.",
                _reversed),
        Mistake("roles-swapped",
                "A projection got another role's weights: W_query comes from the heads' W_query, W_key "
                "from W_key, W_value from W_value.",
                _roles_swapped),
        Mistake("first-head-only",
                "Only the first head's weights were copied: loop over every head and fill its block of rows.",
                _first_head_only),
        Mistake("bias-forgotten",
                "The weights are right but the biases were not copied: with qkv_bias=True concatenate "
                "the heads' biases into W_query.bias, W_key.bias and W_value.bias too.",
                _bias_forgotten),
        Mistake("plain-tensors",
                "You replaced mha's weights by plain tensors: mha computes the right output, but those "
                "weights are no longer parameters, so .parameters() misses them, no optimiser would "
                "train them and state_dict() does not save them. Copy the values into the existing "
                "parameters: mha.W_query.weight.copy_(...) under torch.no_grad().",
                _replaced("plain tensor"), (_KEEPS,)),
        Mistake("frozen",
                "Your copies froze mha's parameters (requires_grad=False), so it cannot be trained any "
                "more. Copy with .copy_() under torch.no_grad(): the parameters stay trainable.",
                _replaced("frozen"), (_KEEPS,)),
    ),
    shortcuts=package(transfer_weights, MultiHeadAttention.from_wrapper, MultiHeadAttention.from_fast),
)

# ----------------------------------------------------------------------------------------------
# 3.4 Size an attention layer: GPT-2 small and others

KEYS = ("head_dim", "parameters", "attention_weights_mib")
GPT2 = "GPT-2 small"


def layer_cases(seed: int) -> dict[str, tuple[int, int, int, bool]]:
    """``(d_model, num_heads, context_length, qkv_bias)``: GPT-2 small, and two layers drawn from the seed."""
    a = draw(seed, "3.4 a", {"head_dim": (8, 128), "num_heads": (2, 32), "context_length": (64, 4096)})
    b = draw(seed, "3.4 b", {"head_dim": (1, 6), "num_heads": (2, 5), "context_length": (3, 40)})
    return {GPT2: (768, 12, 1024, True),
            "a layer with qkv bias": (a["head_dim"] * a["num_heads"], a["num_heads"], a["context_length"], True),
            "a small layer without qkv bias": (b["head_dim"] * b["num_heads"], b["num_heads"], b["context_length"], False)}


def layer_expected(args) -> dict:
    d, h, t, bias = args
    return {
        "head_dim": d // h,
        "parameters": parameter_count("batched", d, d, h, qkv_bias=bias),
        "attention_weights_mib": score_memory_bytes(1, h, t) / 2**20,  # float32, one sequence
    }


def _probe_size(size, rec: Recorder) -> None:
    for name, (d, h, t, bias) in layer_cases(rec.seed).items():
        rec.call(name, size, d, h, t, qkv_bias=bias)


def _size_call(args) -> str:
    d, h, t, bias = args
    return f"attention_layer_size({d}, {h}, {t}, qkv_bias={bias})"


def _size_answer(record, name: str) -> dict:
    return dict_of(record, name, KEYS, _size_call(layer_cases(seed_of(record))[name]))


def _as_number(value):
    """The number in a value of the learner's dict (an int, a float or a one-element tensor), or ``None``."""
    return number(summarise(value))


def _size_key(name: str, keys=KEYS):
    def run(record):
        args = layer_cases(seed_of(record))[name]
        answer, expected = _size_answer(record, name), layer_expected(args)
        for key in keys:
            got = _as_number(answer[key])
            if not agrees(got, expected[key]):
                raise Failed(f"{key} = {expected[key]:,} for {_size_call(args)}",
                             number_text(summarise(answer[key])) if got is not None else repr(answer[key]))
    return run


_D, _H, _T, _ = 768, 12, 1024, True


def _small_is(key: str, value) -> callable:
    return lambda record: agrees(_as_number(plain(record[GPT2])[key]), value)


def _biases_without_qkv_bias(record) -> bool:
    d, h, _, _ = layer_cases(seed_of(record))[_NO_BIAS]
    return agrees(_as_number(plain(record[_NO_BIAS])["parameters"]), parameter_count("batched", d, d, h, qkv_bias=True))


_HEAD_DIM_CHECK = ("GPT-2 small: head_dim",)
_PARAMETERS_CHECK = ("GPT-2 small: parameters",)
_MIB_CHECK = ("GPT-2 small: attention_weights_mib",)
_NO_BIAS = "a small layer without qkv bias"

SIZE = Exercise(
    id="3.4",
    title="size an attention layer (GPT-2 small and others)",
    answer_name="attention_layer_size",
    signature="attention_layer_size(d_model, num_heads, context_length, qkv_bias=True)",
    probe=_probe_size,
    checks=(
        Check("returns the three numbers", lambda r: _size_answer(r, GPT2)),
        Check(_HEAD_DIM_CHECK[0], _size_key(GPT2, ("head_dim",))),
        Check(_PARAMETERS_CHECK[0], _size_key(GPT2, ("parameters",))),
        Check(_MIB_CHECK[0], _size_key(GPT2, ("attention_weights_mib",))),
        Check("a layer of other sizes, with qkv bias", _size_key("a layer with qkv bias")),
        Check(_NO_BIAS, _size_key(_NO_BIAS)),
    ),
    mistakes=(
        Mistake("head-dim-is-d-model",
                "head_dim is the width of ONE head: d_model // num_heads.",
                _small_is("head_dim", _D), _HEAD_DIM_CHECK),
        Mistake("no-qkv-bias",
                "GPT-2's query, key and value projections have biases (qkv_bias=True): 3 x d_model more "
                "parameters.",
                _small_is("parameters", parameter_count("batched", _D, _D, _H)), _PARAMETERS_CHECK),
        Mistake("no-biases",
                "You counted the four weight matrices only. Each of them also has a bias of d_model "
                "numbers (query, key and value when qkv_bias=True, and out_proj always).",
                _small_is("parameters", 4 * _D * _D), _PARAMETERS_CHECK),
        Mistake("no-out-proj",
                "Don't forget the output projection out_proj: a d_model x d_model weight and a bias of "
                "d_model.",
                _small_is("parameters", 3 * (_D * _D + _D)), _PARAMETERS_CHECK),
        Mistake("d-model-per-head",
                "You gave every head d_model columns, the wrapper's meaning of d_out. In "
                "MultiHeadAttention d_out = d_model is the TOTAL width, split into num_heads heads.",
                _small_is("parameters", parameter_count("wrapper", _D, _D, _H, qkv_bias=True)), _PARAMETERS_CHECK),
        Mistake("one-head",
                "That is one head's context_length x context_length matrix. Every head holds its own.",
                _small_is("attention_weights_mib", score_memory_bytes(1, 1, _T) / 2**20), _MIB_CHECK),
        Mistake("bytes-not-mib",
                "That is a number of bytes: divide by 2**20 = 1,048,576 for MiB.",
                _small_is("attention_weights_mib", score_memory_bytes(1, _H, _T)), _MIB_CHECK),
        Mistake("float64",
                "float32 numbers take 4 bytes each, not 8.",
                _small_is("attention_weights_mib", score_memory_bytes(1, _H, _T, 8) / 2**20), _MIB_CHECK),
        Mistake("lower-triangle-only",
                "The module stores the full T x T matrix per head, masked entries included: the mask "
                "gives them zero weight but does not save their memory.",
                lambda record: (_small_is("attention_weights_mib", score_memory_bytes(1, _H, _T) / 2**21)(record)
                                or _small_is("attention_weights_mib", _H * _T * (_T + 1) / 2 * 4 / 2**20)(record)),
                _MIB_CHECK),
        Mistake("bias-always",
                "With qkv_bias=False the query, key and value projections have no biases; only "
                "out_proj keeps its bias.",
                _biases_without_qkv_bias, (_NO_BIAS,)),
    ),
    shortcuts=package(parameter_count, count_parameters, score_memory_bytes, multiply_adds, cost_by_heads,
                      why="This asks mha_course for the numbers: work them out from the arguments.")
    + attention_modules(),
)

EXERCISES = (SPLIT, MERGE, TRANSFER, SIZE, CAPSTONE)

__all__ = ["EXERCISES", "split_cases", "merge_cases", "transfer_cases", "pair", "layer_cases", "layer_expected"]
