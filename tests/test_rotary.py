"""Rotary position embeddings: a rotation by position, relative in the scores, keys rotated before caching."""

from __future__ import annotations

import pytest
import torch

from mha_course import GroupedQueryAttention, KVCache, RotaryEmbedding, rotate_half
from mha_course.attention.rotary import inverse_frequencies


def _rotate_by_hand(x, position, theta):
    """Pair i is numbers i and i + d/2, turned by position * theta**(-2i/d): written out, pair by pair."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        angle = torch.tensor(position * theta ** (-2 * i / d), dtype=torch.float64)
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * angle.cos() - b * angle.sin()
        out[..., i + d // 2] = a * angle.sin() + b * angle.cos()
    return out


def test_rotate_half_turns_each_half_split_pair_a_quarter():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert rotate_half(x).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]
    assert torch.equal(rotate_half(rotate_half(x)), -x)  # two quarter turns


def test_the_rotation_is_the_pairwise_one_written_out():
    rotary = RotaryEmbedding(head_dim=6, rope_theta=50.0).double()
    q = torch.randn(1, 2, 4, 6, dtype=torch.float64)
    rotated, _ = rotary(q, q, start=3)
    for t in range(4):
        torch.testing.assert_close(rotated[:, :, t], _rotate_by_hand(q[:, :, t], 3 + t, 50.0))
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm(dim=-1))  # rotations keep lengths


def test_scores_depend_on_the_distance_between_positions_only():
    rotary = RotaryEmbedding(head_dim=8, rope_theta=10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    scores = {}
    for m, n in [(5, 2), (9, 6), (3, 0), (5, 5), (7, 7)]:
        q_m, _ = rotary(q, k, start=m)
        _, k_n = rotary(q, k, start=n)
        scores[m, n] = (q_m * k_n).sum().item()
    assert scores[5, 2] == pytest.approx(scores[9, 6], abs=1e-5) == pytest.approx(scores[3, 0], abs=1e-5)
    assert scores[5, 5] == pytest.approx(scores[7, 7], abs=1e-5) == pytest.approx((q * k).sum().item(), abs=1e-5)
    assert abs(scores[5, 2] - scores[5, 5]) > 1e-3


def test_interleaved_pairs_give_the_same_scores_after_permuting_the_numbers():
    """Why checkpoints are permuted: the half-split rotation of permuted vectors is the interleaved one."""
    d = 8
    q, k = torch.randn(2, 1, 5, d, dtype=torch.float64), torch.randn(2, 1, 5, d, dtype=torch.float64)
    freqs = inverse_frequencies(d, 10000.0).double()
    angles = torch.arange(5, dtype=torch.float64)[:, None] * freqs  # (T, d/2)

    def interleaved(x):  # pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * angles.cos() - b * angles.sin(), a * angles.sin() + b * angles.cos()
        return out

    permutation = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # evens first, then odds
    rotary = RotaryEmbedding(d, 10000.0).double()
    q_half, k_half = rotary(q[..., permutation], k[..., permutation], start=0)
    torch.testing.assert_close(q_half @ k_half.transpose(2, 3), interleaved(q) @ interleaved(k).transpose(2, 3))
    q_plain, k_plain = rotary(q, k, start=0)  # without the permutation the two conventions differ
    assert not torch.allclose(q_plain @ k_plain.transpose(2, 3), interleaved(q) @ interleaved(k).transpose(2, 3))


def test_keys_enter_the_cache_rotated_and_decoding_continues_the_positions():
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(6, 8, 10, 0.0, num_heads=4, num_kv_groups=2, rope_theta=100.0).eval()
    x = torch.randn(2, 7, 6)
    cache = KVCache()
    with torch.no_grad():
        steps = [gqa(x[:, :3], cache=cache)] + [gqa(x[:, t:t + 1], cache=cache) for t in range(3, 7)]
        torch.testing.assert_close(torch.cat(steps, dim=1), gqa(x), rtol=1e-5, atol=1e-6)
        keys = gqa.W_key(x).view(2, 7, 2, 2).transpose(1, 2)
        _, rotated = gqa.rotary(keys, keys, start=0)
    torch.testing.assert_close(cache.keys, rotated)


def test_without_rope_theta_nothing_turns_and_position_ids_change_nothing():
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(6, 8, 10, 0.0, num_heads=4, num_kv_groups=2).eval()
    assert gqa.rotary is None and "rotary" not in "".join(gqa.state_dict())
    x = torch.randn(1, 4, 6)
    with torch.no_grad():
        torch.testing.assert_close(gqa(x, position_ids=torch.tensor([[7, 8, 9, 10]])), gqa(x))


def test_the_frequencies_are_saved_with_the_module():
    gqa = GroupedQueryAttention(6, 8, 10, 0.0, num_heads=2, num_kv_groups=1, rope_theta=500.0)
    assert torch.equal(gqa.state_dict()["rotary.inv_freq"], inverse_frequencies(4, 500.0))


@pytest.mark.parametrize("kwargs,message", [
    (dict(rope_theta=0.5), r"rope_theta must be a number above 1 .*or None for no rotation; got 0\.5"),
    (dict(rope_theta="10000"), r"rope_theta must be a number above 1 .*got '10000'"),
    (dict(rope_theta=True), r"rope_theta must be a number above 1"),
    (dict(d_out=6, num_heads=2, rope_theta=1e4), r"head_dim = d_out // num_heads must be even, got 3"),
], ids=["small", "string", "bool", "odd-head"])
def test_a_wrong_rotation_setting_is_refused(kwargs, message):
    settings = dict(d_in=4, d_out=8, context_length=6, dropout=0.0, num_heads=2, num_kv_groups=1) | kwargs
    with pytest.raises(ValueError, match=message):
        GroupedQueryAttention(**settings)


@pytest.mark.parametrize("position_ids,error,message", [
    (torch.zeros(1, 3), TypeError, r"position_ids must hold whole numbers.*got torch\.float32"),
    (torch.zeros(1, 4, dtype=torch.long), ValueError, r"position_ids must have shape \(batch, num_tokens\) = "
                                                      r"\(1, 3\), one position per new token of x, got \(1, 4\)"),
    ([[0, 1, 2]], TypeError, r"position_ids must be a torch\.Tensor .* got list"),
], ids=["float", "shape", "list"])
def test_wrong_position_ids_are_refused_naming_the_parameter(position_ids, error, message):
    gqa = GroupedQueryAttention(4, 8, 6, 0.0, num_heads=2, num_kv_groups=1, rope_theta=1e4)
    with pytest.raises(error, match=message):
        gqa(torch.randn(1, 3, 4), position_ids=position_ids)


def test_the_frequencies_stay_float32_when_the_module_turns_to_half_precision():
    gqa = GroupedQueryAttention(8, 16, 1024, 0.0, num_heads=2, num_kv_groups=1, rope_theta=1e4)
    before = gqa.rotary.inv_freq.clone()
    gqa = gqa.to(torch.bfloat16)
    assert gqa.W_query.weight.dtype == torch.bfloat16
    assert gqa.rotary.inv_freq.dtype == torch.float32 and torch.equal(gqa.rotary.inv_freq, before)
    q = torch.ones(1, 1, 1, 8, dtype=torch.bfloat16)
    turned, _ = gqa.rotary(q, q, start=1000)  # the angle of pair 0 is 1000 rad, computed in float32
    expected = torch.tensor(1000.0).cos() - torch.tensor(1000.0).sin()
    assert turned.dtype == torch.bfloat16 and abs(float(turned[0, 0, 0, 0]) - float(expected)) < 0.02
    assert gqa.to("meta").rotary.inv_freq.device.type == "meta"
