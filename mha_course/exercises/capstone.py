"""Exercise 3.5, the capstone of the first three chapters: the whole batched ``MultiHeadAttention``.

The learner writes a class with the course's constructor, ``(d_in, d_out, context_length, dropout,
num_heads, qkv_bias=False)``, its parts under the course's names (``W_query``, ``W_key``,
``W_value``, ``out_proj``, the ``mask`` buffer) and the forward pass: project, split into heads,
score, mask, scale, softmax, dropout, weight the values, merge, project out. The check loads the
learner's weights into the package's :class:`~mha_course.MultiHeadAttention` and compares the two
on random batches, shorter than ``context_length`` and as long; probes causality; replays dropout in
training mode from the same random state; and runs the module on another device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.heads import merge_heads, split_heads, stack_qkv, unstack_qkv
from ..attention.masking import causal_mask
from ..attention.multihead import MultiHeadAttention
from .framework import Check, Exercise, Mistake
from .probes import (batch, causality_check, device_check, draw, dropout_in_eval, dropout_lost, error_on_device,
                     eval_output, future_changed, gradients_check, module_class_check, parameters_with_gradients,
                     probe_backward, probe_dropout, probe_module_class, probe_on_devices, state_of)
from .records import (Failed, Recorder, expect_close, expect_shape, format_shape, plain, raised, same, seed_of,
                      tensor_of, value_of)
from .shortcuts import attention_modules, package, torch_attention

DROPOUT = 0.5


def capstone_cases(seed: int) -> dict[str, tuple]:
    """``case -> (constructor arguments, qkv_bias, num_tokens)``, drawn from the run's seed.

    The main case's input is one token shorter than ``context_length``, so the mask buffer must be
    sliced; ``head_dim`` and ``num_heads`` differ, so that scaling by the wrong width shows.
    """
    main = draw(seed, "3.5 main", {"d_in": (3, 7), "num_heads": (2, 4), "head_dim": (2, 5), "context_length": (8, 10)})
    bias = draw(seed, "3.5 bias", {"d_in": (2, 6), "num_heads": (2, 3), "head_dim": (3, 4)})
    if main["d_in"] == main["num_heads"] * main["head_dim"]:  # d_in and d_out must differ, so a swap shows
        main["d_in"] += 1
    return {
        "main": ((main["d_in"], main["num_heads"] * main["head_dim"], main["context_length"], 0.0, main["num_heads"]),
                 False, main["context_length"] - 1),
        "bias": ((bias["d_in"], bias["num_heads"] * bias["head_dim"], 5, 0.0, bias["num_heads"]), True, 5),
        "dropout": ((3, 4, 6, DROPOUT, 2), False, 6),
    }


def call_text(args: tuple, qkv_bias: bool) -> str:
    return "BatchedHeads(" + ", ".join(map(str, args)) + (", qkv_bias=True" if qkv_bias else "") + ")"


def case_input(seed: int, case: str) -> tuple[torch.Tensor, str]:
    args, _, num_tokens = capstone_cases(seed)[case]
    return batch(seed, f"3.5 {case}", 2, num_tokens, args[0])


def _probe(cls, rec: Recorder) -> None:
    probe_module_class(rec, cls)
    for case, (args, qkv_bias, _) in capstone_cases(rec.seed).items():
        module = rec.call(f"{case}_build", cls, *args, qkv_bias=qkv_bias)
        if not isinstance(module, torch.nn.Module):
            continue
        rec.note(f"{case}_parameters", state_of(module))
        rec.note(f"{case}_buffers", {name: b.detach() for name, b in module.named_buffers()})
        mask = getattr(module, "mask", None)
        rec.note(f"{case}_mask_attribute", isinstance(mask, torch.Tensor))
        x, _ = case_input(rec.seed, case)
        if case == "dropout":
            probe_dropout(rec, module, module, x)
            continue
        module.eval()
        rec.call(f"{case}_out", module, x)
        if case != "main":
            continue
        rec.call("main_future", module, future_changed(x, rec.seed))
        module.train()  # dropout is 0 here: training mode changes nothing but must work
        probe_backward(rec, "main_grad_out", rec.call("main_grad_out", module, x))
        rec.note("main_gradients", parameters_with_gradients(module))
        probe_on_devices(rec, "main_on", lambda device, module=module, x=x: module.to(device)(x.to(device)))


def reference(record, case: str) -> MultiHeadAttention:
    """The package's module with the learner's weights (the learner's parameters loaded by name)."""
    args, qkv_bias, _ = capstone_cases(seed_of(record))[case]
    with torch.random.fork_rng(devices=[]):
        module = MultiHeadAttention(*args, qkv_bias=qkv_bias)
    state = plain(record[f"{case}_parameters"])
    module.load_state_dict({**state, "mask": module.mask}, strict=True)
    return module


def _parts(case: str):
    """The learner's parameters have the course's names and shapes."""
    def run(record):
        args, qkv_bias, _ = capstone_cases(seed_of(record))[case]
        value_of(record, f"{case}_build", call_text(args, qkv_bias))
        with torch.random.fork_rng(devices=[]):
            expected = {n: tuple(p.shape) for n, p in MultiHeadAttention(*args, qkv_bias=qkv_bias).named_parameters()}
        got = {n: tuple(t.shape) for n, t in plain(record[f"{case}_parameters"]).items()}
        for name, shape in expected.items():
            if got.get(name) != shape:
                have = "none" if name not in got else f"shape {format_shape(got[name])}"
                raise Failed(f"a parameter {name} of shape {format_shape(shape)} in {call_text(args, qkv_bias)}",
                             have)
        extra = sorted(set(got) - set(expected))
        if extra:
            raise Failed(f"the parameters {', '.join(expected)} only", f"also {', '.join(extra)}")
    return run


def _mask_buffer(record):
    args, _, _ = capstone_cases(seed_of(record))["main"]
    buffers = plain(record["main_buffers"])
    if "mask" not in buffers:
        raise Failed("a buffer named mask (register_buffer)", f"buffers {sorted(buffers) or 'none'}",
                     "Register the mask with self.register_buffer('mask', ...): then .to(device) moves it "
                     "and state_dict() saves it.")
    mask, context_length = buffers["mask"], args[2]
    expect_shape(mask, (context_length, context_length))
    if not same(mask != 0, causal_mask(context_length)):
        raise Failed("True (or 1) exactly above the diagonal, where the key is in the future", "another pattern")


def _output(case: str):
    def run(record):
        seed = seed_of(record)
        args, qkv_bias, _ = capstone_cases(seed)[case]
        x, label = case_input(seed, case)
        got = tensor_of(record, f"{case}_out", f"{call_text(args, qkv_bias)} on x = {label}")
        expect_shape(got, (*x.shape[:2], args[1]))
        _parts(case)(record)
        with torch.no_grad():
            expected = reference(record, case).eval()(x)
        expect_close(got, expected, labels=("sequence", "token"),
                     where=f"(mha_course's MultiHeadAttention with your weights) for {call_text(args, qkv_bias)} on x = {label}")
    return run


def _shape(record):
    seed = seed_of(record)
    args, qkv_bias, _ = capstone_cases(seed)["main"]
    x, label = case_input(seed, "main")
    got = tensor_of(record, "main_out", f"{call_text(args, qkv_bias)} on x = {label}")
    expected = (*x.shape[:2], args[1])
    if tuple(got.shape) != expected:
        raise Failed(f"shape {format_shape(expected)} = (B, T, d_out) for x = {label}", f"shape {format_shape(got.shape)}")


def dropout_expected(record, where: str = "weights") -> torch.Tensor:
    """The dropout case's training-mode output, replaying the probe's random draws.

    ``where`` is where dropout acts: ``"weights"`` (the attention weights, correct), ``"scores"``
    (before the softmax) or ``"output"`` (after the output projection).
    """
    seed = seed_of(record)
    x, _ = case_input(seed, "dropout")
    state = plain(record["dropout_parameters"])
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        if where == "weights":
            return reference(record, "dropout").train()(x)
        return batched_variant(state, x, 2, dropout=DROPOUT, dropout_on=where)


def _dropout_train(record):
    args, _, _ = capstone_cases(seed_of(record))["dropout"]
    got = tensor_of(record, "dropout_train", f"{call_text(args, False)} in training mode")
    _parts("dropout")(record)
    expect_close(got, dropout_expected(record), labels=("sequence", "token"),
                 where=f"for {call_text(args, False)} in training mode, dropout on the attention weights")


def _dropout_eval(record):
    args, _, _ = capstone_cases(seed_of(record))["dropout"]
    first = eval_output(record, f"{call_text(args, False)} in eval mode")
    x, _ = case_input(seed_of(record), "dropout")
    with torch.no_grad():
        expect_close(first, reference(record, "dropout").eval()(x), labels=("sequence", "token"))


def batched_variant(state: dict, x: torch.Tensor, num_heads: int, *, scale: str = "head_dim", split: str = "heads",
                    merge: str = "heads", out_proj: bool = True, mask: str = "causal", softmax_dim: int = -1,
                    dropout: float = 0.0, dropout_on: str = "weights") -> torch.Tensor:
    """The batched forward pass on the weights ``state``, written out with a chosen mistake.

    The defaults give the package's module in eval mode (or, with ``dropout``, in training mode
    from the current random state); the catalogue of 3.5 compares the variants with the record.
    """
    def project(role: str, t: torch.Tensor) -> torch.Tensor:
        return F.linear(t, state[f"{role}.weight"], state.get(f"{role}.bias"))

    b, t, _ = x.shape
    d_out = state["W_query.weight"].shape[0]
    head_dim = d_out // num_heads

    def to_heads(p: torch.Tensor) -> torch.Tensor:
        if split == "no-transpose":
            return p.reshape(b, num_heads, t, head_dim)  # (B, h, T, d_h), tokens mixed up
        if split == "interleaved":
            return p.view(b, t, head_dim, num_heads).permute(0, 3, 1, 2)  # (B, h, T, d_h), columns dealt out
        return p.view(b, t, num_heads, head_dim).transpose(1, 2)  # (B, h, T, d_h)

    q, k, v = (to_heads(project(role, x)) for role in ("W_query", "W_key", "W_value"))
    scores = q @ k.transpose(-2, -1)  # (B, h, T, T)
    if dropout and dropout_on == "scores":
        scores = F.dropout(scores, dropout, training=True)
    ones = torch.ones(t, t, dtype=torch.bool)
    future = {"causal": torch.triu(ones, 1), "diagonal": torch.triu(ones, 0), "none": torch.zeros_like(ones)}[mask]
    divisor = {"head_dim": head_dim**0.5, "d_out": d_out**0.5, "none": 1.0}[scale]
    weights = torch.softmax(scores.masked_fill(future, float("-inf")) / divisor, dim=softmax_dim)  # (B, h, T, T)
    if dropout and dropout_on == "weights":
        weights = F.dropout(weights, dropout, training=True)
    context = weights @ v  # (B, h, T, d_h)
    if merge == "no-transpose":
        merged = context.reshape(b, t, d_out)  # (B, T, d_out), heads and tokens mixed up
    else:
        merged = context.transpose(1, 2).reshape(b, t, d_out)  # (B, T, d_out)
    out = project("out_proj", merged) if out_proj else merged
    if dropout and dropout_on == "output":
        out = F.dropout(out, dropout, training=True)
    return out


def _like(**how):
    def detect(record):
        args, _, _ = capstone_cases(seed_of(record))["main"]
        x, _ = case_input(seed_of(record), "main")
        with torch.no_grad():
            return same(record["main_out"]["value"], batched_variant(plain(record["main_parameters"]), x, args[4], **how))
    return detect


def _shape_of(name: str, rule):
    def detect(record):
        args, _, _ = capstone_cases(seed_of(record))["main"]
        d_in, d_out, _, _, num_heads = args
        got = plain(record["main_parameters"]).get(name)
        return isinstance(got, torch.Tensor) and tuple(got.shape) == rule(d_in, d_out, num_heads)
    return detect


_PARTS = "the course's parts: W_query, W_key, W_value, out_proj"
_MASK = "the causal mask is a buffer named mask"
_DROP_TRAIN = "dropout acts on the attention weights in training mode"
_DROP_EVAL = "no dropout in eval mode"
_DEVICE = "output on the input's device"
_VALUES = "output = mha_course's MultiHeadAttention with the same weights"

CAPSTONE = Exercise(
    id="3.5",
    title="the whole batched MultiHeadAttention",
    answer_name="BatchedHeads",
    signature="class BatchedHeads(nn.Module) with __init__(self, d_in, d_out, context_length, dropout, "
              "num_heads, qkv_bias=False)",
    probe=_probe,
    checks=(
        Check("is an nn.Module class", module_class_check('check("3.5", BatchedHeads)'), gate=True),
        Check(_PARTS, _parts("main")),
        Check(_MASK, _mask_buffer),
        Check("output shape (B, T, d_out) on an input shorter than context_length", _shape),
        Check("no future-token leak", causality_check("main_out", "main_future")),
        Check(_VALUES, _output("main")),
        Check("with qkv_bias=True, other sizes", _output("bias")),
        Check(_DROP_TRAIN, _dropout_train),
        Check(_DROP_EVAL, _dropout_eval),
        Check("gradients reach every parameter", gradients_check("main_grad_out", "main_gradients")),
        Check(_DEVICE, device_check("main_on", "module.to(device)(x)")),
    ),
    mistakes=(
        Mistake("d-out-per-head",
                "Your projections are num_heads * d_out wide: that is the wrapper's meaning of d_out. In "
                "the batched module d_out is the total width, and each head gets head_dim = d_out // "
                "num_heads of its columns.",
                _shape_of("W_query.weight", lambda d_in, d_out, h: (h * d_out, d_in)), (_PARTS,)),
        Mistake("linear-arguments-swapped",
                "W_query.weight has the shape (d_in, d_out): nn.Linear takes (in_features, "
                "out_features), so the query projection is nn.Linear(d_in, d_out), which stores its "
                "weight as (d_out, d_in).",
                _shape_of("W_query.weight", lambda d_in, d_out, h: (d_in, d_out)), (_PARTS,)),
        Mistake("out-proj-without-bias",
                "out_proj has no bias; in the course's module it has one (nn.Linear(d_out, d_out)), "
                "whatever qkv_bias says.",
                lambda record: "out_proj.weight" in plain(record["main_parameters"])
                and "out_proj.bias" not in plain(record["main_parameters"]), (_PARTS,)),
        Mistake("qkv-bias-ignored",
                "qkv_bias=True must give the query, key and value projections a bias: "
                "nn.Linear(d_in, d_out, bias=qkv_bias).",
                lambda record: "W_query.bias" not in plain(record["bias_parameters"]),
                ("with qkv_bias=True, other sizes",)),
        Mistake("mask-not-a-buffer",
                "Your mask is a plain attribute: .to(device) does not move it and state_dict() does not "
                "save it. Register it: self.register_buffer('mask', torch.triu(torch.ones(context_length, "
                "context_length, dtype=torch.bool), diagonal=1)).",
                lambda record: plain(record["main_mask_attribute"]) and "mask" not in plain(record["main_buffers"]),
                (_MASK, _DEVICE)),
        Mistake("view-without-contiguous",
                "context.transpose(1, 2) is not contiguous in memory, and .view cannot change the shape "
                "of such a tensor: call .contiguous() first, context.transpose(1, 2).contiguous().view(B, T, "
                "d_out), or use .reshape.",
                lambda record: raised(record, "main_out", "view size is not compatible")),
        Mistake("mask-not-sliced",
                "The input is shorter than context_length, and the whole (context_length, "
                "context_length) mask does not fit its (T, T) scores. Use its top-left corner: "
                "self.mask[:num_tokens, :num_tokens].",
                lambda record: raised(record, "main_out", "must match the size", "shape mismatch", "broadcast")),
        Mistake("scale-d-out",
                "You scaled the scores by sqrt(d_out). Each head's scores are dot products of head_dim "
                "numbers, so the scale is sqrt(head_dim) = sqrt(d_out // num_heads).",
                _like(scale="d_out")),
        Mistake("no-scale",
                "The scores are not scaled: divide them by sqrt(head_dim) before the softmax.",
                _like(scale="none")),
        Mistake("split-without-transpose",
                "Right shapes, wrong numbers: viewing (B, T, d_out) directly as (B, num_heads, T, "
                "head_dim) mixes tokens inside a head. View as (B, T, num_heads, head_dim), then "
                ".transpose(1, 2).",
                _like(split="no-transpose")),
        Mistake("split-interleaved",
                "Each head got every num_heads-th column. View as (B, T, num_heads, head_dim): head m "
                "(counting from 1) owns columns (m - 1)*head_dim to m*head_dim - 1.",
                _like(split="interleaved")),
        Mistake("merge-without-transpose",
                "The merge reshapes (B, num_heads, T, head_dim) straight to (B, T, d_out), which puts "
                "pieces of different tokens into one row. Transpose first: context.transpose(1, 2)"
                ".contiguous().view(B, T, d_out).",
                _like(merge="no-transpose")),
        Mistake("no-out-proj",
                "The merged heads come out as they are: apply the output projection, self.out_proj(...), "
                "last.",
                _like(out_proj=False)),
        Mistake("no-mask",
                "Nothing stops a token from attending to later tokens: fill the scores with -inf where "
                "the mask is True, before the softmax.",
                _like(mask="none")),
        Mistake("mask-diagonal",
                "The mask also hides each token from itself, so the first token sees nothing (NaN). The "
                "mask is True strictly above the diagonal: torch.triu(..., diagonal=1).",
                _like(mask="diagonal")),
        Mistake("softmax-axis",
                "The softmax runs over the queries: each query's weights, a row, must sum to 1, so take "
                "softmax(..., dim=-1).",
                _like(softmax_dim=-2)),
        Mistake("dropout-missing",
                "In training mode your module gives its eval-mode output: no dropout. Apply "
                "self.dropout (nn.Dropout(dropout)) to the attention weights, after the softmax.",
                dropout_lost, (_DROP_TRAIN,)),
        Mistake("dropout-on-masked-scores",
                "Your training-mode output is NaN: dropout acts on the masked scores, and it multiplies "
                "their -inf by 0, which is NaN (and a softmax row with one NaN is all NaN). Drop the "
                "attention weights instead, after the softmax: self.dropout(torch.softmax(...)).",
                lambda record: bool(record["dropout_train"]["value"].isnan().any())
                and not bool(record["dropout_eval"]["value"].isnan().any()), (_DROP_TRAIN,)),
        Mistake("dropout-on-scores",
                "Dropout acts on the scores, before the softmax, where a zeroed score still gets weight "
                "(exp(0) = 1). Drop the attention weights instead, after the softmax.",
                lambda record: same(record["dropout_train"]["value"], dropout_expected(record, "scores")),
                (_DROP_TRAIN,)),
        Mistake("dropout-on-output",
                "Dropout acts on the module's output. In attention it acts on the attention weights, "
                "after the softmax and before they weight the values.",
                lambda record: same(record["dropout_train"]["value"], dropout_expected(record, "output")),
                (_DROP_TRAIN,)),
        Mistake("dropout-always",
                "Dropout is active in eval mode too. nn.Dropout follows the module's mode; "
                "F.dropout(x, p) does not unless you pass training=self.training.",
                dropout_in_eval, (_DROP_EVAL,)),
        Mistake("mask-on-cpu",
                "The mask stays on the CPU when the module moves: register it as a buffer "
                "(self.register_buffer('mask', ...)), and .to(device) moves it with the weights.",
                lambda record: error_on_device(record, "main_on", "expected device", "same device"), (_DEVICE,)),
    ),
    shortcuts=attention_modules()
    + package(split_heads, merge_heads, stack_qkv, unstack_qkv,
              why="This calls mha_course's own head helpers: write the split and the merge yourself (your "
                  "own to_heads and from_heads of 3.1 and 3.2 are welcome).")
    + torch_attention("This calls torch's attention, which does the scores, mask, softmax and weighted sum "
                      "for you: write those steps yourself."),
)

__all__ = ["CAPSTONE", "capstone_cases", "batched_variant", "dropout_expected", "reference"]
