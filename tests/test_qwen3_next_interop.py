"""The course's GatedDeltaNet against transformers' Qwen3NextGatedDeltaNet: built by
``from_qwen3_next_gated_deltanet``, it computes what the original computes, for prompts of every
length from 1 to 150, token by token with a KVCache, a prompt in two pieces, left-padded batches,
and gradients.

Every parameter of the transformers layer is redrawn before converting: its RMSNorm weight starts
at 1 and ``dt_bias`` at 1, which would let a conversion that dropped them pass. transformers computes
the rule in float32 whatever the layer's dtype, so the comparisons run in float32, with float32
tolerances.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from mha_course import GatedDeltaNet, KVCache, UnsupportedConfigError, from_qwen3_next_gated_deltanet

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, Qwen3NextConfig  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet  # noqa: E402

TOL = {"rtol": 1e-5, "atol": 2e-5}


def qwen_config(**sizes) -> Qwen3NextConfig:
    settings = dict(hidden_size=32, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                    linear_value_head_dim=12, linear_conv_kernel_dim=4, layer_types=["linear_attention"],
                    num_hidden_layers=1)
    return Qwen3NextConfig(**{**settings, **sizes})


def qwen_layer(seed=0, **sizes):
    torch.manual_seed(seed)
    layer = Qwen3NextGatedDeltaNet(qwen_config(**sizes), 0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer


def theirs(layer, x, **kwargs):
    with warnings.catch_warnings():  # "falling back to its reference PyTorch implementation"
        warnings.simplefilter("ignore")
        return layer(x, **kwargs)


def batch(tokens, width=32, seed=1, size=2):
    return torch.randn(size, tokens, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("sizes", [{}, {"linear_num_value_heads": 2, "linear_num_key_heads": 2},
                                   {"linear_num_value_heads": 6, "linear_num_key_heads": 2, "linear_key_head_dim": 4,
                                    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 3}])
def test_the_conversion_keeps_the_sizes_and_copies_the_weights(sizes):
    layer = qwen_layer(**sizes)
    ours = from_qwen3_next_gated_deltanet(layer)
    assert isinstance(ours, GatedDeltaNet)
    assert (ours.num_heads, ours.num_key_heads, ours.key_dim, ours.value_dim, ours.conv_size) == (
        layer.num_v_heads, layer.num_k_heads, layer.head_k_dim, layer.head_v_dim, layer.conv_kernel_size)
    x = batch(20)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(layer, x), **TOL)
        ours.W_beta.weight.zero_()  # the copy is a copy
    assert layer.in_proj_ba.weight.abs().min() > 0


def test_prompts_of_every_length_from_1_to_150_chunked_and_recurrent():
    layer = qwen_layer()
    ours = from_qwen3_next_gated_deltanet(layer)
    x = batch(150)
    with torch.no_grad():
        for tokens in range(1, 151):
            expected = theirs(layer, x[:, :tokens])
            torch.testing.assert_close(ours(x[:, :tokens]), expected, **TOL)
            if tokens in (1, 2, 63, 64, 65, 150):
                ours.form = "recurrent"
                torch.testing.assert_close(ours(x[:, :tokens]), expected, **TOL)
                ours.form = "chunked"


def test_decoding_token_by_token_with_a_kvcache_equals_the_prompt_and_transformers_cache():
    config, layer = qwen_config(), qwen_layer()
    ours = from_qwen3_next_gated_deltanet(layer)
    x = batch(30)
    with torch.no_grad():
        whole = theirs(layer, x)
        cache, their_cache, sizes = KVCache(), DynamicCache(config=config), []
        mine = [ours(x[:, :3], cache=cache)]
        them = [theirs(layer, x[:, :3], cache_params=their_cache)]
        for t in range(3, 30):
            mine.append(ours(x[:, t:t + 1], cache=cache))
            them.append(theirs(layer, x[:, t:t + 1], cache_params=their_cache))
            sizes.append(cache.nbytes)
    torch.testing.assert_close(torch.cat(mine, 1), whole, **TOL)
    torch.testing.assert_close(torch.cat(mine, 1), torch.cat(them, 1), **TOL)
    torch.testing.assert_close(cache.states["state"], their_cache.layers[0].recurrent_states[0], **TOL)
    assert len(set(sizes)) == 1 and len(cache) == 30


@pytest.mark.parametrize("split", [1, 2, 40, 64, 100])
def test_a_prompt_in_two_pieces_equals_the_whole_prompt(split):
    config, layer = qwen_config(), qwen_layer()
    ours = from_qwen3_next_gated_deltanet(layer)
    x = batch(130)
    with torch.no_grad():
        cache, their_cache = KVCache(), DynamicCache(config=config)
        mine = torch.cat([ours(x[:, :split], cache=cache), ours(x[:, split:], cache=cache)], 1)
        them = torch.cat([theirs(layer, x[:, :split], cache_params=their_cache),
                          theirs(layer, x[:, split:], cache_params=their_cache)], 1)
        torch.testing.assert_close(mine, theirs(layer, x), **TOL)
        torch.testing.assert_close(mine, them, **TOL)


def test_a_left_padded_batch_equals_each_sequence_alone_as_in_transformers():
    layer = qwen_layer()
    ours = from_qwen3_next_gated_deltanet(layer)
    lengths, total = [70, 9, 2], 70
    xs = [batch(n, seed=i, size=1) for i, n in enumerate(lengths)]
    padded = torch.cat([torch.cat([torch.full((1, total - n, 32), 5.0), x], 1) for x, n in zip(xs, lengths)])
    mask = torch.tensor([[0] * (total - n) + [1] * n for n in lengths])
    with torch.no_grad():
        mine, them = ours(padded, attention_mask=mask), theirs(layer, padded, attention_mask=mask)
        for i, (x, n) in enumerate(zip(xs, lengths)):
            alone = theirs(layer, x)[0]
            torch.testing.assert_close(mine[i, total - n:], alone, **TOL)
            torch.testing.assert_close(them[i, total - n:], alone, **TOL)
    assert mine[1, :total - 9].abs().max() == 0


def test_gradients_equal_transformers_inputs_and_every_weight():
    layer = qwen_layer().train()
    ours = from_qwen3_next_gated_deltanet(layer)
    x = batch(80)
    upstream = batch(80, seed=7)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ours(x_ours) * upstream).sum().backward()
    (theirs(layer, x_theirs) * upstream).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, **TOL)
    # transformers' weight gradients, put where the conversion puts the weights
    gradients = copy.deepcopy(layer)
    with torch.no_grad():
        for p, original in zip(gradients.parameters(), layer.parameters()):
            p.copy_(original.grad)
    expected = dict(from_qwen3_next_gated_deltanet(gradients).named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5, msg=name)
    assert ours.training


def test_the_conversion_refuses_what_it_cannot_express():
    with pytest.raises(TypeError, match="layer must be a transformers Qwen3NextGatedDeltaNet, got Linear"):
        from_qwen3_next_gated_deltanet(torch.nn.Linear(2, 2))
    with pytest.raises(UnsupportedConfigError, match="hidden_act='gelu' is not supported"):
        from_qwen3_next_gated_deltanet(qwen_layer(hidden_act="gelu"))
