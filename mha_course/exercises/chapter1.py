"""Exercises of chapter 1, one causal head: the mask, the forward pass, what a token may see."""

from __future__ import annotations

import torch
from torch.func import functional_call

from ..causal_attention import CausalAttention
from ..data import random_batch, running_example
from ..device import get_device
from ..masking import causal_mask, visibility
from .framework import (Check, Exercise, Failed, Mistake, Recorder, describe, expect_close, expect_shape,
                        plain, same, tensor_of, value_of)

# ----------------------------------------------------------------------------------------------
# 1.1 Build the causal mask


def _probe_mask(build_causal_mask, rec: Recorder) -> None:
    for n in (1, 3, 6):
        rec.call(f"mask_{n}", build_causal_mask, n)
    device = get_device()
    rec.note("device_asked", str(device))
    rec.call("mask_on_device", build_causal_mask, 4, device=device)


def _mask_check(n: int):
    def run(record):
        got = tensor_of(record, f"mask_{n}", f"build_causal_mask({n})")
        expect_shape(got, (n, n))
        if got.dtype != torch.bool:
            raise Failed("a bool tensor", f"dtype {str(got.dtype).removeprefix('torch.')}",
                         "masked_fill needs a boolean mask: build it with dtype=torch.bool.")
        expect_close(got, causal_mask(n), labels=("row",))
    return run


def _mask_device(record):
    got = value_of(record, "mask_on_device", "build_causal_mask(4, device=...)")
    asked = plain(record["device_asked"])
    if got.get("kind") != "tensor":
        raise Failed("a torch.Tensor", describe(got))
    if torch.device(got["device"]).type != torch.device(asked).type:
        raise Failed(f"a mask on {asked}", f"one on {got['device']}",
                     "Create the tensor on the device you are given: torch.ones(..., device=device).")


def _mask_returned(record):
    tensor_of(record, "mask_3", "build_causal_mask(3)")


def _mask_like(pattern) -> callable:
    """A detector: the 6-token answer, read as booleans, equals ``pattern(ones)``."""
    def detect(record):
        got = record["mask_6"]["value"]
        return got.dtype == torch.bool and same(got, pattern(torch.ones(6, 6, dtype=torch.bool)))
    return detect


def _numeric_causal(record) -> bool:
    got = record["mask_6"]["value"]
    if got.dtype == torch.bool or (got.is_floating_point() and not bool(torch.isfinite(got).all())):
        return False
    return same(got != 0, causal_mask(6))


def _additive(record) -> bool:
    got = record["mask_6"]["value"]
    return got.is_floating_point() and same(torch.isneginf(got), causal_mask(6)) and bool(
        (got[~causal_mask(6)] == 0).all())


def _device_ignored(record) -> bool:
    got = record["mask_on_device"]
    return got["kind"] == "tensor" and same(got["value"], causal_mask(4)) and (
        torch.device(got["device"]).type != torch.device(plain(record["device_asked"])).type)


