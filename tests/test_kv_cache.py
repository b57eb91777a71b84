"""The KV cache: decoding with it gives exactly what recomputing the whole prefix gives; misuse is refused clearly."""

from __future__ import annotations

import copy

from itertools import pairwise

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import GroupedQueryAttention, KVCache, random_batch

TOL = dict(rtol=1e-5, atol=1e-6)
DIVISORS = {h: [g for g in range(1, h + 1) if h % g == 0] for h in range(1, 9)}


def _gqa(num_heads=4, num_kv_groups=2, head_dim=2, d_in=5, context_length=8, qkv_bias=False, dropout=0.0):
    return GroupedQueryAttention(d_in, num_heads * head_dim, context_length, dropout, num_heads, num_kv_groups,
                                 qkv_bias).eval()


@settings(max_examples=40, deadline=None)
@given(
    d_in=st.integers(1, 6),
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 8),
    group_index=st.integers(0, 3),
    batch=st.integers(1, 3),
    tokens=st.integers(1, 10),
    extra_context=st.integers(0, 3),
    qkv_bias=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_cached_decoding_equals_recomputing_the_prefix(d_in, head_dim, num_heads, group_index, batch, tokens,
                                                       extra_context, qkv_bias, seed, data):
    """Any split of a sequence into chunks (a prompt, then tokens one by one, or anything else)."""
    torch.manual_seed(seed)
    groups = DIVISORS[num_heads][group_index % len(DIVISORS[num_heads])]
    gqa = _gqa(num_heads, groups, head_dim, d_in, tokens + extra_context, qkv_bias)
    x = random_batch(batch, tokens, d_in, seed=seed)
    cuts = sorted(data.draw(st.sets(st.integers(1, tokens - 1)), label="cuts")) if tokens > 1 else []
    bounds = [0, *cuts, tokens]
    cache = KVCache()
    outputs = []
    for start, end in pairwise(bounds):
        out = gqa(x[:, start:end], cache=cache)
        recomputed = gqa(x[:, :end])  # the whole prefix, without a cache
        torch.testing.assert_close(out, recomputed[:, start:end], **TOL)
        assert len(cache) == end
        outputs.append(out)
    assert cache.keys.shape == cache.values.shape == (batch, groups, tokens, head_dim)
    torch.testing.assert_close(torch.cat(outputs, dim=1), gqa(x), **TOL)


def test_the_cache_holds_the_keys_and_values_of_every_position():
    gqa = _gqa()
    x = random_batch(2, 6, 5)
    cache = KVCache()
    for t in range(6):
        gqa(x[:, t : t + 1], cache=cache)
    expected_keys = gqa.W_key(x).view(2, 6, 2, 2).transpose(1, 2)  # (B, g, T, d_h)
    torch.testing.assert_close(cache.keys, expected_keys, **TOL)
    torch.testing.assert_close(cache.values, gqa.W_value(x).view(2, 6, 2, 2).transpose(1, 2), **TOL)


def test_the_cache_is_what_the_later_tokens_read():
    """Proof that the cache is used: corrupting it changes the next step's output."""
    gqa = _gqa()
    x = random_batch(1, 4, 5)
    cache = KVCache()
    gqa(x[:, :3], cache=cache)
    honest = gqa(x[:, 3:], cache=cache)
    cache.reset()
    gqa(x[:, :3], cache=cache)
    cache.values = cache.values + 1.0
    assert not torch.allclose(gqa(x[:, 3:], cache=cache), honest, atol=1e-4)


def test_reset_starts_a_new_sequence():
    gqa = _gqa(context_length=6)
    first, second = random_batch(2, 6, 5, seed=1), random_batch(3, 4, 5, seed=2)
    cache = KVCache()
    for t in range(6):
        gqa(first[:, t : t + 1], cache=cache)
    cache.reset()
    assert len(cache) == 0 and cache.keys is None and cache.values is None
    out = torch.cat([gqa(second[:, t : t + 1], cache=cache) for t in range(4)], dim=1)  # another batch size too
    torch.testing.assert_close(out, gqa(second), **TOL)
    assert repr(cache) == "KVCache(4 positions, batch=3, kv_heads=2, head_dim=2)"
    cache.reset()
    assert repr(cache) == "KVCache(empty)"


