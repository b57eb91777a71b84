"""Padded batches: each real token of a left- or right-padded batch gets what its sequence gives alone.

The modules that take a padding mask (``MultiHeadAttention``, ``TiledMultiHeadAttention``,
``FastMultiHeadAttention`` and ``GroupedQueryAttention`` on both of their paths, the latter with and
without rotary positions, with a cache for decoding) are run on batches of sequences of different
lengths, padded with random vectors (so that a padded key that leaked in would change the result),
and compared with each sequence run alone.

A query that sees no key at all, which left padding makes, follows one rule in every module, the
rule of PyTorch's ``scaled_dot_product_attention`` and of FlashAttention: attention weights of 0,
a context vector of 0, so the layer's output there is its output projection's bias, and gradients
of 0 through it. The modules built from the same weights give the same padded rows, values and
gradients.
"""

from __future__ import annotations

import pytest
import torch

from mha_course import (FastMultiHeadAttention, GroupedQueryAttention, KVCache, MultiHeadAttention,
                        TiledMultiHeadAttention, causal_mask, tiled_attention, with_padding)

TOL = dict(rtol=1e-5, atol=1e-5)
LENGTHS = (5, 3, 1)
D_IN = 6


def _sequences(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, D_IN, generator=g) for n in LENGTHS]


def _pad(sequences, side, seed=1):
    """A (B, T_max, d) batch with random vectors as padding, and its (B, T_max) 0/1 mask."""
    g = torch.Generator().manual_seed(seed)
    longest = max(len(s) for s in sequences)
    x = torch.randn(len(sequences), longest, D_IN, generator=g)  # the padding: random, not zero
    real = torch.zeros(len(sequences), longest, dtype=torch.long)
    for i, s in enumerate(sequences):
        where = slice(longest - len(s), longest) if side == "left" else slice(0, len(s))
        x[i, where], real[i, where] = s, 1
    return x, real


def _on_path(make, use_sdpa):
    def build():
        module = make()
        module.use_sdpa = use_sdpa
        return module
    return build


def _grouped(rope=None):
    return lambda: GroupedQueryAttention(D_IN, 8, 8, 0.0, num_heads=4, num_kv_groups=2, rope_theta=rope)


MODULES = {
    "multihead": lambda: MultiHeadAttention(D_IN, 8, 8, 0.0, num_heads=2),
    "tiled": lambda: TiledMultiHeadAttention(D_IN, 8, 8, 0.0, num_heads=2, block_size=2),
    "fast-sdpa": _on_path(lambda: FastMultiHeadAttention(D_IN, 8, 8, 0.0, num_heads=2), True),
    "fast-explicit": _on_path(lambda: FastMultiHeadAttention(D_IN, 8, 8, 0.0, num_heads=2), False),
    "grouped": _grouped(),
    "grouped-explicit": _on_path(_grouped(), False),
    "grouped-rope": _grouped(100.0),
    "grouped-rope-explicit": _on_path(_grouped(100.0), False),
}


def _positions(real):
    """transformers' position ids for a padded batch: each sequence counts from its first real token."""
    return (real.cumsum(-1) - 1).clamp(min=0)


def _call(module, x, real):
    if isinstance(module, GroupedQueryAttention):
        return module(x, attention_mask=real, position_ids=_positions(real))
    return module(x, attention_mask=real)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_each_real_token_gets_what_its_sequence_gives_alone(kind, side):
    torch.manual_seed(0)
    module = MODULES[kind]().eval()
    sequences = _sequences()
    x, real = _pad(sequences, side)
    with torch.no_grad():
        out = _call(module, x, real)
        assert torch.isfinite(out).all()
        for i, s in enumerate(sequences):
            torch.testing.assert_close(out[i][real[i].bool()], module(s[None])[0], **TOL)


def test_padding_changes_the_output_when_the_mask_is_left_out():
    """Guards the test above: the padding vectors are not harmless by themselves."""
    torch.manual_seed(0)
    module = MODULES["multihead"]().eval()
    sequences = _sequences()
    x, real = _pad(sequences, "left")
    with torch.no_grad():
        out = module(x)
        assert not torch.allclose(out[1][real[1].bool()], module(sequences[1][None])[0], atol=1e-3)


