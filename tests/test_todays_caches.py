"""The caches of today's models: the counts of ``cache_layers`` against bytes measured on real layers,
the course's own for the kinds it builds (``KVCache.nbytes``) and transformers' caches for the
others (windows, recurrent states, cross-layer sharing)."""

from __future__ import annotations

import pytest
import torch

from mha_course.todays_caches import (PUBLISHED, Held, LayerCache, cache_bytes, cache_layers, cache_rows, cache_table,
                                      counted_held, layer_check_table, layer_checks, measured_layer_bytes,
                                      measured_sharing)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_what_small_layers_keep_is_what_is_counted(name):
    layers = cache_layers(PUBLISHED[name].config())
    measured = measured_layer_bytes(name)
    assert measured, f"{name}: no kind of its layers was measured"
    for kind, held in measured.items():
        counted = {counted_held(layer) for layer in layers if layer.kind == kind}
        assert counted == {held}, f"{name}: {kind} layers counted {counted}, measured {held}"


def test_a_gated_deltanet_layer_keeps_a_float32_state_and_the_last_kernel_minus_one_inputs():
    """Qwen3-Next-80B-A3B in bfloat16: 32 states of 128 x 128 in float32, and 3 inputs of the convolution's
    2 x 16 x 128 query and key channels and 32 x 128 value channels in bfloat16; nothing per token."""
    state = 32 * 128 * 128 * 4
    inputs = (2 * 16 * 128 + 32 * 128) * 3 * 2
    assert measured_layer_bytes("Qwen3-Next-80B-A3B")["state"] == Held(0, state + inputs)
    assert counted_held(cache_layers(PUBLISHED["Qwen3-Next-80B-A3B"].config())[0]) == Held(0, state + inputs)
    rows = {r["name"]: r for r in cache_rows(["Qwen3-Next-80B-A3B"], lengths=[4096])}
    assert rows["Qwen3-Next-80B-A3B"]["bytes"][4096] == 36 * (state + inputs) + 12 * 2 * 2 * 256 * 2 * 4096


def test_the_check_table_says_what_a_layer_keeps_and_whether_count_and_measure_agree():
    rows = layer_checks(["Qwen3-Next-80B-A3B"])
    assert [(r["kind"], r["equal"]) for r in rows] == [("full", True), ("state", True)]
    text = str(layer_check_table(rows))
    assert "2.00 KiB a token" in text and "2.05 MiB" in text
    assert str(Held(8, 2**20)) == "8 B a token + 1.00 MiB" and str(Held(0, 0)) == "0 B"
    assert LayerCache("state", fixed=2, state=2).nbytes(5, bytes_per_number=8) == 32  # float64: no float32 state


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
    assert rows["Mistral-7B-v0.1"]["layers"] == "32 window 4096" and rows["Mistral-7B-v0.1"]["per_token"] == 0
    assert rows["Mistral-7B-v0.1"]["bytes"][131072] == rows["Mistral-7B-v0.1"]["bytes"][4096] == 32 * 2 * 8 * 128 * 4096 * 2
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
    """gpt-oss's sliding layers and Qwen3-Next's Gated DeltaNet, run by transformers on a small bfloat16 model.

    Between two steps transformers keeps ``sliding_window - 1`` positions of a window: with the next
    token's own key and value that makes the ``sliding_window`` the count holds. Of a Gated DeltaNet's
    convolution it keeps ``conv_kernel`` inputs, one more per channel than the next step needs and the
    count holds; its state is float32 in a bfloat16 model, as the count's.
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
            model = model(config).eval().to(torch.bfloat16)
            cache = model(torch.randint(0, 32, (1, 9)), use_cache=True).past_key_values
        for layer, theirs in zip(cache_layers(config), cache.layers, strict=True):
            kept = layer.nbytes(9)
            if layer.kind == "window":
                kept = layer.nbytes(layer.window - 1)
            if layer.kind == "state":  # one more input per channel of the convolution
                kept += layer.fixed // (config.linear_conv_kernel_dim - 1) * 2
            assert _held(theirs) == kept, f"{type(config).__name__}: a {layer.kind} layer"


def test_cross_layer_sharing_keeps_what_the_count_says():
    """A small Gemma 4 in transformers: 15 of its 35 layers keep a cache, the 20 last read theirs."""
    held = measured_sharing(num_tokens=8)
    layers = cache_layers(PUBLISHED["Gemma-4-E2B"].config())
    assert [layer.kind for layer in layers].count("shared") == 20
    # measured on widths 8 (windowed) and 16 (full), the published 256 and 512: the same ratio
    counted = sum(layer.nbytes(8) for layer in layers)
    own = sum(layer.nbytes(8) if layer.kind != "shared" else 0 for layer in layers) + 2 * sum(
        (2 * 512 if t == "full_attention" else 2 * 256) * 8
        for layer, t in zip(layers, PUBLISHED["Gemma-4-E2B"].config().layer_types, strict=True) if layer.kind == "shared")
    assert held["shared"] / held["own"] == pytest.approx(counted / own)
    assert held["shared"] / held["own"] == pytest.approx(18 / 42)


def test_the_layers_are_measured_on_a_processor_without_avx512():
    """The chapter runs under ATEN_CPU_CAPABILITY=default, as on a processor without AVX-512, where PyTorch's
    fused kernel refuses a bfloat16 prompt of 70 tokens: the measuring layers must not depend on it."""
    import os
    import subprocess
    import sys

    code = ("from mha_course.todays_caches import layer_checks; "
            "assert all(r['equal'] for r in layer_checks(['Qwen3-Next-80B-A3B', 'Llama-3.1-8B']))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("name", ["Mistral-7B-v0.1", "gpt-oss-120b"])
def test_a_windowed_layer_of_the_course_stops_at_window_minus_one_positions(name):
    """The course's windowed layer with a model's key/value sizes and window: past the window its cache holds
    window - 1 positions, the table's window less the token being added."""
    from mha_course import GroupedQueryAttention, KVCache

    config = PUBLISHED[name].config()
    window_layer = next(layer for layer in cache_layers(config) if layer.kind == "window")
    heads, head_dim = config.num_key_value_heads, config.head_dim
    layer = GroupedQueryAttention(8, heads * head_dim, 2 * window_layer.window, 0.0, heads, heads,
                                  window=window_layer.window).eval()
    cache = KVCache()
    with torch.no_grad():
        layer(torch.randn(1, window_layer.window + 5, 8), cache=cache)
        layer(torch.randn(1, 1, 8), cache=cache)
    assert cache.nbytes == window_layer.per_token * (window_layer.window - 1) * 4  # float32

