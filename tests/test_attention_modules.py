"""Shapes, causality, determinism and the mask buffer, for every attention class."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from conftest import BUFFER_KINDS, CAUSAL_KINDS, CUDA, KINDS, build
from mha_course import causal_mask, random_batch


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 6), (3, 4)])
def test_output_shape(kind, batch, tokens):
    module = build(kind, d_in=5, head_dim=3, num_heads=4, context_length=6)
    out = module(random_batch(batch, tokens, 5))
    width = {"causal": 3, "wrapper": 12, "batched": 12, "gqa": 12}[kind]
    assert out.shape == (batch, tokens, width)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_weights_shape_and_rows_sum_to_one(kind):
    module = build(kind, num_heads=3, context_length=8)
    weights = module.attention_weights(random_batch(2, 5, 3))
    expected = (2, 5, 5) if kind == "causal" else (2, 3, 5, 5)
    assert weights.shape == expected
    torch.testing.assert_close(weights.sum(-1), torch.ones(expected[:-1]))
    # Nothing above the diagonal: no weight on a future token.
    assert torch.all(weights.triu(diagonal=1) == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_weights_leave_forward_unchanged(kind):
    module = build(kind).eval()
    x = random_batch(2, 6, 3)
    before = module(x)
    module.attention_weights(x)
    torch.testing.assert_close(module(x), before)


@settings(max_examples=50, deadline=None)
@given(
    kind=st.sampled_from(CAUSAL_KINDS),
    d_in=st.integers(1, 6),
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 4),
    tokens=st.integers(2, 9),
    t=st.integers(0, 8),
    seed=st.integers(0, 2**16),
)
def test_future_tokens_never_change_the_past(kind, d_in, head_dim, num_heads, tokens, t, seed):
    """Changing tokens after position t leaves outputs up to t unchanged (and does change the rest)."""
    t = t % (tokens - 1)
    torch.manual_seed(seed)
    module = build(kind, d_in=d_in, head_dim=head_dim, num_heads=num_heads, context_length=tokens).eval()
    x = random_batch(2, tokens, d_in, seed=seed)
    changed = x.clone()
    changed[:, t + 1 :] = random_batch(2, tokens - t - 1, d_in, seed=seed + 1) * 3
    out, out_changed = module(x), module(changed)
    torch.testing.assert_close(out_changed[:, : t + 1], out[:, : t + 1], rtol=1e-5, atol=1e-6)
    # ...while the changed positions do change: the test can fail.
    assert not torch.allclose(out_changed[:, t + 1 :], out[:, t + 1 :], atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_later_tokens_do_see_earlier_ones(kind):
    """The converse of causality: changing token 0 changes every later output."""
    module = build(kind).eval()
    x = random_batch(1, 6, 3)
    changed = x.clone()
    changed[:, 0] += 1.0
    difference = (module(changed) - module(x)).abs().amax(dim=-1)[0]
    assert torch.all(difference > 1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_eval_mode_is_deterministic_with_dropout(kind):
    module = build(kind, dropout=0.5).eval()
    x = random_batch(2, 6, 3)
    torch.testing.assert_close(module(x), module(x))


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_acts_in_training_mode(kind):
    module = build(kind, dropout=0.5).train()
    x = random_batch(2, 6, 3)
    assert not torch.allclose(module(x), module(x))


@pytest.mark.parametrize("kind", BUFFER_KINDS)
def test_mask_is_a_saved_buffer_and_survives_state_dict_round_trip(kind):
    module = build(kind, context_length=5)
    state = module.state_dict()
    mask_keys = [key for key in state if key.endswith("mask")]
    assert mask_keys, "the causal mask must be a registered (persistent) buffer"
    assert not any(name.endswith("mask") for name, _ in module.named_parameters())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = build(kind, context_length=5)
    fresh.load_state_dict(torch.load(buffer))
    x = random_batch(1, 5, 3)
    torch.testing.assert_close(fresh.eval()(x), module.eval()(x))
    for key in mask_keys:
        assert torch.equal(fresh.state_dict()[key], torch.triu(torch.ones(5, 5, dtype=torch.bool), 1))


@pytest.mark.parametrize("kind", KINDS)
def test_mask_moves_with_to(kind):
    module = build(kind).to(torch.float64)
    # dtype moves apply to floating buffers only; the boolean mask must stay boolean.
    for name, buf in module.named_buffers():
        assert buf.dtype == torch.bool, name
    out = module(random_batch(1, 6, 3).double())
    assert out.dtype == torch.float64


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_every_parameter(kind):
    module = build(kind, qkv_bias=True)
    module(random_batch(2, 6, 3)).sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_heads_do_not_share_weights():
    wrapper = build("wrapper", num_heads=3)
    pointers = {head.W_query.weight.data_ptr() for head in wrapper.heads}
    assert len(pointers) == 3
    assert not torch.equal(wrapper.heads[0].W_query.weight, wrapper.heads[1].W_query.weight)


def test_wrapper_output_is_concatenation_of_heads():
    wrapper = build("wrapper", num_heads=3).eval()
    x = random_batch(2, 6, 3)
    expected = torch.cat([head(x) for head in wrapper.heads], dim=-1)
    torch.testing.assert_close(wrapper(x), expected)


def test_causal_attention_matches_hand_computation():
    head = build("causal", d_in=3, head_dim=2).eval()
    x = random_batch(1, 4, 3)
    q, k, v = head.W_query(x), head.W_key(x), head.W_value(x)
    scores = q @ k.transpose(1, 2) / 2**0.5
    scores = scores + torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)
    expected = torch.softmax(scores, dim=-1) @ v
    torch.testing.assert_close(head(x), expected)


@CUDA
@pytest.mark.parametrize("kind", KINDS)
def test_runs_on_cuda(kind):
    module = build(kind).to("cuda")
    assert all(buffer.is_cuda for buffer in module.buffers())
    x = random_batch(2, 6, 3)
    out = module(x.cuda())
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), module.cpu()(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS + ["fast", "fast-explicit", "tiled"])
def test_empty_sequence_gives_an_empty_result(kind):
    module = build(kind, num_heads=2).eval()
    out = module(torch.rand(2, 0, 3))
    assert out.shape == (2, 0, 2 if kind == "causal" else 4)


# ----------------------------------------------------------------------------------------------
# Half precision: the scale comes before the product, so large scores stay finite


@pytest.mark.parametrize("kind", KINDS + ["fast", "fast-explicit", "tiled"])
def test_float16_scores_that_overflow_unscaled_stay_finite(kind):
    """Here q.k reaches about 1e5 (float16 stops at 65504) while q.k / sqrt(d_h) stays near 1e4."""
    module = build(kind, d_in=64, head_dim=64, num_heads=1, context_length=4).eval()
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "W_" in name or name.startswith("qkv"):  # every query, key and value projection
                rows = parameter.shape[0]
                parameter.copy_(torch.eye(64).repeat(rows // 64, 1))
    module = module.half()
    x = torch.full((1, 4, 64), 40.0, dtype=torch.float16)
    assert torch.isfinite(module(x)).all()
    assert torch.isfinite(module.attention_weights(x)).all()


@pytest.mark.parametrize("kind", KINDS + ["fast", "fast-explicit", "tiled"])
def test_float16_inputs_near_1e4_give_what_float32_gives_not_nan(kind):
    """Inputs of magnitude 1e4 make float16 dot products overflow even after scaling: every module
    computes the scores and softmax in float32 for half-precision inputs, as the fused kernel does."""
    torch.manual_seed(0)
    module = build(kind, d_in=16, head_dim=8, num_heads=2, context_length=6).eval().half()
    x = (torch.randn(2, 6, 16) * 1e4).half()
    with torch.no_grad():
        out = module(x)
        reference = module.float()(x.float())  # the same (rounded) weights, in float32
    assert torch.isfinite(out).all()
    relative = (out.float() - reference).abs().max() / reference.abs().max()
    assert relative < 1e-2, f"float16 output differs from float32 by {float(relative):.3g} (relative)"
    module.half()
    assert torch.isfinite(module.attention_weights(x)).all()


# ----------------------------------------------------------------------------------------------
# State dicts: compatible both ways with the canonical chapter's modules, and a corrupted mask refused


class CanonicalCausalAttention(nn.Module):
    """The best-known chapter's single head, by its state dict: W_query/W_key/W_value and a float mask."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        T = x.shape[1]
        scores = self.W_query(x) @ self.W_key(x).transpose(1, 2)
        scores = scores.masked_fill(self.mask.bool()[:T, :T], float("-inf"))
        return self.dropout(torch.softmax(scores / self.W_key.out_features**0.5, dim=-1)) @ self.W_value(x)


