"""The course's multi-head latent attention against transformers' ``DeepseekV3Attention``: built by
``from_deepseek_v3_attention``, it computes what the original computes, fed with
``DeepseekV3RotaryEmbedding``'s cos and sin: rope types "default" and "yarn" (with and without the
scale of cos and sin), ``rope_interleave`` on and off, ``q_lora_rank`` None or set; for a prompt and
for cached decoding, absorbed and not, a left-padded batch, gradients too; its cache holds what
transformers' cache holds. The comparisons run in float32 (transformers' softmax is float32).

Every parameter of the transformers layer is redrawn before converting, RMSNorm weights (which start
at 1) and biases included, so a conversion that drops one fails.
"""

from __future__ import annotations

import pytest
import torch
from deepseek_layers import FLOAT32, YARN, additive

from mha_course import KVCache, MultiHeadLatentAttention, UnsupportedConfigError, from_deepseek_v3_attention

transformers = pytest.importorskip("transformers")
from transformers import DeepseekV3Config, DynamicCache  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 1e4},
    "yarn": YARN,  # DeepSeek-V3's: mscale == mscale_all_dim, cos and sin unscaled
    "yarn-scaled": {**YARN, "mscale": 0.7},  # cos and sin scaled by 0.96
    "yarn-no-correction": {k: v for k, v in YARN.items() if k not in ("mscale", "mscale_all_dim")},
}


def deepseek(rope="yarn", q_lora_rank=None, interleave=True, bias=False, seed=0, **settings):
    config = DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, rope_interleave=interleave,
        max_position_embeddings=64, rope_parameters=dict(ROPES[rope]), attention_bias=bias,
        attn_implementation="eager", **settings)
    attention = DeepseekV3Attention(config, layer_idx=0)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in attention.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if "layernorm" in name else torch.randn_like(p) * 64**-0.5)
    return attention.eval()


def inputs(batch=2, tokens=7, seed=1):
    return torch.randn(batch, tokens, 64, generator=torch.Generator().manual_seed(seed))


def theirs(attention, x, positions, real=None, cache=None):
    """What a DeepseekV3Model's layer computes: cos and sin from the model's rotary embedding."""
    real = torch.ones(len(x), positions.max() + 1 if cache is None else cache.get_seq_length() + x.shape[1],
                      dtype=torch.long) if real is None else real
    rotation = DeepseekV3RotaryEmbedding(attention.config)(x, positions)
    return attention(x, position_embeddings=rotation, attention_mask=additive(real, x.shape[1]),
                     past_key_values=cache)[0]


CASES = [(rope, q, inter) for rope in ROPES for q in (None, 24) for inter in (True, False)]


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
@pytest.mark.parametrize("rope,q_lora_rank,interleave", CASES,
                         ids=[f"{r}-q{q}-{'interleaved' if i else 'half'}" for r, q, i in CASES])
def test_a_prompt_gives_what_deepseek_v3_gives(rope, q_lora_rank, interleave, absorb):
    attention = deepseek(rope, q_lora_rank, interleave)
    ours = from_deepseek_v3_attention(attention)
    ours.absorb = absorb
    x = inputs()
    # positions past original_max_position_embeddings (16), where yarn's stretched frequencies count
    positions = torch.arange(30, 37).expand(2, -1)
    with torch.no_grad():
        expected = theirs(attention, x, positions, real=torch.ones(2, 7, dtype=torch.long))
        torch.testing.assert_close(ours(x, position_ids=positions), expected, **FLOAT32)


