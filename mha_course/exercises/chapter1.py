"""Exercises of chapter 1, one causal head: the mask, the forward pass, the shapes along the way."""

from __future__ import annotations

import warnings

import torch
from torch.func import functional_call

from ..attention.causal_attention import CausalAttention
from ..data import random_batch, running_example
from ..attention.masking import causal_mask, visibility
from .framework import Check, Exercise, Mistake
from .probes import (KEEP, batch, causality_check, connected_check, device_check, draw, error_on_device,
                     future_changed, matrices, probe_backward, probe_on_devices)
from .records import (Failed, Recorder, dict_of, error_summary, expect_close, expect_shape, format_shape, plain, same,
                      seed_of, tensor_of)
from .shortcuts import attention_modules, package, torch_attention

# ----------------------------------------------------------------------------------------------
# 1.1 Build the causal mask


def mask_sizes(seed: int) -> dict[str, int]:
    """The two sequence lengths 1.1 is asked about in one run (besides a single token)."""
    return {"1": 1, **draw(seed, "1.1", {"short": (2, 6), "long": (7, 16)})}


def _probe_mask(build_causal_mask, rec: Recorder) -> None:
    for key, n in mask_sizes(rec.seed).items():
        rec.call(f"mask_{key}", build_causal_mask, n)
    probe_on_devices(rec, "mask_on", lambda device: build_causal_mask(4, device=device))


def _mask_check(key: str):
    def run(record):
        n = mask_sizes(seed_of(record))[key]
        got = tensor_of(record, f"mask_{key}", f"build_causal_mask({n})")
        expect_shape(got, (n, n))
        if got.dtype != torch.bool:
            raise Failed("a bool tensor", f"dtype {str(got.dtype).removeprefix('torch.')}",
                         "masked_fill needs a boolean mask: build it with dtype=torch.bool.")
        expect_close(got, causal_mask(n), labels=("row",), where=f"for build_causal_mask({n})")
    return run


def _mask_like(pattern) -> callable:
    """A detector: the long answer, read as booleans, equals ``pattern(ones)``."""
    def detect(record):
        got = record["mask_long"]["value"]
        n = got.shape[0]
        return got.dtype == torch.bool and same(got, pattern(torch.ones(n, n, dtype=torch.bool)))
    return detect


def _numeric_causal(record) -> bool:
    got = record["mask_long"]["value"]
    if got.dtype == torch.bool or (got.is_floating_point() and not bool(torch.isfinite(got).all())):
        return False
    return same(got != 0, causal_mask(got.shape[0]))


def _additive(record) -> bool:
    got = record["mask_long"]["value"]
    future = causal_mask(got.shape[0])
    return got.is_floating_point() and same(torch.isneginf(got), future) and bool((got[~future] == 0).all())


def _device_ignored(record) -> bool:
    for device in plain(record["mask_on:devices"]):
        got = record[f"mask_on@{torch.device(device).type}"]
        if got["kind"] == "tensor" and got["device"] == "cpu" and same(got["value"], causal_mask(4)):
            return True
    return False


MASK = Exercise(
    id="1.1",
    title="build the causal mask",
    answer_name="build_causal_mask",
    signature="build_causal_mask(num_tokens, device=None)",
    probe=_probe_mask,
    checks=(
        Check("returns a tensor", lambda r: tensor_of(r, "mask_short", "build_causal_mask(n)"), gate=True),
        Check("mask for a short sequence", _mask_check("short")),
        Check("mask for a long sequence", _mask_check("long")),
        Check("mask for a single token", _mask_check("1")),
        Check("mask on the requested device", device_check("mask_on", "build_causal_mask(4, device=...)")),
    ),
    mistakes=(
        Mistake("diagonal-masked",
                "Your mask also hides each token from itself (the diagonal). A token may always see "
                "itself: start the mask one above the diagonal, torch.triu(..., diagonal=1).",
                _mask_like(lambda ones: torch.triu(ones, diagonal=0))),
        Mistake("transposed",
                "Your mask hides the past and shows the future: it is the causal mask transposed. Row i "
                "is the query, column j the key, and the forbidden keys are the later ones, j > i: the "
                "upper triangle, torch.triu(..., diagonal=1).",
                _mask_like(lambda ones: torch.tril(ones, diagonal=-1))),
        Mistake("visibility-table",
                "You returned the visibility table (True where a token MAY look). The mask is its "
                "opposite: True where attention is forbidden, the future positions j > i.",
                _mask_like(lambda ones: torch.tril(ones, diagonal=0))),
        Mistake("nothing-masked",
                "Your mask forbids nothing, so every token would see the whole sentence, future "
                "included. Mark the positions j > i as True.",
                _mask_like(lambda ones: torch.zeros_like(ones))),
        Mistake("additive-mask",
                "You built an additive mask (-inf above the diagonal, 0 elsewhere). That works when "
                "added to the scores, but this exercise asks for the boolean mask that masked_fill "
                "takes: True above the diagonal.",
                _additive),
        Mistake("not-bool",
                "Right pattern, wrong dtype: masked_fill needs a boolean mask. Build it with "
                "dtype=torch.bool, or convert with .bool().",
                _numeric_causal),
        Mistake("device-ignored",
                "Right mask, wrong device: you ignored the device argument. The mask must live where "
                "the scores live, so create it there: torch.ones(..., device=device).",
                _device_ignored),
    ),
    shortcuts=package(causal_mask, visibility),
)

