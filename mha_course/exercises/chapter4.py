"""Exercises of chapter 4, what heads cost: attention's share of the work, and a predicted peak.

The references are the cost formulas of :mod:`mha_course.cost`: ``multiply_adds`` for 4.1 and
``score_memory_bytes`` for 4.2.
"""

from __future__ import annotations

from ..cost import multiply_adds, score_memory_bytes
from .framework import Check, Exercise, Failed, Mistake, Recorder, describe, value_of

# ----------------------------------------------------------------------------------------------
# 4.1 Where attention's work goes

#: (num_tokens, d_in, d_out) of the calls the answer is asked about.
SHARE_CASES = {
    "GPT-2 small's 1024 tokens": (1024, 768, 768),
    "T* = 1536 tokens at width 768": (1536, 768, 768),
    "the running example (6 tokens, d_in 3, d_out 4)": (6, 3, 4),
    "256 tokens, d_in 128, d_out 512": (256, 128, 512),
}


def share_variant(num_tokens, d_in, d_out, *, attention_products: int = 2, out_proj: bool = True,
                  of_total: bool = True, widths_swapped: bool = False) -> float:
    """``attention_share`` written out with a chosen mistake; the defaults give the correct share.

    The catalogue of 4.1 compares these variants with what the learner's function returned.
    """
    if widths_swapped:
        d_in, d_out = d_out, d_in
    attention = attention_products * num_tokens**2 * d_out  # QK^T, weights @ V (per sequence)
    rest = 3 * num_tokens * d_in * d_out + (num_tokens * d_out**2 if out_proj else 0)
    return attention / (attention + rest) if of_total else attention / rest


def expected_share(key: str) -> float:
    """The share for case ``key``, from the package's multiply-add formula."""
    macs = multiply_adds("batched", 1, *SHARE_CASES[key], num_heads=1)
    return (macs.scores + macs.weighted_sum) / macs.total


def _number(summary: dict) -> float | None:
    if summary.get("kind") in ("int", "float"):
        return float(summary["value"])
    if summary.get("kind") == "tensor" and summary["value"].numel() == 1:
        return float(summary["value"].item())
    return None


def _close(got: float | None, expected: float) -> bool:
    return got is not None and abs(got - expected) <= 1e-6 * max(1.0, abs(expected))


class _NumberAnswer:
    """Probe and checks for an exercise whose answer is a function returning one number.

    Args:
        name: the answer's function name, as the learner writes it.
        cases: label -> positional arguments of each call the answer is asked about.
        expected: label -> the right number, from the package's formulas.
        variant: (*arguments, **mistake) -> the number that mistake gives.
        kind: what a right answer looks like, for the "returns a number" check.
        show: formats a number for the failure message.
    """

    def __init__(self, name, cases, expected, variant, kind, show):
        self.name, self.cases, self.expected, self.variant = name, cases, expected, variant
        self.kind, self.show = kind, show

    def probe(self, answer, rec: Recorder) -> None:
        for key, args in self.cases.items():
            rec.call(key, answer, *args)

    def call(self, key: str) -> str:
        return f"{self.name}({', '.join(map(str, self.cases[key]))})"

    def number(self, record, key: str) -> float:
        summary = value_of(record, key, self.call(key))
        got = _number(summary)
        if got is None:
            raise Failed(self.kind, describe(summary))
        return got

    def value(self, key: str):
        def run(record):
            got, expected = self.number(record, key), self.expected(key)
            if not _close(got, expected):
                raise Failed(f"{self.show(expected)} for {self.call(key)}", self.show(got))
        return run

    def like(self, **how):
        """Detects the mistake ``how`` (keyword arguments of ``variant``) on every case."""
        def detect(record):
            return all(_close(_number(record[key]) if record[key].get("kind") != "error" else None,
                              self.variant(*args, **how))
                       for key, args in self.cases.items())
        return detect


_SHARE = _NumberAnswer("attention_share", SHARE_CASES, expected_share, share_variant,
                       "a number (a float between 0 and 1)", lambda v: f"{v:.6f}")


