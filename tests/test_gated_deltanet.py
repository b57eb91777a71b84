"""A state that does not grow: causal linear attention in both forms, the delta rule, the recurrent and
chunked forms of the gated delta rule, and the GatedDeltaNet layer with its cache.

The equalities run in float64, where two forms of the same function agree to about 1e-12 and a wrong
mask, decay or normaliser is off by far more.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mha_course import (GatedDeltaNet, KVCache, chunked_gated_delta_rule, delta_rule_step, gated_delta_step,
                        l2_normalise, linear_attention_quadratic, linear_attention_recurrent,
                        recurrent_gated_delta_rule)
from mha_course.bench.tiled_steps import saved_tensor_bytes

F64 = torch.float64


def draw(*shape, seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def rule_inputs(batch=2, heads=3, tokens=150, d_k=8, d_v=12, seed=0, strong_decay=False):
    """Queries and keys as the layer makes them (unit length, queries scaled), values, log decays, betas."""
    q = l2_normalise(draw(batch, heads, tokens, d_k, seed=seed)) * d_k**-0.5
    k = l2_normalise(draw(batch, heads, tokens, d_k, seed=seed + 1))
    v = draw(batch, heads, tokens, d_v, seed=seed + 2)
    scale = 20.0 if strong_decay else 1.0
    g = -scale * draw(batch, heads, tokens, seed=seed + 3).abs()
    beta = torch.sigmoid(draw(batch, heads, tokens, seed=seed + 4))
    return q, k, v, g, beta


# ----------------------------------------------------------------------------------------------
# Causal linear attention


@pytest.mark.parametrize("batch,heads,tokens,d_k,d_v", [(1, 1, 1, 2, 2), (2, 3, 17, 4, 6), (1, 2, 64, 8, 3)])
def test_causal_linear_attention_is_its_quadratic_form_as_a_recurrence(batch, heads, tokens, d_k, d_v):
    q, k, v = draw(batch, heads, tokens, d_k), draw(batch, heads, tokens, d_k, seed=1), draw(batch, heads, tokens, d_v, seed=2)
    quadratic, recurrent = linear_attention_quadratic(q, k, v), linear_attention_recurrent(q, k, v)
    torch.testing.assert_close(recurrent, quadratic, rtol=0, atol=1e-12)


def test_causal_linear_attention_is_causal_and_normalised():
    q, k, v = draw(1, 2, 9, 4), draw(1, 2, 9, 4, seed=1), draw(1, 2, 9, 3, seed=2)
    changed = v.clone()
    changed[:, :, 5:] += 10.0  # the future moves; the first five outputs must not
    torch.testing.assert_close(linear_attention_recurrent(q, k, changed)[:, :, :5],
                               linear_attention_recurrent(q, k, v)[:, :, :5], rtol=0, atol=1e-12)
    ones = torch.ones_like(v)  # the weights of each row sum to 1: equal values come back as they are
    torch.testing.assert_close(linear_attention_recurrent(q, k, ones), ones, rtol=0, atol=1e-12)


def test_custom_feature_maps_are_used_by_both_forms():
    q, k, v = draw(1, 1, 6, 3).abs(), draw(1, 1, 6, 3, seed=1).abs(), draw(1, 1, 6, 2, seed=2)
    identity = lambda x: x  # noqa: E731
    torch.testing.assert_close(linear_attention_recurrent(q, k, v, identity),
                               linear_attention_quadratic(q, k, v, identity), rtol=0, atol=1e-12)
    assert not torch.allclose(linear_attention_recurrent(q, k, v, identity), linear_attention_recurrent(q, k, v))


# ----------------------------------------------------------------------------------------------
# The delta rule and its gates


def test_a_delta_write_with_beta_one_makes_a_unit_key_read_back_its_value():
    state = draw(3, 4, 5)  # anything already there
    k, v = draw(3, 4, seed=1), draw(3, 5, seed=2)
    k = k / k.norm(dim=-1, keepdim=True)  # exactly unit length (l2_normalise keeps an epsilon)
    written = delta_rule_step(state, k, v, torch.ones(3, dtype=F64))
    torch.testing.assert_close((k[:, None, :] @ written)[:, 0], v, rtol=0, atol=1e-12)
    # linear attention's write, k v^T added, does not: it reads back v plus what was there
    added = state + k[:, :, None] * v[:, None, :]
    assert not torch.allclose((k[:, None, :] @ added)[:, 0], v, atol=1e-3)


def test_the_gated_step_without_decay_is_the_delta_rule_and_reads_the_new_state():
    state, q, k, v = draw(2, 3, 4, 5), draw(2, 3, 4, seed=1), l2_normalise(draw(2, 3, 4, seed=2)), draw(2, 3, 5, seed=3)
    beta = torch.rand(2, 3, generator=torch.Generator().manual_seed(4), dtype=F64)
    out, new = gated_delta_step(state, q, k, v, torch.ones(2, 3, dtype=F64), beta)
    torch.testing.assert_close(new, delta_rule_step(state, k, v, beta), rtol=0, atol=1e-12)
    torch.testing.assert_close(out, (q[..., None, :] @ new)[..., 0, :], rtol=0, atol=1e-12)


def test_the_decay_shrinks_the_state_before_the_error_is_read():
    state, k, v = draw(1, 1, 4, 3), l2_normalise(draw(1, 1, 4, seed=1)), draw(1, 1, 3, seed=2)
    alpha, beta = torch.full((1, 1), 0.5, dtype=F64), torch.full((1, 1), 0.25, dtype=F64)
    _, new = gated_delta_step(state, k, k, v, alpha, beta)
    decayed = alpha[..., None, None] * state
    error = v - (k[..., None, :] @ decayed)[..., 0, :]
    torch.testing.assert_close(new, decayed + beta * k[..., :, None] * error[..., None, :], rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# The recurrent and the chunked forms


@pytest.mark.parametrize("tokens", [1, 2, 63, 64, 65, 128, 150])
@pytest.mark.parametrize("chunk_size", [64, 16])
def test_the_chunked_form_equals_the_recurrent_one_outputs_and_state(tokens, chunk_size):
    q, k, v, g, beta = rule_inputs(tokens=tokens)
    one, state_one = recurrent_gated_delta_rule(q, k, v, g, beta)
    chunks, state_chunks = chunked_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size)
    torch.testing.assert_close(chunks, one, rtol=0, atol=1e-12)
    torch.testing.assert_close(state_chunks, state_one, rtol=0, atol=1e-12)


@pytest.mark.parametrize("strong_decay", [False, True])
def test_the_forms_agree_from_a_given_state_and_under_a_strong_decay(strong_decay):
    q, k, v, g, beta = rule_inputs(tokens=100, strong_decay=strong_decay)
    start = draw(2, 3, 8, 12, seed=9)
    one, state_one = recurrent_gated_delta_rule(q, k, v, g, beta, start)
    chunks, state_chunks = chunked_gated_delta_rule(q, k, v, g, beta, start)
    torch.testing.assert_close(chunks, one, rtol=0, atol=1e-12)
    torch.testing.assert_close(state_chunks, state_one, rtol=0, atol=1e-12)


def test_the_forms_have_the_same_gradients():
    inputs = [t.requires_grad_() for t in rule_inputs(tokens=70, d_k=4, d_v=5)]
    upstream = draw(2, 3, 70, 5, seed=7)
    grads = {}
    for name, rule in (("recurrent", recurrent_gated_delta_rule), ("chunked", chunked_gated_delta_rule)):
        out, state = rule(*inputs)
        grads[name] = torch.autograd.grad((out * upstream).sum() + state.sum(), inputs)
    for one, chunks in zip(grads["recurrent"], grads["chunked"]):
        torch.testing.assert_close(chunks, one, rtol=0, atol=1e-10)


def test_a_prompt_in_chunks_carries_its_state_exactly():
    q, k, v, g, beta = rule_inputs(tokens=90)
    whole, state = chunked_gated_delta_rule(q, k, v, g, beta)
    first, middle = chunked_gated_delta_rule(*(t[:, :, :37] for t in (q, k, v, g, beta)))
    second, end = chunked_gated_delta_rule(*(t[:, :, 37:] for t in (q, k, v, g, beta)), middle)
    torch.testing.assert_close(torch.cat([first, second], dim=2), whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(end, state, rtol=0, atol=1e-12)


def test_the_chunked_form_keeps_no_buffer_quadratic_in_the_length():
    """What autograd keeps for the backward doubles with the length: each chunk's (64, 64) blocks, not (T, T)."""
    def kept(tokens):
        inputs = [t.float().requires_grad_() for t in rule_inputs(batch=1, heads=1, tokens=tokens)]
        return saved_tensor_bytes(lambda: chunked_gated_delta_rule(*inputs)[0])
    assert kept(2048) / kept(1024) == pytest.approx(2.0, rel=0.05)


