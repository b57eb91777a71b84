"""Exercises of chapter 3, batched heads: split and merge, weight transfer, sizing a layer."""

from __future__ import annotations

import torch

from ..cost import parameter_count, score_memory_bytes
from ..data import random_batch, running_example
from ..device import get_device
from ..heads import split_heads
from ..multihead import MultiHeadAttention
from ..wrapper import MultiHeadAttentionWrapper
from .framework import (Check, Exercise, Failed, Mistake, Recorder, describe, expect_close, expect_shape,
                        plain, same, tensor_of, value_of)

HEAD_LABELS = ("sequence", "head", "token")
TOKEN_LABELS = ("sequence", "token")


def _probe_reshaper(answer, rec: Recorder, cases: dict, *extra) -> None:
    """Run a split or merge answer on every case, then once for gradients and once on the device."""
    for key, (x, args) in cases.items():
        rec.call(key, answer, x, *args)
    x, args = cases["a"]
    leaf = x.clone().requires_grad_()
    out = rec.call("grad_out", answer, leaf, *args)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        rec.call("backward", lambda: out.sum().backward())
    rec.note("grad", leaf.grad)
    device = get_device()
    rec.note("device_asked", str(device))
    rec.call("on_device", answer, x.to(device), *args)


def _grad_check(record):
    out = value_of(record, "grad_out")
    if out.get("kind") != "tensor" or not out["requires_grad"]:
        raise Failed("an output connected to the autograd graph", "an output that does not require grad",
                     "Reshape with tensor methods (view, transpose, reshape), without .detach(), "
                     "torch.no_grad() or NumPy.")
    value_of(record, "backward", "backward()")
    grad = plain(record["grad"])
    if not isinstance(grad, torch.Tensor) or not bool((grad == 1).all()):
        raise Failed("a gradient of 1 for every input number", "none" if grad is None else "other values")


def _device_check(record):
    asked = plain(record["device_asked"])
    got = value_of(record, "on_device", "the call on the device")
    if got.get("kind") != "tensor":
        raise Failed("a torch.Tensor", describe(got))
    if torch.device(got["device"]).type != torch.device(asked).type:
        raise Failed(f"an output on {asked}, where the input is", f"one on {got['device']}")


# ----------------------------------------------------------------------------------------------
# 3.1 Split into heads


def _split_cases() -> dict:
    return {"a": (random_batch(2, 5, 12, seed=31), (3,)), "b": (random_batch(1, 6, 4, seed=32), (2,))}


