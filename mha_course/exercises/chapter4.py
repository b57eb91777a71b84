"""Exercises of chapter 4, what heads cost: attention's share of the work, and the batched module's
forward pass through PyTorch's fused attention.

The references: ``multiply_adds`` of :mod:`mha_course.cost` for 4.1, and the package's own module
with the same weights for 4.2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cost import cost_by_heads, multiply_adds
from ..convert.pytorch import sdpa_forward
from ..attention.masking import causal_mask
from ..attention.multihead import MultiHeadAttention
from .framework import Check, Exercise, Mistake
from .probes import (agrees, batch, causality_check, device_check, draw, dropout_in_eval, dropout_lost, eval_output,
                     future_changed, gradients_check, parameters_with_gradients, probe_backward, probe_dropout,
                     probe_on_devices)
from .records import (Failed, Recorder, expect_close, format_shape, number, number_of, number_pair, same,
                      seed_of, tensor_of)
from .shortcuts import Shortcut, attention_modules, called, package, sdpa_entry_points, torch_attention

# ----------------------------------------------------------------------------------------------
# 4.1 Where attention's work goes


def share_cases(seed: int) -> dict[str, tuple[int, int, int]]:
    """``(num_tokens, d_in, d_out)`` per case: the running example, random sizes, and the crossover T*."""
    a = draw(seed, "4.1 a", {"num_tokens": (256, 4096), "d_in": (64, 1024), "d_out": (64, 1024)})
    b = draw(seed, "4.1 b", {"num_tokens": (8, 200), "d_in": (16, 512), "d_out": (16, 512)})
    star = draw(seed, "4.1 star", {"d_in": (16, 512), "d_out": (16, 512)})
    d_out = star["d_out"] + (3 * star["d_in"] + star["d_out"]) % 2  # 3 d_in + d_out even: T* is whole
    return {
        "running": (6, 3, 4),
        "long": (a["num_tokens"], a["d_in"], a["d_out"]),
        "short": (b["num_tokens"], b["d_in"], b["d_out"]),
        "crossover": ((3 * star["d_in"] + d_out) // 2, star["d_in"], d_out),
    }


def share_variant(num_tokens, d_in, d_out, *, attention_products: int = 2, out_proj: bool = True,
                  of_total: bool = True, widths_swapped: bool = False, counted: int | None = None) -> float:
    """``attention_share`` written out with a chosen mistake; the defaults give the correct share.
    ``counted``: how many of the attention products the share's numerator counts (all, by default)."""
    if widths_swapped:
        d_in, d_out = d_out, d_in
    attention = attention_products * num_tokens**2 * d_out  # QK^T, weights @ V (per sequence)
    rest = 3 * num_tokens * d_in * d_out + (num_tokens * d_out**2 if out_proj else 0)
    shown = attention if counted is None else attention * counted / attention_products
    return shown / (attention + rest) if of_total else shown / rest


def expected_share(args: tuple[int, int, int]) -> float:
    """The share for ``(num_tokens, d_in, d_out)``, from the package's multiply-add formula."""
    macs = multiply_adds("batched", 1, *args, num_heads=1)
    return (macs.scores + macs.weighted_sum) / macs.total


def _share_call(args) -> str:
    return f"attention_share(num_tokens={args[0]}, d_in={args[1]}, d_out={args[2]})"


def _probe_share(share, rec: Recorder) -> None:
    for key, args in share_cases(rec.seed).items():
        rec.call(key, share, *args)


def _share_value(key: str):
    def run(record):
        args = share_cases(seed_of(record))[key]
        got = number_of(record, key, _share_call(args), "a number (a float between 0 and 1)")
        expected = expected_share(args)
        if not agrees(got, expected):
            shown, seen = number_pair(expected, record[key], 6)
            raise Failed(f"{shown} for {_share_call(args)}", seen)
    return run


def _share_like(**how):
    def detect(record):
        return all(agrees(number(record[key]), share_variant(*args, **how))
                   for key, args in share_cases(seed_of(record)).items())
    return detect


