"""Exercises of chapter 2, stacked heads: a wrapper of CausalAttention heads, a wrapper of a given
width, and what stacked heads cost."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.causal_attention import CausalAttention
from ..cost import cost_by_heads, count_parameters, parameter_count
from ..data import running_example
from ..attention.multihead import MultiHeadAttention
from ..attention.wrapper import MultiHeadAttentionWrapper
from .framework import Check, Exercise, Mistake
from .probes import (batch, causality_check, connected_check, device_check, draw, dropout_lost, eval_output,
                     future_changed, module_class_check, parameters_with_gradients, probe_backward, probe_dropout,
                     probe_module_class, probe_on_devices)
from .records import (Failed, Recorder, describe, expect_close, expect_shape, int_of, number_text, plain, same, seed_of,
                      tensor_of, value_of)
from .shortcuts import attention_modules, package

# ----------------------------------------------------------------------------------------------
# 2.1 A wrapper of CausalAttention heads

DROPOUT = 0.5  # the dropout probe's rate: half the weights dropped, the rest doubled


def stacked_cases(seed: int) -> dict[str, tuple]:
    """Constructor arguments ``(d_in, d_out per head, context_length, dropout, num_heads)`` per case."""
    sizes = draw(seed, "2.1", {"d_in": (2, 6), "d_out": (2, 5), "num_heads": (3, 5)}, distinct=False)
    return {
        "two": (3, 2, 6, 0.0, 2),
        "more": (sizes["d_in"], sizes["d_out"], 7, 0.0, sizes["num_heads"]),
        "dropout": (3, 2, 6, DROPOUT, 2),
    }


def _case_input(seed: int, case: str) -> tuple[torch.Tensor, str]:
    d_in, _, context_length, _, _ = stacked_cases(seed)[case]
    return batch(seed, f"2.1 {case}", 2, context_length, d_in)


def _heads_in(module) -> list[CausalAttention]:
    if not isinstance(module, nn.Module):
        return []
    return [m for m in module.modules() if isinstance(m, CausalAttention)]


def _head_state(head: CausalAttention) -> dict:
    return {name: value for name, value in head.state_dict().items() if name != "mask"}


def _parameters(module) -> int:
    return count_parameters(module) if isinstance(module, nn.Module) else 0


def _probe_stacked(cls, rec: Recorder) -> None:
    probe_module_class(rec, cls)
    for case, args in stacked_cases(rec.seed).items():
        module = rec.call(f"{case}_build", cls, *args)
        if module is None:
            continue
        rec.note(f"{case}_heads", [_head_state(head) for head in _heads_in(module)])
        rec.note(f"{case}_parameters", _parameters(module))
        x, _ = _case_input(rec.seed, case)
        if case == "dropout":
            probe_dropout(rec, module, module, x)
            continue
        rec.call(f"{case}_out", module, x)
        if case != "two":
            continue
        rec.call("two_running", module, running_example(batch=True))
        rec.call("two_future", module, future_changed(x, rec.seed))
        out = rec.call("two_grad_out", module, x)
        probe_backward(rec, "two_grad_out", out)
        rec.note("two_head_grads", [all(parameters_with_gradients(head).values()) for head in _heads_in(module)])
        if isinstance(module, nn.Module):
            probe_on_devices(rec, "two_on", lambda device, module=module, x=x: module.to(device)(x.to(device)))
    biased = rec.call("bias_build", cls, 3, 2, 6, 0.0, 2, qkv_bias=True)
    rec.note("bias_parameters", _parameters(biased))


def _call_text(args: tuple, **extra) -> str:
    return "StackedHeads(" + ", ".join([*map(str, args), *(f"{k}={v}" for k, v in extra.items())]) + ")"


def _expected_width(args: tuple) -> int:
    _, d_out, _, _, num_heads = args
    return num_heads * d_out


def reference_wrapper(args: tuple, heads: list[dict], qkv_bias: bool = False) -> MultiHeadAttentionWrapper:
    """The package's wrapper built with ``args``, holding the given heads' weights."""
    with torch.random.fork_rng(devices=[]):
        wrapper = MultiHeadAttentionWrapper(*args, qkv_bias=qkv_bias)
    for head, state in zip(wrapper.heads, heads):
        head.load_state_dict(state, strict=False)
    return wrapper


def _stacked_shape(record):
    args = stacked_cases(seed_of(record))["two"]
    x, label = _case_input(seed_of(record), "two")
    got = tensor_of(record, "two_out", f"the forward pass on x = {label}")
    expect_shape(got, (*x.shape[:2], _expected_width(args)))


def _stacked_registered(record):
    heads, parameters = plain(record["two_heads"]), plain(record["two_parameters"])
    d_in, d_out, _, _, num_heads = stacked_cases(seed_of(record))["two"]
    expected = parameter_count("wrapper", d_in, d_out, num_heads)
    if len(heads) != num_heads or parameters != expected:
        raise Failed(f"{num_heads} CausalAttention submodules holding {expected} parameters",
                     f"{len(heads)} CausalAttention submodule(s) and {parameters} parameters")


def _stacked_own_weights(record):
    heads = plain(record["two_heads"])
    for role in ("W_query.weight", "W_key.weight", "W_value.weight"):
        if same(heads[0][role], heads[1][role]):
            raise Failed("different weights in every head", f"the same {role} in heads 0 and 1")


def _stacked_values(case: str, key: str | None = None):
    key = key or f"{case}_out"

    def run(record):
        seed = seed_of(record)
        args = stacked_cases(seed)[case]
        heads = plain(value_of(record, f"{case}_heads"))
        x, label = (running_example(batch=True), "the running example") if key == "two_running" else _case_input(seed, case)
        got = tensor_of(record, key, f"{_call_text(args)} on {label}")
        expect_shape(got, (*x.shape[:2], _expected_width(args)))
        if len(heads) != args[4]:
            raise Failed(f"{args[4]} CausalAttention heads", f"{len(heads)}")
        with torch.no_grad():
            expected = reference_wrapper(args, heads).eval()(x)
        expect_close(got, expected, labels=("sequence", "token"), where=f"for {_call_text(args)} on {label}")
    return run


def _stacked_bias(record):
    value_of(record, "bias_build", _call_text((3, 2, 6, 0.0, 2), qkv_bias=True))
    expected = parameter_count("wrapper", 3, 2, 2, qkv_bias=True)
    got = plain(record["bias_parameters"])
    if got != expected:
        raise Failed(f"{expected} parameters with qkv_bias=True", f"{got}")


def dropout_expected(record, how: str = "heads") -> torch.Tensor:
    """The training-mode output of the dropout case, replaying the probe's random draws.

    ``how`` is where dropout acts: ``"heads"`` (on every head's attention weights, correct),
    ``"output"`` (on the merged output instead) or ``"both"``.
    """
    seed = seed_of(record)
    args = stacked_cases(seed)["dropout"]
    heads = plain(record["dropout_heads"])
    x, _ = _case_input(seed, "dropout")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        wrapper = reference_wrapper(args, heads)
        torch.manual_seed(seed)
        out = wrapper.train()(x) if how in ("heads", "both") else wrapper.eval()(x)
        return F.dropout(out, DROPOUT, training=True) if how in ("output", "both") else out


def _stacked_dropout_train(record):
    args = stacked_cases(seed_of(record))["dropout"]
    got = tensor_of(record, "dropout_train", f"{_call_text(args)} in training mode")
    if len(plain(record["dropout_heads"])) != args[4]:
        raise Failed(f"{args[4]} CausalAttention heads", f"{len(plain(record['dropout_heads']))}")
    expect_close(got, dropout_expected(record), labels=("sequence", "token"),
                 where=f"for {_call_text(args)} in training mode, each head dropping its own attention weights")


def _stacked_dropout_eval(record):
    args = stacked_cases(seed_of(record))["dropout"]
    eval_output(record, f"{_call_text(args)} in eval mode",
                "Dropout must be off in eval mode: use nn.Dropout (or pass training=self.training).")
    _stacked_values("dropout", "dropout_eval")(record)


def _stacked_grads(record):
    connected_check(record, "two_grad_out")
    flags = plain(record["two_head_grads"])
    if not flags or not all(flags):
        missing = [i for i, flag in enumerate(flags) if not flag]
        raise Failed("a gradient for every weight of every head", f"none for head(s) {missing}")


def _head_outputs(record, case: str = "two") -> list[torch.Tensor]:
    """What each recorded head computes on the case's input."""
    seed = seed_of(record)
    _, _, context_length, _, _ = stacked_cases(seed)[case]
    x, _ = _case_input(seed, case)
    outputs = []
    for state in plain(record[f"{case}_heads"]):
        d_out, d_in = state["W_query.weight"].shape
        with torch.random.fork_rng(devices=[]):
            head = CausalAttention(d_in, d_out, context_length, 0.0, qkv_bias="W_query.bias" in state)
        head.load_state_dict(state, strict=False)
        with torch.no_grad():
            outputs.append(head(x))
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
    return len(heads) == 2 and all(h["W_query.weight"].shape[0] == 1 for h in heads)


def _summed(record) -> bool:
    outputs = _head_outputs(record)
    return len(outputs) == 2 and same(record["two_out"]["value"], outputs[0] + outputs[1])


def _one_head(record) -> bool:
    outputs = _head_outputs(record)
    return len(outputs) == 1 and same(record["two_out"]["value"], outputs[0])


def _out_shape_is(shapes):
    return lambda record: tuple(record["two_out"]["value"].shape) in shapes


def _dropout_like(how: str):
    return lambda record: same(record["dropout_train"]["value"], dropout_expected(record, how))


_DROPOUT_TRAIN = "dropout acts on every head's attention weights in training mode"
_DROPOUT_EVAL = "no dropout in eval mode"

STACKED = Exercise(
    id="2.1",
    title="a wrapper of CausalAttention heads",
    answer_name="StackedHeads",
    signature="class StackedHeads(nn.Module) with __init__(self, d_in, d_out, context_length, dropout, "
              "num_heads, qkv_bias=False)",
    probe=_probe_stacked,
    checks=(
        Check("is an nn.Module class", module_class_check('check("2.1", StackedHeads)'), gate=True),
        Check("builds as StackedHeads(3, 2, 6, 0.0, 2)", lambda r: value_of(r, "two_build", "StackedHeads(3, 2, 6, 0.0, 2)"), gate=True),
        Check("output shape with 2 heads of width 2", _stacked_shape),
        Check("holds its heads as CausalAttention submodules", _stacked_registered),
        Check("each head has weights of its own", _stacked_own_weights),
        Check("no future-token leak", causality_check("two_out", "two_future")),
        Check("output = the heads' outputs side by side", _stacked_values("two", "two_running")),
        Check("more heads of another width, on other features", _stacked_values("more")),
        Check("qkv_bias reaches every head", _stacked_bias),
        Check(_DROPOUT_TRAIN, _stacked_dropout_train),
        Check(_DROPOUT_EVAL, _stacked_dropout_eval),
        Check("gradients reach every head", _stacked_grads),
        Check("output on the input's device", device_check("two_on", "module.to(device)(x)")),
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
        Mistake("dropout-not-passed",
                "In training mode your module gives exactly its eval-mode output: the dropout rate never "
                "reaches the heads. Pass it on, CausalAttention(d_in, d_out, context_length, dropout, "
                "qkv_bias), so that each head drops some of its attention weights while training.",
                dropout_lost, (_DROPOUT_TRAIN,)),
        Mistake("dropout-on-output",
                "You applied dropout to the merged output. In attention, dropout acts on the attention "
                "weights inside every head (each CausalAttention does it when given the rate), so pass "
                "dropout to the heads and drop nothing after the merge.",
                _dropout_like("output"), (_DROPOUT_TRAIN,)),
        Mistake("dropout-twice",
                "Dropout acts twice: inside every head, and again on the merged output. The heads "
                "already drop attention weights; remove the dropout after the merge.",
                _dropout_like("both"), (_DROPOUT_TRAIN,)),
    ),
    shortcuts=attention_modules(keep=(CausalAttention,)),
)

# ----------------------------------------------------------------------------------------------
# 2.2 A wrapper whose merged output has a given width

WIDTH_ARGUMENTS = ("d_in", "width", "num_heads", "context_length")


def width_cases(seed: int) -> dict[str, tuple[int, int, int, int]]:
    """``(d_in, width, num_heads, context_length)`` per case: the running example's (2 heads, 2 wide),
    two random sizes, and a width that the head count does not divide."""
    a = draw(seed, "2.2 a", {"d_in": (2, 9), "per_head": (2, 4), "num_heads": (3, 6)}, distinct=False)
    b = draw(seed, "2.2 b", {"d_in": (2, 9), "per_head": (1, 3), "num_heads": (3, 6)}, distinct=False)
    odd = draw(seed, "2.2 odd", {"num_heads": (2, 5), "per_head": (1, 4)}, distinct=False)
    return {
        "running": (3, 2, 2, 6),
        "a": (a["d_in"], a["per_head"] * a["num_heads"], a["num_heads"], 5),
        "b": (b["d_in"], b["per_head"] * b["num_heads"], b["num_heads"], 4),
        "indivisible": (3, odd["per_head"] * odd["num_heads"] + 1, odd["num_heads"], 6),
    }


def _width_call(args: tuple) -> str:
    return "wrapper_with_width(" + ", ".join(f"{n}={v}" for n, v in zip(WIDTH_ARGUMENTS, args)) + ")"


def _probe_width(build, rec: Recorder) -> None:
    for case, args in width_cases(rec.seed).items():
        module = rec.call(case, build, *args)
        wrapper = isinstance(module, MultiHeadAttentionWrapper)
        rec.note(f"{case}_class", type(module).__name__ if module is not None else None)
        rec.note(f"{case}_is_wrapper", wrapper)
        rec.note(f"{case}_heads", len(module.heads) if wrapper else getattr(module, "num_heads", None))
        # The width of one head: the wrapper's d_out, the batched module's head_dim.
        rec.note(f"{case}_head_width", module.d_out if wrapper else getattr(module, "head_dim", None))
        rec.note(f"{case}_dropouts", [float(m.p) for m in module.modules() if isinstance(m, nn.Dropout)]
                 if isinstance(module, nn.Module) else [])
        if isinstance(module, nn.Module):
            x = running_example(batch=True)[..., :args[0]] if case == "running" else batch(rec.seed, case, 1, 3, args[0])[0]
            with torch.no_grad():
                rec.call(f"{case}_out", module, x)


def _is_wrapper(record, case: str = "running") -> None:
    args = width_cases(seed_of(record))[case]
    summary = value_of(record, case, _width_call(args))
    if not plain(record[f"{case}_is_wrapper"]):
        raise Failed(f"a MultiHeadAttentionWrapper from {_width_call(args)}", describe(summary))


def _width_case(case: str):
    def run(record):
        args = width_cases(seed_of(record))[case]
        _is_wrapper(record, case)
        d_in, width, num_heads, _ = args
        heads = plain(record[f"{case}_heads"])
        if heads != num_heads:
            raise Failed(f"{num_heads} heads for {_width_call(args)}", f"{heads}")
        got = tensor_of(record, f"{case}_out", "the wrapper's forward pass")
        if got.shape[-1] != width:
            raise Failed(f"a merged output {width} wide for {_width_call(args)}",
                         f"one {got.shape[-1]} wide ({heads} heads of width {plain(record[f'{case}_head_width'])})")
    return run


def _no_dropout(record):
    _is_wrapper(record)
    rates = [p for case in ("running", "a", "b") for p in plain(record.get(f"{case}_dropouts")) or []]
    if any(p != 0 for p in rates):
        raise Failed("dropout 0 in every head, as the exercise asks", f"dropout {max(rates):g}")


def _width_refused(record):
    args = width_cases(seed_of(record))["indivisible"]
    got = record.get("indivisible")
    if got is None or got.get("kind") != "error" or got.get("type") != "ValueError":
        raise Failed(f"a ValueError for {_width_call(args)}: {args[2]} heads cannot share {args[1]} "
                     "columns evenly", describe(got))


def _head_width_is(rule):
    """A detector: in the random cases, each head is ``rule(width, num_heads)`` wide."""
    def detect(record):
        cases = width_cases(seed_of(record))
        return all(plain(record[f"{c}_head_width"]) == rule(cases[c][1], cases[c][2]) for c in ("a", "b"))
    return detect


_RUNNING = "2 heads, merged output 2 wide on the running example"

WIDTH = Exercise(
    id="2.2",
    title="a wrapper whose merged output has a given width",
    answer_name="wrapper_with_width",
    signature="wrapper_with_width(d_in, width, num_heads, context_length)",
    probe=_probe_width,
    checks=(
        Check("returns a MultiHeadAttentionWrapper", _is_wrapper, gate=True),
        Check(_RUNNING, _width_case("running")),
        Check("another width and head count", _width_case("a")),
        Check("a third width and head count", _width_case("b")),
        Check("no dropout", _no_dropout),
        Check("refuses a width the heads cannot share evenly", _width_refused),
    ),
    mistakes=(
        Mistake("batched-module",
                "You built a MultiHeadAttention, whose d_out is the total width. The exercise asks for "
                "the wrapper, where d_out is the width of each head: choose it so that num_heads of them "
                "side by side are width wide.",
                lambda record: plain(record["running_class"]) == "MultiHeadAttention"),
        Mistake("changed-num-heads",
                "The exercise keeps num_heads and chooses the width of each head; a single head of the "
                "whole width is not multi-head attention.",
                lambda record: plain(record["running_heads"]) == 1),
        Mistake("d-out-is-width",
                "You gave every head the whole width, so the merged output is num_heads times too wide. "
                "In the wrapper d_out is per head: d_out = width // num_heads.",
                _head_width_is(lambda width, heads: width)),
        Mistake("d-out-times-heads",
                "You multiplied by num_heads; the wrapper already does that when it concatenates its "
                "heads. Each head is width // num_heads wide.",
                _head_width_is(lambda width, heads: width * heads)),
        Mistake("halved",
                "Each head is width // 2 wide: right for two heads only. Divide by num_heads.",
                _head_width_is(lambda width, heads: width // 2)),
        Mistake("dropout-kept",
                "The exercise asks for a wrapper without dropout: pass dropout=0.0 (the fourth argument "
                "of MultiHeadAttentionWrapper), so that the module gives the same output on every call.",
                lambda record: any(p != 0 for p in plain(record["running_dropouts"])), ("no dropout",)),
        Mistake("indivisible-accepted",
                "When num_heads does not divide width, no per-head width gives that merged width (the "
                "wrapper would silently be narrower). Raise a ValueError that says so.",
                lambda record: record["indivisible"].get("kind") != "error",
                ("refuses a width the heads cannot share evenly",)),
    ),
    shortcuts=(),  # the wrapper is the building block here; only the checks' own code is refused
)

# ----------------------------------------------------------------------------------------------
# 2.3 The wrapper's parameters as a formula

FORMULA_ARGUMENTS = ("d_in", "d_out", "num_heads", "qkv_bias")


def formula_cases(seed: int) -> dict[str, tuple[int, int, int, bool]]:
    """``(d_in, d_out per head, num_heads, qkv_bias)`` per case, drawn from the run's seed."""
    cases = {}
    for number, bias in enumerate((False, False, True, True)):
        sizes = draw(seed, f"2.3 {number}", {"d_in": (3, 200), "d_out": (2, 64), "num_heads": (2, 16)})
        cases[f"case {number}"] = (sizes["d_in"], sizes["d_out"], sizes["num_heads"], bias)
    one = cases["case 0"]
    cases["one head"] = (one[0], one[1], 1, False)
    return cases


def _formula_call(args) -> str:
    return "wrapper_parameter_count(" + ", ".join(f"{n}={v}" for n, v in zip(FORMULA_ARGUMENTS, args)) + ")"


def _probe_formula(formula, rec: Recorder) -> None:
    for case, (d_in, d_out, num_heads, qkv_bias) in formula_cases(rec.seed).items():
        rec.call(case, formula, d_in, d_out, num_heads, qkv_bias=qkv_bias)


def _truth(d_in, d_out, num_heads, qkv_bias):
    return parameter_count("wrapper", d_in, d_out, num_heads, qkv_bias=qkv_bias)


def _formula_case(case: str):
    def run(record):
        args = formula_cases(seed_of(record))[case]
        got = int_of(record, case, _formula_call(args))
        expected = _truth(*args)
        if got != expected:
            raise Failed(f"{expected:,} for {_formula_call(args)}", number_text(record[case]))
    return run


def _formula_proportional(record):
    cases = formula_cases(seed_of(record))
    one = int_of(record, "one head", _formula_call(cases["one head"]))
    args = cases["case 0"]
    got = int_of(record, "case 0", _formula_call(args))
    if got != args[2] * one:
        raise Failed(f"{args[2]} x {one:,} = {args[2] * one:,} for {_formula_call(args)} (each head adds its own "
                     "weights)", number_text(record["case 0"]))


def _formula_like(rule):
    def detect(record):
        return all(int_of(record, case) == rule(*args) for case, args in formula_cases(seed_of(record)).items())
    return detect


FORMULA = Exercise(
    id="2.3",
    title="the wrapper's parameter count",
    answer_name="wrapper_parameter_count",
    signature="wrapper_parameter_count(d_in, d_out, num_heads, qkv_bias=False)",
    probe=_probe_formula,
    checks=(
        Check("returns a whole number", lambda r: int_of(r, "one head", "wrapper_parameter_count(...)"), gate=True),
        Check("one head", _formula_case("one head")),
        Check("grows in proportion to num_heads", _formula_proportional),
        Check("several heads, no qkv bias", _formula_case("case 1")),
        Check("with qkv_bias", _formula_case("case 2")),
        Check("with qkv_bias, other sizes", _formula_case("case 3")),
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
    shortcuts=package(parameter_count, count_parameters, cost_by_heads,
                      why="This asks mha_course for the count: work it out from the arguments.")
    + package(CausalAttention, MultiHeadAttentionWrapper, MultiHeadAttention,
              why="This builds a module to count it: work the count out from the arguments, without "
                  "building anything."),
)

EXERCISES = (STACKED, WIDTH, FORMULA)

__all__ = ["EXERCISES", "reference_wrapper", "stacked_cases", "width_cases", "formula_cases", "dropout_expected"]