def test_without_a_cache_nothing_is_kept():
    gqa = _gqa()
    x = random_batch(1, 4, 5)
    torch.testing.assert_close(gqa(x, cache=None), gqa(x))


def test_a_position_past_context_length_is_refused():
    gqa = _gqa(context_length=5)
    x = random_batch(1, 5, 5)
    cache = KVCache()
    gqa(x[:, :4], cache=cache)
    with pytest.raises(ValueError, match=r"the cache holds 4 positions and x adds 2 more, 6 in all, but the module "
                                         r"was built with context_length=5.*cache\.reset\(\).*context_length>=6"):
        gqa(x[:, :2], cache=cache)
    assert len(cache) == 4  # the refused call changed nothing
    gqa(x[:, 4:5], cache=cache)  # exactly context_length is fine
    with pytest.raises(ValueError, match="the cache holds 5 positions and x adds 1 more"):
        gqa(x[:, :1], cache=cache)


def test_a_batch_size_mismatch_is_refused():
    gqa = _gqa()
    cache = KVCache()
    gqa(random_batch(2, 3, 5), cache=cache)
    with pytest.raises(ValueError, match=r"batch of 2 sequences, but the new tokens come in a batch of 3 "
                                         r"\(x\.shape\[0\]\).*cache\.reset\(\)"):
        gqa(random_batch(3, 1, 5), cache=cache)
    assert len(cache) == 3


def test_a_cache_shared_between_layers_is_refused():
    cache = KVCache()
    _gqa(num_kv_groups=2)(random_batch(1, 3, 5), cache=cache)  # a layer gone since
    with pytest.raises(ValueError, match=r"another layer \(one that no longer exists\), filled for 3 positions: "
                                         r"each attention layer needs its own KVCache\(\)"):
        _gqa(num_kv_groups=1)(random_batch(1, 1, 5), cache=cache)
    assert len(cache) == 3  # left as it was


def test_a_cache_filled_by_another_layer_of_the_same_shape_is_refused():
    """Same shapes, so nothing but the owner tells the layers apart: accepting it gave a wrong output."""
    torch.manual_seed(0)
    first, second = _gqa(num_kv_groups=2), _gqa(num_kv_groups=2)
    x = random_batch(1, 4, 5)
    cache = KVCache()
    first(x[:, :3], cache=cache)
    with pytest.raises(ValueError, match=r"another layer \(GroupedQueryAttention\).*each attention layer needs "
                                         r"its own KVCache\(\).*cache\.reset\(\)"):
        second(x[:, 3:], cache=cache)
    assert len(cache) == 3
    cache.reset()  # a new sequence: the cache may serve another layer
    second(x[:, :3], cache=cache)
    torch.testing.assert_close(second(x[:, 3:], cache=cache), second(x[:, :4])[:, 3:])


def test_a_cache_filled_with_gradients_on_can_be_deep_copied():
    """Keys computed with gradients are not graph leaves, which torch refuses to deepcopy by itself."""
    gqa = _gqa(num_kv_groups=2)
    x = random_batch(1, 4, 5)
    cache = KVCache()
    gqa(x[:, :3], cache=cache)
    assert cache.keys.requires_grad
    twin = copy.deepcopy(cache)
    assert len(twin) == 3 and not twin.keys.requires_grad
    assert torch.equal(twin.keys, cache.keys) and torch.equal(twin.values, cache.values)
    twin.keys.add_(1.0)  # its own tensors: the original is untouched
    assert not torch.equal(twin.keys, cache.keys)
    with torch.no_grad():  # the copy still serves the layer that filled it
        step = gqa(x[:, 3:], cache=copy.deepcopy(cache))
        torch.testing.assert_close(step, gqa(x[:, :4])[:, 3:])