SHARE = Exercise(
    id="4.1",
    title="attention's share of the multiply-adds",
    answer_name="attention_share",
    signature="attention_share(num_tokens, d_in, d_out)",
    probe=_probe_share,
    checks=(
        Check("returns a number", lambda r: number_of(r, "running", "attention_share(6, 3, 4)", "a number"), gate=True),
        Check("the running example (6 tokens, d_in 3, d_out 4)", _share_value("running")),
        Check("a long sequence", _share_value("long")),
        Check("a short sequence", _share_value("short")),
        Check("one half at T* = (3 d_in + d_out) / 2", _share_value("crossover")),
    ),
    mistakes=(
        Mistake("percentage",
                "That is a percentage. Return the share as a fraction between 0 and 1: attention / total, "
                "without the factor 100.",
                lambda record: all(agrees(number(record[key]), 100 * expected_share(args))
                                   for key, args in share_cases(seed_of(record)).items())),
        Mistake("one-attention-product",
                "You counted one attention product. There are two of the same size, each "
                "T x T x d_out per sequence: the scores Q K^T, and the weighted sum of the values.",
                _share_like(attention_products=1)),
        Mistake("one-product-shared",
                "Your total counts both attention products, but the share counts only one of them: the "
                "weighted sum of the values, T x T x d_out, is attention's work too, beside the scores.",
                _share_like(counted=1)),
        Mistake("no-out-proj",
                "You left out the output projection, T x d_out x d_out multiply-adds per sequence: "
                "it is part of the batched module's forward pass, so it belongs in the total.",
                _share_like(out_proj=False)),
        Mistake("ratio-not-share",
                "You divided the attention products by the other products. The share is a fraction "
                "of the whole: attention / (attention + projections).",
                _share_like(of_total=False)),
        Mistake("widths-swapped",
                "Right when d_in == d_out, wrong otherwise: d_in and d_out are swapped. The "
                "projections cost T x d_in x d_out each, the attention products T x T x d_out, and the "
                "output projection T x d_out x d_out.",
                _share_like(widths_swapped=True)),
    ),
    shortcuts=package(multiply_adds, cost_by_heads,
                      why="This asks mha_course for the multiply-adds: work the share out from the formulas.")
    + attention_modules(),
)

# ----------------------------------------------------------------------------------------------
# 4.2 The batched module's forward pass through the fused attention call

DROPOUT = 0.5
SDPA = "torch's scaled_dot_product_attention"


def fused_cases(seed: int) -> dict[str, tuple]:
    """``case -> (MultiHeadAttention arguments, qkv_bias, num_tokens)`` drawn from the run's seed."""
    main = draw(seed, "4.2 main", {"d_in": (3, 8), "num_heads": (2, 4), "head_dim": (2, 6)})
    bias = draw(seed, "4.2 bias", {"d_in": (2, 6), "num_heads": (2, 3), "head_dim": (3, 5)})
    return {
        "main": ((main["d_in"], main["num_heads"] * main["head_dim"], 8, 0.0, main["num_heads"]), False, 7),
        "bias": ((bias["d_in"], bias["num_heads"] * bias["head_dim"], 6, 0.0, bias["num_heads"]), True, 6),
        "dropout": ((3, 4, 6, DROPOUT, 2), False, 6),
    }


def fused_module(seed: int, case: str) -> MultiHeadAttention:
    """The module of a case, the same in the probe and in the judge."""
    args, qkv_bias, _ = fused_cases(seed)[case]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(*args, qkv_bias=qkv_bias)


def fused_input(seed: int, case: str) -> tuple[torch.Tensor, str]:
    args, _, num_tokens = fused_cases(seed)[case]
    return batch(seed, f"4.2 {case}", 2, num_tokens, args[0])


def _module_text(seed: int, case: str) -> str:
    args, qkv_bias, _ = fused_cases(seed)[case]
    return "MultiHeadAttention(" + ", ".join(map(str, args)) + (", qkv_bias=True" if qkv_bias else "") + ")"


def _probe_fused(forward, rec: Recorder) -> None:
    for case in fused_cases(rec.seed):
        mha, (x, _) = fused_module(rec.seed, case), fused_input(rec.seed, case)
        if case == "dropout":
            probe_dropout(rec, mha, forward, mha, x)
            continue
        mha.eval()
        rec.call(case, forward, mha, x)
        if case != "main":
            continue
        rec.call("main_future", forward, mha, future_changed(x, rec.seed))
        probe_backward(rec, "main_grad_out", rec.call("main_grad_out", forward, mha, x))
        rec.note("main_gradients", parameters_with_gradients(mha))
        probe_on_devices(rec, "main_on", lambda device, mha=mha, x=x: forward(mha.to(device), x.to(device)))