SHARE = Exercise(
    id="4.1",
    title="attention's share of the multiply-adds",
    answer_name="attention_share",
    signature="attention_share(num_tokens, d_in, d_out)",
    probe=_SHARE.probe,
    checks=(
        Check("returns a number", lambda r: _SHARE.number(r, "GPT-2 small's 1024 tokens")),
        Check("GPT-2 small's 1024 tokens", _SHARE.value("GPT-2 small's 1024 tokens")),
        Check("one half at T* = 1536 tokens (width 768)", _SHARE.value("T* = 1536 tokens at width 768")),
        Check("the running example (6 tokens, d_in 3, d_out 4)",
              _SHARE.value("the running example (6 tokens, d_in 3, d_out 4)")),
        Check("256 tokens, d_in 128, d_out 512", _SHARE.value("256 tokens, d_in 128, d_out 512")),
    ),
    mistakes=(
        Mistake("one-attention-product",
                "You counted one attention product. There are two of the same size, each "
                "T x T x d_out per sequence: the scores Q K^T, and the weighted sum of the values.",
                _SHARE.like(attention_products=1)),
        Mistake("no-out-proj",
                "You left out the output projection, T x d_out x d_out multiply-adds per sequence: "
                "it is part of the batched module's forward pass, so it belongs in the total.",
                _SHARE.like(out_proj=False)),
        Mistake("ratio-not-share",
                "You divided the attention products by the other products. The share is a fraction "
                "of the whole: attention / (attention + projections).",
                _SHARE.like(of_total=False)),
        Mistake("widths-swapped",
                "Right when d_in == d_out, wrong otherwise: d_in and d_out are swapped. The "
                "projections cost T x d_in x d_out each, the attention products T x T x d_out, and the "
                "output projection T x d_out x d_out.",
                _SHARE.like(widths_swapped=True)),
    ),
)

# ----------------------------------------------------------------------------------------------
# 4.2 Predict the peak of a forward pass

#: (batch, num_heads, num_tokens, d_out) of the calls the answer is asked about.
PEAK_CASES = {
    "GPT-2 small (8 x 1024 tokens, 12 heads, width 768)": (8, 12, 1024, 768),
    "16 small heads (8 x 256 tokens, width 256)": (8, 16, 256, 256),
    "an odd size (3 x 7 tokens, 5 heads, width 20)": (3, 5, 7, 20),
}


def peak_variant(batch, num_heads, num_tokens, d_out, *, score_tensors: int = 2, activations: int = 3,
                 bytes_per_number: int = 4, heads: bool = True) -> int:
    """``predicted_forward_peak`` written out with a chosen mistake; the defaults are correct."""
    scores = score_tensors * batch * (num_heads if heads else 1) * num_tokens**2
    return bytes_per_number * (scores + activations * batch * num_tokens * d_out)


def expected_peak(key: str) -> int:
    """Two score tensors (scores, softmax output) plus Q, K and V, in float32 bytes."""
    batch, num_heads, num_tokens, d_out = PEAK_CASES[key]
    return 2 * score_memory_bytes(batch, num_heads, num_tokens) + 3 * 4 * batch * num_tokens * d_out


_PEAK = _NumberAnswer("predicted_forward_peak", PEAK_CASES, expected_peak, peak_variant,
                      "a number of bytes", lambda v: f"{v:,.0f} bytes")


_GPT2 = "GPT-2 small (8 x 1024 tokens, 12 heads, width 768)"

PEAK = Exercise(
    id="4.2",
    title="predict the peak memory of a forward pass",
    answer_name="predicted_forward_peak",
    signature="predicted_forward_peak(batch, num_heads, num_tokens, d_out)",
    probe=_PEAK.probe,
    checks=(
        Check("returns a number", lambda r: _PEAK.number(r, _GPT2)),
        Check(_GPT2, _PEAK.value(_GPT2)),
        Check("16 small heads (8 x 256 tokens, width 256)", _PEAK.value("16 small heads (8 x 256 tokens, width 256)")),
        Check("an odd size (3 x 7 tokens, 5 heads, width 20)", _PEAK.value("an odd size (3 x 7 tokens, 5 heads, width 20)")),
    ),
    mistakes=(
        Mistake("one-score-tensor",
                "You counted one (batch, heads, tokens, tokens) tensor. torch.softmax writes its output "
                "into a new tensor while the scores are still alive, so two of them exist at the peak.",
                _PEAK.like(score_tensors=1)),
        Mistake("no-activations",
                "You left out the queries, keys and values: three (batch, tokens, d_out) tensors that are "
                "alive while the scores are computed.",
                _PEAK.like(activations=0)),
        Mistake("numbers-not-bytes",
                "That is a count of numbers. Each float32 number takes 4 bytes.",
                _PEAK.like(bytes_per_number=1)),
        Mistake("heads-ignored",
                "Every head has its own tokens x tokens score matrix: the score tensors are "
                "(batch, num_heads, tokens, tokens), num_heads times one head's.",
                _PEAK.like(heads=False)),
        Mistake("float64",
                "float32 numbers take 4 bytes each, not 8.",
                _PEAK.like(bytes_per_number=8)),
    ),
)

EXERCISES = (SHARE, PEAK)

__all__ = ["EXERCISES", "share_variant", "expected_share", "peak_variant", "expected_peak"]
