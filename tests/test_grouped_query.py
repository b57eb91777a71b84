"""Grouped-query attention: multi-head at one end, multi-query at the other, and mean-pooled from a trained module."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CUDA
from mha_course import (FastMultiHeadAttention, GroupedQueryAttention, KVCache, MultiHeadAttention, MultiHeadAttentionWrapper,
                        causal_mask, random_batch)
from mha_course.cost import count_parameters

TOL = dict(rtol=1e-5, atol=1e-6)
DIVISORS = {h: [g for g in range(1, h + 1) if h % g == 0] for h in range(1, 9)}


@torch.no_grad()
def expanded_multihead(gqa: GroupedQueryAttention) -> MultiHeadAttention:
    """The MultiHeadAttention that gives every query head its own copy of its group's key/value head.

    Written here independently of the module: key head ``g`` becomes key heads ``g*r .. g*r + r - 1``.
    """
    mha = MultiHeadAttention(gqa.d_in, gqa.d_out, gqa.context_length, gqa.dropout.p, gqa.num_heads,
                             qkv_bias=gqa.W_query.bias is not None)
    mha.W_query.load_state_dict(gqa.W_query.state_dict())
    mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    r = gqa.num_heads // gqa.num_kv_groups
    for role in ("W_key", "W_value"):
        source, target = getattr(gqa, role), getattr(mha, role)
        heads = source.weight.view(gqa.num_kv_groups, gqa.head_dim, gqa.d_in)
        target.weight.copy_(torch.stack([heads[h // r] for h in range(gqa.num_heads)]).view(gqa.d_out, gqa.d_in))
        if source.bias is not None:
            biases = source.bias.view(gqa.num_kv_groups, gqa.head_dim)
            target.bias.copy_(torch.stack([biases[h // r] for h in range(gqa.num_heads)]).view(gqa.d_out))
    return mha.train(gqa.training)


@settings(max_examples=25, deadline=None)
@given(
    d_in=st.integers(1, 6),
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 8),
    group_index=st.integers(0, 3),
    tokens=st.integers(1, 7),
    qkv_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_each_group_serves_its_consecutive_query_heads(d_in, head_dim, num_heads, group_index, tokens, qkv_bias, seed):
    """Group g's key/value head serves query heads g*r .. g*r+r-1 (repeat_interleave, not repeat)."""
    torch.manual_seed(seed)
    groups = DIVISORS[num_heads][group_index % len(DIVISORS[num_heads])]
    gqa = GroupedQueryAttention(d_in, num_heads * head_dim, 7, 0.0, num_heads, groups, qkv_bias).eval()
    mha = expanded_multihead(gqa).eval()
    x = random_batch(2, tokens, d_in, seed=seed)
    torch.testing.assert_close(gqa(x), mha(x), **TOL)
    torch.testing.assert_close(gqa.attention_weights(x), mha.attention_weights(x), **TOL)