# ----------------------------------------------------------------------------------------------
# The layer and its cache


def layer(seed=0, **sizes):
    torch.manual_seed(seed)
    settings = dict(d_in=16, num_heads=4, num_key_heads=2, key_dim=8, value_dim=6)
    module = GatedDeltaNet(**{**settings, **sizes}).double().eval()
    with torch.no_grad():  # weights at a trained layer's scale, a norm that is not all ones
        for p in module.parameters():
            p.normal_(0.0, 0.4)
    return module


def test_the_layer_runs_chunked_or_recurrent_to_the_same_outputs():
    module, x = layer(), draw(2, 100, 16)
    with torch.no_grad():
        chunked = module(x)
        module.form = "recurrent"
        recurrent = module(x)
    assert chunked.shape == (2, 100, 16)
    torch.testing.assert_close(chunked, recurrent, rtol=0, atol=1e-12)


def test_decoding_token_by_token_equals_the_prompt_and_the_cache_does_not_grow():
    module, x = layer(), draw(2, 40, 16)
    with torch.no_grad():
        whole = module(x)
        cache, sizes, steps = KVCache(), [], []
        steps.append(module(x[:, :1], cache=cache))
        for t in range(1, 40):
            steps.append(module(x[:, t:t + 1], cache=cache))
            sizes.append(cache.nbytes)
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=0, atol=1e-12)
    conv_inputs = 2 * (2 * 2 * 8 + 4 * 6) * 3  # batch x channels x (conv_size - 1)
    state = 2 * 4 * 8 * 6  # batch x value heads x key_dim x value_dim
    assert set(sizes) == {(conv_inputs + state) * 8}  # float64
    assert len(cache) == 40 and set(cache.states) == {"conv_inputs", "state"} and not cache.tensors


