"""Exercises of chapter 2, stacked heads: a wrapper of CausalAttention heads, and what it costs."""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..causal_attention import CausalAttention
from ..cost import count_parameters, parameter_count
from ..data import random_batch, running_example
from ..device import get_device
from ..multihead import MultiHeadAttention
from ..wrapper import MultiHeadAttentionWrapper
from .framework import (Check, Exercise, Failed, Mistake, Recorder, describe, expect_close, expect_shape,
                        int_of, plain, same, tensor_of, value_of)

# ----------------------------------------------------------------------------------------------
# 2.1 A wrapper of CausalAttention heads

#: The constructions the probe tries: (d_in, d_out per head, context_length, dropout, num_heads).
CASES = {"two": (3, 2, 6, 0.0, 2), "three": (4, 3, 5, 0.0, 3)}
KEEP = 3  # the causality probe changes tokens 3 and later


def _case_input(case: str) -> torch.Tensor:
    d_in, _, context_length, _, _ = CASES[case]
    return random_batch(2 if case == "two" else 1, context_length, d_in, seed=21 if case == "two" else 22)


def _future_changed(x: torch.Tensor) -> torch.Tensor:
    changed = x.clone()
    changed[:, KEEP:] = random_batch(x.shape[0], x.shape[1] - KEEP, x.shape[2], seed=99)
    return changed


def _heads_in(module) -> list[CausalAttention]:
    if not isinstance(module, nn.Module):
        return []
    return [m for m in module.modules() if isinstance(m, CausalAttention)]


def _head_state(head: CausalAttention) -> dict:
    return {name: value for name, value in head.state_dict().items() if name != "mask"}


def _parameters(module) -> int:
    return count_parameters(module) if isinstance(module, nn.Module) else 0


def _probe_stacked(cls, rec: Recorder) -> None:
    rec.note("is_module_class", isinstance(cls, type) and issubclass(cls, nn.Module))
    rec.note("type", "a class not derived from nn.Module" if isinstance(cls, type)
             else f"an object of type {type(cls).__name__}")
    for case, args in CASES.items():
        module = rec.call(f"{case}_build", cls, *args)
        if module is None:
            continue
        heads = _heads_in(module)
        rec.note(f"{case}_heads", [_head_state(head) for head in heads])
        rec.note(f"{case}_parameters", _parameters(module))
        x = _case_input(case)
        rec.call(f"{case}_out", module, x)
        if case != "two":
            continue
        rec.call("two_running", module, running_example(batch=True))
        rec.call("two_future", module, _future_changed(x))
        out = rec.call("two_grad_out", module, x)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            rec.call("two_backward", lambda: out.sum().backward())
        rec.note("two_head_grads", [all(p.grad is not None and bool(p.grad.abs().sum() > 0)
                                        for p in head.parameters()) for head in heads])
        device = get_device()
        rec.note("device_asked", str(device))
        moved = rec.call("two_to_device", module.to, device) if isinstance(module, nn.Module) else None
        if moved is not None:
            rec.call("two_on_device", moved, x.to(device))
    biased = rec.call("bias_build", cls, 3, 2, 6, 0.0, 2, qkv_bias=True)
    rec.note("bias_parameters", _parameters(biased))


def _stacked_is_class(record):
    if not plain(record["is_module_class"]):
        raise Failed("a class derived from nn.Module", plain(record["type"]),
                     "Pass the class itself, e.g. check(\"2.1\", StackedHeads), not an instance or a function.")


def _call_text(case: str) -> str:
    return "StackedHeads(" + ", ".join(map(str, CASES[case])) + ")"


def _stacked_builds(record):
    value_of(record, "two_build", _call_text("two"))


def _expected_width(case: str) -> int:
    _, d_out, _, _, num_heads = CASES[case]
    return num_heads * d_out


def _stacked_shape(record):
    x = _case_input("two")
    expect_shape(tensor_of(record, "two_out", "the forward pass"), (*x.shape[:2], _expected_width("two")))