def test_the_group_order_matters():
    """Pairing the heads the other way round (repeat instead of repeat_interleave) gives other outputs."""
    gqa = GroupedQueryAttention(4, 8, 6, 0.0, num_heads=4, num_kv_groups=2).eval()
    mha = expanded_multihead(gqa)
    with torch.no_grad():  # key heads in the order g0 g1 g0 g1, as repeat would give
        heads = mha.W_key.weight.view(4, 2, 4)
        mha.W_key.weight.copy_(heads[[0, 2, 1, 3]].reshape(8, 4))
    x = random_batch(2, 6, 4)
    assert not torch.allclose(gqa(x), mha.eval()(x), atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(
    d_in=st.integers(1, 6),
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 6),
    tokens=st.integers(1, 7),
    qkv_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_as_many_groups_as_heads_is_multi_head_attention(d_in, head_dim, num_heads, tokens, qkv_bias, seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_in, num_heads * head_dim, 7, 0.0, num_heads, qkv_bias).eval()
    gqa = GroupedQueryAttention.from_multihead(mha, num_kv_groups=num_heads)
    x = random_batch(2, tokens, d_in, seed=seed)
    torch.testing.assert_close(gqa(x), mha(x), **TOL)
    torch.testing.assert_close(gqa.attention_weights(x), mha.attention_weights(x), **TOL)
    assert count_parameters(gqa) == count_parameters(mha)
    for name, tensor in mha.state_dict().items():  # the same weights, one for one (and no mask buffer)
        assert name == "mask" or torch.equal(gqa.state_dict()[name], tensor), name
    assert "mask" not in gqa.state_dict()


def test_one_group_is_multi_query_attention():
    mqa = GroupedQueryAttention(8, 12, 6, 0.0, num_heads=4, num_kv_groups=1)
    assert mqa.W_query.weight.shape == (12, 8)
    assert mqa.W_key.weight.shape == mqa.W_value.weight.shape == (3, 8)  # one key head of width d_h = 3
    mha = MultiHeadAttention(8, 12, 6, 0.0, num_heads=4)
    assert count_parameters(mha) - count_parameters(mqa) == 2 * (12 - 3) * 8


def test_from_multihead_mean_pools_the_key_and_value_heads_of_each_group():
    mha = MultiHeadAttention(5, 12, 6, 0.25, num_heads=6, qkv_bias=True).double().eval()
    gqa = GroupedQueryAttention.from_multihead(mha, num_kv_groups=2)
    assert gqa.W_key.weight.dtype == torch.float64 and gqa.dropout.p == 0.25 and not gqa.training
    key_heads = mha.W_key.weight.view(6, 2, 5)  # (h, d_h, d_in)
    for g in range(2):  # group g = query heads 3g, 3g+1, 3g+2
        expected = key_heads[3 * g : 3 * g + 3].mean(0)
        torch.testing.assert_close(gqa.W_key.weight.view(2, 2, 5)[g], expected)
        expected_bias = mha.W_value.bias.view(6, 2)[3 * g : 3 * g + 3].mean(0)
        torch.testing.assert_close(gqa.W_value.bias.view(2, 2)[g], expected_bias)
    assert torch.equal(gqa.W_query.weight, mha.W_query.weight) and torch.equal(gqa.out_proj.weight, mha.out_proj.weight)


def test_from_multihead_recovers_a_module_whose_heads_already_agree_within_groups():
    gqa = GroupedQueryAttention(4, 8, 6, 0.0, num_heads=4, num_kv_groups=2, qkv_bias=True).eval()
    back = GroupedQueryAttention.from_multihead(expanded_multihead(gqa), num_kv_groups=2)
    x = random_batch(2, 6, 4)
    torch.testing.assert_close(back(x), gqa(x), **TOL)


def test_from_multihead_follows_the_training_mode():
    mha = MultiHeadAttention(4, 8, 6, 0.1, num_heads=4).train()
    assert GroupedQueryAttention.from_multihead(mha, 2).training


def test_num_kv_groups_must_divide_num_heads():
    with pytest.raises(ValueError, match=r"num_kv_groups \(3\) must divide num_heads \(8\).*among 1, 2, 4, 8 "
                                         r"\(the divisors of 8\): 8 is multi-head attention, 1 is multi-query"):
        GroupedQueryAttention(8, 16, 6, 0.0, num_heads=8, num_kv_groups=3)
    with pytest.raises(ValueError, match=r"num_kv_groups \(4\) must divide num_heads \(2\)"):
        GroupedQueryAttention(8, 4, 6, 0.0, num_heads=2, num_kv_groups=4)
    with pytest.raises(ValueError, match="num_kv_groups must be a positive integer, got 0"):
        GroupedQueryAttention(8, 4, 6, 0.0, num_heads=2, num_kv_groups=0)
    with pytest.raises(TypeError, match=r"num_kv_groups must be a positive integer, got 2\.0"):
        GroupedQueryAttention(8, 4, 6, 0.0, num_heads=2, num_kv_groups=2.0)
    with pytest.raises(ValueError, match=r"num_kv_groups \(3\) must divide num_heads \(4\)"):
        GroupedQueryAttention.from_multihead(MultiHeadAttention(8, 8, 6, 0.0, 4), num_kv_groups=3)


@pytest.mark.parametrize("source, hint", [
    ("gqa", r"got GroupedQueryAttention\. It already shares key/value heads; build a new GroupedQueryAttention"),
    ("wrapper", r"got MultiHeadAttentionWrapper\. Convert it first: GroupedQueryAttention\.from_multihead\("
                r"MultiHeadAttention\.from_wrapper\(wrapper\), num_kv_groups\)"),
    ("fast", r"got FastMultiHeadAttention\. Convert it first: GroupedQueryAttention\.from_multihead\("
             r"MultiHeadAttention\.from_fast\(fast\), num_kv_groups\)"),
])
def test_from_multihead_refuses_another_module_with_the_hint_that_fits(source, hint):
    """A GroupedQueryAttention is not converted by from_wrapper or from_fast: the hint says what is."""
    module = {"gqa": GroupedQueryAttention(8, 8, 6, 0.0, 4, 2), "wrapper": MultiHeadAttentionWrapper(8, 2, 6, 0.0, 4),
              "fast": FastMultiHeadAttention(8, 8, 6, 0.0, 4)}[source]
    with pytest.raises(TypeError, match=r"mha must be a MultiHeadAttention, " + hint) as raised:
        GroupedQueryAttention.from_multihead(module, num_kv_groups=2)
    if source == "gqa":
        assert "from_wrapper" not in str(raised.value) and "from_fast" not in str(raised.value)


@CUDA
def test_runs_on_cuda_with_a_cache():
    from mha_course import KVCache

    gqa = GroupedQueryAttention(4, 8, 6, 0.0, num_heads=4, num_kv_groups=2).eval()
    x = random_batch(2, 6, 4)
    expected = gqa(x)
    gqa = gqa.cuda()
    cache = KVCache()
    out = torch.cat([gqa(x[:, :4].cuda(), cache=cache), gqa(x[:, 4:].cuda(), cache=cache)], dim=1)
    assert out.is_cuda and cache.keys.is_cuda
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# The fused kernel and the explicit path: the same numbers


def _paths(num_heads=4, num_kv_groups=2, rope=None, dropout=0.0, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    fused = GroupedQueryAttention(6, 8, 12, dropout, num_heads, num_kv_groups, qkv_bias=True,
                                  rope_theta=rope).to(dtype).eval()
    explicit = copy.deepcopy(fused)
    explicit.use_sdpa = False
    return fused, explicit


def _both(fused, explicit, run):
    """``run(module)`` on both paths, with the gradients of the input and of every parameter."""
    results = []
    for module in (fused, explicit):
        module.zero_grad()
        out, x = run(module)
        out.backward(torch.ones_like(out).normal_(generator=torch.Generator().manual_seed(3)))
        results.append((out.detach(), x.grad, {n: p.grad for n, p in module.named_parameters()}))
    return results


PATH_CASES = [(4, 4, None), (4, 2, None), (4, 1, None), (4, 2, 100.0), (2, 1, 10000.0)]


@pytest.mark.parametrize("num_heads,num_kv_groups,rope", PATH_CASES)
@pytest.mark.parametrize("case", ["prompt", "decoding", "chunked", "left-padded", "padded-decoding"])
def test_the_fused_and_the_explicit_paths_agree_values_and_gradients(num_heads, num_kv_groups, rope, case):
    """A prompt (is_causal), decoding token by token (no mask), a chunk of several new tokens after a
    cache (the rows of the causal mask), and left-padded batches with and without a cache."""
    fused, explicit = _paths(num_heads, num_kv_groups, rope)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 6, generator=g, dtype=torch.float64)
    real = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1], [0] * 6 + [1]])
    positions = (real.cumsum(-1) - 1).clamp(min=0)

    def run(module):
        leaf = x.clone().requires_grad_()
        if case == "prompt":
            return module(leaf), leaf
        cache, outputs = KVCache(), []
        if case == "decoding":  # three tokens, then one at a time
            outputs.append(module(leaf[:, :3], cache=cache))
            outputs += [module(leaf[:, t:t + 1], cache=cache) for t in range(3, 7)]
        elif case == "chunked":  # a prompt in chunks of 3, 2 and 2
            outputs += [module(leaf[:, a:b], cache=cache) for a, b in ((0, 3), (3, 5), (5, 7))]
        elif case == "left-padded":
            outputs.append(module(leaf, attention_mask=real, position_ids=positions))
        else:  # padded-decoding: the prompt padded, then two tokens decoded with the mask growing
            outputs.append(module(leaf[:, :5], cache=cache, attention_mask=real[:, :5],
                                  position_ids=positions[:, :5]))
            for t in (5, 6):
                outputs.append(module(leaf[:, t:t + 1], cache=cache, attention_mask=real[:, :t + 1],
                                      position_ids=positions[:, t:t + 1]))
        return torch.cat(outputs, dim=1), leaf

    (out_f, dx_f, grads_f), (out_e, dx_e, grads_e) = _both(fused, explicit, run)
    torch.testing.assert_close(out_f, out_e, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dx_f, dx_e, rtol=1e-10, atol=1e-10)
    for name, grad in grads_f.items():
        torch.testing.assert_close(grad, grads_e[name], rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("num_heads,num_kv_groups", [(4, 4), (4, 2), (4, 1)])
def test_in_float32_the_paths_agree_to_rounding(num_heads, num_kv_groups):
    fused, explicit = _paths(num_heads, num_kv_groups, rope=10000.0, dtype=torch.float32)
    x = torch.randn(2, 9, 6)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), explicit(x), rtol=1e-5, atol=1e-6)