def test_the_scale_of_the_scores_is_deepseeks_own():
    for rope in ROPES:
        attention = deepseek(rope)
        assert from_deepseek_v3_attention(attention).softmax_scale == pytest.approx(attention.scaling, rel=1e-12)
    assert deepseek("yarn").scaling != deepseek("default").scaling  # yarn's correction is seen


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
@pytest.mark.parametrize("q_lora_rank,interleave", [(None, True), (24, False)])
def test_cached_decoding_gives_what_deepseek_v3_gives_and_caches_what_it_caches(q_lora_rank, interleave, absorb):
    attention = deepseek("yarn", q_lora_rank, interleave, bias=True)
    ours = from_deepseek_v3_attention(attention)
    ours.absorb = absorb
    x = inputs(tokens=8)
    positions = torch.arange(8).expand(2, -1)
    their_cache, our_cache = DynamicCache(config=attention.config), KVCache()
    with torch.no_grad():
        pieces = [(theirs(attention, x[:, :5], positions[:, :5], cache=their_cache),
                   ours(x[:, :5], cache=our_cache))]
        for t in range(5, 8):
            pieces.append((theirs(attention, x[:, t:t + 1], positions[:, t:t + 1], cache=their_cache),
                           ours(x[:, t:t + 1], cache=our_cache)))
    for expected, got in pieces:
        torch.testing.assert_close(got, expected, **FLOAT32)
    latent, rotated = their_cache.layers[0].keys, their_cache.layers[0].values  # (B, 1, S, r), (B, 1, S, d_r)
    torch.testing.assert_close(our_cache.tensors["latent"], latent.squeeze(1), **FLOAT32)
    torch.testing.assert_close(our_cache.tensors["rotated_key"], rotated, **FLOAT32)
    assert our_cache.nbytes == 2 * 8 * (16 + 4) * 4 == latent.nbytes + rotated.nbytes


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
def test_a_left_padded_batch_gives_what_deepseek_v3_gives_and_each_sequence_alone(absorb):
    attention = deepseek("yarn", 24)
    ours = from_deepseek_v3_attention(attention)
    ours.absorb = absorb
    x = inputs(tokens=7)
    real = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    their_cache, our_cache = DynamicCache(config=attention.config), KVCache()
    with torch.no_grad():
        expected = torch.cat([theirs(attention, x[:, :5], positions[:, :5], real[:, :5], their_cache),
                              *(theirs(attention, x[:, t:t + 1], positions[:, t:t + 1], real[:, :t + 1], their_cache)
                                for t in (5, 6))], dim=1)
        got = torch.cat([ours(x[:, :5], our_cache, real[:, :5], positions[:, :5]),
                         *(ours(x[:, t:t + 1], our_cache, real[:, :t + 1], positions[:, t:t + 1]) for t in (5, 6))],
                        dim=1)
        alone = ours(x[:1, 3:])  # the padded sequence without its padding
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real.bool()], expected[real.bool()], **FLOAT32)
    torch.testing.assert_close(got[0, 3:], alone[0], **FLOAT32)


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
@pytest.mark.parametrize("q_lora_rank,interleave", [(None, True), (24, False)])
def test_gradients_are_deepseek_v3s(q_lora_rank, interleave, absorb):
    """Gradients of the input and of the weights, mapped back through the conversion."""
    attention = deepseek("yarn-scaled", q_lora_rank, interleave, bias=True)
    ours = from_deepseek_v3_attention(attention)
    ours.absorb = absorb
    x = inputs(tokens=6)
    positions = torch.arange(6).expand(2, -1)
    upstream = torch.randn(2, 6, 64, generator=torch.Generator().manual_seed(5))
    x_theirs, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    (theirs(attention, x_theirs, positions) * upstream).sum().backward()
    (ours(x_ours) * upstream).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, **FLOAT32)
    h, rank = 4, 16
    up = torch.cat([ours.W_up_key.weight.grad.view(h, 8, rank), ours.W_up_value.weight.grad.view(h, 12, rank)], dim=1)
    torch.testing.assert_close(up.reshape(-1, rank), attention.kv_b_proj.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.W_latent.weight.grad, attention.kv_a_proj_with_mqa.weight.grad[:rank], **FLOAT32)
    torch.testing.assert_close(ours.kv_norm.weight.grad, attention.kv_a_layernorm.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.out_proj.weight.grad, attention.o_proj.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.out_proj.bias.grad, attention.o_proj.bias.grad, **FLOAT32)


def test_training_mode_dropout_and_the_same_random_draws():
    attention = deepseek("yarn", attention_dropout=0.5).train()
    ours = from_deepseek_v3_attention(attention)
    assert ours.training and ours.dropout.p == 0.5
    x, positions = inputs(), torch.arange(7).expand(2, -1)
    torch.manual_seed(3)
    expected = theirs(attention, x, positions)
    torch.manual_seed(3)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), expected, **FLOAT32)


def test_sizes_context_length_dtype_device_and_copies():
    attention = deepseek("default", 24, bias=True)
    ours = from_deepseek_v3_attention(attention)
    assert isinstance(ours, MultiHeadLatentAttention) and not ours.training and not ours.absorb
    assert (ours.num_heads, ours.kv_lora_rank, ours.qk_rope_head_dim, ours.context_length) == (4, 16, 4, 64)
    assert from_deepseek_v3_attention(attention, context_length=9).context_length == 9
    assert all(p.dtype == torch.float64 for p in from_deepseek_v3_attention(attention.double()).parameters())
    on_meta = from_deepseek_v3_attention(deepseek("yarn", 24, bias=True).to("meta"))
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}
    assert on_meta.rotary.inv_freq.device.type == "meta" and on_meta.rotary.inv_freq.dtype == torch.float32
    theirs_storage = {p.untyped_storage().data_ptr() for p in attention.parameters()}
    assert not theirs_storage & {p.untyped_storage().data_ptr() for p in ours.parameters()}


def test_what_the_course_cannot_express_gets_one_named_error():
    with pytest.raises(TypeError, match=r"attention must be a transformers DeepseekV3Attention, got "
                                        r"MultiHeadLatentAttention"):
        from_deepseek_v3_attention(MultiHeadLatentAttention(8, 4, 0.0, 2, 4, 2, 2, 2))
    dynamic = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
    attention = deepseek("default")
    attention.config.rope_parameters = dynamic
    with pytest.raises(UnsupportedConfigError, match=r"rope_type='dynamic' is not supported: .* 'default' and "
                                                     r"'yarn'"):
        from_deepseek_v3_attention(attention)
    attention = deepseek("default")
    attention.config.num_key_value_heads = 2
    with pytest.raises(UnsupportedConfigError, match=r"num_key_value_heads=2 is not supported: .*"
                                                     r"num_key_value_heads=4"):
        from_deepseek_v3_attention(attention)
