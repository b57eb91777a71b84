"""Sliding windows and sinks in the course's GroupedQueryAttention (chapter 11).

Key ``j`` is visible from query ``i`` when ``0 <= i - j < window``. The mask of a call holds the rows of
its new tokens and only the columns some row can see; the module's fused path (``scaled_dot_product_attention``)
and its explicit path agree with each other and with attention under a mask written out from that rule, for
a prompt, for decoding past the window with a cache that stops growing, for a prompt in pieces, for a
left-padded batch, and in their gradients. Sinks add a column of the softmax with no value.
"""

from __future__ import annotations

import pytest
import torch

from mha_course import GroupedQueryAttention, KVCache, causal_mask, with_padding
from mha_course.attention.heads import merge_heads, split_heads


def rule(num_queries: int, start: int, num_keys_from: int, window: int | None) -> torch.Tensor:
    """True where hidden, by the rule itself: queries at start.., keys at num_keys_from.."""
    q = torch.arange(start, start + num_queries)[:, None]
    k = torch.arange(num_keys_from, start + num_queries)
    back = q - k
    visible = (back >= 0) & ((back < window) if window is not None else True)
    return ~visible


@pytest.mark.parametrize("start", [0, 1, 3, 7, 20])
@pytest.mark.parametrize("window", [None, 1, 2, 4, 9, 50])
@pytest.mark.parametrize("num_tokens", [0, 1, 5])
def test_the_window_mask_is_the_rule_and_leaves_out_the_columns_no_row_sees(num_tokens, window, start):
    mask = causal_mask(num_tokens, start=start, window=window)
    first = 0 if window is None else max(0, start - window + 1)
    assert mask.shape == (num_tokens, start + num_tokens - first)
    assert torch.equal(mask, rule(num_tokens, start, first, window))
    if num_tokens and first:  # the first column kept is seen by the first row: none kept in vain
        assert not mask[0, 0]


def test_a_window_as_long_as_the_sequence_is_the_causal_mask():
    assert torch.equal(causal_mask(6, window=6), causal_mask(6))
    assert torch.equal(causal_mask(6, window=100), causal_mask(6))
    assert not torch.equal(causal_mask(6, window=5), causal_mask(6))  # the last row loses the first key


@pytest.mark.parametrize("window", [0, -3, 2.0, True, "4"])
def test_a_window_that_is_not_a_positive_integer_is_refused_by_name(window):
    with pytest.raises((TypeError, ValueError), match=r"window must be a positive integer.*positions a query sees"):
        causal_mask(3, window=window)
    with pytest.raises((TypeError, ValueError), match=r"window must be a positive integer"):
        GroupedQueryAttention(8, 8, 8, 0.0, 2, 1, window=window)


def test_other_new_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match=r"sinks must be"):
        GroupedQueryAttention(8, 8, 8, 0.0, 2, 1, sinks=1)
    with pytest.raises(ValueError, match=r"out_width must be a positive integer"):
        GroupedQueryAttention(8, 8, 8, 0.0, 2, 1, out_width=0)


def test_padding_with_a_windowed_mask_uses_the_last_columns_and_checks_every_position():
    real = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])  # seven positions, the first two padding
    windowed = causal_mask(2, start=5, window=3)  # positions 3..6 as keys
    mask = with_padding(windowed, real, batch=1, num_positions=7)
    assert torch.equal(mask[0, 0], windowed | ~real.bool()[:, 3:])
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, cached \+ new positions\) = \(1, 7\)"):
        with_padding(windowed, real[:, 1:], batch=1, num_positions=7)


