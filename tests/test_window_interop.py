"""The course's sliding windows and sinks against transformers' ``MistralAttention`` and ``GptOssAttention``.

Built by ``from_mistral_attention`` and ``from_gpt_oss_attention``, a ``GroupedQueryAttention`` with a
window (and gpt-oss's sinks, biases and yarn rotation) computes what the transformers layer computes when
fed with its model's rotary embedding and its model's own mask (``create_sliding_window_causal_mask``
for windowed layers, ``create_causal_mask`` for full ones), and with transformers' own cache: for a prompt
longer than the window, for decoding token by token far past it, for a left-padded batch, gradients too.
Both caches hold the same last ``window - 1`` keys, and the course's ``nbytes`` stops growing. The
comparisons run in float32. Every parameter is redrawn before converting (gpt-oss's sinks start
uninitialised), so a conversion that drops one fails.
"""

from __future__ import annotations

import pytest
import torch

from mha_course import GroupedQueryAttention, KVCache, UnsupportedConfigError, from_gpt_oss_attention, \
    from_mistral_attention

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, GptOssConfig, MistralConfig  # noqa: E402
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralAttention, MistralRotaryEmbedding  # noqa: E402

FLOAT32 = {"rtol": 2e-5, "atol": 2e-5}
WINDOW = 4

#: gpt-oss's own rotation (its config.json), with positions short enough for a test.
GPT_OSS_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


def _redraw(attention, seed):
    """Every parameter drawn afresh: weights and biases of a trained model's size (scores of about
    1), the sinks of both signs and about 1 (gpt-oss's leave torch.empty uninitialised)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in attention.named_parameters():
            p.copy_(torch.randn_like(p) * (1.0 if name == "sinks" else 0.1))
    return attention.eval()


def mistral(window=WINDOW, seed=0, **settings):
    config = MistralConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                           num_hidden_layers=1, max_position_embeddings=64, attn_implementation="eager", **settings)
    return _redraw(MistralAttention(config, layer_idx=0), seed)


def gpt_oss(layer_type="sliding_attention", seed=0, **settings):
    """A small gpt-oss layer whose heads together (4 x 16 = 64) are wider than the model (48), as
    gpt-oss-120b's 64 heads of 64 are wider than its 2880."""
    config = GptOssConfig(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          sliding_window=WINDOW, layer_types=[layer_type], num_hidden_layers=1, attention_bias=True,
                          rope_parameters=dict(GPT_OSS_YARN), max_position_embeddings=64,
                          attn_implementation="eager", **settings)
    return _redraw(GptOssAttention(config, layer_idx=0), seed)


ROTARY = {MistralAttention: MistralRotaryEmbedding, GptOssAttention: GptOssRotaryEmbedding}
CONVERT = {MistralAttention: from_mistral_attention, GptOssAttention: from_gpt_oss_attention}
LAYERS = {"mistral": lambda **kw: mistral(**kw),
          # Mistral NeMo's heads are wider together than the model: 32 x 128 in 5120
          "mistral-wide-heads": lambda **kw: mistral(head_dim=16, **kw),
          "gpt-oss-sliding": lambda **kw: gpt_oss("sliding_attention", **kw),
          "gpt-oss-full": lambda **kw: gpt_oss("full_attention", **kw)}


def theirs(attention, x, real, positions, cache=None):
    """What the transformers model's layer computes: its rotary embedding's cos and sin, its own mask."""
    config = attention.config
    windowed = getattr(attention, "sliding_window", None) or (
        isinstance(attention, MistralAttention) and config.sliding_window)
    make_mask = create_sliding_window_causal_mask if windowed else create_causal_mask
    mask = make_mask(config=config, inputs_embeds=x, attention_mask=real, past_key_values=cache,
                     position_ids=positions, allow_is_causal_skip=False)
    rotation = ROTARY[type(attention)](config)(x, positions)
    return attention(x, position_embeddings=rotation, attention_mask=mask, past_key_values=cache)[0]