@pytest.mark.parametrize("rope", [None, 100.0])
def test_left_padded_batched_decoding_equals_decoding_each_sequence_alone(rope):
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(D_IN, 8, 12, 0.0, num_heads=4, num_kv_groups=2, rope_theta=rope).eval()
    prompts = _sequences()
    steps = torch.randn(4, len(prompts), 1, D_IN, generator=torch.Generator().manual_seed(5))
    x, real = _pad(prompts, "left")
    cache = KVCache()
    with torch.no_grad():
        batched = [gqa(x, cache=cache, attention_mask=real, position_ids=_positions(real))]
        for step in steps:  # one new real token per sequence
            real = torch.cat([real, torch.ones(len(prompts), 1, dtype=real.dtype)], dim=1)
            batched.append(gqa(step, cache=cache, attention_mask=real, position_ids=_positions(real)[:, -1:]))
        batched = torch.cat(batched, dim=1)
        for i, prompt in enumerate(prompts):
            alone_cache = KVCache()
            alone = [gqa(prompt[None], cache=alone_cache)] + [gqa(step[i:i + 1], cache=alone_cache)
                                                               for step in steps]
            torch.testing.assert_close(batched[i][real[i].bool()], torch.cat(alone, dim=1)[0], **TOL)


def test_the_rotation_sees_only_relative_positions_so_a_consistent_shift_changes_nothing():
    """Positions that count the padding shift a whole sequence alike, which a rotation cannot see;
    positions counted one way for the prompt and another for the next token can be seen."""
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(D_IN, 8, 8, 0.0, num_heads=4, num_kv_groups=2, rope_theta=100.0).eval()
    sequences = _sequences()
    x, real = _pad(sequences, "left")
    step = torch.randn(3, 1, D_IN)
    one = torch.ones(3, 1, dtype=real.dtype)
    with torch.no_grad():
        counted = gqa(x, attention_mask=real)  # positions 0..4 for every sequence, padding counted
        assert torch.allclose(counted[1][real[1].bool()], gqa(sequences[1][None])[0], atol=1e-5)
        cache = KVCache()
        gqa(x, cache=cache, attention_mask=real)  # the prompt counts the padding, the step does not
        mixed = gqa(step, cache=cache, attention_mask=torch.cat([real, one], 1),
                    position_ids=_positions(torch.cat([real, one], 1))[:, -1:])
        alone_cache = KVCache()
        gqa(sequences[1][None], cache=alone_cache)
        assert not torch.allclose(mixed[1], gqa(step[1:2], cache=alone_cache)[0], atol=1e-3)


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_a_query_with_no_visible_key_gives_finite_numbers(kind):
    torch.manual_seed(0)
    module = MODULES[kind]().eval()
    x = torch.randn(2, 4, D_IN)
    real = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]])  # a sequence of padding only, and a left-padded one
    with torch.no_grad():
        out = module(x, attention_mask=real)
    assert torch.isfinite(out).all()


def test_with_padding_hides_padded_keys_and_leaves_a_row_with_none_masked():
    causal = torch.triu(torch.ones(3, 3, dtype=torch.bool), diagonal=1)
    mask = with_padding(causal, torch.tensor([[False, True, True], [True, True, False]]), batch=2)
    assert mask.shape == (2, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, True, True], [True, False, True], [True, False, False]]
    assert mask[1, 0].tolist() == [[False, True, True], [False, False, True], [False, False, True]]
    assert with_padding(causal, None, batch=2) is causal


def test_an_all_true_mask_changes_nothing():
    torch.manual_seed(0)
    for kind, make in MODULES.items():
        module = make().eval()
        x = torch.randn(2, 5, D_IN)
        with torch.no_grad():
            ones = module(x, attention_mask=torch.ones(2, 5, dtype=torch.bool))
            torch.testing.assert_close(ones, module(x), **TOL, msg=kind)


# ----------------------------------------------------------------------------------------------
# What is refused


