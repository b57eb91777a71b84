"""The course's modules against transformers' GPT-2 and Llama attention: built by
``from_gpt2_attention`` and ``from_llama_attention``, they compute what the originals compute (in
eval mode, given the causal mask, and for Llama with the rotary embedding a real model computes,
prompt and cached decoding alike), keep device, dtype, dropout and training mode, own copies of the
weights, and refuse what they cannot express.

Llama's eager attention takes the softmax in float32 whatever the input's dtype, so its
comparisons run in float32 with float32 tolerances; GPT-2's run in float64 as well.

Every parameter of the transformers modules is redrawn at random before converting: GPT-2's
``Conv1D`` starts with zero biases, which would let a conversion that drops them pass.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mha_course import (GroupedQueryAttention, KVCache, MultiHeadAttention, UnsupportedConfigError, causal_mask,
                        from_gpt2_attention, from_llama_attention)

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, LlamaConfig  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding  # noqa: E402


def randomised(module, seed=0):
    """Every parameter redrawn, of the scale a trained layer has (biases included)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, module.config.hidden_size**-0.5)
    return module


def gpt2(width, heads, *, layer_idx=0, seed=0, dtype=torch.float64, **settings):
    config = GPT2Config(n_embd=width, n_head=heads, n_positions=settings.pop("n_positions", 16),
                        attn_implementation="eager", **settings)
    return randomised(GPT2Attention(config, layer_idx=layer_idx), seed).to(dtype).eval()


def llama(width, heads, kv_heads, *, seed=0, dtype=torch.float32, **settings):
    config = LlamaConfig(hidden_size=width, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=settings.pop("max_position_embeddings", 16),
                         attn_implementation="eager", **settings)
    return randomised(LlamaAttention(config, layer_idx=0), seed).to(dtype).eval()


def additive_causal_mask(num_tokens, dtype):
    """transformers' form of the course's mask: added to the scores, -inf where attention is forbidden."""
    mask = torch.zeros(num_tokens, num_tokens, dtype=dtype).masked_fill(causal_mask(num_tokens), float("-inf"))
    return mask[None, None]  # (1, 1, T, T): every sequence, every head


def gpt2_output(attention, x):
    return attention(x, attention_mask=additive_causal_mask(x.shape[1], x.dtype))[0]


# Tight for float32: the two modules differ only in where they scale (queries or scores).
FLOAT32 = {"rtol": 1e-5, "atol": 1e-6}


def llama_output(attention, x):
    """What a LlamaModel's layer computes: cos and sin from the model's own rotary embedding."""
    b, t, _ = x.shape
    position_ids = torch.arange(t).expand(b, -1)
    rotation = LlamaRotaryEmbedding(attention.config)(x, position_ids)
    return attention(x, position_embeddings=rotation, attention_mask=additive_causal_mask(t, x.dtype))[0]


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}