def _fused_output(case: str):
    def run(record):
        seed = seed_of(record)
        x, label = fused_input(seed, case)
        got = tensor_of(record, case, f"sdpa_attention(mha, x) for mha = {_module_text(seed, case)}")
        with torch.no_grad():
            expected = fused_module(seed, case).eval()(x)
        expect_close(got, expected, labels=("sequence", "token"),
                     where=f"(mha(x)) for mha = {_module_text(seed, case)} in eval mode and x = {label}")
    return run


def _fused_shape(record):
    seed = seed_of(record)
    x, label = fused_input(seed, "main")
    args, _, _ = fused_cases(seed)["main"]
    got = tensor_of(record, "main", "sdpa_attention(mha, x)")
    if tuple(got.shape) != (*x.shape[:2], args[1]):
        raise Failed(f"shape {format_shape((*x.shape[:2], args[1]))} = (B, T, d_out) for x = {label}",
                     f"shape {format_shape(got.shape)}")


def _uses_fused(record):
    if not called(record, SDPA):
        raise Failed("a call of torch.nn.functional.scaled_dot_product_attention", "none",
                     "This exercise is about the fused call: let it do the scores, mask, scale, softmax, "
                     "dropout and weighted sum.")


def dropout_expected(record) -> torch.Tensor:
    """The dropout case's training-mode output, replaying the probe's random draws."""
    seed = seed_of(record)
    x, _ = fused_input(seed, "dropout")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        mha = fused_module(seed, "dropout").train()
        torch.manual_seed(seed)
        return sdpa_forward(mha, x)


def _dropout_train(record):
    seed = seed_of(record)
    got = tensor_of(record, "dropout_train", "sdpa_attention(mha, x) in training mode")
    expect_close(got, dropout_expected(record), labels=("sequence", "token"),
                 where=f"for mha = {_module_text(seed, 'dropout')} in training mode: the fused call with "
                       f"dropout_p={DROPOUT}")


def _dropout_eval(record):
    first = eval_output(record, "sdpa_attention(mha, x) in eval mode")
    x, label = fused_input(seed_of(record), "dropout")
    with torch.no_grad():
        expect_close(first, fused_module(seed_of(record), "dropout").eval()(x), labels=("sequence", "token"),
                     where=f"(mha(x) in eval mode) for x = {label}")


def fused_variant(mha: MultiHeadAttention, x: torch.Tensor, *, causal: str = "is_causal", heads: bool = True,
                  split: str = "heads", merge: str = "heads", out_proj: bool = True,
                  scale: float | None = None) -> torch.Tensor:
    """The fused forward pass written out with a chosen mistake; the defaults give the right output
    (in eval mode). ``causal`` is ``"is_causal"``, ``"none"`` or ``"mask-as-is"`` (the course's
    mask passed as ``attn_mask``, where ``True`` means *take part*); ``split`` is ``"heads"``,
    ``"no-transpose"`` (tokens left before heads) or ``"view-as-heads"`` (viewed as (B, h, T, d_h))."""
    b, t, _ = x.shape
    h = mha.num_heads if heads else 1
    d_h = mha.d_out // h

    def to_heads(p):
        if split == "view-as-heads":
            return p.view(b, h, t, d_h)
        heads_second = p.view(b, t, h, d_h)
        return heads_second if split == "no-transpose" else heads_second.transpose(1, 2)  # (B, h, T, d_h)

    q, k, v = (to_heads(layer(x)) for layer in (mha.W_query, mha.W_key, mha.W_value))
    options = {"is_causal": {"is_causal": True}, "none": {},
               "mask-as-is": {"attn_mask": causal_mask(t)}}[causal]
    context = F.scaled_dot_product_attention(q, k, v, scale=scale, **options)  # (B, h, T, d_h)
    merged = (context.transpose(1, 2) if merge == "heads" else context).reshape(b, t, mha.d_out)  # (B, T, d_out)
    return mha.out_proj(merged) if out_proj else merged