@pytest.mark.parametrize("kind", sorted(MODULES))
@pytest.mark.parametrize("mask,error,message", [
    (torch.ones(2, 4), TypeError, r"attention_mask must be boolean or integer \(1 for a real token, 0 for "
                                  r"padding\), got torch\.float32\. This is the padding mask of transformers' "
                                  r"generate, not a mask added to the scores"),
    (torch.ones(2, 5, dtype=torch.long), ValueError, r"attention_mask must have shape \(batch, cached \+ new "
                                                     r"positions\) = \(2, 4\).*got \(2, 5\)"),
    (torch.ones(4, dtype=torch.long), ValueError, r"attention_mask must have shape .* = \(2, 4\).*got \(4,\)"),
    ([[1, 1, 1, 1]] * 2, TypeError, r"attention_mask must be a torch\.Tensor of shape .* got list"),
], ids=["float", "too-long", "1-D", "list"])
def test_a_wrong_mask_is_refused_naming_the_parameter(kind, mask, error, message):
    module = MODULES[kind]()
    with pytest.raises(error, match=message):
        module(torch.randn(2, 4, D_IN), attention_mask=mask)


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_a_nonzero_integer_counts_as_a_real_token_and_no_value_is_checked(kind):
    """The mask's values are never read on the host (that would wait for a GPU): any nonzero integer is a
    real token, as ``attention_mask.bool()`` reads it."""
    module = MODULES[kind]().eval()
    x = torch.randn(2, 4, D_IN)
    real = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad():
        torch.testing.assert_close(module(x, attention_mask=real * 2), module(x, attention_mask=real))


def test_with_a_cache_the_mask_covers_the_cached_positions_too():
    gqa = MODULES["grouped"]()
    cache = KVCache()
    gqa(torch.randn(2, 3, D_IN), cache=cache)
    with pytest.raises(ValueError, match=r"\(batch, cached \+ new positions\) = \(2, 4\).*got \(2, 1\)\. With a "
                                         r"cache, it covers the cached positions too"):
        gqa(torch.randn(2, 1, D_IN), cache=cache, attention_mask=torch.ones(2, 1, dtype=torch.long))


def test_a_mask_on_another_device_is_refused():
    with pytest.raises(ValueError, match=r"attention_mask is on meta but x is on cpu.*attention_mask\.to\('cpu'\)"):
        MODULES["multihead"]()(torch.randn(1, 2, D_IN), attention_mask=torch.ones(1, 2, device="meta"
                                                                                   ).long())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_on_the_gpu_padded_batches_agree_and_stay_finite(kind):
    """PyTorch's fused kernels on a GPU take the boolean mask too; a row with no key stays finite."""
    torch.manual_seed(0)
    module = MODULES[kind]().eval().cuda()
    sequences = [s.cuda() for s in _sequences()]
    x, real = _pad([s.cpu() for s in sequences], "left")
    x, real = x.cuda(), real.cuda()
    with torch.no_grad():
        out = _call(module, x, real)
        assert torch.isfinite(out).all()
        for i, s in enumerate(sequences):
            torch.testing.assert_close(out[i][real[i].bool()], module(s[None])[0], **TOL)


# ----------------------------------------------------------------------------------------------
# A query with no visible key: one rule in every module, values and gradients


