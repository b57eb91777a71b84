"""The course's sparse attention against transformers' ``DeepseekV32Attention``: built by
``from_deepseek_v32_attention``, it chooses the keys transformers' indexer chooses and computes what
the layer computes, fed with ``DeepseekV32RotaryEmbedding``'s cos and sin and the causal mask: rope
types "default" and "yarn" (with and without the scale of cos and sin), for a prompt, for decoding
token by token, for a left-padded batch, absorbed and not, gradients too; its cache holds what
transformers' holds, the indexer's keys included. The comparisons run in float32.

Every parameter of the transformers layer is redrawn before converting (norm weights start at 1, the
indexer's LayerNorm has a bias), so a conversion that drops one fails. Sixteen index heads keep the
top-k free of ties (see ``test_few_index_heads_tie_at_zero``).
"""

from __future__ import annotations

import pytest
import torch
from deepseek_layers import FLOAT32, YARN, additive

from mha_course import (KVCache, SparseLatentAttention, UnsupportedConfigError, causal_mask,
                        from_deepseek_v32_attention)
from mha_course.attention.sparse import zero_ties

transformers = pytest.importorskip("transformers")
from transformers import DeepseekV32Config, DynamicCache  # noqa: E402
from transformers.models.deepseek_v32.modeling_deepseek_v32 import (  # noqa: E402
    DeepseekV32Attention,
    DeepseekV32RotaryEmbedding,
)

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 1e4},
    "yarn": YARN,
    "yarn-scaled": {**YARN, "mscale": 0.7},  # cos and sin scaled by 0.96: the indexer's turned numbers too
}


def deepseek(rope="yarn", index_heads=16, topk=3, bias=False, seed=0, **settings):
    config = DeepseekV32Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, index_n_heads=index_heads, index_head_dim=8,
        index_topk=topk, max_position_embeddings=64, rope_parameters=dict(ROPES[rope]), attention_bias=bias,
        num_hidden_layers=1, attn_implementation="eager", **settings)
    attention = DeepseekV32Attention(config, layer_idx=0)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in attention.named_parameters():
            norm_weight = "norm" in name and name.endswith("weight")
            p.copy_(torch.rand_like(p) + 0.5 if norm_weight else torch.randn_like(p) * 64**-0.5)
    return attention.eval()


def inputs(batch=2, tokens=9, seed=1):
    return torch.randn(batch, tokens, 64, generator=torch.Generator().manual_seed(seed))


def theirs(attention, x, positions, real=None, cache=None):
    """What a DeepseekV32Model's layer computes: cos and sin from the model's rotary embedding."""
    if real is None:
        seen = 0 if cache is None else cache.get_seq_length()
        real = torch.ones(len(x), seen + x.shape[1], dtype=torch.long)
    rotation = DeepseekV32RotaryEmbedding(attention.config)(x, positions)
    return attention(x, position_embeddings=rotation, attention_mask=additive(real, x.shape[1]),
                     past_key_values=cache)[0]


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
@pytest.mark.parametrize("rope", list(ROPES))
def test_a_prompt_gives_what_deepseek_v32_gives(rope, absorb):
    attention = deepseek(rope, bias=True)
    ours = from_deepseek_v32_attention(attention)
    ours.absorb = absorb
    x = inputs()
    positions = torch.arange(30, 39).expand(2, -1)  # past original_max_position_embeddings: yarn counts
    with torch.no_grad():
        expected = theirs(attention, x, positions)
        torch.testing.assert_close(ours(x, position_ids=positions), expected, **FLOAT32)


def test_the_indexer_chooses_the_keys_transformers_chooses():
    attention = deepseek("yarn-scaled")
    ours = from_deepseek_v32_attention(attention)
    x, positions = inputs(), torch.arange(9).expand(2, -1)
    rotation = DeepseekV32RotaryEmbedding(attention.config)(x, positions)
    with torch.no_grad():
        q_low = attention.q_a_layernorm(attention.q_a_proj(x))
        causal = additive(torch.ones(2, 9), 9)[:, 0]
        expected = attention.indexer(x, q_low, rotation, causal, positions).long()  # (B, T, k)
        index_q, index_k = ours.indexer(x, ours.W_query[1](ours.W_query[0](x)), start=0)
        hidden = ours.indexer.select(ours.indexer.scores(x, index_q, index_k), causal_mask(9))
    chosen = torch.ones(2, 9, 9, dtype=torch.bool).scatter(-1, expected, False)  # True: not chosen
    causal_hidden = torch.ones(9, 9, dtype=torch.bool).triu(1)
    torch.testing.assert_close(hidden[:, 0], chosen | causal_hidden)  # the same visible keys chosen
    assert (~hidden).sum(-1).max() == 3 and (~hidden).sum(-1).min() == 1  # top-3, fewer where fewer visible