def batch(width, num_tokens=7, dtype=torch.float64, seed=1):
    """Two sequences of ``num_tokens`` random token vectors."""
    return torch.randn(2, num_tokens, width, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------------------------
# The same function


@pytest.mark.parametrize("width,heads", [(8, 2), (12, 3), (32, 8), (768, 12)])
def test_gpt2_attention_and_the_course_module_agree(width, heads):
    attention = gpt2(width, heads)
    mha = from_gpt2_attention(attention)
    assert isinstance(mha, MultiHeadAttention)
    assert (mha.d_in, mha.d_out, mha.num_heads) == (width, width, heads)
    x = batch(width, num_tokens=5 if width == 768 else 7)
    with torch.no_grad():
        assert torch.allclose(mha(x), gpt2_output(attention, x), rtol=0, atol=1e-10)


def test_gpt2_agrees_in_float32_too():
    attention = gpt2(16, 4, dtype=torch.float32)
    x = batch(16, dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(from_gpt2_attention(attention)(x), gpt2_output(attention, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width,heads,kv_heads", [(8, 4, 2), (16, 4, 4), (24, 6, 1), (768, 12, 4)])
def test_llama_attention_and_the_course_module_agree(width, heads, kv_heads):
    attention = llama(width, heads, kv_heads)
    gqa = from_llama_attention(attention)
    assert isinstance(gqa, GroupedQueryAttention)
    assert (gqa.d_in, gqa.num_heads, gqa.num_kv_groups, gqa.head_dim) == (width, heads, kv_heads, width // heads)
    x = batch(width, num_tokens=5 if width == 768 else 7, dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(gqa(x), llama_output(attention, x), **FLOAT32)


def test_llama_with_attention_bias_agrees_biases_and_all():
    attention = llama(16, 4, 2, attention_bias=True)
    gqa = from_llama_attention(attention)
    assert gqa.W_key.bias is not None
    x = batch(16, dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(gqa(x), llama_output(attention, x), **FLOAT32)
        assert gqa.out_proj.bias.abs().min() > 0  # a bias the comparison would miss if dropped


def test_llama_without_bias_gets_a_zero_output_bias():
    gqa = from_llama_attention(llama(8, 2, 1))
    assert gqa.W_query.bias is None and torch.equal(gqa.out_proj.bias, torch.zeros(8))


ROPE_TYPES = {"default": {}, "llama3": {"rope_parameters": LLAMA3}}


@pytest.mark.parametrize("rope", sorted(ROPE_TYPES))
@pytest.mark.parametrize("width,heads,kv_heads", [(16, 4, 1), (16, 4, 2), (24, 4, 4)])
def test_the_rotation_carries_over_for_a_prompt_and_for_cached_decoding(rope, width, heads, kv_heads):
    attention = llama(width, heads, kv_heads, max_position_embeddings=32, **ROPE_TYPES[rope])
    gqa = from_llama_attention(attention)
    x = batch(width, num_tokens=20, dtype=torch.float32)  # past llama3's original 8 positions
    with torch.no_grad():
        theirs = llama_output(attention, x)
        torch.testing.assert_close(gqa(x), theirs, rtol=1e-5, atol=1e-5)
        cache = KVCache()  # a prompt of 4, then one token at a time
        steps = [gqa(x[:, :4], cache=cache)] + [gqa(x[:, t:t + 1], cache=cache) for t in range(4, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), theirs, rtol=1e-5, atol=1e-5)
    # the rotation matters at these sizes: without it the outputs are far apart
    gqa.rotary = None
    with torch.no_grad():
        assert (gqa(x) - theirs).abs().max() > 1e-2


def test_the_frequencies_are_llamas_own():
    for parameters in ({}, {"rope_parameters": LLAMA3}):
        attention = llama(16, 2, 1, **parameters)
        gqa = from_llama_attention(attention)
        assert torch.equal(gqa.rotary.inv_freq, LlamaRotaryEmbedding(attention.config).inv_freq)
    assert from_llama_attention(llama(16, 2, 1)).rotary.rope_theta == 10000.0
    assert from_llama_attention(llama(16, 2, 1, rope_parameters=LLAMA3)).rotary.rope_theta == 500000.0


def test_the_converted_rotation_survives_a_state_dict_round_trip():
    gqa = from_llama_attention(llama(16, 2, 1, rope_parameters=LLAMA3))
    twin = GroupedQueryAttention(16, 16, 16, 0.0, 2, 1, rope_theta=500000.0)
    twin.load_state_dict(gqa.state_dict())
    x = batch(16, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), gqa(x))


def test_left_padded_llama_positions_match_transformers():
    """A batch padded on the left, with transformers' position ids (counting from each first real token)."""
    attention = llama(16, 4, 2)
    gqa = from_llama_attention(attention)
    x = batch(16, num_tokens=6, dtype=torch.float32)
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    position_ids = (real.cumsum(-1) - 1).clamp(min=0)
    cos, sin = LlamaRotaryEmbedding(attention.config)(x, position_ids)
    additive = additive_causal_mask(6, x.dtype).expand(2, 1, 6, 6).clone()
    additive.masked_fill_(real[:, None, None, :] == 0, torch.finfo(x.dtype).min)
    with torch.no_grad():
        theirs = attention(x, position_embeddings=(cos, sin), attention_mask=additive)[0]
        ours = gqa(x, attention_mask=real, position_ids=position_ids)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours[real.bool()], theirs[real.bool()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make,convert,output", [
    (lambda: gpt2(8, 2, attn_pdrop=0.5, resid_pdrop=0.0), from_gpt2_attention, gpt2_output),
    (lambda: llama(8, 4, 2, attention_dropout=0.5), from_llama_attention, llama_output),
], ids=["gpt2", "llama"])
def test_training_mode_dropout_and_the_same_random_draws(make, convert, output):
    attention = make().train()
    ours = convert(attention)
    assert ours.training and ours.dropout.p == 0.5
    assert not convert(attention.eval()).training
    attention.train()
    x = batch(8, dtype=next(attention.parameters()).dtype)
    # Both drop attention weights with one draw of the same shape: the same seed, the same output.
    torch.manual_seed(3)
    theirs = output(attention, x)
    torch.manual_seed(3)
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs, **FLOAT32)


# ----------------------------------------------------------------------------------------------
# Sizes, device, dtype, copies


def test_context_length_comes_from_the_config_unless_given():
    assert from_gpt2_attention(gpt2(8, 2, n_positions=24)).context_length == 24
    assert from_gpt2_attention(gpt2(8, 2), context_length=5).context_length == 5
    assert from_llama_attention(llama(8, 2, 1, max_position_embeddings=20)).context_length == 20
    assert from_llama_attention(llama(8, 2, 1), context_length=9).context_length == 9


@pytest.mark.parametrize("make,convert", [(lambda: gpt2(8, 2), from_gpt2_attention),
                                          (lambda: llama(8, 4, 2), from_llama_attention)], ids=["gpt2", "llama"])
def test_weights_are_copies_not_shared(make, convert):
    attention = make()
    ours = convert(attention)
    theirs_storage = {p.untyped_storage().data_ptr() for p in attention.parameters()}
    assert not theirs_storage & {p.untyped_storage().data_ptr() for p in ours.parameters()}
    before = {name: p.clone() for name, p in ours.named_parameters()}
    with torch.no_grad():
        for p in attention.parameters():
            p.add_(1.0)
    assert all(torch.equal(p, before[name]) for name, p in ours.named_parameters())
    assert all(p.requires_grad for p in ours.parameters())


@pytest.mark.parametrize("make,convert", [(lambda: gpt2(8, 2), from_gpt2_attention),
                                          (lambda: llama(8, 4, 2), from_llama_attention)], ids=["gpt2", "llama"])
def test_dtype_and_device_are_kept(make, convert):
    assert all(p.dtype == torch.float64 for p in convert(make().to(torch.float64)).parameters())
    on_meta = convert(make().to(torch.float32).to("meta"))  # the meta device stands in for a GPU
    assert {(p.device.type, p.dtype) for p in on_meta.parameters()} == {("meta", torch.float32)}
    assert all(buffer.device.type == "meta" for buffer in on_meta.buffers())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
def test_on_the_gpu_the_modules_agree():
    attention = gpt2(64, 4).cuda()
    x = batch(64).cuda()
    with torch.no_grad():
        assert torch.allclose(from_gpt2_attention(attention)(x), gpt2_output(attention, x), rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# What they refuse


def test_a_module_of_another_type_gets_a_type_error_naming_the_class_expected():
    with pytest.raises(TypeError, match=r"attention must be a transformers GPT2Attention, got MultiHeadAttention"):
        from_gpt2_attention(MultiHeadAttention(8, 8, 4, 0.0, 2))
    with pytest.raises(TypeError, match=r"attention must be a transformers LlamaAttention, got GPT2Attention"):
        from_llama_attention(gpt2(8, 2))


@pytest.mark.parametrize("make,message", [
    (lambda: gpt2(8, 2, scale_attn_weights=False),
     r"scale_attn_weights=False is not supported: .* scales the scores by 1, .*1/sqrt\(head_dim\) = 0.5"),
    (lambda: gpt2(8, 2, layer_idx=2, scale_attn_by_inverse_layer_idx=True),
     r"scale_attn_by_inverse_layer_idx=True is not supported: this layer \(layer_idx=2\) scales the scores by "
     r"0.166667"),
    (lambda: gpt2(8, 2, reorder_and_upcast_attn=True), r"reorder_and_upcast_attn=True is not supported"),
    (lambda: randomised(GPT2Attention(GPT2Config(n_embd=8, n_head=2), is_cross_attention=True, layer_idx=0)),
     r"is_cross_attention=True is not supported: the course's modules attend within one sequence"),
    (lambda: llama(8, 2, 1, head_dim=8),
     r"head_dim=8 is not supported: 2 heads of width 8 make 16, not hidden_size=8.*head_dim=4"),
    (lambda: llama(8, 2, 1, rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}),
     r"rope_type='yarn' is not supported: .*carries over the rope types 'default' and 'llama3'"),
    (lambda: llama(8, 2, 1, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     r"rope_type='linear' is not supported"),
], ids=["no-scale", "inverse-layer-scale", "upcast", "cross-attention", "llama-head-dim", "yarn", "linear"])
def test_what_the_course_cannot_express_gets_one_named_error(make, message):
    attention = make()
    convert = from_llama_attention if isinstance(attention, LlamaAttention) else from_gpt2_attention
    with pytest.raises(UnsupportedConfigError, match=message):
        convert(attention)
    assert issubclass(UnsupportedConfigError, ValueError)


def test_the_first_layer_scaled_by_inverse_layer_index_is_plain_gpt2_and_converts():
    attention = gpt2(8, 2, layer_idx=0, scale_attn_by_inverse_layer_idx=True)
    x = batch(8)
    with torch.no_grad():
        assert torch.allclose(from_gpt2_attention(attention)(x), gpt2_output(attention, x), rtol=0, atol=1e-10)


def test_neither_the_package_nor_its_checks_import_transformers_until_a_conversion_runs():
    code = ("import sys, mha_course; mha_course.check; print('transformers' in sys.modules); "
            "mha_course.check('1.1', None); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "○", "1.1", "not", "implemented", "yet", "False"]


# ----------------------------------------------------------------------------------------------
# Memory: nothing quadratic in the context


LLAMA_31_LAYER = r"""
import os, resource, sys
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention
from mha_course import from_llama_attention

# A 16 GiB mask would be refused as an allocation error rather than end in the kernel's OOM killer.
with open("/proc/self/status", encoding="utf-8") as status:
    vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 6 * 2**30, resource.RLIM_INFINITY))
config = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                     max_position_embeddings=131072,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192})
with torch.no_grad():
    attention = LlamaAttention(config, layer_idx=0).eval()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gqa = from_llama_attention(attention)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak
    out = gqa(torch.randn(1, 3, 4096))
weights = sum(t.nbytes for t in (*gqa.parameters(), *gqa.buffers()))
print(gqa.context_length, weights, grown, tuple(out.shape))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and RLIMIT_AS: Linux only")
def test_converting_a_llama_31_layer_allocates_no_more_than_its_weights():
    """A Llama 3.1 layer (131,072 positions, width 4,096, 32 heads and 8 key/value heads) converts in a
    fresh process whose peak resident memory grows by less than the new module's weights plus 1 GiB:
    nothing of size (context x context) is built. (A dense boolean mask would be 16 GiB.)"""
    done = subprocess.run([sys.executable, "-c", LLAMA_31_LAYER], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    context_length, weights, grown, shape = done.stdout.split(maxsplit=3)
    assert int(context_length) == 131072 and shape.strip() == "(1, 3, 4096)"
    assert 160 * 2**20 < int(weights) < 170 * 2**20  # 4 * 4096 * (2 * 4096 + 2 * 1024) float32 weights
    assert int(grown) < int(weights) + 2**30, f"grew by {int(grown) / 2**30:.2f} GiB"