def _stacked_registered(record):
    heads = plain(record["two_heads"])
    parameters = plain(record["two_parameters"])
    d_in, d_out, _, _, num_heads = CASES["two"]
    expected = parameter_count("wrapper", d_in, d_out, num_heads)
    if len(heads) != num_heads or parameters != expected:
        raise Failed(f"{num_heads} CausalAttention submodules holding {expected} parameters",
                     f"{len(heads)} CausalAttention submodule(s) and {parameters} parameters")


def _stacked_own_weights(record):
    heads = plain(record["two_heads"])
    for role in ("W_query.weight", "W_key.weight", "W_value.weight"):
        if same(heads[0][role], heads[1][role]):
            raise Failed("different weights in every head", f"the same {role} in heads 0 and 1")


def _stacked_causal(record):
    before = tensor_of(record, "two_out")
    after = tensor_of(record, "two_future", "the call with later tokens changed")
    change = (after[:, :KEEP] - before[:, :KEEP]).abs()
    if not bool(change.max() <= 1e-5):
        raise Failed(f"tokens 0-{KEEP - 1} unchanged when only tokens {KEEP} and later change",
                     f"a change of {float(torch.nan_to_num(change, nan=float('inf')).max()):.3g}")


def reference_wrapper(case: str, heads: list[dict], qkv_bias: bool = False) -> MultiHeadAttentionWrapper:
    """The package's wrapper for ``case``, with the given heads' weights loaded."""
    with torch.random.fork_rng(devices=[]):
        wrapper = MultiHeadAttentionWrapper(*CASES[case], qkv_bias=qkv_bias)
    for head, state in zip(wrapper.heads, heads):
        head.load_state_dict(state, strict=False)
    return wrapper


def _stacked_values(case: str):
    def run(record):
        heads = plain(record[f"{case}_heads"])
        got = tensor_of(record, f"{case}_out", "the forward pass")
        x = _case_input(case)
        expect_shape(got, (*x.shape[:2], _expected_width(case)))
        if len(heads) != CASES[case][4]:
            raise Failed(f"{CASES[case][4]} CausalAttention heads", f"{len(heads)}")
        with torch.no_grad():
            expected = reference_wrapper(case, heads)(x)
        expect_close(got, expected, labels=("sequence", "token"))
    return run


def _stacked_bias(record):
    value_of(record, "bias_build", _call_text("two")[:-1] + ", qkv_bias=True)")
    d_in, d_out, _, _, num_heads = CASES["two"]
    expected = parameter_count("wrapper", d_in, d_out, num_heads, qkv_bias=True)
    got = plain(record["bias_parameters"])
    if got != expected:
        raise Failed(f"{expected} parameters with qkv_bias=True", f"{got}")


def _stacked_grads(record):
    out = value_of(record, "two_grad_out")
    if out.get("kind") != "tensor" or not out["requires_grad"]:
        raise Failed("an output connected to the autograd graph", "an output that does not require grad")
    value_of(record, "two_backward", "backward()")
    flags = plain(record["two_head_grads"])
    if not flags or not all(flags):
        missing = [i for i, flag in enumerate(flags) if not flag]
        raise Failed("a gradient for every weight of every head", f"none for head(s) {missing}")


def _stacked_device(record):
    asked = plain(record["device_asked"])
    value_of(record, "two_to_device", f"module.to({asked!r})")
    got = value_of(record, "two_on_device", "the forward pass on the device")
    if got.get("kind") != "tensor":
        raise Failed("a torch.Tensor", describe(got))
    if torch.device(got["device"]).type != torch.device(asked).type:
        raise Failed(f"an output on {asked}, where the inputs are", f"one on {got['device']}")


def _head_outputs(record, case: str) -> list[torch.Tensor]:
    """What each recorded head computes on the case's input."""
    _, _, context_length, _, _ = CASES[case]
    outputs = []
    for state in plain(record[f"{case}_heads"]):
        d_out, d_in = state["W_query.weight"].shape
        with torch.random.fork_rng(devices=[]):
            head = CausalAttention(d_in, d_out, context_length, 0.0, qkv_bias="W_query.bias" in state)
        head.load_state_dict(state, strict=False)
        with torch.no_grad():
            outputs.append(head(_case_input(case)))
    return outputs


