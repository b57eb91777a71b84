"""Bad arguments and inputs raise errors that name the argument, the value and the fix."""

from __future__ import annotations

import pytest
import torch

from conftest import KINDS, build
from mha_course import (
    CausalAttention,
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    causal_mask,
    random_batch,
)

CLASSES = {
    "causal": lambda **kw: CausalAttention(kw["d_in"], kw["d_out"], kw["context_length"], kw["dropout"]),
    "wrapper": lambda **kw: MultiHeadAttentionWrapper(
        kw["d_in"], kw["d_out"], kw["context_length"], kw["dropout"], kw["num_heads"]),
    "batched": lambda **kw: MultiHeadAttention(
        kw["d_in"], kw["d_out"], kw["context_length"], kw["dropout"], kw["num_heads"]),
    "gqa": lambda **kw: GroupedQueryAttention(
        kw["d_in"], kw["d_out"], kw["context_length"], kw["dropout"], kw["num_heads"], num_kv_groups=1),
}
GOOD = dict(d_in=3, d_out=4, context_length=6, dropout=0.0, num_heads=2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "argument,value,error,message",
    [
        ("d_in", 0, ValueError, r"d_in must be a positive integer, got 0\. Pass a whole number"),
        ("d_out", -2, ValueError, r"d_out must be a positive integer, got -2"),
        ("context_length", 2.5, TypeError, r"context_length must be a positive integer, got 2\.5 \(float\)"),
        ("d_in", True, TypeError, r"d_in must be a positive integer, got True \(bool\)"),
        ("dropout", 1.0, ValueError, r"dropout must be in \[0, 1\), got 1\.0.*0\.0 turns it off"),
        ("dropout", -0.1, ValueError, r"dropout must be in \[0, 1\), got -0\.1"),
        ("dropout", "0.1", TypeError, r"dropout must be a number in \[0, 1\), got '0\.1' \(str\)"),
    ],
)
def test_bad_constructor_arguments(kind, argument, value, error, message):
    with pytest.raises(error, match=message):
        CLASSES[kind](**{**GOOD, argument: value})


@pytest.mark.parametrize("kind", ["wrapper", "batched", "gqa"])
def test_bad_num_heads(kind):
    with pytest.raises(ValueError, match=r"num_heads must be a positive integer, got 0"):
        CLASSES[kind](**{**GOOD, "num_heads": 0})


def test_d_out_not_divisible_by_num_heads():
    with pytest.raises(ValueError, match=r"d_out \(10\) must be divisible by num_heads \(4\).*d_out=8 or d_out=12"):
        MultiHeadAttention(3, 10, 6, 0.0, num_heads=4)
    with pytest.raises(ValueError, match=r"d_out \(2\) must be divisible by num_heads \(4\).*e\.g\. d_out=4,"):
        MultiHeadAttention(3, 2, 6, 0.0, num_heads=4)


def test_wrapper_accepts_any_per_head_width():
    """In the wrapper d_out is per head, so it need not divide by num_heads."""
    assert MultiHeadAttentionWrapper(3, 3, 6, 0.0, num_heads=2)(random_batch(1, 6, 3)).shape == (1, 6, 6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "make_input,error,message",
    [
        (lambda: [[0.1, 0.2, 0.3]], TypeError, r"x must be a torch\.Tensor of shape \(batch, num_tokens, d_in\), got list"),
        (lambda: random_batch(1, 6, 3)[0], ValueError, r"got shape \(6, 3\) \(2-D\)\. For a single sequence add a batch dimension: x\.unsqueeze\(0\)"),
        (lambda: torch.zeros(1, 1, 6, 3), ValueError, r"x must be a 3-D tensor.*got shape \(1, 1, 6, 3\) \(4-D\)\.$"),
        (lambda: torch.ones(1, 6, 3, dtype=torch.long), TypeError, r"x must be a floating-point tensor, got dtype torch\.int64.*x\.float\(\)"),
        (lambda: random_batch(1, 6, 4), ValueError, r"x has 4 features per token \(x\.shape\[-1\]\) but the module was built with d_in=3"),
        (lambda: random_batch(1, 7, 3), ValueError, r"x has 7 tokens \(x\.shape\[1\]\) but the module was built with context_length=6.*context_length>=7"),
    ],
)
def test_bad_inputs(kind, make_input, error, message):
    module = build(kind, context_length=6)
    with pytest.raises(error, match=message):
        module(make_input())
    with pytest.raises(error, match=message):
        module.attention_weights(make_input())


def test_causal_mask_argument_checked():
    with pytest.raises(ValueError, match="num_tokens must be a non-negative integer, got -1"):
        causal_mask(-1)
    with pytest.raises(TypeError, match=r"num_tokens must be a non-negative integer, got 2\.0 \(float\)"):
        causal_mask(2.0)
    assert causal_mask(0).shape == (0, 0)  # an empty sequence has an empty mask


ALL_KINDS = KINDS + ["fast"]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_input_dtype_must_match_the_module(kind):
    module = build(kind, context_length=6)
    for method in (module, module.attention_weights):
        with pytest.raises(TypeError, match=r"x has dtype torch\.float64 but the module's weights are "
                                            r"torch\.float32.*x\.to\(torch\.float32\).*\.to\(torch\.float64\)"):
            method(random_batch(1, 6, 3).double())


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_input_device_must_match_the_module(kind):
    module = build(kind, context_length=6).to("meta")  # a second device that every machine has
    with pytest.raises(ValueError, match=r"x is on cpu but the module's weights are on meta.*x\.to\("):
        module(random_batch(1, 6, 3))


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_autocast_may_mix_dtypes(kind):
    """Under autocast PyTorch casts inputs and weights itself, so a bfloat16 input is fine."""
    module = build(kind, context_length=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(random_batch(1, 6, 3).bfloat16())
    assert out.shape[:2] == (1, 6)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("value", ["no", 1, None])
def test_qkv_bias_must_be_a_bool(kind, value):
    with pytest.raises(TypeError, match=rf"qkv_bias must be True or False, got {value!r}"):
        build(kind, qkv_bias=value)


def test_kv_groups_must_divide_num_heads_wherever_they_are_given():
    """One check serves the module, the cost formulas and the figure, each naming its argument."""
    from mha_course.attention._validation import validate_kv_groups
    from mha_course.cost import MODEL_SHAPES, grouped_query_multiply_adds
    from mha_course.plots import plot_kv_sharing

    assert validate_kv_groups(4, 12) == 4
    fix = r"Choose num_kv_groups among 1, 2, 3, 4, 6, 12 \(the divisors of 12\)"
    with pytest.raises(ValueError, match=r"num_kv_groups \(5\) must divide num_heads \(12\).*" + fix):
        validate_kv_groups(5, 12)
    with pytest.raises(ValueError, match=r"num_kv_groups \(5\) must divide num_heads \(12\).*" + fix):
        grouped_query_multiply_adds(1, 4, 8, 24, 12, 5)
    shape = MODEL_SHAPES["gpt2-small"]
    with pytest.raises(ValueError, match=r"num_kv_groups \(5\) must divide num_heads \(12\).*" + fix):
        type(shape)("odd", shape.num_layers, shape.num_heads, shape.head_dim, 5, shape.context_length).kv_heads()
    with pytest.raises(ValueError, match=r"kv_groups \(3\) must divide num_heads \(8\).*among 1, 2, 4, 8"):
        plot_kv_sharing(8, (8, 3))
    with pytest.raises(TypeError, match=r"num_kv_groups must be a positive integer, got 2\.0"):
        validate_kv_groups(2.0, 4)