def test_a_dtype_or_device_change_is_refused():
    gqa = _gqa()
    cache = KVCache()
    gqa(random_batch(1, 3, 5), cache=cache)
    with pytest.raises(TypeError, match=r"the cache holds torch\.float32 keys but the new keys are torch\.float64"
                                        r".*cache\.reset\(\)"):
        gqa.double()(random_batch(1, 1, 5).double(), cache=cache)
    with pytest.raises(ValueError, match=r"the cache is on cpu but the new keys are on meta.*cache\.reset\(\)"):
        gqa.to("meta")(torch.rand(1, 1, 5, device="meta", dtype=torch.float64), cache=cache)


def test_the_cache_argument_is_checked():
    with pytest.raises(TypeError, match=r"cache must be a KVCache or None, got dict\. Make one with KVCache\(\)"):
        _gqa()(random_batch(1, 2, 5), cache={})
    cache = KVCache()
    with pytest.raises(ValueError, match=r"keys must be a 4-D tensor \(batch, num_kv_groups, num_new, head_dim\), "
                                         r"got shape \(2, 3\)"):
        cache.append(torch.rand(2, 3), torch.rand(2, 3))
    with pytest.raises(ValueError, match=r"keys \(1, 2, 3, 4\) and values \(1, 2, 3, 5\) must have the same shape"):
        cache.append(torch.rand(1, 2, 3, 4), torch.rand(1, 2, 3, 5))
    assert len(cache) == 0


def test_cached_decoding_with_dropout_in_training_mode_runs():
    """Dropout acts on the weights over every visible position; the shapes stay right."""
    gqa = _gqa(dropout=0.5).train()
    cache = KVCache()
    out = torch.cat([gqa(random_batch(2, 1, 5, seed=t), cache=cache) for t in range(4)], dim=1)
    assert out.shape == (2, 4, 8) and torch.isfinite(out).all()


def test_a_used_cache_pickles_without_its_layer():
    """A weak reference cannot be pickled: the cache keeps its keys and values and forgets its owner."""
    import pickle

    gqa = _gqa(num_kv_groups=2)
    x = random_batch(1, 4, 5)
    cache = KVCache()
    with torch.no_grad():
        gqa(x[:, :3], cache=cache)
        twin = pickle.loads(pickle.dumps(cache))
        assert len(twin) == 3 and torch.equal(twin.keys, cache.keys) and twin._layer is None
        torch.testing.assert_close(gqa(x[:, 3:], cache=twin), gqa(x[:, :4])[:, 3:])
    assert len(pickle.loads(pickle.dumps(KVCache()))) == 0


def test_a_cache_copied_with_its_layer_belongs_to_the_copy():
    gqa = _gqa(num_kv_groups=2)
    x = random_batch(1, 4, 5)
    cache = KVCache()
    with torch.no_grad():
        gqa(x[:, :3], cache=cache)
        layer_twin, cache_twin = copy.deepcopy((gqa, cache))
        torch.testing.assert_close(layer_twin(x[:, 3:], cache=cache_twin), gqa(x[:, :4])[:, 3:])
        with pytest.raises(ValueError, match=r"another layer \(GroupedQueryAttention\)"):
            gqa(x[:, 3:], cache=cache_twin)  # the original no longer owns the copy