class CanonicalMultiHeadAttention(nn.Module):
    """The same chapter's batched module: its projections, ``out_proj`` and a float mask."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (w(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                   for w in (self.W_query, self.W_key, self.W_value))
        scores = (q @ k.transpose(2, 3)).masked_fill(self.mask.bool()[:T, :T], float("-inf"))
        weights = self.dropout(torch.softmax(scores / self.head_dim**0.5, dim=-1))
        return self.out_proj((weights @ v).transpose(1, 2).contiguous().view(B, T, -1))


class CanonicalWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            CanonicalCausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads))

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


CANONICAL = {"causal": lambda: CanonicalCausalAttention(3, 2, 6, 0.0, True),
             "wrapper": lambda: CanonicalWrapper(3, 2, 6, 0.0, 2, True),
             "batched": lambda: CanonicalMultiHeadAttention(3, 4, 6, 0.0, 2, True)}


@pytest.mark.parametrize("kind", list(CANONICAL))
def test_state_dicts_load_strictly_both_ways_with_the_canonical_modules(kind):
    x = random_batch(2, 6, 3)
    ours = build(kind, qkv_bias=True).eval()
    theirs = CANONICAL[kind]().eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(theirs(x), ours(x), rtol=1e-5, atol=1e-6)
    assert all(buf.dtype == torch.float32 for name, buf in theirs.named_buffers())  # theirs keeps float masks

    theirs = CANONICAL[kind]().eval()
    ours = build(kind, qkv_bias=True).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-6)
    assert all(buf.dtype == torch.bool for name, buf in ours.named_buffers())  # ours stays boolean


def _corrupt(state: dict, how: str) -> dict:
    state = dict(state)
    for key in [k for k in state if k.endswith("mask")]:
        mask = state[key]
        if how == "all False":
            state[key] = torch.zeros_like(mask)
        elif how == "transposed":
            state[key] = mask.T.contiguous()
        elif how == "float 0.5":
            state[key] = mask.float() * 0.5
    return state


@pytest.mark.parametrize("kind", BUFFER_KINDS)
@pytest.mark.parametrize("how", ["all False", "transposed", "float 0.5"])
def test_a_mask_that_is_not_causal_is_refused(kind, how):
    module = build(kind)
    before = {key: value.clone() for key, value in module.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"mask.*not the causal pattern.*causal_mask\(6\)"):
        module.load_state_dict(_corrupt(module.state_dict(), how))
    with pytest.raises(RuntimeError, match=r"mask.*not the causal pattern"):
        module.load_state_dict(_corrupt(module.state_dict(), how), strict=False)
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} changed although loading failed"
    # The module is still causal.
    x = random_batch(1, 6, 3)
    changed = x.clone()
    changed[:, 3:] += 1.0
    torch.testing.assert_close(module.eval()(changed)[:, :3], module(x)[:, :3])


def test_a_mask_of_another_context_length_names_the_fix():
    small, large = build("batched", context_length=6), build("batched", context_length=8)
    with pytest.raises(RuntimeError, match=r"context_length=8, this one has context_length=6\. Build it with context_length=8"):
        small.load_state_dict(large.state_dict())


# ----------------------------------------------------------------------------------------------
# No mask quadratic in the context


@pytest.mark.parametrize("kind", CAUSAL_KINDS)
def test_no_module_holds_a_mask_for_a_context_it_has_not_seen(kind):
    """Made for Llama 3.1's 131,072 positions, a module holds at most a 1,024 x 1,024 mask per head
    (1 MiB); the taught modules' buffer then grows to the longest input seen, and no further."""
    from mha_course.attention.masking import MASK_BUFFER_SIDE

    module = build(kind, context_length=131072).eval()
    if kind == "tiled":
        module.block_size = 256  # no buffer depends on it; tiles of 2 made 1,029 tokens 132,870 tiles in Python
    heads = module.num_heads if kind == "wrapper" else 1
    assert sum(b.nbytes for b in module.buffers()) <= heads * MASK_BUFFER_SIDE**2
    x = random_batch(1, MASK_BUFFER_SIDE + 5, 3)
    with torch.no_grad():
        module(x)
    assert sum(b.nbytes for b in module.buffers()) <= heads * (MASK_BUFFER_SIDE + 5) ** 2


def test_a_grown_mask_buffer_is_the_causal_mask_of_the_input_and_loads_back():
    from mha_course.attention.masking import MASK_BUFFER_SIDE

    seen = MASK_BUFFER_SIDE + 3
    module = build("batched", context_length=131072).eval()
    assert module.mask.shape == (MASK_BUFFER_SIDE, MASK_BUFFER_SIDE)
    with torch.no_grad():
        module(random_batch(1, seen, 3))
    assert torch.equal(module.mask, causal_mask(seen))
    for context_length in (131072, seen, seen + 4):  # a causal mask of another side loads: the same rule
        build("batched", context_length=context_length).load_state_dict(module.state_dict())
    with pytest.raises(RuntimeError, match=rf"context_length={seen}, this one has context_length={seen - 1}\."):
        build("batched", context_length=seen - 1).load_state_dict(module.state_dict())