def reference_split(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The package's split, ``(B, T, d_out) -> (B, num_heads, T, head_dim)``."""
    return split_heads(x, num_heads)


def _split_case(key: str):
    def run(record):
        x, (num_heads,) = _split_cases()[key]
        got = tensor_of(record, key, f"split_heads(x, {num_heads})")
        expect_close(got, reference_split(x, num_heads), labels=HEAD_LABELS)
    return run


def _split_shape(record):
    x, (num_heads,) = _split_cases()["a"]
    expect_shape(tensor_of(record, "a", f"split_heads(x, {num_heads})"),
                 (2, num_heads, 5, x.shape[-1] // num_heads))


def _split_like(fn):
    def detect(record):
        x, (num_heads,) = _split_cases()["a"]
        return same(record["a"]["value"], fn(x, num_heads, x.shape[0], x.shape[1], x.shape[-1] // num_heads))
    return detect


def _split_shape_in(*shapes):
    return lambda record: tuple(record["a"]["value"].shape) in shapes


SPLIT = Exercise(
    id="3.1",
    title="split the projections into heads",
    answer_name="split_heads",
    signature="split_heads(x, num_heads)",
    probe=lambda answer, rec: _probe_reshaper(answer, rec, _split_cases()),
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "a", "split_heads(x, 3)")),
        Check("shape (2, 3, 5, 4) for 3 heads of a (2, 5, 12) input", _split_shape),
        Check("head h holds columns h*head_dim to (h+1)*head_dim of every token", _split_case("a")),
        Check("2 heads of a (1, 6, 4) input", _split_case("b")),
        Check("gradients flow back to the input", _grad_check),
        Check("output on the input's device", _device_check),
    ),
    mistakes=(
        Mistake("view-without-transpose",
                "Right shape, wrong numbers: viewing (B, T, d_out) directly as (B, num_heads, T, "
                "head_dim) cuts the memory into the wrong pieces, mixing tokens inside a head. View as "
                "(B, T, num_heads, head_dim) first, then swap tokens and heads with .transpose(1, 2).",
                _split_like(lambda x, h, b, t, hd: x.view(b, h, t, hd))),
        Mistake("no-transpose",
                "You stopped at (B, T, num_heads, head_dim). Bring the heads in front of the tokens "
                "with .transpose(1, 2), so that each head is a batch of (T, head_dim) matrices.",
                _split_shape_in((2, 5, 3, 4))),
        Mistake("interleaved",
                "Each head got every num_heads-th column instead of a block of head_dim neighbouring "
                "columns: you viewed as (B, T, head_dim, num_heads). View as (B, T, num_heads, "
                "head_dim): head h owns columns h*head_dim to (h+1)*head_dim, the ones its weights "
                "produce.",
                _split_like(lambda x, h, b, t, hd: x.view(b, t, hd, h).permute(0, 3, 1, 2))),
        Mistake("head-dim-first",
                "You viewed as (B, T, head_dim, num_heads): num_heads comes before head_dim, "
                "x.view(B, T, num_heads, head_dim).transpose(1, 2).",
                _split_shape_in((2, 4, 5, 3))),
        Mistake("wrong-axes",
                "You swapped the wrong axes. After .view(B, T, num_heads, head_dim) the token axis (1) "
                "and the head axis (2) swap: .transpose(1, 2).",
                _split_shape_in((2, 5, 4, 3), (2, 4, 3, 5))),
    ),
)

# ----------------------------------------------------------------------------------------------
# 3.2 Merge the heads back


def _merge_cases() -> dict:
    # (B, h, T, hd) tensors laid out contiguously, as attention's weights @ values gives them.
    return {"a": (random_batch(2, 3 * 5, 4, seed=33).reshape(2, 3, 5, 4), ()),
            "b": (random_batch(1, 2 * 6, 2, seed=35).reshape(1, 2, 6, 2), ())}


def _merge_case(key: str):
    def run(record):
        x, _ = _merge_cases()[key]
        batch, num_heads, num_tokens, head_dim = x.shape
        got = tensor_of(record, key, "merge_heads(x)")
        expect_shape(got, (batch, num_tokens, num_heads * head_dim))
        # A correct merge is undone by the package's split.
        expect_close(reference_split(got, num_heads), x, labels=HEAD_LABELS)
    return run


def _merge_shape(record):
    x, _ = _merge_cases()["a"]
    expect_shape(tensor_of(record, "a", "merge_heads(x)"), (2, 5, 12))


def _merge_like(fn):
    def detect(record):
        x, _ = _merge_cases()["a"]
        return same(record["a"]["value"], fn(x))
    return detect


def _needs_contiguous(record) -> bool:
    error = record["a"]
    return error["kind"] == "error" and "view" in error["message"] and (
        "stride" in error["message"] or "contiguous" in error["message"])


MERGE = Exercise(
    id="3.2",
    title="merge the heads back",
    answer_name="merge_heads",
    signature="merge_heads(x)",
    probe=lambda answer, rec: _probe_reshaper(answer, rec, _merge_cases()),
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "a", "merge_heads(x)")),
        Check("shape (2, 5, 12) for a (2, 3, 5, 4) input", _merge_shape),
        Check("splitting the result gives the heads back", _merge_case("a")),
        Check("a (1, 2, 6, 2) input", _merge_case("b")),
        Check("gradients flow back to the input", _grad_check),
        Check("output on the input's device", _device_check),
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
                "The heads' numbers are interleaved (head 0's first number, head 1's first number, "
                "...). Each token's row must hold head 0's head_dim numbers, then head 1's: "
                "x.transpose(1, 2) gives (B, T, num_heads, head_dim), which then views as (B, T, d_out).",
                _merge_like(lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1))),
        Mistake("stopped-early",
                "You stopped at (B, T, num_heads, head_dim). Glue the last two axes together: "
                ".contiguous().view(B, T, num_heads * head_dim).",
                lambda record: tuple(record["a"]["value"].shape) == (2, 5, 3, 4)),
    ),
)