def test_the_selection_changes_the_output():
    """A top-k that keeps every key is latent attention; top-3 of 9 reads less, and gives another output."""
    sparse, dense = (from_deepseek_v32_attention(deepseek(topk=k)) for k in (3, 64))
    x = inputs()
    with torch.no_grad():
        assert not torch.allclose(sparse(x)[:, 3:], dense(x)[:, 3:], atol=1e-3)
        torch.testing.assert_close(sparse(x)[:, :3], dense(x)[:, :3], **FLOAT32)  # rows with <= 3 keys


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
def test_decoding_token_by_token_gives_what_deepseek_v32_gives_and_caches_what_it_caches(absorb):
    attention = deepseek("yarn", bias=True)
    ours = from_deepseek_v32_attention(attention)
    ours.absorb = absorb
    x = inputs(tokens=10)
    positions = torch.arange(10).expand(2, -1)
    their_cache, our_cache = DynamicCache(config=attention.config), KVCache()
    with torch.no_grad():
        pieces = [(theirs(attention, x[:, :4], positions[:, :4], cache=their_cache), ours(x[:, :4], cache=our_cache))]
        for t in range(4, 10):
            pieces.append((theirs(attention, x[:, t:t + 1], positions[:, t:t + 1], cache=their_cache),
                           ours(x[:, t:t + 1], cache=our_cache)))
        whole = ours(x)
    for expected, got in pieces:
        torch.testing.assert_close(got, expected, **FLOAT32)
    torch.testing.assert_close(torch.cat([got for _, got in pieces], dim=1), whole, **FLOAT32)
    layer = their_cache.layers[0]
    torch.testing.assert_close(our_cache.tensors["latent"], layer.keys.squeeze(1), **FLOAT32)
    torch.testing.assert_close(our_cache.tensors["rotated_key"], layer.values, **FLOAT32)
    torch.testing.assert_close(our_cache.tensors["index_key"], layer.indexer_keys, **FLOAT32)
    assert our_cache.nbytes == 2 * 10 * (16 + 4 + 8) * 4 == sum(
        t.nbytes for t in (layer.keys, layer.values, layer.indexer_keys))


def test_a_left_padded_batch_gives_what_deepseek_v32_gives_and_each_sequence_alone():
    attention = deepseek("yarn")
    ours = from_deepseek_v32_attention(attention)
    x = inputs(tokens=8)
    real = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8])
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    their_cache, our_cache = DynamicCache(config=attention.config), KVCache()
    with torch.no_grad():
        expected = torch.cat([theirs(attention, x[:, :5], positions[:, :5], real[:, :5], their_cache),
                              *(theirs(attention, x[:, t:t + 1], positions[:, t:t + 1], real[:, :t + 1], their_cache)
                                for t in (5, 6, 7))], dim=1)
        got = torch.cat([ours(x[:, :5], our_cache, real[:, :5], positions[:, :5]),
                         *(ours(x[:, t:t + 1], our_cache, real[:, :t + 1], positions[:, t:t + 1]) for t in (5, 6, 7))],
                        dim=1)
        alone = ours(x[:1, 3:])  # the padded sequence without its padding
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real.bool()], expected[real.bool()], **FLOAT32)
    torch.testing.assert_close(got[0, 3:], alone[0], **FLOAT32)


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
def test_gradients_are_deepseek_v32s(absorb):
    """Gradients of the input and of the weights; neither indexer gets any (its choice is not differentiable)."""
    attention = deepseek("yarn-scaled", bias=True)
    ours = from_deepseek_v32_attention(attention)
    ours.absorb = absorb
    x = inputs(tokens=7)
    positions = torch.arange(7).expand(2, -1)
    upstream = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(5))
    x_theirs, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    (theirs(attention, x_theirs, positions) * upstream).sum().backward()
    (ours(x_ours) * upstream).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, **FLOAT32)
    h, rank = 4, 16
    up = torch.cat([ours.W_up_key.weight.grad.view(h, 8, rank), ours.W_up_value.weight.grad.view(h, 12, rank)], dim=1)
    torch.testing.assert_close(up.reshape(-1, rank), attention.kv_b_proj.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.W_query[0].weight.grad, attention.q_a_proj.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.W_query[1].weight.grad, attention.q_a_layernorm.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.kv_norm.weight.grad, attention.kv_a_layernorm.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.out_proj.weight.grad, attention.o_proj.weight.grad, **FLOAT32)
    assert all(p.grad is None for p in ours.indexer.parameters())
    assert all(p.grad is None for p in attention.indexer.parameters())