MASK = Exercise(
    id="1.1",
    title="build the causal mask",
    answer_name="build_causal_mask",
    signature="build_causal_mask(num_tokens, device=None)",
    probe=_probe_mask,
    checks=(
        Check("returns a tensor", _mask_returned),
        Check("mask for 3 tokens", _mask_check(3)),
        Check("mask for 6 tokens", _mask_check(6)),
        Check("mask for a single token", _mask_check(1)),
        Check("mask on the requested device", _mask_device),
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
)

# ----------------------------------------------------------------------------------------------
# 1.2 One causal head's forward pass


def _head_inputs():
    """Two fixed cases: the running sentence with d_out = 2, and a random batch with d_out = 8."""
    generator = torch.Generator().manual_seed(123)
    running = (running_example(batch=True),) + tuple(torch.rand(3, 2, generator=generator) for _ in range(3))
    generator = torch.Generator().manual_seed(7)
    x = random_batch(2, 5, 4, seed=3)
    # d_out (8) differs from d_in (4), so scaling by the wrong width shows.
    weights = tuple(0.5 * torch.randn(4, 8, generator=generator) for _ in range(3))
    return running, (x,) + weights


def _future_changed(x: torch.Tensor, keep: int) -> torch.Tensor:
    """``x`` with every token from position ``keep`` on replaced by different numbers."""
    changed = x.clone()
    changed[:, keep:] = random_batch(x.shape[0], x.shape[1] - keep, x.shape[2], seed=99)
    return changed


KEEP = 3  # the causality probe changes tokens 3, 4 and checks tokens 0, 1, 2


def _probe_head(forward, rec: Recorder) -> None:
    running, rand = _head_inputs()
    rec.call("running", forward, *running)
    rec.call("random", forward, *rand)
    rec.call("future_changed", forward, _future_changed(rand[0], KEEP), *rand[1:])
    leaves = [t.clone().requires_grad_() for t in rand]
    out = rec.call("grad_out", forward, *leaves)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        rec.call("backward", lambda: out.sum().backward())
    rec.note("grads", [leaf.grad for leaf in leaves])
    device = get_device()
    rec.note("device_asked", str(device))
    rec.call("on_device", forward, *(t.to(device) for t in rand))


def reference_head(x, W_query, W_key, W_value) -> torch.Tensor:
    """The package's CausalAttention run with the given (d_in, d_out) weight matrices."""
    d_in, d_out = W_query.shape
    head = CausalAttention(d_in, d_out, x.shape[1], dropout=0.0)
    # nn.Linear stores (d_out, d_in) and computes x @ weight.T.
    params = {"W_query.weight": W_query.T, "W_key.weight": W_key.T, "W_value.weight": W_value.T}
    return functional_call(head, params, (x,))


def _head_shape(key: str, what: str):
    def run(record):
        running, rand = _head_inputs()
        inputs = running if key == "running" else rand
        got = tensor_of(record, key, what)
        expect_shape(got, (*inputs[0].shape[:2], inputs[1].shape[1]))
    return run


def _head_values(key: str, what: str):
    def run(record):
        running, rand = _head_inputs()
        inputs = running if key == "running" else rand
        with torch.no_grad():
            expected = reference_head(*inputs)
        expect_close(tensor_of(record, key, what), expected, labels=("sequence", "token"))
    return run


def _head_causal(record):
    before = tensor_of(record, "random")
    after = tensor_of(record, "future_changed", "the call with later tokens changed")
    expect_shape(after, tuple(before.shape))
    for name, out in (("the first call", before), ("the call with later tokens changed", after)):
        if bool(out[:, :KEEP].isnan().any()):
            token = int(out[:, :KEEP].isnan().any(dim=-1).any(dim=0).nonzero()[0])
            raise Failed(f"numbers for tokens 0-{KEEP - 1}", f"NaN in token {token}'s output in {name}")
    change = (after[:, :KEEP] - before[:, :KEEP]).abs()
    if change.max() > 1e-5:
        token = int(change.amax(dim=(0, 2)).argmax())
        raise Failed(f"tokens 0-{KEEP - 1} unchanged when only tokens {KEEP} and later change",
                     f"token {token} changed by {float(change.max()):.3g}")


def _head_grads(record):
    out = value_of(record, "grad_out")
    if out.get("kind") != "tensor" or not out["requires_grad"]:
        raise Failed("an output connected to the autograd graph",
                     "an output that does not require grad",
                     "Compute with torch operations on the given tensors: no torch.no_grad(), "
                     ".detach(), .item() or NumPy along the way.")
    value_of(record, "backward", "backward()")
    _, rand = _head_inputs()
    leaves = [t.clone().requires_grad_() for t in rand]
    reference_head(*leaves).sum().backward()
    names = ("x", "W_query", "W_key", "W_value")
    for name, got, leaf in zip(names, plain(record["grads"]), leaves):
        if not isinstance(got, torch.Tensor):
            raise Failed(f"a gradient for {name}", "none: no gradient reached it")
        expect_close(got, leaf.grad, labels=(f"{name}.grad row",))


def _head_device(record):
    got = value_of(record, "on_device", "the call on the device")
    asked = plain(record["device_asked"])
    if got.get("kind") != "tensor":
        raise Failed("a torch.Tensor", describe(got))
    if torch.device(got["device"]).type != torch.device(asked).type:
        raise Failed(f"an output on {asked}, where the inputs are", f"one on {got['device']}")


def head_variant(x, W_query, W_key, W_value, *, mask="causal", fill=float("-inf"), softmax_dim=-1,
                 scale="sqrt_d_out", mix="values", scores="qk", zero_after_softmax=False):
    """One causal head written out with a chosen mistake; the defaults give the correct result.

    The catalogue of 1.2 runs these variants on the probe's inputs and compares them with what
    the learner's function returned.
    """
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value  # (B, T, d_out)
    if scores == "qk":
        s = queries @ keys.transpose(-2, -1)  # (B, T, T)
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


def _head_like(**how):
    def detect(record):
        running, rand = _head_inputs()
        with torch.no_grad():
            return (same(record["running"]["value"], head_variant(*running, **how))
                    and same(record["random"]["value"], head_variant(*rand, **how)))
    return detect


HEAD = Exercise(
    id="1.2",
    title="one causal head's forward pass",
    answer_name="causal_attention_forward",
    signature="causal_attention_forward(x, W_query, W_key, W_value)",
    probe=_probe_head,
    checks=(
        Check("output shape on the running example", _head_shape("running", "the running example")),
        Check("output shape on a random batch", _head_shape("random", "a random batch")),
        Check("no future-token leak", _head_causal),
        Check("values on the running example", _head_values("running", "the running example")),
        Check("values on a random batch (d_in=4, d_out=8)", _head_values("random", "a random batch")),
        Check("gradients reach x and all three weights", _head_grads),
        Check("output on the input's device", _head_device),
    ),
    mistakes=(
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
                "The scores are not scaled. Divide them by sqrt(d_out), the square root of the key "
                "width, before the softmax.",
                _head_like(scale="none")),
        Mistake("scale-d-in",
                "You scaled by sqrt(d_in), the input width. The scale is the square root of the key "
                "width: sqrt(d_out) = keys.shape[-1] ** 0.5.",
                _head_like(scale="sqrt_d_in")),
        Mistake("scale-no-sqrt",
                "You divided by d_out itself. The scale is its square root: keys.shape[-1] ** 0.5.",
                _head_like(scale="d_out")),
        Mistake("weights-times-inputs",
                "You multiplied the attention weights by the inputs x. Context vectors are weighted "
                "sums of the values: weights @ (x @ W_value).",
                _head_like(mix="inputs")),
        Mistake("weights-times-keys",
                "You multiplied the attention weights by the keys. Context vectors are weighted sums "
                "of the values: weights @ values.",
                _head_like(mix="keys")),
    ),
)