@pytest.mark.parametrize("split", [1, 2, 3, 5, 64, 70])
def test_a_prompt_in_two_pieces_equals_the_whole(split):
    module, x = layer(), draw(2, 90, 16)
    with torch.no_grad():
        cache = KVCache()
        pieces = torch.cat([module(x[:, :split], cache=cache), module(x[:, split:], cache=cache)], dim=1)
        torch.testing.assert_close(pieces, module(x), rtol=0, atol=1e-12)


def test_a_left_padded_batch_equals_each_sequence_alone_and_pads_give_zero():
    module, lengths, total = layer(), [12, 7, 1], 12
    xs = [draw(1, n, 16, seed=i) for i, n in enumerate(lengths)]
    padded = torch.cat([torch.cat([torch.full((1, total - n, 16), 3.0, dtype=F64), x], dim=1)
                        for x, n in zip(xs, lengths)])
    mask = torch.tensor([[0] * (total - n) + [1] * n for n in lengths])
    more = draw(3, 4, 16, seed=9)  # then four decoded tokens each
    with torch.no_grad():
        cache = KVCache()
        out = module(padded, cache=cache, attention_mask=mask)
        steps = [module(more[:, t:t + 1], cache=cache, attention_mask=torch.cat([mask, torch.ones(3, t + 1, dtype=torch.long)], 1))
                 for t in range(4)]
        for i, (x, n) in enumerate(zip(xs, lengths)):
            alone_cache = KVCache()
            alone = module(x, cache=alone_cache)
            torch.testing.assert_close(out[i, total - n:], alone[0], rtol=0, atol=1e-12)
            alone_steps = [module(more[i:i + 1, t:t + 1], cache=alone_cache) for t in range(4)]
            torch.testing.assert_close(torch.cat(steps, 1)[i], torch.cat(alone_steps, 1)[0], rtol=0, atol=1e-12)
    assert out[2, :total - 1].abs().max() == 0  # padding gives 0


def test_the_cache_is_the_layers_and_a_deep_copy_continues_alike():
    module, x = layer(), draw(1, 10, 16)
    with torch.no_grad():
        cache = KVCache()
        module(x[:, :6], cache=cache)
        twin = copy.deepcopy(cache)
        torch.testing.assert_close(module(x[:, 6:], cache=twin), module(x[:, 6:], cache=cache), rtol=0, atol=0)
        with pytest.raises(ValueError, match="another layer"):
            layer(seed=1)(x[:, :1], cache=cache)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="num_key_heads"):
        GatedDeltaNet(16, num_heads=4, num_key_heads=3, key_dim=8, value_dim=6)
    with pytest.raises(ValueError, match="key_dim"):
        GatedDeltaNet(16, num_heads=4, num_key_heads=2, key_dim=0, value_dim=6)
    module = GatedDeltaNet(16, num_heads=4, num_key_heads=2, key_dim=8, value_dim=6)
    with pytest.raises(ValueError, match="form must be one of 'chunked', 'recurrent', got 'fast'"):
        module.form = "fast"
    with pytest.raises(ValueError, match="d_in=16"):
        module(torch.rand(1, 3, 8))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, cached \+ new positions\)"):
        module(torch.rand(1, 3, 16), attention_mask=torch.ones(1, 2, dtype=torch.long))