def _same_function(seed=0):
    """Every module that takes a padding mask, built on one ``MultiHeadAttention``'s weights."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(D_IN, 8, 8, 0.0, num_heads=2, qkv_bias=True)
    with torch.no_grad():
        mha.out_proj.bias.normal_()  # a bias that shows where it is the whole output
    modules = {"multihead": mha, "tiled": TiledMultiHeadAttention.from_multihead(mha, block_size=2)}
    for use_sdpa, path in ((True, "sdpa"), (False, "explicit")):
        modules[f"fast-{path}"] = FastMultiHeadAttention.from_multihead(mha)
        modules[f"grouped-{path}"] = GroupedQueryAttention.from_multihead(mha, num_kv_groups=2)
        modules[f"fast-{path}"].use_sdpa = modules[f"grouped-{path}"].use_sdpa = use_sdpa
    return modules


def _left_padded_with_an_empty_sequence():
    x, real = _pad(_sequences(), "left")  # lengths 5, 3 and 1: padded rows at the start
    real[2] = 0  # and a sequence of padding only
    return x, real


def _outputs_and_gradients(module, x, real, upstream):
    x = x.clone().requires_grad_()
    out = module.eval()(x, attention_mask=real)
    out.backward(upstream)
    return out.detach(), x.grad, module.out_proj.weight.grad, module.out_proj.bias.grad


def test_every_module_gives_a_query_with_no_visible_key_the_same_output_and_gradients():
    """The padded rows of a left-padded batch: equal across the modules, values and gradients, and
    equal to the output projection's bias."""
    x, real = _left_padded_with_an_empty_sequence()
    upstream = torch.randn(*x.shape[:2], 8, generator=torch.Generator().manual_seed(7))
    results = {name: _outputs_and_gradients(module, x, real, upstream)
               for name, module in _same_function().items()}
    padded = ~real.bool()  # (B, T): every padded query of a left-padded batch sees no key
    reference = results["fast-sdpa"]
    bias = _same_function()["multihead"].out_proj.bias.detach()
    for name, (out, *grads) in results.items():
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), name
        torch.testing.assert_close(out[padded], bias.expand(int(padded.sum()), -1), **TOL, msg=name)
        torch.testing.assert_close(out, reference[0], **TOL, msg=name)
        for got, expected in zip(grads, reference[1:]):
            torch.testing.assert_close(got, expected, **TOL, msg=name)


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_no_gradient_flows_through_a_query_with_no_visible_key(kind):
    """A loss on the padded rows alone reaches the output projection's bias and nothing else: the
    rows hold no information, forward or backward (and no NaN on the way, even in anomaly mode)."""
    module = MODULES[kind]().eval()
    x, real = _left_padded_with_an_empty_sequence()
    x.requires_grad_()
    padded = ~real.bool()
    with torch.autograd.detect_anomaly(check_nan=True):
        out = module(x, attention_mask=real, **({"position_ids": _positions(real)}
                                                 if isinstance(module, GroupedQueryAttention) else {}))
        out[padded].square().sum().backward()
    torch.testing.assert_close(out[padded], module.out_proj.bias.expand(int(padded.sum()), -1).detach())
    assert torch.equal(x.grad, torch.zeros_like(x))
    for name, parameter in module.named_parameters():
        if name != "out_proj.bias":
            assert torch.equal(parameter.grad, torch.zeros_like(parameter)), name
    assert module.out_proj.bias.grad.abs().sum() > 0


def test_the_tiled_loop_gives_a_row_masked_to_the_end_zero_as_the_fused_kernel_does():
    """The online softmax of a row that sees no key ends with sum 0 and accumulator 0: the loop returns
    0 there (not 0/0), and its backward, from L = +inf, gives gradients of 0: PyTorch's kernel's numbers."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    real = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])  # left padding; all padding
    upstream = torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64)
    tiled = tiled_attention(q, k, v, block_size=2, attention_mask=real)
    tiled_grads = torch.autograd.grad(tiled, (q, k, v), upstream)
    mask = ~with_padding(causal_mask(7), real, batch=2)  # True: may attend, as the kernel reads it
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    fused_grads = torch.autograd.grad(fused, (q, k, v), upstream)
    assert torch.equal(tiled[:, :, :3], torch.zeros_like(tiled[:, :, :3])) and not tiled[1].any()
    torch.testing.assert_close(tiled, fused)
    for got, expected in zip(tiled_grads, fused_grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected)


def test_pytorchs_kernel_gives_a_query_with_no_visible_key_zeros():
    """The rule the modules follow is the fused kernel's own, on the pinned PyTorch, on the CPU: a
    boolean mask that hides a whole row gives 0 there, and a gradient of 0."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g).requires_grad_() for _ in range(3))
    sees = torch.tensor([[False, False, False], [True, True, False], [True, True, True]])
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sees)
    out.sum().backward()
    assert torch.equal(out[0, :, 0], torch.zeros(2, 4)) and torch.isfinite(out).all()
    assert torch.equal(q.grad[0, :, 0], torch.zeros(2, 4))