def _plain_list(record) -> bool:
    return plain(record["two_parameters"]) == 0 and tuple(record["two_out"]["value"].shape) == (2, 6, 4)


def _own_heads(record) -> bool:
    return not plain(record["two_heads"]) and plain(record["two_parameters"]) > 0


def _repeated_head(record) -> bool:
    out = record["two_out"]["value"]
    heads = plain(record["two_heads"])
    halves_equal = tuple(out.shape) == (2, 6, 4) and same(out[..., :2], out[..., 2:])
    return halves_equal and (len(heads) < 2 or same(heads[0]["W_query.weight"], heads[1]["W_query.weight"]))


def _d_out_total(record) -> bool:
    heads = plain(record["two_heads"])
    _, d_out, _, _, num_heads = CASES["two"]
    return len(heads) == num_heads and all(h["W_query.weight"].shape[0] == d_out // num_heads for h in heads)


def _summed(record) -> bool:
    outputs = _head_outputs(record, "two")
    return len(outputs) == 2 and same(record["two_out"]["value"], outputs[0] + outputs[1])


def _one_head(record) -> bool:
    outputs = _head_outputs(record, "two")
    return len(outputs) == 1 and same(record["two_out"]["value"], outputs[0])


def _out_shape_is(shapes):
    return lambda record: tuple(record["two_out"]["value"].shape) in shapes


STACKED = Exercise(
    id="2.1",
    title="a wrapper of CausalAttention heads",
    answer_name="StackedHeads",
    signature="class StackedHeads(nn.Module) with __init__(self, d_in, d_out, context_length, dropout, "
              "num_heads, qkv_bias=False)",
    probe=_probe_stacked,
    checks=(
        Check("is an nn.Module class", _stacked_is_class),
        Check("builds as " + _call_text("two"), _stacked_builds),
        Check("output shape with 2 heads of width 2", _stacked_shape),
        Check("holds its heads as CausalAttention submodules", _stacked_registered),
        Check("each head has weights of its own", _stacked_own_weights),
        Check("no future-token leak", _stacked_causal),
        Check("output = the heads' outputs side by side", _stacked_values("two")),
        Check("3 heads of width 3 on 4 features", _stacked_values("three")),
        Check("qkv_bias reaches every head", _stacked_bias),
        Check("gradients reach every head", _stacked_grads),
        Check("output on the input's device", _stacked_device),
    ),
    mistakes=(
        Mistake("plain-list",
                "Your heads sit in a plain Python list, so PyTorch does not see them: their weights are "
                "not the module's parameters, .to(device) does not move them and no optimiser would "
                "train them. Keep them in an nn.ModuleList.",
                _plain_list),
        Mistake("own-heads",
                "No CausalAttention inside: this exercise builds the wrapper out of the package's "
                "CausalAttention heads, one per head, in an nn.ModuleList.",
                _own_heads),
        Mistake("repeated-head",
                "Every head computes the same thing: you used one CausalAttention object several times "
                "(e.g. [head] * num_heads), so the heads share their weights. Build a new one per head: "
                "nn.ModuleList(CausalAttention(...) for _ in range(num_heads)).",
                _repeated_head),
        Mistake("d-out-as-total",
                "Your heads are d_out // num_heads wide: that is MultiHeadAttention's meaning of d_out. "
                "In the wrapper d_out is the width of EACH head and the merged output is "
                "num_heads * d_out wide.",
                _d_out_total),
        Mistake("concatenated-tokens",
                "You concatenated the heads along the token axis (dim=1), giving twice as many tokens. "
                "Merge along the feature axis: torch.cat([...], dim=-1).",
                _out_shape_is({(2, 12, 2)})),
        Mistake("stacked",
                "torch.stack adds a new axis for the heads. The merge puts the heads' context vectors "
                "side by side: torch.cat([...], dim=-1).",
                _out_shape_is({(2, 6, 2, 2), (2, 2, 6, 2)})),
        Mistake("summed",
                "You added the heads' outputs. The wrapper keeps them apart and places them side by "
                "side: torch.cat([...], dim=-1), num_heads * d_out features per token.",
                _summed),
        Mistake("one-head",
                "Only one head is used: build num_heads CausalAttention heads and concatenate all "
                "their outputs.",
                _one_head),
        Mistake("qkv-bias-ignored",
                "qkv_bias does not reach the heads: pass it on, CausalAttention(d_in, d_out, "
                "context_length, dropout, qkv_bias).",
                lambda record: plain(record["bias_parameters"]) == parameter_count("wrapper", 3, 2, 2)),
    ),
)

# ----------------------------------------------------------------------------------------------
# 2.2 Count a module's trainable parameters


def _build_modules() -> dict[str, nn.Module]:
    """The modules the answer counts, built the same way in the probe and in the judge."""
    with torch.random.fork_rng(devices=[]):
        frozen = MultiHeadAttention(8, 8, 4, 0.0, num_heads=2)
        frozen.W_query.requires_grad_(False)
        frozen.W_key.requires_grad_(False)
        return {
            "one head": CausalAttention(3, 2, 6, 0.0),
            "one head with qkv_bias": CausalAttention(3, 2, 6, 0.0, qkv_bias=True),
            "12 stacked heads of width 64 on 768 features": MultiHeadAttentionWrapper(768, 64, 1024, 0.0, 12),
            "MultiHeadAttention(768, 768, 1024, 0.0, 12)": MultiHeadAttention(768, 768, 1024, 0.0, 12),
            "a module with two frozen projections": frozen,
        }


# The judge's copies; the probe builds its own, since an answer may change what it is given.
_modules = functools.lru_cache(maxsize=1)(_build_modules)


def _probe_count(count, rec: Recorder) -> None:
    for name, module in _build_modules().items():
        rec.call(name, count, module)


def _count_case(name: str):
    def run(record):
        got = int_of(record, name, "the count")
        expected = count_parameters(_modules()[name])
        if got != expected:
            raise Failed(f"{expected:,}", f"{got:,}")
    return run


def _count_like(rule):
    def detect(record):
        return all(int_of(record, name) == rule(module) for name, module in _modules().items())
    return detect


COUNT = Exercise(
    id="2.2",
    title="count a module's trainable parameters",
    answer_name="count_trainable_parameters",
    signature="count_trainable_parameters(module)",
    probe=_probe_count,
    checks=(
        Check("returns a whole number", lambda r: int_of(r, "one head", "the count")),
        *(Check(name, _count_case(name)) for name in (
            "one head", "one head with qkv_bias", "12 stacked heads of width 64 on 768 features",
            "MultiHeadAttention(768, 768, 1024, 0.0, 12)", "a module with two frozen projections")),
    ),
    mistakes=(
        Mistake("counted-tensors",
                "You counted parameter tensors, not the numbers in them: add up p.numel() for each "
                "parameter p.",
                _count_like(lambda m: len(list(m.parameters())))),
        Mistake("counted-buffers",
                "You counted the state_dict, which includes the causal mask buffer. The mask is saved "
                "with the model but never trained: count module.parameters() only.",
                _count_like(lambda m: sum(t.numel() for t in m.state_dict().values()))),
        Mistake("counted-frozen",
                "You counted frozen parameters too. Trainable ones have requires_grad=True: "
                "sum(p.numel() for p in module.parameters() if p.requires_grad).",
                _count_like(lambda m: sum(p.numel() for p in m.parameters()))),
        Mistake("weights-only",
                "You counted only the weight matrices. Biases are parameters too: count every tensor "
                "in module.parameters().",
                _count_like(lambda m: sum(p.numel() for n, p in m.named_parameters()
                                          if n.endswith("weight") and p.requires_grad))),
        Mistake("counted-bytes",
                "You counted bytes (4 per float32 number), not parameters: use p.numel(), not "
                "p.numel() * p.element_size().",
                _count_like(lambda m: 4 * count_parameters(m))),
    ),
)

# ----------------------------------------------------------------------------------------------
# 2.3 The wrapper's parameters as a formula

#: (d_in, d_out per head, num_heads, qkv_bias) the formula is tried on.
GRID = ((3, 2, 1, False), (3, 2, 2, False), (3, 2, 4, False), (768, 64, 12, False), (768, 64, 12, True),
        (5, 3, 4, True))


def _probe_formula(formula, rec: Recorder) -> None:
    for d_in, d_out, num_heads, qkv_bias in GRID:
        rec.call(str((d_in, d_out, num_heads, qkv_bias)), formula, d_in, d_out, num_heads, qkv_bias=qkv_bias)


def _formula_value(record, d_in, d_out, num_heads, qkv_bias) -> int:
    call = f"wrapper_parameter_count({d_in}, {d_out}, {num_heads}, qkv_bias={qkv_bias})"
    return int_of(record, str((d_in, d_out, num_heads, qkv_bias)), call)


def _formula_case(*config):
    def run(record):
        got = _formula_value(record, *config)
        expected = parameter_count("wrapper", config[0], config[1], config[2], qkv_bias=config[3])
        if got != expected:
            raise Failed(f"{expected:,} for d_in={config[0]}, d_out={config[1]}, num_heads={config[2]}, "
                         f"qkv_bias={config[3]}", f"{got:,}")
    return run


def _formula_proportional(record):
    one = _formula_value(record, 3, 2, 1, False)
    for heads in (2, 4):
        got = _formula_value(record, 3, 2, heads, False)
        if got != heads * one:
            raise Failed(f"{heads} x {one} = {heads * one} with {heads} heads (each head adds its own weights)",
                         f"{got}")


def _formula_like(rule):
    def detect(record):
        return all(_formula_value(record, *config) == rule(*config) for config in GRID)
    return detect


def _truth(d_in, d_out, num_heads, qkv_bias):
    return parameter_count("wrapper", d_in, d_out, num_heads, qkv_bias=qkv_bias)


FORMULA = Exercise(
    id="2.3",
    title="the wrapper's parameter count",
    answer_name="wrapper_parameter_count",
    signature="wrapper_parameter_count(d_in, d_out, num_heads, qkv_bias=False)",
    probe=_probe_formula,
    checks=(
        Check("returns a whole number", lambda r: _formula_value(r, 3, 2, 1, False)),
        Check("one head of width 2 on 3 features", _formula_case(3, 2, 1, False)),
        Check("grows in proportion to num_heads", _formula_proportional),
        Check("12 heads of width 64 on 768 features", _formula_case(768, 64, 12, False)),
        Check("with qkv_bias", _formula_case(768, 64, 12, True)),
        Check("with qkv_bias, 4 heads of width 3 on 5 features", _formula_case(5, 3, 4, True)),
    ),
    mistakes=(
        Mistake("no-heads-factor",
                "Your count does not grow with num_heads. Every head owns its query, key and value "
                "weights, so the count is num_heads times one head's (and in the wrapper d_out is the "
                "width of one head, not the total).",
                _formula_like(lambda d_in, d_out, h, bias: 3 * (d_in * d_out + (d_out if bias else 0)))),
        Mistake("one-projection",
                "You counted one weight matrix per head. Each head has three: query, key and value.",
                _formula_like(lambda d_in, d_out, h, bias: h * (d_in * d_out + (d_out if bias else 0)))),
        Mistake("output-projection",
                "You added an output projection, but the wrapper has none: it merges by concatenation "
                "alone. The output projection arrives with MultiHeadAttention in chapter 3.",
                _formula_like(lambda d_in, d_out, h, bias: _truth(d_in, d_out, h, bias) + (h * d_out) ** 2 + h * d_out)),
        Mistake("bias-ignored",
                "With qkv_bias=True each of the three projections of each head adds d_out biases: "
                "3 * num_heads * d_out more.",
                _formula_like(lambda d_in, d_out, h, bias: _truth(d_in, d_out, h, False))),
        Mistake("bias-always",
                "You counted biases even when qkv_bias=False; then the projections have weights only.",
                _formula_like(lambda d_in, d_out, h, bias: _truth(d_in, d_out, h, True))),
    ),
)

EXERCISES = (STACKED, COUNT, FORMULA)

__all__ = ["EXERCISES", "reference_wrapper"]