# ----------------------------------------------------------------------------------------------
# 1.2 One causal head's forward pass


def head_cases(seed: int) -> dict:
    """The two inputs of one run: the running sentence with ``d_out = 2``, and a random batch
    whose ``d_out`` differs from ``d_in``, so that scaling by the wrong width shows."""
    sizes = draw(seed, "1.2 sizes", {"batch": (1, 3), "tokens": (KEEP + 2, 8), "d_in": (2, 6), "d_out": (7, 10)})
    x, label = batch(seed, "1.2 batch", sizes["batch"], sizes["tokens"], sizes["d_in"])
    return {
        "running": ((running_example(batch=True), *matrices(seed, "1.2 running", 3, 3, 2)),
                    "the running example with d_out=2"),
        "random": ((x, *matrices(seed, "1.2 weights", 3, sizes["d_in"], sizes["d_out"])),
                   f"x = {label} with d_out={sizes['d_out']}"),
    }


def _probe_head(forward, rec: Recorder) -> None:
    cases = head_cases(rec.seed)
    for key, (inputs, _) in cases.items():
        rec.call(key, forward, *inputs)
    rand = cases["random"][0]
    rec.call("random_again", forward, *rand)  # the same input again: a head without dropout gives the same output
    rec.call("future_changed", forward, future_changed(rand[0], rec.seed), *rand[1:])
    leaves = [t.clone().requires_grad_() for t in rand]
    probe_backward(rec, "grad_out", rec.call("grad_out", forward, *leaves))
    rec.note("grads", [leaf.grad for leaf in leaves])
    probe_on_devices(rec, "on", lambda device: forward(*(t.to(device) for t in rand)))


def reference_head(x, W_query, W_key, W_value) -> torch.Tensor:
    """The package's CausalAttention run with the given (d_in, d_out) weight matrices."""
    d_in, d_out = W_query.shape
    head = CausalAttention(d_in, d_out, x.shape[1], dropout=0.0)
    # nn.Linear stores (d_out, d_in) and computes x @ weight.T.
    params = {"W_query.weight": W_query.T, "W_key.weight": W_key.T, "W_value.weight": W_value.T}
    return functional_call(head, params, (x,))


def _head_shape(key: str):
    def run(record):
        inputs, label = head_cases(seed_of(record))[key]
        got = tensor_of(record, key, label)
        expected = (*inputs[0].shape[:2], inputs[1].shape[1])
        if tuple(got.shape) != expected:
            raise Failed(f"shape {format_shape(expected)} for {label}", f"shape {format_shape(got.shape)}")
    return run


def _head_values(key: str):
    def run(record):
        inputs, label = head_cases(seed_of(record))[key]
        with torch.no_grad():
            expected = reference_head(*inputs)
        expect_close(tensor_of(record, key, label), expected, labels=("sequence", "token"), where=f"for {label}")
    return run


def _head_grads(record):
    connected_check(record, "grad_out")
    rand = head_cases(seed_of(record))["random"][0]
    leaves = [t.clone().requires_grad_() for t in rand]
    reference_head(*leaves).sum().backward()
    for name, got, leaf in zip(("x", "W_query", "W_key", "W_value"), plain(record["grads"]), leaves):
        if not isinstance(got, torch.Tensor):
            raise Failed(f"a gradient for {name}", "none: no gradient reached it")
        expect_close(got, leaf.grad, labels=(f"{name}.grad row",))