@pytest.mark.parametrize("move,message", [
    (lambda layer: layer.double(),
     r"another layer \(GroupedQueryAttention\), filled for 3 positions, in torch\.float32 on cpu, where this "
     r"layer's weights are torch\.float64 on cpu \(a copy of a layer moved with \.to\(\) is another layer"),
    (lambda layer: layer.to("meta"),
     r"another layer \(GroupedQueryAttention\), filled for 3 positions, in torch\.float32 on cpu, where this "
     r"layer's weights are torch\.float32 on meta"),
], ids=["dtype", "device"])
def test_a_moved_copy_of_the_layer_is_told_what_differs(move, message):
    gqa = _gqa(num_kv_groups=2)
    cache = KVCache()
    gqa(random_batch(1, 3, 5), cache=cache)
    twin = move(copy.deepcopy(gqa))
    x = torch.rand(1, 1, 5, dtype=twin.W_key.weight.dtype, device=twin.W_key.weight.device)
    with pytest.raises(ValueError, match=message):
        twin(x, cache=cache)
    assert len(cache) == 3


def test_nbytes_is_the_bytes_of_the_keys_and_values_held():
    gqa = _gqa(num_heads=4, num_kv_groups=2, head_dim=2)
    cache = KVCache()
    assert cache.nbytes == 0
    gqa(random_batch(3, 5, 5), cache=cache)
    assert cache.nbytes == 2 * 3 * 2 * 5 * 2 * 4  # keys and values: B x g x T x d_h float32 numbers
    gqa.double()
    cache64 = KVCache()
    gqa(random_batch(3, 5, 5).double(), cache=cache64)
    assert cache64.nbytes == 2 * cache.nbytes


def test_other_layers_keep_other_tensors_by_name():
    """A latent and a rotated key per token, as multi-head latent attention keeps them."""
    cache = KVCache()
    prompt = (torch.rand(2, 3, 16), torch.rand(2, 1, 3, 4))
    latent, rotated = cache.extend(latent=prompt[0], rotated_key=prompt[1])
    assert latent is prompt[0] and len(cache) == 3
    step = (torch.rand(2, 1, 16), torch.rand(2, 1, 1, 4))
    latent, rotated = cache.extend(latent=step[0], rotated_key=step[1])
    assert torch.equal(latent, torch.cat([prompt[0], step[0]], dim=1))
    assert torch.equal(rotated, torch.cat([prompt[1], step[1]], dim=2))
    assert len(cache) == 4 and cache.keys is None and cache.nbytes == 4 * 2 * 4 * (16 + 4)
    assert repr(cache) == "KVCache(4 positions, latent=(2, 4, 16), rotated_key=(2, 1, 4, 4))"
    twin = copy.deepcopy(cache)
    assert torch.equal(twin.tensors["latent"], latent) and twin.tensors["latent"] is not latent


def test_a_state_is_replaced_not_grown_and_counted_in_nbytes():
    cache = KVCache()
    cache.extend(inputs=torch.rand(1, 3, 6))
    cache.hold(state=torch.zeros(1, 2, 4, 4))
    cache.hold(state=torch.ones(1, 2, 4, 4))
    assert len(cache) == 3 and torch.equal(cache.states["state"], torch.ones(1, 2, 4, 4))
    assert cache.nbytes == (3 * 6 + 2 * 4 * 4) * 4
    with pytest.raises(ValueError, match=r"the cache holds state of shape \(1, 2, 4, 4\), the new state is of shape "
                                         r"\(1, 2, 4, 5\)"):
        cache.hold(state=torch.ones(1, 2, 4, 5))
    with pytest.raises(TypeError, match=r"the cache holds torch\.float32 state but the new state is torch\.float64"):
        cache.hold(state=torch.ones(1, 2, 4, 4, dtype=torch.float64))
    twin = copy.deepcopy(cache)
    assert torch.equal(twin.states["state"], cache.states["state"]) and twin.states["state"] is not cache.states["state"]
    cache.reset()
    assert cache.nbytes == 0 and repr(cache) == "KVCache(empty)"


