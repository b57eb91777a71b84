"""The cost formulas agree with the real modules and with counted matrix products."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import build
from mha_course import MultiHeadAttention
from mha_course.cost import (batched_forward_peak_bytes, class_d_out, count_parameters, multiply_adds, parameter_count,
                             score_memory_bytes)


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(["causal", "wrapper", "batched"]), d_in=st.integers(1, 20),
       head_dim=st.integers(1, 8), num_heads=st.integers(1, 6), qkv_bias=st.booleans())
def test_parameter_formula_matches_modules(kind, d_in, head_dim, num_heads, qkv_bias):
    module = build(kind, d_in=d_in, head_dim=head_dim, num_heads=num_heads, qkv_bias=qkv_bias)
    d_out = num_heads * head_dim if kind == "batched" else head_dim
    assert parameter_count(kind, d_in, d_out, num_heads, qkv_bias) == count_parameters(module)


def test_gpt2_small_attention_parameters():
    mha = MultiHeadAttention(768, 768, 16, 0.0, 12)
    assert count_parameters(mha) == parameter_count("batched", 768, 768, 12) == 4 * 768 * 768 + 768


def test_regimes():
    fixed_model = {h: parameter_count("batched", 64, 64, h) for h in (1, 2, 4, 8)}
    assert len(set(fixed_model.values())) == 1
    fixed_head = [parameter_count("wrapper", 64, 16, h) for h in (1, 2, 4)]
    assert fixed_head == [fixed_head[0] * h for h in (1, 2, 4)]
    macs = {h: multiply_adds("batched", 2, 32, 64, 64, h).total for h in (1, 2, 4, 8)}
    assert len(set(macs.values())) == 1


def _count_matmul_macs(module, x):
    """Count multiply-adds of every matmul and linear layer the forward pass runs."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops() // 2


@pytest.mark.parametrize("kind,d_out,num_heads", [("causal", 4, 1), ("wrapper", 3, 3), ("batched", 8, 4)])
def test_multiply_add_formula_matches_counted_products(kind, d_out, num_heads):
    head_dim = d_out if kind != "batched" else d_out // num_heads
    module = build(kind, d_in=5, head_dim=head_dim, num_heads=num_heads, context_length=7)
    counted = _count_matmul_macs(module, torch.randn(2, 7, 5))
    assert multiply_adds(kind, 2, 7, 5, d_out, num_heads).total == counted


def test_score_memory():
    assert score_memory_bytes(8, 12, 1024) == 8 * 12 * 1024 * 1024 * 4
    assert score_memory_bytes(1, 1, 10, bytes_per_element=2) == 200


@pytest.mark.parametrize("batch,num_tokens,num_heads,head_dim", [(1, 1, 1, 1), (2, 7, 3, 5), (3, 11, 4, 2)])
def test_batched_peak_is_two_score_tensors_and_the_projections(batch, num_tokens, num_heads, head_dim):
    """The prediction adds up the tensors the batched module holds at its peak, sized on the module."""
    module = MultiHeadAttention(6, num_heads * head_dim, num_tokens, 0.0, num_heads=num_heads)
    x = torch.randn(batch, num_tokens, 6)
    with torch.no_grad():
        weights = module.attention_weights(x)  # (B, h, T, T): the scores have this size too
        projection = module.W_query(x)  # (B, T, h * d_h): so have the keys and the values
    expected = 2 * weights.nbytes + 3 * projection.nbytes
    assert batched_forward_peak_bytes(batch, num_tokens, num_heads, head_dim) == expected
    assert batched_forward_peak_bytes(batch, num_tokens, num_heads, head_dim, bytes_per_element=2) == expected // 2
    with pytest.raises(ValueError, match="head_dim must be a positive integer, got 0"):
        batched_forward_peak_bytes(batch, num_tokens, num_heads, 0)


@pytest.mark.parametrize("kind", ["causal", "wrapper", "batched"])
def test_class_d_out_is_what_each_class_takes(kind):
    num_heads = 1 if kind == "causal" else 3
    module = build(kind, d_in=5, head_dim=4, num_heads=num_heads)
    assert class_d_out(kind, num_heads, 4) == module.d_out
    assert multiply_adds(kind, 1, 6, 5, class_d_out(kind, num_heads, 4), num_heads).total == _count_matmul_macs(
        module, torch.randn(1, 6, 5))
    with pytest.raises(ValueError, match="kind must be one of 'causal', 'wrapper', 'batched', got 'fast'"):
        class_d_out("fast", 2, 4)


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind must be one of 'causal', 'wrapper', 'batched', got 'fast'"):
        parameter_count("fast", 3, 4, 2)
    with pytest.raises(ValueError, match=r"d_out \(5\) must be divisible by num_heads \(2\)"):
        multiply_adds("batched", 1, 6, 3, 5, 2)