# ----------------------------------------------------------------------------------------------
# 1.3 Which positions a token may see

LENGTHS = (1, 3, 6)


def _probe_visible(visible_positions, rec: Recorder) -> None:
    for n in LENGTHS:
        for i in range(n):
            rec.call(f"visible_{i}_{n}", visible_positions, i, n)


def _positions(record, i: int, n: int) -> list[int]:
    summary = value_of(record, f"visible_{i}_{n}", f"visible_positions({i}, {n})")
    value = plain(summary)
    if isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_floating_point():
        return [int(v) for v in value.tolist()]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise Failed("a list of whole numbers", describe(summary))


def _expected_positions(i: int, n: int) -> list[int]:
    return visibility(n)[i].nonzero().flatten().tolist()


def _visible_case(i: int, n: int):
    def run(record):
        got = _positions(record, i, n)
        if got != _expected_positions(i, n):
            raise Failed(f"visible_positions({i}, {n}) = {_expected_positions(i, n)}", str(got))
    return run


def _visible_all(record):
    for n in LENGTHS:
        for i in range(n):
            _visible_case(i, n)(record)


def _visible_stable(record):
    # A token's view depends only on its own position, not on how long the sentence grows.
    for i in range(3):
        if _positions(record, i, 3) != _positions(record, i, 6):
            raise Failed(f"visible_positions({i}, 3) == visible_positions({i}, 6)",
                         f"{_positions(record, i, 3)} and {_positions(record, i, 6)}")


def _visible_like(rule):
    def detect(record):
        return all(_positions(record, i, n) == list(rule(i, n)) for n in LENGTHS for i in range(n))
    return detect


VISIBLE = Exercise(
    id="1.3",
    title="which positions a token may see",
    answer_name="visible_positions",
    signature="visible_positions(position, num_tokens)",
    probe=_probe_visible,
    checks=(
        Check("returns a list of positions", lambda r: _positions(r, 0, 3)),
        Check("the first token", _visible_case(0, 3)),
        Check("the last token", _visible_case(2, 3)),
        Check("every token of the six-word sentence", _visible_all),
        Check("a token's view does not depend on later tokens", _visible_stable),
    ),
    mistakes=(
        Mistake("excludes-itself",
                "A token may see itself: include its own position (range(position + 1)).",
                _visible_like(lambda i, n: range(i))),
        Mistake("forbidden-positions",
                "You listed the positions the token may NOT see, the ones after it. Causal attention "
                "allows the opposite: positions 0 up to and including its own.",
                _visible_like(lambda i, n: range(i + 1, n))),
        Mistake("sees-the-future",
                "You listed the token and the positions after it: that is the future, which the causal "
                "mask hides. A token sees itself and the positions before it.",
                _visible_like(lambda i, n: range(i, n))),
        Mistake("sees-everything",
                "Every token sees the whole sentence in your answer: that is bidirectional attention. "
                "With the causal mask token i sees positions 0 to i only.",
                _visible_like(lambda i, n: range(n))),
        Mistake("counts-from-one",
                "Positions count from 0 here, as tensor indices do: the first token is position 0 and "
                "sees [0].",
                _visible_like(lambda i, n: range(1, i + 2))),
    ),
)

EXERCISES = (MASK, HEAD, VISIBLE)

__all__ = ["EXERCISES", "reference_head", "head_variant"]