# ----------------------------------------------------------------------------------------------
# 3.3 Transfer weights from stacked heads into the batched module

#: wrapper arguments (d_in, d_out per head, context_length, dropout, num_heads, qkv_bias) per case.
PAIRS = {"two": (3, 2, 6, 0.0, 2, False), "bias": (5, 3, 4, 0.0, 3, True)}


def _pair(case: str) -> tuple[MultiHeadAttentionWrapper, MultiHeadAttention]:
    """The wrapper and the (differently initialised) batched module of a case, always the same."""
    d_in, d_out, context_length, dropout, num_heads, qkv_bias = PAIRS[case]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        wrapper = MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        torch.manual_seed(2)
        mha = MultiHeadAttention(d_in, num_heads * d_out, context_length, dropout, num_heads, qkv_bias)
    return wrapper, mha


def _inputs(case: str) -> dict[str, torch.Tensor]:
    if case == "two":
        return {"running": running_example(batch=True), "random": random_batch(2, 6, 3, seed=36)}
    return {"random": random_batch(2, 4, 5, seed=37)}


def _state(module) -> dict:
    return {name: value for name, value in module.state_dict().items() if not name.endswith("mask")}


def _probe_transfer(transfer, rec: Recorder) -> None:
    for case in PAIRS:
        wrapper, mha = _pair(case)
        rec.call(f"{case}_call", transfer, wrapper, mha)
        rec.note(f"{case}_wrapper_state", _state(wrapper))
        rec.note(f"{case}_mha_state", _state(mha))
        rec.note(f"{case}_trainable", all(p.requires_grad for p in mha.parameters()))
        for name, x in _inputs(case).items():
            with torch.no_grad():
                rec.call(f"{case}_{name}", mha, x)


def _expected(case: str) -> tuple[MultiHeadAttentionWrapper, dict]:
    wrapper, _ = _pair(case)
    return wrapper, _state(MultiHeadAttention.from_wrapper(wrapper))


def _transfer_runs(case: str):
    def run(record):
        d_in, d_out, _, _, num_heads, qkv_bias = PAIRS[case]
        value_of(record, f"{case}_call",
                 f"transfer_heads(wrapper, mha) with {num_heads} heads of width {d_out} on {d_in} features"
                 + (" and qkv_bias=True" if qkv_bias else ""))
    return run


def _wrapper_unchanged(record):
    wrapper, _ = _pair("two")
    for name, value in _state(wrapper).items():
        if not same(plain(record["two_wrapper_state"]).get(name), value):
            raise Failed("the wrapper's weights untouched", f"a changed {name}",
                         "Copy from the wrapper into mha, never the other way round.")


def _same_output(case: str, name: str):
    def run(record):
        _transfer_runs(case)(record)
        wrapper, _ = _pair(case)
        x = _inputs(case)[name]
        with torch.no_grad():
            expected = wrapper(x)
        expect_close(tensor_of(record, f"{case}_{name}", "mha(x) after the transfer"), expected,
                     labels=TOKEN_LABELS)
    return run


def _trainable(record):
    if not plain(record["two_trainable"]):
        raise Failed("every parameter of mha to keep requires_grad=True", "frozen parameters",
                     "Copy values into the existing parameters with .copy_() under torch.no_grad(), "
                     "rather than replacing them with plain tensors.")


def _mha_state(record, case: str = "two") -> dict:
    return plain(record[f"{case}_mha_state"])