@pytest.mark.parametrize("kind,d_out,num_heads", [("causal", 4, 1), ("wrapper", 3, 3), ("batched", 8, 4)])
def test_forward_backward_formula_matches_counted_products(kind, d_out, num_heads):
    """With the input needing a gradient, a training step is exactly three forward passes of products."""
    from torch.utils.flop_counter import FlopCounterMode

    head_dim = d_out if kind != "batched" else d_out // num_heads
    module = build(kind, d_in=5, head_dim=head_dim, num_heads=num_heads, context_length=7)
    x = torch.randn(2, 7, 5, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        module(x).sum().backward()
    assert multiply_adds(kind, 2, 7, 5, d_out, num_heads).forward_backward == counter.get_total_flops() // 2


def test_cost_by_heads_in_both_regimes_matches_the_modules():
    from mha_course.cost import cost_by_heads

    heads = [1, 2, 4, 8]
    fixed_model = cost_by_heads("model_width_fixed", heads, batch=2, num_tokens=16, d_in=32, width=32)
    assert [r["head_dim"] for r in fixed_model] == [32, 16, 8, 4]
    assert len({r["parameters"] for r in fixed_model}) == 1
    assert len({r["multiply_adds"] for r in fixed_model}) == 1
    assert [r["score_bytes"] for r in fixed_model] == [2 * h * 16 * 16 * 4 for h in heads]
    fixed_head = cost_by_heads("head_width_fixed", heads, batch=2, num_tokens=16, d_in=32, width=8)
    assert [r["d_out"] for r in fixed_head] == [8, 16, 32, 64]
    for row in fixed_model + fixed_head:
        mha = MultiHeadAttention(32, row["d_out"], 16, 0.0, row["num_heads"])
        assert row["parameters"] == count_parameters(mha)
        assert row["score_bytes"] == mha.attention_weights(torch.randn(2, 16, 32)).nbytes
    stacked = cost_by_heads("head_width_fixed", heads, batch=2, num_tokens=16, d_in=32, width=8, kind="wrapper")
    assert [r["parameters"] for r in stacked] == [h * stacked[0]["parameters"] for h in heads]
    assert [r["multiply_adds"] for r in stacked] == [h * stacked[0]["multiply_adds"] for h in heads]


def test_cost_by_heads_rejects_bad_arguments():
    from mha_course.cost import cost_by_heads

    with pytest.raises(ValueError, match="regime must be one of 'head_width_fixed', 'model_width_fixed', got 'fixed'"):
        cost_by_heads("fixed", [1], batch=1, num_tokens=4, d_in=4, width=4)
    with pytest.raises(ValueError, match=r"d_out \(12\) must be divisible by num_heads \(5\)"):
        cost_by_heads("model_width_fixed", [1, 5], batch=1, num_tokens=4, d_in=4, width=12)
    with pytest.raises(ValueError, match="kind must be 'batched' or 'wrapper'"):
        cost_by_heads("model_width_fixed", [1], batch=1, num_tokens=4, d_in=4, width=4, kind="causal")


# --- Sharing keys and values: the cache's bytes and one generated token's work -----------------

from mha_course import GroupedQueryAttention, KVCache  # noqa: E402
from mha_course.cost import (MODEL_SHAPES, grouped_query_multiply_adds, kv_cache_bytes,  # noqa: E402
                             kv_cache_bytes_per_token, kv_cache_sizes)


@settings(max_examples=15, deadline=None)
@given(num_layers=st.integers(1, 3), num_heads=st.sampled_from([1, 2, 4, 6]), group_index=st.integers(0, 3),
       head_dim=st.integers(1, 4), batch=st.integers(1, 3), tokens=st.integers(1, 6),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
def test_cache_bytes_formula_matches_the_cache_tensors(num_layers, num_heads, group_index, head_dim, batch, tokens,
                                                       dtype):
    """A stack of layers, each with its own cache, fed token by token: the formula is what the tensors hold."""
    divisors = [g for g in range(1, num_heads + 1) if num_heads % g == 0]
    groups = divisors[group_index % len(divisors)]
    d_model = num_heads * head_dim
    layers = [GroupedQueryAttention(d_model, d_model, tokens, 0.0, num_heads, groups).to(dtype).eval()
              for _ in range(num_layers)]
    caches = [KVCache() for _ in layers]
    x = torch.randn(batch, tokens, d_model, dtype=dtype)
    with torch.no_grad():
        for t in range(tokens):
            h = x[:, t : t + 1]
            for layer, cache in zip(layers, caches):
                h = layer(h, cache=cache)
    held = sum(c.keys.nbytes + c.values.nbytes for c in caches)
    number = torch.tensor([], dtype=dtype).element_size()
    assert held == kv_cache_bytes(num_layers, groups, head_dim, tokens, batch, bytes_per_number=number)
    assert held == batch * tokens * kv_cache_bytes_per_token(num_layers, groups, head_dim, number)


def test_cache_sizes_of_the_chapter_shapes():
    gpt2, llama = MODEL_SHAPES["gpt2-small"], MODEL_SHAPES["llama-style"]
    rows = {r["kind"]: r for r in kv_cache_sizes(gpt2)}
    assert rows["multi-head"]["bytes_per_token"] == 2 * 12 * 12 * 64 * 2 == 36 * 2**10
    assert rows["multi-head"]["bytes_at_context"] == 36 * 2**20
    assert rows["grouped-query"]["kv_heads"] == 4 and rows["multi-query"]["vs_multi_head"] == 1 / 12
    rows = {r["kind"]: r for r in kv_cache_sizes(llama, bytes_per_number=2)}
    assert rows["multi-head"]["bytes_at_context"] == 4 * 2**30  # 0.5 MiB per token, 8192 tokens
    assert rows["grouped-query"]["bytes_at_context"] == 2**30
    assert rows["multi-query"]["bytes_at_context"] == 2**27
    assert kv_cache_sizes(llama, batch=4)[0]["bytes_at_context"] == 4 * kv_cache_sizes(llama)[0]["bytes_at_context"]


@pytest.mark.parametrize("num_heads,groups,cached,new", [(4, 4, 0, 5), (4, 2, 0, 5), (6, 2, 5, 1), (4, 1, 3, 2)])
def test_grouped_query_multiply_adds_match_counted_products(num_heads, groups, cached, new):
    from torch.utils.flop_counter import FlopCounterMode

    gqa = GroupedQueryAttention(5, 2 * num_heads, cached + new, 0.0, num_heads, groups).eval()
    gqa.use_sdpa = False  # the formula counts the explicit products: the counter sees no fused kernel
    x = torch.randn(2, cached + new, 5)
    cache = KVCache()
    with torch.no_grad():
        if cached:
            gqa(x[:, :cached], cache=cache)
        with FlopCounterMode(display=False) as counter:
            gqa(x[:, cached:], cache=cache)
    expected = grouped_query_multiply_adds(2, new, 5, 2 * num_heads, num_heads, groups, num_cached=cached)
    assert expected.total == counter.get_total_flops() // 2


def test_without_sharing_the_grouped_query_count_is_the_batched_one():
    assert (grouped_query_multiply_adds(2, 16, 12, 24, 4, 4).total
            == multiply_adds("batched", 2, 16, 12, 24, 4).total)


def test_one_cached_step_is_one_token_of_the_recomputed_work():
    for tokens in (16, 256, 1024):
        recompute = grouped_query_multiply_adds(1, tokens, 768, 768, 12, 12)
        cached = grouped_query_multiply_adds(1, 1, 768, 768, 12, 12, num_cached=tokens - 1)
        assert recompute.total == tokens * cached.total


def test_cache_formulas_reject_bad_arguments():
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer, got 0"):
        kv_cache_bytes_per_token(12, 0, 64)
    with pytest.raises(ValueError, match="num_tokens must be a positive integer, got -1"):
        kv_cache_bytes(12, 12, 64, num_tokens=-1)
    with pytest.raises(ValueError, match=r"num_kv_groups \(5\) must divide num_heads \(12\)"):
        grouped_query_multiply_adds(1, 4, 8, 24, 12, 5)
    with pytest.raises(ValueError, match="num_cached must be a non-negative integer, got -2. Pass 0 or more"):
        grouped_query_multiply_adds(1, 4, 8, 24, 12, 4, num_cached=-2)
    with pytest.raises(TypeError, match=r"num_cached must be a non-negative integer, got 1\.5"):
        grouped_query_multiply_adds(1, 4, 8, 24, 12, 4, num_cached=1.5)


def test_causal_block_share_counts_the_tiles_the_loop_computes():
    from mha_course.cost import causal_block_share, torch_cpu_flash_blocks
    from mha_course.attention.tiled import SKIPPED, tile_kind

    for tokens, block in ((10, 4), (16, 4), (7, 7), (9, 1), (100, 32)):
        starts = range(0, tokens, block)
        computed = sum(min(block, tokens - q) * min(block, tokens - k)
                       for q in starts for k in starts if tile_kind(q, k, block, tokens) != SKIPPED)
        assert causal_block_share(tokens, block, block) == computed / tokens**2
    # PyTorch's CPU kernel: nothing skipped up to one key block of 512, then whole key blocks.
    assert [causal_block_share(t, *torch_cpu_flash_blocks(t)) for t in (512, 1024, 4096)] == [1.0, 0.75, 0.5625]
    assert [torch_cpu_flash_blocks(t)[0] for t in (191, 192, 767, 768)] == [32, 64, 64, 256]
    with pytest.raises(ValueError, match="query_block must be a positive integer, got 0"):
        causal_block_share(8, 0, 4)
