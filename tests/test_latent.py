"""Multi-head latent attention on its own: causal, cached decoding equal to the whole prompt with and
without absorption, a cache of the latent and the rotated key only (and its exact ``nbytes``), padded
batches equal to each sequence alone, a fully masked query giving 0, and arguments refused clearly.

The equality with transformers' ``DeepseekV3Attention`` is in ``tests/test_deepseek_interop.py``.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import KVCache, MultiHeadLatentAttention, random_batch, yarn_softmax_scale

TOL = dict(rtol=1e-5, atol=2e-6)
SIZES = dict(num_heads=4, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3)


def mla(d_in=8, context_length=12, dropout=0.0, seed=0, absorb=False, **settings):
    """A module with every weight redrawn (norms and biases included, so that a dropped one shows)."""
    torch.manual_seed(seed)
    module = MultiHeadLatentAttention(d_in, context_length, dropout, **{**SIZES, **settings})
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if "norm" in name or name == "W_query.1.weight"
                    else torch.randn_like(p) * 0.5)
    module.absorb = absorb
    return module.eval()


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 9), batch=st.integers(1, 3), q_lora=st.sampled_from([None, 5]),
       bias=st.booleans(), absorb=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_cached_decoding_equals_the_whole_prompt(tokens, batch, q_lora, bias, absorb, seed, data):
    """Any split of a sequence into chunks: a prompt, then tokens one by one, or anything else."""
    module = mla(seed=seed, q_lora_rank=q_lora, bias=bias, absorb=absorb)
    x = random_batch(batch, tokens, 8, seed=seed)
    cuts = sorted(data.draw(st.sets(st.integers(1, tokens - 1)), label="cuts")) if tokens > 1 else []
    cache = KVCache()
    with torch.no_grad():
        whole = module(x)
        pieces = [module(x[:, start:end], cache=cache) for start, end in pairwise([0, *cuts, tokens])]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **TOL)
    assert len(cache) == tokens


def test_absorbed_and_expanded_compute_the_same_function():
    module = mla(q_lora_rank=5, bias=True)
    x = random_batch(2, 9, 8)
    expanded = module(x)
    module.absorb = True
    torch.testing.assert_close(module(x), expanded, **TOL)


def test_the_cache_holds_the_latent_and_the_rotated_key_only():
    module = mla()
    x = random_batch(2, 5, 8)
    cache = KVCache()
    with torch.no_grad():
        module(x[:, :3], cache=cache)
        module(x[:, 3:], cache=cache)
    assert set(cache.tensors) == {"latent", "rotated_key"} and not cache.states
    assert cache.tensors["latent"].shape == (2, 5, 6) and cache.tensors["rotated_key"].shape == (2, 1, 5, 2)
    torch.testing.assert_close(cache.tensors["latent"], module.kv_norm(module.W_latent(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("absorb", [False, True])
def test_nbytes_is_batch_times_tokens_times_latent_and_rotary_dims_times_element_size(dtype, absorb):
    module = mla(absorb=absorb, kv_lora_rank=10, qk_rope_head_dim=4).to(dtype)
    batch, tokens = 3, 7
    cache = KVCache()
    with torch.no_grad():
        module(random_batch(batch, 4, 8).to(dtype), cache=cache)
        for t in range(tokens - 4):
            module(random_batch(batch, 1, 8, seed=t).to(dtype), cache=cache)
    element = torch.empty((), dtype=dtype).element_size()
    assert cache.nbytes == batch * tokens * (10 + 4) * element


def test_the_cache_is_what_the_later_tokens_read():
    """Corrupting the cached latent changes the next step, in both forms."""
    for absorb in (False, True):
        module = mla(absorb=absorb)
        x = random_batch(1, 4, 8)
        cache = KVCache()
        with torch.no_grad():
            module(x[:, :3], cache=cache)
            honest = module(x[:, 3:], cache=copy_of(cache))
            cache.tensors["latent"] = cache.tensors["latent"] + 1.0
            assert not torch.allclose(module(x[:, 3:], cache=cache), honest, atol=1e-3)


def copy_of(cache: KVCache) -> KVCache:
    import copy

    return copy.deepcopy(cache)


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(2, 8), t=st.integers(0, 7), absorb=st.booleans(), seed=st.integers(0, 2**16))
def test_future_tokens_never_change_the_past(tokens, t, absorb, seed):
    t = t % (tokens - 1)
    module = mla(seed=seed, absorb=absorb)
    x = random_batch(1, tokens, 8, seed=seed)
    changed = x.clone()
    changed[:, t + 1:] = random_batch(1, tokens - t - 1, 8, seed=seed + 1)
    with torch.no_grad():
        torch.testing.assert_close(module(changed)[:, :t + 1], module(x)[:, :t + 1], **TOL)


@pytest.mark.parametrize("absorb", [False, True])
def test_a_left_padded_batch_equals_each_sequence_alone_prompt_and_decoding(absorb):
    module = mla(absorb=absorb)
    long, short = random_batch(1, 6, 8, seed=1), random_batch(1, 4, 8, seed=2)
    x = torch.cat([long, torch.cat([torch.zeros(1, 2, 8), short], dim=1)])  # (2, 6, d): short padded left
    real = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    cache = KVCache()
    with torch.no_grad():
        prompt = module(x[:, :4], cache=cache, attention_mask=real[:, :4], position_ids=positions[:, :4])
        steps = [module(x[:, t:t + 1], cache=cache, attention_mask=real[:, :t + 1], position_ids=positions[:, t:t + 1])
                 for t in (4, 5)]
        batched = torch.cat([prompt, *steps], dim=1)
        torch.testing.assert_close(batched[0], module(long)[0], **TOL)
        torch.testing.assert_close(batched[1, 2:], module(short)[0], **TOL)


def test_a_query_that_sees_no_key_gets_a_context_of_zero_and_no_nan():
    """A padded query at the start of a left-padded sequence: weights 0, output = out_proj's bias."""
    module = mla(bias=True)
    x = random_batch(1, 3, 8).requires_grad_()
    real = torch.tensor([[0, 1, 1]])
    out = module(x, attention_mask=real)
    torch.testing.assert_close(out[0, 0], module.out_proj.bias, **TOL)
    weights = torch.ones(1)  # the row of the padded query in the weights is all 0
    with torch.no_grad():
        hooked = []
        handle = module.dropout.register_forward_hook(lambda _m, args, _o: hooked.append(args[0]))
        module(x, attention_mask=real)
        handle.remove()
        weights = hooked[0]
    assert torch.equal(weights[0, :, 0], torch.zeros_like(weights[0, :, 0]))
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in module.parameters())