def inputs(width, batch=2, tokens=11, seed=1):
    return torch.randn(batch, tokens, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_prompt_longer_than_the_window_gives_what_transformers_gives(layer, use_sdpa):
    attention = LAYERS[layer]()
    ours = CONVERT[type(attention)](attention)
    ours.use_sdpa = use_sdpa  # a layer with sinks computes the explicit way either way
    x = inputs(attention.config.hidden_size)
    real = torch.ones(2, 11, dtype=torch.long)
    positions = torch.arange(11).expand(2, -1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(attention, x, real, positions), **FLOAT32)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_decoding_far_past_the_window_gives_what_transformers_gives_and_caches_what_it_caches(layer):
    attention = LAYERS[layer]()
    ours = CONVERT[type(attention)](attention)
    x = inputs(attention.config.hidden_size, tokens=14)
    real, positions = torch.ones(2, 14, dtype=torch.long), torch.arange(14).expand(2, -1)
    their_cache, our_cache, sizes = DynamicCache(config=attention.config), KVCache(), []
    with torch.no_grad():
        pairs = [(theirs(attention, x[:, :6], real[:, :6], positions[:, :6], their_cache), ours(x[:, :6], our_cache))]
        for t in range(6, 14):
            pairs.append((theirs(attention, x[:, t:t + 1], real[:, :t + 1], positions[:, t:t + 1], their_cache),
                          ours(x[:, t:t + 1], our_cache)))
            sizes.append(our_cache.nbytes)
        whole = ours(x)
    for expected, got in pairs:
        torch.testing.assert_close(got, expected, **FLOAT32)
    torch.testing.assert_close(torch.cat([got for _, got in pairs], dim=1), whole, **FLOAT32)
    held = their_cache.layers[0]
    torch.testing.assert_close(our_cache.keys, held.keys, **FLOAT32)
    torch.testing.assert_close(our_cache.values, held.values, **FLOAT32)
    if ours.window is not None:  # the window's cache stopped growing: window - 1 positions
        assert len(set(sizes)) == 1 and our_cache.held == WINDOW - 1 and len(our_cache) == 14
    else:
        assert sizes == sorted(set(sizes)) and our_cache.held == 14


@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_left_padded_batch_gives_what_transformers_gives_and_each_sequence_alone(layer):
    attention = LAYERS[layer]()
    ours = CONVERT[type(attention)](attention)
    x = inputs(attention.config.hidden_size, tokens=12)
    real = torch.tensor([[0, 0, 0] + [1] * 9, [1] * 12])
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    their_cache, our_cache = DynamicCache(config=attention.config), KVCache()
    with torch.no_grad():
        expected = [theirs(attention, x[:, :7], real[:, :7], positions[:, :7], their_cache)]
        got = [ours(x[:, :7], our_cache, real[:, :7], positions[:, :7])]
        for t in range(7, 12):
            expected.append(theirs(attention, x[:, t:t + 1], real[:, :t + 1], positions[:, t:t + 1], their_cache))
            got.append(ours(x[:, t:t + 1], our_cache, real[:, :t + 1], positions[:, t:t + 1]))
        expected, got = torch.cat(expected, dim=1), torch.cat(got, dim=1)
        alone = ours(x[:1, 3:])  # the padded sequence without its padding
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real.bool()], expected[real.bool()], **FLOAT32)
    torch.testing.assert_close(got[0, 3:], alone[0], **FLOAT32)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_gradients_are_transformers(layer):
    attention = LAYERS[layer]()
    ours = CONVERT[type(attention)](attention)
    x = inputs(attention.config.hidden_size, tokens=9)
    real, positions = torch.ones(2, 9, dtype=torch.long), torch.arange(9).expand(2, -1)
    upstream = torch.randn(2, 9, attention.config.hidden_size, generator=torch.Generator().manual_seed(5))
    x_theirs, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    (theirs(attention, x_theirs, real, positions) * upstream).sum().backward()
    (ours(x_ours) * upstream).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, **FLOAT32)
    torch.testing.assert_close(ours.W_value.weight.grad, attention.v_proj.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.out_proj.weight.grad, attention.o_proj.weight.grad, **FLOAT32)
    scale = ROTARY[type(attention)](attention.config).attention_scaling  # folded into W_query and W_key
    torch.testing.assert_close(ours.W_key.weight.grad * scale, attention.k_proj.weight.grad, **FLOAT32)
    torch.testing.assert_close(ours.W_query.weight.grad * scale, attention.q_proj.weight.grad, **FLOAT32)
    if isinstance(attention, GptOssAttention):
        torch.testing.assert_close(ours.sinks.grad, attention.sinks.grad, **FLOAT32)
        torch.testing.assert_close(ours.W_value.bias.grad, attention.v_proj.bias.grad, **FLOAT32)