def _heads(role: str, case: str = "two", reverse: bool = False) -> torch.Tensor:
    heads = _pair(case)[0].heads
    heads = list(reversed(heads)) if reverse else list(heads)
    return torch.cat([getattr(head, role).weight.detach() for head in heads], dim=0)


def _qkv_right(record, case: str = "two") -> bool:
    state, (_, expected) = _mha_state(record, case), _expected(case)
    return all(same(state[f"{role}.weight"], expected[f"{role}.weight"]) for role in ("W_query", "W_key", "W_value"))


def _out_proj_left(record) -> bool:
    state = _mha_state(record)
    return _qkv_right(record) and not same(state["out_proj.weight"], torch.eye(4))


def _out_proj_bias(record) -> bool:
    state = _mha_state(record)
    return (_qkv_right(record) and same(state["out_proj.weight"], torch.eye(4))
            and not same(state["out_proj.bias"], torch.zeros(4)))


def _not_in_place(record) -> bool:
    return all(same(_mha_state(record)[name], value) for name, value in _state(_pair("two")[1]).items())


def _reversed(record) -> bool:
    return same(_mha_state(record)["W_query.weight"], _heads("W_query", reverse=True))


def _roles_swapped(record) -> bool:
    state, (_, expected) = _mha_state(record), _expected("two")
    roles = ("W_query", "W_key", "W_value")
    return any(same(state[f"{a}.weight"], expected[f"{b}.weight"]) for a in roles for b in roles if a != b)


def _first_head_only(record) -> bool:
    got = _mha_state(record)["W_query.weight"]
    original = _state(_pair("two")[1])["W_query.weight"]
    head0 = _pair("two")[0].heads[0].W_query.weight.detach()
    return same(got[:2], head0) and same(got[2:], original[2:])


def _bias_forgotten(record) -> bool:
    state, (_, expected) = _mha_state(record, "bias"), _expected("bias")
    return _qkv_right(record, "bias") and not all(
        same(state[f"{role}.bias"], expected[f"{role}.bias"]) for role in ("W_query", "W_key", "W_value"))


def _error_says(*fragments):
    def detect(record):
        error = record["two_call"]
        return error["kind"] == "error" and any(f in error["message"] for f in fragments)
    return detect


TRANSFER = Exercise(
    id="3.3",
    title="transfer stacked heads into the batched module",
    answer_name="transfer_heads",
    signature="transfer_heads(wrapper, mha)",
    probe=_probe_transfer,
    checks=(
        Check("runs on a 2-head wrapper", _transfer_runs("two")),
        Check("leaves the wrapper unchanged", _wrapper_unchanged),
        Check("mha gives the wrapper's output on the running example", _same_output("two", "running")),
        Check("mha gives the wrapper's output on a random batch", _same_output("two", "random")),
        Check("3 heads with qkv_bias", _same_output("bias", "random")),
        Check("mha stays trainable", _trainable),
    ),
    mistakes=(
        Mistake("needs-no-grad",
                "Copying into a parameter in place is an operation autograd refuses to record. Wrap the "
                "copies in `with torch.no_grad():`.",
                _error_says("leaf Variable", "requires grad")),
        Mistake("rows-not-columns",
                "The shapes do not fit: nn.Linear stores its weight as (out_features, in_features), so "
                "each head owns a block of ROWS of mha's weight. Concatenate the heads' weights along "
                "dim=0.",
                _error_says("must match", "size mismatch", "shape")),
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
                "The heads are in reverse order: head h's weights belong in rows h*head_dim to "
                "(h+1)*head_dim, head 0 first.",
                _reversed),
        Mistake("roles-swapped",
                "A projection got another role's weights: W_query comes from the heads' W_query, W_key "
                "from W_key, W_value from W_value.",
                _roles_swapped),
        Mistake("first-head-only",
                "Only head 0's weights were copied: loop over every head and fill its block of rows.",
                _first_head_only),
        Mistake("bias-forgotten",
                "The weights are right but the biases were not copied: with qkv_bias=True concatenate "
                "the heads' biases into W_query.bias, W_key.bias and W_value.bias too.",
                _bias_forgotten),
    ),
)