def test_the_fused_path_is_the_default_and_the_switch_is_per_module():
    fused, explicit = _paths()
    assert GroupedQueryAttention.use_sdpa and fused.use_sdpa and not explicit.use_sdpa


def test_the_fused_path_copies_no_key_or_value_head():
    """With ``enable_gqa`` the kernel reads the shared heads where they are: no ``repeat_interleave``."""
    fused, explicit = _paths(4, 2)
    seen = []
    with _Recorder(seen):
        fused(torch.randn(1, 5, 6, dtype=torch.float64))
    assert "repeat_interleave" not in seen and "scaled_dot_product_attention" in seen
    seen.clear()
    with _Recorder(seen):
        explicit(torch.randn(1, 5, 6, dtype=torch.float64))
    assert "repeat_interleave" in seen and "scaled_dot_product_attention" not in seen


class _Recorder(torch.overrides.TorchFunctionMode):
    """Records the name of every torch function called while it is active."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_dropout_runs_in_the_kernel_in_training_and_not_in_eval():
    fused, _ = _paths(dropout=0.5, dtype=torch.float32)
    x = torch.randn(2, 6, 6)
    with torch.no_grad():
        assert torch.equal(fused.eval()(x), fused(x))
        fused.train()
        assert not torch.allclose(fused(x), fused(x))


def test_a_multihead_state_dict_loads_and_its_mask_is_checked_then_dropped():
    """The module keeps no mask, yet MultiHeadAttention's state dict loads into it strictly (chapter 6):
    its causal mask is checked and dropped, and a mask that is not causal is refused."""
    mha = MultiHeadAttention(8, 8, 6, 0.0, 4).eval()
    gqa = GroupedQueryAttention(8, 8, 6, 0.0, 4, 4).eval()
    loaded = gqa.load_state_dict(mha.state_dict())
    assert not loaded.missing_keys and not loaded.unexpected_keys and "mask" not in gqa.state_dict()
    x = random_batch(2, 6, 8)
    torch.testing.assert_close(gqa(x), mha(x))
    for bad in (torch.zeros(6, 6, dtype=torch.bool), causal_mask(7)):
        with pytest.raises(RuntimeError, match=r"mask: (the loaded mask is not the causal pattern|the state dict "
                                               r"was saved from a module with context_length=7)"):
            gqa.load_state_dict({**mha.state_dict(), "mask": bad})


@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("tokens", [0, 1, 4])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("window", [None, 2])
def test_call_mask_is_none_only_where_the_kernel_needs_none(start, tokens, padded, window):
    """A prompt and one new token need no mask (is_causal, or every key seen); everything else gets
    the causal rows of the new tokens, with the window and the padding."""
    from mha_course.attention.masking import call_mask, causal_mask, with_padding

    x = torch.zeros(2, tokens, 4)
    attention_mask = None
    if padded:  # the first sequence left-padded by one position
        attention_mask = torch.ones(2, start + tokens, dtype=torch.long)
        attention_mask[0, :1] = 0
    mask = call_mask(x, start, window, attention_mask)
    if not padded and window is None and (start == 0 or tokens <= 1):
        assert mask is None
    else:
        expected = with_padding(causal_mask(tokens, start=start, window=window), attention_mask, 2,
                                start + tokens)
        assert mask is not None and torch.equal(mask, expected)
