"""The caches of today's models: the counts of ``cache_layers`` against bytes measured on real layers,
the course's own for the kinds it builds (``KVCache.nbytes``) and transformers' caches for the
others (windows, recurrent states, cross-layer sharing)."""

from __future__ import annotations

import pytest
import torch

from mha_course.todays_caches import (PUBLISHED, cache_bytes, cache_layers, cache_rows, cache_table,
                                      measured_bytes_per_token, measured_sharing)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_bytes_per_token_measured_on_small_layers_are_the_counted_ones(name):
    layers = cache_layers(PUBLISHED[name].config())
    measured = measured_bytes_per_token(name)
    assert measured, f"{name}: no kind of its layers was measured"
    for kind, per_token in measured.items():
        counted = {layer.per_token for layer in layers if layer.kind == kind}
        assert counted == {per_token // 2}, f"{name}: {kind} layers hold {counted} numbers a token, measured {per_token} bytes"


def test_deepseek_v3_caches_what_its_papers_say():
    """DeepSeek-V2's paper: (d_c + d_h^R) l = 4.5 d_h l numbers a token, as grouped-query attention with 2.25 groups."""
    config = PUBLISHED["DeepSeek-V3"].config()
    per_layer = cache_layers(config)[0].per_token
    head_dim = config.qk_nope_head_dim
    assert per_layer == 4.5 * head_dim == 2 * 2.25 * head_dim
    assert cache_bytes(config, 1) == 61 * 576 * 2


def test_the_published_sizes_are_what_the_configs_hold():
    rows = {r["name"]: r for r in cache_rows()}
    assert rows["Llama-3.1-8B"]["per_token"] == 32 * 2 * 8 * 128 * 2 == 128 * 1024
    assert rows["Llama-3.1-70B"]["bytes"][131072] == 40 * 2**30
    assert rows["gpt-oss-120b"]["layers"] == "18 window 128 + 18 full"
    assert rows["Gemma-3-27B"]["layers"] == "52 window 1024 + 10 full"
    assert rows["Qwen3-Next-80B-A3B"]["layers"] == "36 state + 12 full"
    assert rows["Gemma-4-E2B"]["layers"] == "12 window 512 + 3 full + 20 shared"
    table = str(cache_table())
    assert "DeepSeek-V3" in table and "128k tokens" in table


def _held(cache_layer) -> int:
    """Bytes of what a transformers cache layer keeps: keys and values, or convolution and recurrent states."""
    def walk(value):
        if isinstance(value, torch.Tensor):
            return value.nbytes
        return sum(walk(v) for v in value.values()) if isinstance(value, dict) else 0
    return sum(walk(getattr(cache_layer, name, None)) for name in ("keys", "values", "conv_states", "recurrent_states"))


def test_a_window_and_a_recurrent_state_hold_what_transformers_caches_hold():
    """gpt-oss's sliding layers and Qwen3-Next's Gated DeltaNet, run by transformers on a small model.

    Between two steps transformers keeps ``sliding_window - 1`` positions of a window: with the next
    token's own key and value that makes the ``sliding_window`` the count holds.
    """
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssModel
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextModel

    gpt_oss = transformers.GptOssConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"], num_local_experts=2,
        num_experts_per_tok=1, intermediate_size=8, vocab_size=32)
    qwen = transformers.Qwen3NextConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=4, linear_value_head_dim=6,
        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"], num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=8, shared_expert_intermediate_size=8, intermediate_size=8,
        vocab_size=32)
    for config, model in ((gpt_oss, GptOssModel), (qwen, Qwen3NextModel)):
        torch.manual_seed(0)
        with torch.no_grad():
            cache = model(config).eval()(torch.randint(0, 32, (1, 9)), use_cache=True).past_key_values
        for layer, theirs in zip(cache_layers(config), cache.layers, strict=True):
            kept = layer.per_token * (layer.window - 1) if layer.kind == "window" else layer.numbers(9)
            assert _held(theirs) == 4 * kept, f"{type(config).__name__}: a {layer.kind} layer"


def test_cross_layer_sharing_keeps_what_the_count_says():
    """A small Gemma 4 in transformers: 15 of its 35 layers keep a cache, the 20 last read theirs."""
    held = measured_sharing(num_tokens=8)
    layers = cache_layers(PUBLISHED["Gemma-4-E2B"].config())
    assert [layer.kind for layer in layers].count("shared") == 20
    # measured on widths 8 (windowed) and 16 (full), the published 256 and 512: the same ratio
    counted = sum(layer.numbers(8) for layer in layers)
    own = sum(layer.numbers(8) if layer.kind != "shared" else 0 for layer in layers) + sum(
        (2 * 512 if t == "full_attention" else 2 * 256) * 8
        for layer, t in zip(layers, PUBLISHED["Gemma-4-E2B"].config().layer_types, strict=True) if layer.kind == "shared")
    assert held["shared"] / held["own"] == pytest.approx(counted / own)
    assert held["shared"] / held["own"] == pytest.approx(18 / 42)