# ----------------------------------------------------------------------------------------------
# 3.4 Size an attention layer: GPT-2 small and others

#: (d_model, num_heads, context_length, qkv_bias) of the layers the answer is asked about.
LAYERS = {"GPT-2 small": (768, 12, 1024, True), "GPT-2 medium": (1024, 16, 1024, True),
          "a toy layer without qkv bias": (4, 2, 6, False)}
KEYS = ("head_dim", "parameters", "attention_weights_mib")


def _layer_expected(name: str) -> dict:
    d, h, t, bias = LAYERS[name]
    return {
        "head_dim": d // h,
        "parameters": parameter_count("batched", d, d, h, qkv_bias=bias),
        "attention_weights_mib": score_memory_bytes(1, h, t) / 2**20,  # float32, one sequence
    }


def _probe_size(size, rec: Recorder) -> None:
    for name, (d, h, t, bias) in LAYERS.items():
        rec.call(name, size, d, h, t, qkv_bias=bias)


def _call_text(name: str) -> str:
    d, h, t, bias = LAYERS[name]
    return f"attention_layer_size({d}, {h}, {t}, qkv_bias={bias})"


def _size_answer(record, name: str) -> dict:
    summary = value_of(record, name, _call_text(name))
    answer = plain(summary)
    if not isinstance(answer, dict) or any(key not in answer for key in KEYS):
        raise Failed(f"a dict with keys {', '.join(KEYS)}", describe(summary))
    return answer


def _number(value):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _agrees(got, expected) -> bool:
    got = _number(got)
    return got is not None and abs(got - expected) <= 1e-6 * max(1.0, abs(expected))


def _size_key(name: str, keys=KEYS):
    def run(record):
        answer, expected = _size_answer(record, name), _layer_expected(name)
        for key in keys:
            if not _agrees(answer[key], expected[key]):
                got = _number(answer[key])
                raise Failed(f"{key} = {expected[key]:,}", f"{got:,}" if got is not None else repr(answer[key]))
    return run


_D, _H, _T, _ = LAYERS["GPT-2 small"]


def _small_is(key: str, value) -> callable:
    return lambda record: _agrees(plain(record["GPT-2 small"])[key], value)


_HEAD_DIM_CHECK = ("GPT-2 small: head_dim",)
_PARAMETERS_CHECK = ("GPT-2 small: parameters",)
_MIB_CHECK = ("GPT-2 small: attention_weights_mib",)

SIZE = Exercise(
    id="3.4",
    title="size an attention layer (GPT-2 small and others)",
    answer_name="attention_layer_size",
    signature="attention_layer_size(d_model, num_heads, context_length, qkv_bias=True)",
    probe=_probe_size,
    checks=(
        Check("returns the three numbers", lambda r: _size_answer(r, "GPT-2 small")),
        Check(_HEAD_DIM_CHECK[0], _size_key("GPT-2 small", ("head_dim",))),
        Check(_PARAMETERS_CHECK[0], _size_key("GPT-2 small", ("parameters",))),
        Check(_MIB_CHECK[0], _size_key("GPT-2 small", ("attention_weights_mib",))),
        Check("GPT-2 medium (1024 wide, 16 heads)", _size_key("GPT-2 medium")),
        Check("a toy layer without qkv bias (4 wide, 2 heads, 6 tokens)", _size_key("a toy layer without qkv bias")),
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
                lambda record: _agrees(plain(record["a toy layer without qkv bias"])["parameters"],
                                       parameter_count("batched", 4, 4, 2, qkv_bias=True)),
                ("a toy layer without qkv bias (4 wide, 2 heads, 6 tokens)",)),
    ),
)

EXERCISES = (SPLIT, MERGE, TRANSFER, SIZE)

__all__ = ["EXERCISES", "reference_split"]