def reference(layer: GroupedQueryAttention, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """The layer's attention written out: the rule's mask over every position, the sinks as a column."""
    B, T, _ = x.shape
    h, g = layer.num_heads, layer.num_kv_groups
    positions = torch.arange(T).expand(B, T)
    if attention_mask is not None:
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    q, k = split_heads(layer.W_query(x), h), split_heads(layer.W_key(x), g)
    if layer.rotary is not None:
        q, k = layer.rotary(q, k, 0, positions)
    v = split_heads(layer.W_value(x), g).repeat_interleave(h // g, dim=1)
    scores = q @ k.repeat_interleave(h // g, dim=1).mT / layer.head_dim**0.5
    hidden = rule(T, 0, 0, layer.window).expand(B, 1, T, T)
    if attention_mask is not None:
        hidden = hidden | ~attention_mask.bool()[:, None, None, :]
    scores = scores.masked_fill(hidden, float("-inf"))
    sink = torch.full((h,), float("-inf")) if layer.sinks is None else layer.sinks
    column = sink.view(1, h, 1, 1).expand(B, h, T, 1)
    weights = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1].nan_to_num()
    return layer.out_proj(merge_heads(weights @ v))


def layer(window=4, sinks=False, seed=0, rope=True, **kw) -> GroupedQueryAttention:
    torch.manual_seed(seed)
    gqa = GroupedQueryAttention(16, 16, 64, 0.0, 4, 2, rope_theta=10000.0 if rope else None, window=window,
                                sinks=sinks, **kw).eval()
    if sinks:
        torch.nn.init.normal_(gqa.sinks)
    return gqa


CASES = [dict(window=4), dict(window=1), dict(window=4, sinks=True), dict(window=None, sinks=True),
         dict(window=3, rope=False), dict(window=5, out_width=12)]
IDS = ["window 4", "window 1", "window and sinks", "sinks alone", "no rotation", "out_width"]


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_prompt_is_the_rule(case, use_sdpa):
    gqa = layer(**case)
    gqa.use_sdpa = use_sdpa
    x = torch.randn(2, 13, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(gqa(x), reference(gqa, x), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decoding_past_the_window_equals_the_prompt_and_the_cache_stops_growing(case, use_sdpa):
    gqa = layer(**case)
    gqa.use_sdpa = use_sdpa
    x = torch.randn(2, 20, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = gqa(x)
        cache, sizes = KVCache(), []
        steps = [gqa(x[:, :6], cache=cache)]
        for t in range(6, 20):
            steps.append(gqa(x[:, t:t + 1], cache=cache))
            sizes.append(cache.nbytes)
        pieces, in_pieces = KVCache(), []
        for start, end in ((0, 2), (2, 9), (9, 10), (10, 20)):  # a prompt in pieces, longer than the window
            in_pieces.append(gqa(x[:, start:end], cache=pieces))
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat(in_pieces, 1), whole, atol=2e-6, rtol=1e-5)
    assert len(cache) == 20
    window = case["window"]
    if window is None:
        assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes) and cache.held == 20
    else:
        per_position = 2 * 2 * 2 * gqa.head_dim * 4  # keys and values, batch 2, 2 key/value heads, float32
        assert set(sizes) == {per_position * (window - 1)} and cache.held == window - 1
        assert cache.dropped == 20 - (window - 1)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_left_padded_batch_is_each_sequence_alone_and_decodes_the_same(case):
    gqa = layer(**case)
    x = torch.randn(2, 14, 16, generator=torch.Generator().manual_seed(3))
    real = torch.ones(2, 14, dtype=torch.long)
    real[0, :5] = 0
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = gqa(x, attention_mask=real, position_ids=positions)
        alone = gqa(x[:1, 5:])
        cache = KVCache()
        steps = [gqa(x[:, :7], cache=cache, attention_mask=real[:, :7], position_ids=positions[:, :7])]
        for t in range(7, 14):
            steps.append(gqa(x[:, t:t + 1], cache=cache, attention_mask=real[:, :t + 1],
                             position_ids=positions[:, t:t + 1]))
    torch.testing.assert_close(padded[0, 5:], alone[0], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(padded, reference(gqa, x, real), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat(steps, 1), padded, atol=2e-6, rtol=1e-5)
    # a padded query sees no key: context 0, the output projection's bias alone
    torch.testing.assert_close(padded[0, :5], gqa.out_proj.bias.expand(5, -1))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_fused_and_explicit_paths_have_the_gradients_of_the_rule(case):
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(4))
    upstream = torch.randn(2, 11, case.get("out_width", 16), generator=torch.Generator().manual_seed(5))
    grads = []
    for use_sdpa in (True, False, None):
        gqa = layer(**case)
        gqa.use_sdpa = bool(use_sdpa)
        (((reference(gqa, x) if use_sdpa is None else gqa(x)) * upstream).sum()).backward()
        grads.append({name: p.grad for name, p in gqa.named_parameters()})
    for got in grads[:2]:
        assert got.keys() == grads[2].keys()
        for name in got:
            torch.testing.assert_close(got[name], grads[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_window_of_one_gives_each_token_its_own_value():
    gqa = layer(window=1, rope=False)
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        values = split_heads(gqa.W_value(x), 2).repeat_interleave(2, dim=1)
        torch.testing.assert_close(gqa(x), gqa.out_proj(merge_heads(values)))


def test_sinks_take_probability_and_change_the_output():
    gqa = layer(window=None, sinks=True)
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = gqa(x)
        gqa.sinks.fill_(float("-inf"))  # a sink that takes nothing: plain attention
        none = gqa(x)
        gqa.sinks.fill_(30.0)  # a sink that takes everything: context 0, the bias alone
        all_of_it = gqa(x)
    plain = layer(window=None, sinks=False)
    plain.load_state_dict({k: v for k, v in gqa.state_dict().items() if k != "sinks"})
    with torch.no_grad():
        torch.testing.assert_close(none, plain(x))
    assert (before - none).abs().max() > 1e-3
    torch.testing.assert_close(all_of_it, gqa.out_proj.bias.expand(1, 8, -1), atol=1e-6, rtol=0)


def test_the_module_keeps_no_mask_and_builds_only_the_rows_it_needs(monkeypatch):
    """Decoding one token after 1,000 others through a window of 8 builds a mask of 1 x 8."""
    from mha_course.attention import masking

    shapes = []
    real_mask = masking.causal_mask  # what call_mask, which forward asks for its mask, builds

    def recording(*args, **kwargs):
        mask = real_mask(*args, **kwargs)
        shapes.append(tuple(mask.shape))
        return mask

    monkeypatch.setattr(masking, "causal_mask", recording)
    gqa = GroupedQueryAttention(8, 8, 2048, 0.0, 2, 1, window=8)
    assert not list(gqa.buffers())
    cache = KVCache()
    with torch.no_grad():
        gqa(torch.randn(1, 1000, 8), cache=cache)
        gqa(torch.randn(1, 1, 8), cache=cache)
    assert shapes == [(1000, 1000), (1, 8)]
    assert cache.held == 7