def test_tensors_that_do_not_fit_are_refused_before_anything_changes():
    cache = KVCache()
    cache.extend(latent=torch.rand(2, 3, 16), rotated_key=torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match=r"the cache holds latent, rotated_key, and the new tokens bring keys, values: "
                                         r"the cache was filled by another kind of layer"):
        cache.append(torch.rand(2, 1, 1, 4), torch.rand(2, 1, 1, 4))
    with pytest.raises(ValueError, match=r"the new tensors must hold the same number of tokens .*"
                                         r"\{'latent': 1, 'rotated_key': 2\}"):
        cache.extend(latent=torch.rand(2, 1, 16), rotated_key=torch.rand(2, 2, 4))
    with pytest.raises(ValueError, match=r"the cache holds latent of shape \(2, 3, 16\), the new latent is of shape "
                                         r"\(2, 1, 8\)"):
        cache.extend(latent=torch.rand(2, 1, 8), rotated_key=torch.rand(2, 1, 4))
    with pytest.raises(ValueError, match=r"the cache holds rotated_key for a batch of 2 sequences"):
        cache.extend(latent=torch.rand(2, 1, 16), rotated_key=torch.rand(1, 1, 4))
    with pytest.raises(ValueError, match=r"latent must be a tensor \(batch, \.\.\., num_new, width\), got shape \(2,\)"):
        cache.extend(latent=torch.rand(2), rotated_key=torch.rand(2, 1, 4))
    assert len(cache) == 3 and cache.tensors["latent"].shape == (2, 3, 16)  # nothing changed


def test_a_sliding_cache_stops_growing_and_still_counts_every_position():
    """slide(window): after any split of a sequence the cache holds its last window - 1 positions, in
    order; what each call returns is what the new tokens' queries may read; nbytes stops growing."""
    keys = torch.arange(20.0).view(1, 1, 20, 1).expand(2, 3, 20, 4)
    for window, cuts in ((4, [0, 5, 6, 7, 12, 20]), (1, [0, 3, 4, 20]), (8, [0, 2, 20]), (30, [0, 20])):
        cache, sizes = KVCache(), []
        for start, end in zip(cuts, cuts[1:]):
            held_before = cache.held
            got_keys, got_values = cache.slide(window, keys=keys[:, :, start:end], values=-keys[:, :, start:end])
            assert torch.equal(got_keys, keys[:, :, start - held_before:end])  # the held ones, then the new
            assert torch.equal(got_values, -got_keys)
            assert len(cache) == end and cache.held == min(end, window - 1) and cache.dropped == end - cache.held
            assert torch.equal(cache.keys, keys[:, :, end - cache.held:end])
            sizes.append(cache.nbytes)
        assert max(sizes) == 2 * 2 * 3 * min(20, window - 1) * 4 * 4


def test_a_sliding_cache_copies_its_rows_so_older_ones_are_freed():
    cache = KVCache()
    big = torch.rand(1, 1, 100, 4)
    cache.slide(3, keys=big, values=big.clone())
    assert cache.keys.untyped_storage().nbytes() == 2 * 4 * 4  # not a view of the 100 rows


def test_a_sliding_cache_survives_copies_pickles_and_reset():
    import pickle

    cache = KVCache()
    for _ in range(5):
        cache.slide(2, keys=torch.rand(1, 1, 1, 4), values=torch.rand(1, 1, 1, 4))
    for twin in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert (len(twin), twin.held, twin.dropped) == (5, 1, 4)
    assert repr(cache) == "KVCache(5 positions, the last 1 held, batch=1, kv_heads=1, head_dim=4)"
    cache.reset()
    assert (len(cache), cache.held, cache.dropped) == (0, 0, 0)


@pytest.mark.parametrize("window", [0, -2, 2.5, True])
def test_a_sliding_cache_refuses_a_window_that_is_not_a_positive_integer(window):
    with pytest.raises((ValueError, TypeError), match=r"window must be a positive integer.*how many positions "
                                                      r"a token sees"):
        KVCache().slide(window, keys=torch.rand(1, 1, 1, 4), values=torch.rand(1, 1, 1, 4))