def test_attention_weights_are_causal_rows_that_sum_to_one():
    module = mla()
    weights = module.attention_weights(random_batch(2, 5, 8))
    assert weights.shape == (2, 4, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_the_state_dict_round_trip_keeps_the_function():
    module, twin = mla(seed=0), mla(seed=1)
    twin.load_state_dict(module.state_dict())
    x = random_batch(2, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), module(x))


def test_yarn_softmax_scale():
    assert yarn_softmax_scale(192) == 192**-0.5
    assert yarn_softmax_scale(192, factor=1.0, mscale_all_dim=1.0) == 192**-0.5  # no stretch, no correction
    assert yarn_softmax_scale(192, factor=40.0, mscale_all_dim=0.0) == 192**-0.5
    m = 0.1 * torch.log(torch.tensor(40.0, dtype=torch.float64)).item() + 1
    assert yarn_softmax_scale(192, factor=40.0, mscale_all_dim=1.0) == pytest.approx(m * m / 192**0.5, rel=1e-12)


@pytest.mark.parametrize("change,message", [
    (dict(qk_rope_head_dim=3), r"qk_rope_head_dim must be even, got 3: rotary embeddings turn its numbers in "
                               r"pairs\. Choose e\.g\. qk_rope_head_dim=2 or 4\."),
    (dict(kv_lora_rank=0), r"kv_lora_rank must be a positive integer, got 0"),
    (dict(num_heads=1.5), r"num_heads must be a positive integer, got 1\.5"),
    (dict(q_lora_rank=-2), r"q_lora_rank must be a positive integer, got -2.*Pass None for a full-rank query"),
    (dict(softmax_scale=0.0), r"softmax_scale must be a positive number .* got 0\.0"),
    (dict(dropout=1.5), r"dropout"),
], ids=["odd-rope", "rank", "heads", "q-rank", "scale", "dropout"])
def test_bad_arguments_are_refused_by_name(change, message):
    with pytest.raises((ValueError, TypeError), match=message):
        MultiHeadLatentAttention(8, 12, **{"dropout": 0.0, **SIZES, **change})


def test_bad_input_and_misuse_of_the_cache_are_refused():
    module = mla(context_length=5)
    with pytest.raises(ValueError, match=r"x has 6 features per token .* d_in=8"):
        module(torch.rand(1, 3, 6))
    cache = KVCache()
    module(random_batch(1, 4, 8), cache=cache)
    with pytest.raises(ValueError, match=r"the cache holds 4 positions and x adds 2 more, 6 in all"):
        module(random_batch(1, 2, 8), cache=cache)
    with pytest.raises(ValueError, match=r"another layer \(MultiHeadLatentAttention\)"):
        mla(context_length=5)(random_batch(1, 1, 8), cache=cache)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, cached \+ new positions\) = "
                                         r"\(1, 5\)"):
        module(random_batch(1, 1, 8), cache=cache, attention_mask=torch.ones(1, 1, dtype=torch.long))
    assert len(cache) == 4


@pytest.mark.parametrize("q_lora_rank", [None, 5])
@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
def test_the_products_torch_counts_are_the_cost_formulas(absorb, q_lora_rank):
    """FLOPs counted by torch, prompt and one decoded token: absorbed, no latent is ever expanded."""
    from torch.utils.flop_counter import FlopCounterMode

    from mha_course.cost import latent_multiply_adds

    module = mla(q_lora_rank=q_lora_rank, absorb=absorb)
    cache = KVCache()
    sizes = dict(d_in=8, **SIZES, q_lora_rank=q_lora_rank, absorb=absorb)
    with torch.no_grad():
        for num_cached, num_new in ((0, 7), (7, 1)):
            with FlopCounterMode(display=False) as counter:
                module(random_batch(2, num_new, 8, seed=num_cached), cache=cache)
            expected = latent_multiply_adds(2, num_new, num_cached=num_cached, **sizes)
            assert counter.get_total_flops() == 2 * expected.total