def _fused_like(**how):
    def detect(record):
        seed = seed_of(record)
        x, _ = fused_input(seed, "main")
        with torch.no_grad():
            return same(record["main"]["value"], fused_variant(fused_module(seed, "main").eval(), x, **how))
    return detect


def _split_without_transpose(record) -> bool:
    return any(_fused_like(split=split, merge=merge)(record)
               for split in ("no-transpose", "view-as-heads") for merge in ("heads", "no-transpose"))


def _scale_d_out(record) -> bool:
    args, _, _ = fused_cases(seed_of(record))["main"]
    return _fused_like(scale=args[1] ** -0.5)(record)


_DROP_TRAIN = "dropout on the attention weights in training mode"
_DROP_EVAL = "no dropout in eval mode"

FUSED = Exercise(
    id="4.2",
    title="the batched forward pass through the fused attention call",
    answer_name="sdpa_attention",
    signature="sdpa_attention(mha, x)",
    probe=_probe_fused,
    checks=(
        Check("returns a tensor of shape (B, T, d_out)", _fused_shape),
        Check("calls scaled_dot_product_attention", _uses_fused),
        Check("no future-token leak", causality_check("main", "main_future")),
        Check("output = mha(x) in eval mode", _fused_output("main")),
        Check("with qkv_bias=True, other sizes", _fused_output("bias")),
        Check(_DROP_TRAIN, _dropout_train),
        Check(_DROP_EVAL, _dropout_eval),
        Check("gradients reach every parameter of mha",
              gradients_check("main_grad_out", "main_gradients", "every parameter of mha")),
        Check("output on the input's device", device_check("main_on", "sdpa_attention(mha.to(device), x.to(device))")),
    ),
    mistakes=(
        Mistake("not-causal",
                "Every token sees the whole sequence: the fused call is not causal unless you pass "
                "is_causal=True.",
                _fused_like(causal="none")),
        Mistake("mask-meaning",
                "You passed the course's mask as attn_mask, but a boolean attn_mask means the opposite "
                "there: True marks the pairs that TAKE PART. Pass is_causal=True instead (or the "
                "visibility table, ~mask).",
                _fused_like(causal="mask-as-is")),
        Mistake("one-head",
                "The fused call saw one head of width d_out: split the projections into "
                "(B, num_heads, T, head_dim) first, so that every head attends on its own and the "
                "scale is 1/sqrt(head_dim).",
                _fused_like(heads=False)),
        Mistake("scale-d-out",
                "You passed scale=1/sqrt(d_out). The fused call scales by 1/sqrt(head_dim), the width of "
                "the last axis it is given, which is what each head needs: leave scale out.",
                _scale_d_out),
        Mistake("split-without-transpose",
                "Your split leaves the tokens' axis before the heads' (or views (B, T, d_out) straight as "
                "(B, num_heads, T, head_dim), which cuts tokens apart): the fused call attends over its "
                "third axis. Split with view(B, T, num_heads, head_dim) and then transpose(1, 2).",
                _split_without_transpose),
        Mistake("merge-without-transpose",
                "The merge reshapes (B, num_heads, T, head_dim) straight to (B, T, d_out), which mixes "
                "tokens into one row. Transpose first: context.transpose(1, 2).contiguous().view(B, T, d_out).",
                _fused_like(merge="no-transpose")),
        Mistake("no-out-proj",
                "The merged heads come out as they are: finish with mha.out_proj(...).",
                _fused_like(out_proj=False)),
        Mistake("dropout-never",
                "In training mode your function gives its eval-mode output: pass "
                "dropout_p=mha.dropout.p while mha.training is True.",
                dropout_lost, (_DROP_TRAIN,)),
        Mistake("dropout-always",
                "The fused call drops weights whenever dropout_p > 0, in eval mode too: pass "
                "dropout_p=mha.dropout.p if mha.training else 0.0.",
                dropout_in_eval, (_DROP_EVAL,)),
    ),
    shortcuts=attention_modules() + (
        Shortcut(SDPA, sdpa_entry_points(), forbidden=False),
        *torch_attention("This calls torch's nn.MultiheadAttention: write the forward pass around the fused "
                         "call yourself.")[1:],
    ),
)

EXERCISES = (SHARE, FUSED)

__all__ = ["EXERCISES", "share_variant", "expected_share", "share_cases", "fused_cases", "fused_module",
           "fused_variant"]