def test_few_index_heads_tie_at_zero_and_top_k_then_breaks_ties_its_own_way():
    """Two index heads: a quarter of the scores are exactly 0 after the ReLU, some rows tie at the top-k
    boundary, and there a prompt and the same tokens decoded one by one may keep different keys, in
    transformers as in the course's module, which agree with each other throughout. Sixteen heads: no tie."""
    def zeros_and_ties(index_heads, seed):
        attention = deepseek(index_heads=index_heads, topk=4, seed=seed)
        ours = from_deepseek_v32_attention(attention)
        x, hidden = inputs(tokens=12, seed=seed), causal_mask(12)
        with torch.no_grad():
            index_q, index_k = ours.indexer(x, ours.W_query[1](ours.W_query[0](x)), start=0)
            scores = ours.indexer.scores(x, index_q, index_k)
            cache, steps = KVCache(), []
            for t in range(12):
                steps.append(ours(x[:, t:t + 1], cache=cache))
            decoded, prompt = torch.cat(steps, dim=1), ours(x)
            torch.testing.assert_close(prompt, theirs(attention, x, torch.arange(12).expand(2, -1)), **FLOAT32)
        zero = (scores[:, ~hidden] == 0).float().mean()  # of the visible keys' scores
        return float(zero), zero_ties(scores, hidden, 4), (prompt - decoded).abs().amax(-1)

    zero, ties, gap = zeros_and_ties(2, seed=1)
    assert 0.15 < zero < 0.4 and ties.any()
    assert torch.all(gap[~ties] < 1e-5)  # rows without a tie: the same keys, the same output
    assert gap[ties].max() > 0.1  # a tied row decoded alone kept other keys
    zero, ties, gap = zeros_and_ties(16, seed=1)
    assert zero == 0 and not ties.any() and gap.max() < 1e-5


def test_sizes_context_length_dtype_device_and_copies():
    attention = deepseek("default", bias=True)
    ours = from_deepseek_v32_attention(attention)
    assert isinstance(ours, SparseLatentAttention) and not ours.training and not ours.absorb
    assert (ours.indexer.num_heads, ours.indexer.head_dim, ours.indexer.topk, ours.context_length) == (16, 8, 3, 64)
    assert from_deepseek_v32_attention(attention, context_length=9).context_length == 9
    assert all(p.dtype == torch.float64 for p in from_deepseek_v32_attention(attention.double()).parameters())
    on_meta = from_deepseek_v32_attention(deepseek("yarn", bias=True).to("meta"))
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}
    assert on_meta.indexer.rotary.inv_freq.device.type == "meta"
    theirs_storage = {p.untyped_storage().data_ptr() for p in attention.parameters()}
    assert not theirs_storage & {p.untyped_storage().data_ptr() for p in ours.parameters()}


def test_what_the_course_cannot_express_gets_one_named_error():
    with pytest.raises(TypeError, match=r"attention must be a transformers DeepseekV32Attention, got "
                                        r"SparseLatentAttention"):
        from_deepseek_v32_attention(SparseLatentAttention(8, 4, 0.0, 2, 4, 2, 2, 2, 4, 2, 4, 2))
    attention = deepseek("default")
    attention.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(UnsupportedConfigError, match=r"rope_type='dynamic' is not supported"):
        from_deepseek_v32_attention(attention)
    attention = deepseek("default")
    attention.config.num_key_value_heads = 2
    with pytest.raises(UnsupportedConfigError, match=r"num_key_value_heads=2 is not supported"):
        from_deepseek_v32_attention(attention)
