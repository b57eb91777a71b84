"""DeepSeek's sparse attention on its own: a top-k that keeps every visible key is latent attention,
each query reads at most top-k keys and only visible ones, decoding equals the whole prompt, the cache
holds the latent, the rotated key and the indexer's key, a left-padded batch equals each sequence
alone, a query that sees no key gets 0, no gradient reaches the indexer, and arguments are refused
clearly. The equality with transformers' ``DeepseekV32Attention`` is in
``tests/test_deepseek_sparse_interop.py``.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import KVCache, LightningIndexer, MultiHeadLatentAttention, SparseLatentAttention, random_batch
from mha_course.attention.sparse import zero_ties

TOL = dict(rtol=1e-5, atol=2e-6)
SIZES = dict(num_heads=4, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3, q_lora_rank=5)


def dsa(topk=3, index_heads=8, d_in=8, context_length=12, seed=0, absorb=False, bias=False):
    """A module with every weight redrawn (norms and biases included, so that a dropped one shows)."""
    torch.manual_seed(seed)
    module = SparseLatentAttention(d_in, context_length, 0.0, **SIZES, index_heads=index_heads, index_head_dim=4,
                                   index_topk=topk, bias=bias)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if "norm" in name or name == "W_query.1.weight"
                    else torch.randn_like(p) * 0.5)
    module.absorb = absorb
    return module.eval()


def read_weights(module, x, **kwargs):
    """The attention weights the module hands to dropout."""
    hooked = []
    handle = module.dropout.register_forward_hook(lambda _m, args, _o: hooked.append(args[0]))
    with torch.no_grad():
        module(x, **kwargs)
    handle.remove()
    return hooked[0]


def test_a_top_k_that_keeps_every_key_is_latent_attention():
    sparse = dsa(topk=12)
    dense = MultiHeadLatentAttention(8, 12, 0.0, **SIZES)
    dense.load_state_dict({k: v for k, v in sparse.state_dict().items() if not k.startswith("indexer.")})
    x = random_batch(2, 12, 8)
    with torch.no_grad():
        torch.testing.assert_close(sparse(x), dense(x), **TOL)


@pytest.mark.parametrize("topk", [1, 3, 5])
def test_each_query_reads_at_most_top_k_visible_keys(topk):
    weights = read_weights(dsa(topk=topk), random_batch(2, 10, 8))  # (B, h, T, S)
    read = (weights > 0).sum(-1)
    assert torch.equal(read, torch.arange(1, 11).clamp(max=topk).expand_as(read))
    assert torch.all(weights.triu(diagonal=1) == 0)  # never a future key
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 10))
    assert torch.equal(weights[:, 0] > 0, weights[:, 3] > 0)  # every head reads the same keys


def test_top_k_is_chosen_among_visible_keys_only():
    """A future or padded key never takes one of the k places: each query still reads k keys."""
    indexer = LightningIndexer(8, 5, num_heads=2, head_dim=4, rope_head_dim=2, topk=2)
    scores = torch.arange(16.0).view(1, 4, 4)  # later keys score higher: the future would win
    hidden = indexer.select(scores, torch.ones(4, 4, dtype=torch.bool).triu(1))
    assert (~hidden[0, 0]).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]


@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(1, 10), topk=st.integers(1, 6), absorb=st.booleans(), seed=st.integers(0, 2**16),
       data=st.data())
def test_cached_decoding_equals_the_whole_prompt(tokens, topk, absorb, seed, data):
    module = dsa(topk=topk, seed=seed, absorb=absorb)
    x = random_batch(2, tokens, 8, seed=seed)
    cuts = sorted(data.draw(st.sets(st.integers(1, tokens - 1)), label="cuts")) if tokens > 1 else []
    cache = KVCache()
    with torch.no_grad():
        index_q, index_k = module.indexer(x, module.W_query[1](module.W_query[0](x)), start=0)
        hidden = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
        if zero_ties(module.indexer.scores(x, index_q, index_k), hidden, topk).any():
            return  # a tie at the boundary: top-k may keep other keys for one row alone
        whole = module(x)
        pieces = [module(x[:, start:end], cache=cache) for start, end in pairwise([0, *cuts, tokens])]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **TOL)
    assert set(cache.tensors) == {"latent", "rotated_key", "index_key"}
    assert cache.nbytes == 2 * tokens * (6 + 2 + 4) * 4


def test_the_cached_index_key_is_what_later_tokens_are_chosen_by():
    module = dsa(topk=2)
    x = random_batch(1, 6, 8)
    cache = KVCache()
    with torch.no_grad():
        module(x[:, :5], cache=cache)
        honest = read_weights(module, x[:, 5:], cache=__import__("copy").deepcopy(cache))
        cache.tensors["index_key"] = cache.tensors["index_key"].flip(-2)  # the keys' order reversed
        assert not torch.equal(read_weights(module, x[:, 5:], cache=cache) > 0, honest > 0)


def test_a_left_padded_batch_equals_each_sequence_alone_and_a_padded_query_gets_zero():
    module = dsa(topk=3, bias=True)
    long, short = random_batch(1, 7, 8, seed=1), random_batch(1, 4, 8, seed=2)
    x = torch.cat([long, torch.cat([torch.zeros(1, 3, 8), short], dim=1)])
    real = torch.tensor([[1] * 7, [0, 0, 0, 1, 1, 1, 1]])
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    cache = KVCache()
    with torch.no_grad():
        prompt = module(x[:, :5], cache=cache, attention_mask=real[:, :5], position_ids=positions[:, :5])
        steps = [module(x[:, t:t + 1], cache=cache, attention_mask=real[:, :t + 1],
                        position_ids=positions[:, t:t + 1]) for t in (5, 6)]
        batched = torch.cat([prompt, *steps], dim=1)
        torch.testing.assert_close(batched[0], module(long)[0], **TOL)
        torch.testing.assert_close(batched[1, 3:], module(short)[0], **TOL)
        torch.testing.assert_close(batched[1, 0], module.out_proj.bias, **TOL)  # no key: context 0


def test_no_gradient_reaches_the_indexer_and_the_rest_trains():
    module = dsa(topk=3)
    x = random_batch(2, 6, 8).requires_grad_()
    module(x).square().sum().backward()
    assert all(p.grad is None for p in module.indexer.parameters())
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for name, p in module.named_parameters() if not name.startswith("indexer."))


def test_future_tokens_never_change_the_past():
    module = dsa(topk=2)
    x = random_batch(1, 8, 8)
    changed = x.clone()
    changed[:, 5:] = random_batch(1, 3, 8, seed=9)
    with torch.no_grad():
        torch.testing.assert_close(module(changed)[:, :5], module(x)[:, :5], **TOL)


def test_zero_ties():
    scores = torch.tensor([[[2.0, 0.0, 0.0, -1.0], [2.0, 1.0, 0.0, 0.0]]])
    hidden = torch.zeros(2, 4, dtype=torch.bool)
    assert zero_ties(scores, hidden, 2).tolist() == [[True, False]]
    assert zero_ties(scores, hidden, 3).tolist() == [[False, True]]
    hidden[0, 2] = True  # one of the two zeros hidden: no tie left in row 0
    assert zero_ties(scores, hidden, 2).tolist() == [[False, False]]


@pytest.mark.parametrize("change,message", [
    (dict(q_lora_rank=None), r"q_lora_rank must be a positive integer, got None: the indexer reads"),
    (dict(index_topk=0), r"topk must be a positive integer, got 0.*how many keys each query keeps"),
    (dict(index_head_dim=1), r"rope_head_dim=2 must not exceed head_dim=1"),
    (dict(index_heads=2.5), r"num_heads must be a positive integer, got 2\.5"),
], ids=["no-bottleneck", "topk", "rope-wider", "heads"])
def test_bad_arguments_are_refused_by_name(change, message):
    settings = {**SIZES, "index_heads": 2, "index_head_dim": 4, "index_topk": 2, **change}
    with pytest.raises((ValueError, TypeError), match=message):
        SparseLatentAttention(8, 12, 0.0, **settings)