def test_the_window_and_the_sinks_come_from_the_layer():
    assert from_mistral_attention(mistral()).window == WINDOW
    assert from_mistral_attention(mistral(window=None)).window is None
    sliding, full = from_gpt_oss_attention(gpt_oss("sliding_attention")), from_gpt_oss_attention(gpt_oss("full_attention"))
    assert (sliding.window, full.window) == (WINDOW, None)
    attention = gpt_oss()
    torch.testing.assert_close(from_gpt_oss_attention(attention).sinks.detach(), attention.sinks.detach())
    assert from_mistral_attention(mistral()).sinks is None


def test_changing_the_sinks_changes_the_output_as_it_changes_transformers():
    attention = gpt_oss("full_attention")
    x, real, positions = inputs(48), torch.ones(2, 11, dtype=torch.long), torch.arange(11).expand(2, -1)
    with torch.no_grad():
        before = from_gpt_oss_attention(attention)(x)
        attention.sinks += 3.0  # every head gives its sink more
        after = from_gpt_oss_attention(attention)(x)
        torch.testing.assert_close(after, theirs(attention, x, real, positions), **FLOAT32)
    assert (after - before).abs().max() > 0.05


def test_gpt_oss_yarn_scale_is_carried_by_the_query_and_key_projections():
    """gpt-oss's yarn scales cos and sin by 1.35 (0.1 ln 32 + 1): the conversion scales W_query and W_key."""
    attention = gpt_oss()
    ours = from_gpt_oss_attention(attention)
    scale = GptOssRotaryEmbedding(attention.config).attention_scaling
    assert scale == pytest.approx(0.1 * torch.log(torch.tensor(32.0)).item() + 1, rel=1e-6)
    torch.testing.assert_close(ours.W_key.weight, attention.k_proj.weight * scale)
    torch.testing.assert_close(ours.W_value.weight, attention.v_proj.weight)


def test_what_the_course_cannot_express_gets_one_named_error():
    with pytest.raises(TypeError, match=r"attention must be a transformers MistralAttention, got GroupedQueryAttention"):
        from_mistral_attention(GroupedQueryAttention(8, 8, 4, 0.0, 2, 1))
    with pytest.raises(TypeError, match=r"attention must be a transformers GptOssAttention, got MistralAttention"):
        from_gpt_oss_attention(mistral())
    dynamic = mistral(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(UnsupportedConfigError, match=r"rope_type='dynamic' is not supported"):
        from_mistral_attention(dynamic)


def test_a_layer_of_gpt_oss_120b_s_published_sizes_converts_and_equals_transformers():
    """gpt-oss-120b's attention (config.json): width 2880, 64 heads of 64 (4096, wider than the model), 8 key/value
    heads, a window of 128, its yarn rotation; a prompt of 160 tokens reaches past the window."""
    settings = dict(hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128,
                    layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2, attention_bias=True,
                    rope_parameters=dict(GPT_OSS_YARN, rope_theta=150000.0), max_position_embeddings=131072,
                    attn_implementation="eager")
    config = GptOssConfig(**settings)
    x = torch.randn(1, 160, 2880, generator=torch.Generator().manual_seed(7))
    real, positions = torch.ones(1, 160, dtype=torch.long), torch.arange(160)[None]
    for layer_idx in (0, 1):
        torch.manual_seed(layer_idx)
        attention = GptOssAttention(config, layer_idx=layer_idx).eval()
        with torch.no_grad():
            for name, p in attention.named_parameters():
                p.copy_(torch.randn_like(p) * (1.0 if name == "sinks" else 0.02))
            ours = from_gpt_oss_attention(attention)
            assert (ours.window, ours.out_width, ours.d_out) == ((128, None)[layer_idx], 2880, 4096)
            torch.testing.assert_close(ours(x), theirs(attention, x, real, positions), **FLOAT32)