def head_variant(x, W_query, W_key, W_value, *, mask="causal", fill=float("-inf"), softmax_dim=-1,
                 scale="sqrt_d_out", mix="values", scores="qk", zero_after_softmax=False):
    """One causal head written out with a chosen mistake; the defaults give the correct result.

    The catalogue of 1.2 runs these variants on the probe's inputs and compares them with what
    the learner's function returned.
    """
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value  # (B, T, d_out)
    if scores == "qk":
        s = queries @ keys.transpose(-2, -1)  # (B, T, T)
    elif scores == "k.T":
        with warnings.catch_warnings():  # torch warns that .T on 3 axes is deprecated
            warnings.simplefilter("ignore")
            s = queries @ keys.T  # .T reverses all three axes: (d_out, T, B); raises unless shapes happen to fit
    else:
        s = keys @ queries.transpose(-2, -1)  # the transpose: row i is key i
    num_tokens, d_in, d_out = x.shape[-2], W_query.shape[0], W_query.shape[1]
    ones = torch.ones(num_tokens, num_tokens, dtype=torch.bool)
    future = {"causal": torch.triu(ones, 1), "diagonal": torch.triu(ones, 0),
              "none": torch.zeros_like(ones)}[mask]
    divisor = {"sqrt_d_out": d_out**0.5, "none": 1.0, "sqrt_d_in": d_in**0.5, "d_out": float(d_out)}[scale]
    if zero_after_softmax:
        weights = torch.softmax(s / divisor, dim=softmax_dim).masked_fill(future, 0.0)
    else:
        weights = torch.softmax(s.masked_fill(future, fill) / divisor, dim=softmax_dim)
    return weights @ {"values": values, "inputs": x, "keys": keys}[mix]


def _head_raises_like(**how):
    """The learner's call on the running example raised exactly the error the variant raises there.

    The running example's shapes make ``queries @ keys.T`` fail in torch's batched product whatever
    else the answer does, so its error message identifies the mistake."""
    def detect(record):
        inputs, _ = head_cases(seed_of(record))["running"]
        try:
            with torch.no_grad():
                head_variant(*inputs, **how)
        except Exception as error:
            return record["running"] == error_summary(error)
        return False
    return detect


def _head_like(**how):
    def detect(record):
        cases = head_cases(seed_of(record))
        with torch.no_grad():
            return all(same(record[key]["value"], head_variant(*inputs, **how)) for key, (inputs, _) in cases.items())
    return detect


_DEVICE_CHECK = "output on the input's device"

HEAD = Exercise(
    id="1.2",
    title="one causal head's forward pass",
    answer_name="causal_attention_forward",
    signature="causal_attention_forward(x, W_query, W_key, W_value)",
    probe=_probe_head,
    checks=(
        Check("output shape on the running example", _head_shape("running")),
        Check("output shape on a random batch", _head_shape("random")),
        Check("no future-token leak", causality_check("random", "future_changed")),
        Check("values on the running example", _head_values("running")),
        Check("values on a random batch whose d_out differs from d_in", _head_values("random")),
        Check("gradients reach x and all three weights", _head_grads),
        Check(_DEVICE_CHECK, device_check("on", "causal_attention_forward")),
    ),
    mistakes=(
        Mistake("dropout-left-in",
                "Two calls on the same input gave different outputs: dropout (F.dropout, nn.Dropout) is "
                "left in, and it zeroes other weights on every call, which also looks like a leak of "
                "future tokens. This head has no dropout: remove it.",
                lambda record: record["random"].get("kind") == "tensor"
                and not same(record["random"]["value"], record["random_again"]["value"])),
        Mistake("keys-dot-T",
                "keys.T reverses every axis of a 3-D tensor: (batch, num_tokens, d_out) becomes (d_out, "
                "num_tokens, batch), so torch's batched product refuses it (the 'batch2 tensor' error). "
                "Swap only the last two axes, the tokens and the features: keys.transpose(1, 2), or keys.mT.",
                _head_raises_like(scores="k.T")),
        Mistake("no-mask",
                "Nothing stops a token from attending to later tokens: apply the causal mask to the "
                "scores (masked_fill with -inf above the diagonal) before the softmax.",
                _head_like(mask="none")),
        Mistake("mask-diagonal",
                "The mask hides each token from itself too, so the first token sees nothing and its "
                "softmax row is all NaN. Mask only j > i: torch.triu(..., diagonal=1).",
                _head_like(mask="diagonal")),
        Mistake("mask-fill-zero",
                "You filled the masked scores with 0, but exp(0) = 1, so future tokens still get "
                "weight. Fill them with float('-inf') so the softmax gives them exactly 0.",
                _head_like(fill=0.0)),
        Mistake("zero-after-softmax",
                "You zeroed the future weights after the softmax without renormalising, so the rows no "
                "longer sum to 1. Mask the scores with -inf before the softmax instead.",
                _head_like(zero_after_softmax=True)),
        Mistake("softmax-axis",
                "The softmax runs over the wrong axis: each query's weights (a row of the score matrix) "
                "must sum to 1, so use softmax(..., dim=-1).",
                _head_like(softmax_dim=-2)),
        Mistake("scores-transposed",
                "Your score matrix is keys @ queries^T, the transpose of queries @ keys^T, so row i "
                "belongs to key i and the mask cuts the wrong pairs. Compute queries @ keys.transpose(-2, -1).",
                _head_like(scores="kq")),
        Mistake("no-scale",
                "The scores are not scaled. Divide them by sqrt(d_h), the square root of the head's "
                "width (its d_out, the keys' last axis), before the softmax.",
                _head_like(scale="none")),
        Mistake("scale-d-in",
                "You scaled by sqrt(d_in), the input width. The scale is the square root of the head's "
                "width d_h (its d_out): keys.shape[-1] ** 0.5.",
                _head_like(scale="sqrt_d_in")),
        Mistake("scale-no-sqrt",
                "You divided by d_h (the head's d_out) itself. The scale is its square root: keys.shape[-1] ** 0.5.",
                _head_like(scale="d_out")),
        Mistake("weights-times-inputs",
                "You multiplied the attention weights by the inputs x. Context vectors are weighted "
                "sums of the values: weights @ (x @ W_value).",
                _head_like(mix="inputs")),
        Mistake("weights-times-keys",
                "You multiplied the attention weights by the keys. Context vectors are weighted sums "
                "of the values: weights @ values.",
                _head_like(mix="keys")),
        Mistake("mask-on-cpu",
                "Your mask is built on the CPU whatever the input's device, and masked_fill cannot mix "
                "devices. Build it where the scores are: torch.triu(torch.ones(T, T, dtype=torch.bool, "
                "device=x.device), diagonal=1), or your build_causal_mask of exercise 1.1 with device=x.device "
                "once it passes.",
                lambda record: error_on_device(record, "on", "expected device", "same device"),
                (_DEVICE_CHECK,)),
    ),
    shortcuts=attention_modules() + torch_attention(
        "This calls torch's fused attention, which does the scores, mask, softmax and weighted sum for "
        "you: write those steps yourself."),
)

# ----------------------------------------------------------------------------------------------
# 1.3 The shapes along one head's forward pass

#: What 1.3 asks the shape of, in the order of the forward pass.
SHAPE_KEYS = ("W_query.weight", "queries", "scores", "mask", "mask_used", "weights", "context")
SIZE_NAMES = ("batch", "num_tokens", "d_in", "d_out", "context_length")


def shape_cases(seed: int) -> dict[str, dict[str, int]]:
    """Two sets of sizes per run, every size different from the others so that mix-ups show."""
    cases = {}
    for key in ("a", "b"):
        sizes = draw(seed, f"1.3 {key}", {"batch": (2, 5), "num_tokens": (3, 9), "d_in": (2, 12),
                                          "d_out": (2, 12), "extra": (1, 6)})
        sizes["context_length"] = sizes["num_tokens"] + sizes.pop("extra")
        while len({*sizes.values()}) < len(sizes):  # context_length collided: lengthen it
            sizes["context_length"] += 1
        cases[key] = sizes
    return cases


def measured_shapes(sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The shapes, measured on the package's CausalAttention run on a random batch of ``sizes``."""
    with torch.random.fork_rng(devices=[]):
        head = CausalAttention(sizes["d_in"], sizes["d_out"], sizes["context_length"], dropout=0.0)
    x = random_batch(sizes["batch"], sizes["num_tokens"], sizes["d_in"])
    t = sizes["num_tokens"]
    with torch.no_grad():
        weights = head.attention_weights(x)
        return {"W_query.weight": tuple(head.W_query.weight.shape), "queries": tuple(head.W_query(x).shape),
                "scores": tuple(weights.shape), "mask": tuple(head.mask.shape),
                "mask_used": tuple(head.mask[:t, :t].shape), "weights": tuple(weights.shape),
                "context": tuple(head(x).shape)}


def _call(sizes: dict[str, int]) -> str:
    return "head_shapes(" + ", ".join(f"{name}={sizes[name]}" for name in SIZE_NAMES) + ")"


def _probe_shapes(head_shapes, rec: Recorder) -> None:
    for key, sizes in shape_cases(rec.seed).items():
        rec.call(key, head_shapes, *(sizes[name] for name in SIZE_NAMES))


def _answer(record, key: str) -> dict:
    return dict_of(record, key, SHAPE_KEYS, _call(shape_cases(seed_of(record))[key]))


def _as_shape(value) -> tuple | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def _shape_check(case: str, keys=SHAPE_KEYS):
    def run(record):
        sizes = shape_cases(seed_of(record))[case]
        answer, expected = _answer(record, case), measured_shapes(sizes)
        for key in keys:
            got = _as_shape(answer[key])
            if got != expected[key]:
                raise Failed(f"{key} of shape {format_shape(expected[key])} for {_call(sizes)}",
                             format_shape(got) if got is not None else repr(answer[key]))
    return run


def _shape_is(key: str, rule) -> callable:
    """A detector: the answer's ``key`` is ``rule(sizes)`` in both cases."""
    def detect(record):
        return all(_as_shape(plain(record[case])[key]) == rule(**sizes)
                   for case, sizes in shape_cases(seed_of(record)).items())
    return detect


def _about(key: str) -> tuple[str, ...]:
    return (f"{key}", "every shape for a second set of sizes")


SHAPES = Exercise(
    id="1.3",
    title="the shapes along one head's forward pass",
    answer_name="head_shapes",
    signature="head_shapes(batch, num_tokens, d_in, d_out, context_length)",
    probe=_probe_shapes,
    checks=(
        Check("returns a dict of the seven shapes", lambda r: _answer(r, "a")),
        *(Check(key, _shape_check("a", (key,))) for key in SHAPE_KEYS),
        Check("every shape for a second set of sizes", _shape_check("b")),
    ),
    mistakes=(
        Mistake("linear-weight-transposed",
                "nn.Linear stores its weight as (out_features, in_features) and computes x @ weight.T, "
                "so W_query.weight is (d_out, d_in).",
                _shape_is("W_query.weight", lambda d_in, d_out, **_: (d_in, d_out)), _about("W_query.weight")),
        Mistake("queries-input-width",
                "A query is the projection of a token: d_out numbers, not d_in. queries is "
                "(batch, num_tokens, d_out).",
                _shape_is("queries", lambda batch, num_tokens, d_in, **_: (batch, num_tokens, d_in)), _about("queries")),
        Mistake("scores-like-queries",
                "The scores compare every query with every key: one number per (query, key) pair, so "
                "the last two axes are both num_tokens, (batch, num_tokens, num_tokens). The width d_out "
                "is summed away by the dot product.",
                _shape_is("scores", lambda batch, num_tokens, d_out, **_: (batch, num_tokens, d_out)), _about("scores")),
        Mistake("scores-without-batch",
                "Every sequence of the batch gets its own score matrix: (batch, num_tokens, num_tokens).",
                _shape_is("scores", lambda num_tokens, **_: (num_tokens, num_tokens)), _about("scores")),
        Mistake("mask-per-input",
                "The mask buffer is built once, when the module is built, for the longest input it "
                "accepts: (context_length, context_length). A shorter input uses its top-left corner.",
                _shape_is("mask", lambda num_tokens, **_: (num_tokens, num_tokens)), _about("mask")),
        Mistake("mask-used-whole",
                "An input of num_tokens tokens uses the buffer's top-left corner, "
                "mask[:num_tokens, :num_tokens], so that it lines up with the scores: (num_tokens, num_tokens).",
                _shape_is("mask_used", lambda context_length, **_: (context_length, context_length)), _about("mask_used")),
        Mistake("weights-like-values",
                "The attention weights are the softmax of the scores, row by row: the same shape as the "
                "scores, (batch, num_tokens, num_tokens).",
                _shape_is("weights", lambda batch, num_tokens, d_out, **_: (batch, num_tokens, d_out)), _about("weights")),
        Mistake("context-input-width",
                "A context vector is a weighted sum of value vectors, which are d_out wide: "
                "(batch, num_tokens, d_out).",
                _shape_is("context", lambda batch, num_tokens, d_in, **_: (batch, num_tokens, d_in)), _about("context")),
        Mistake("context-like-weights",
                "The weights (batch, num_tokens, num_tokens) multiply the values (batch, num_tokens, d_out): "
                "the context is (batch, num_tokens, d_out).",
                _shape_is("context", lambda batch, num_tokens, **_: (batch, num_tokens, num_tokens)), _about("context")),
    ),
    shortcuts=attention_modules() + torch_attention(
        "This runs torch's attention to measure the shapes: predict them from the arguments."),
)

EXERCISES = (MASK, HEAD, SHAPES)

__all__ = ["EXERCISES", "reference_head", "head_variant", "head_cases", "mask_sizes", "shape_cases", "measured_shapes"]
