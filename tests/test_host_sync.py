"""No module's ``forward`` waits for the device: no path reads a tensor's value on the host.

Reading a value (``.item()``, ``bool(t)``, ``.tolist()``, ``if t.any():``, ``t.unique()``) makes the
processor wait until the GPU has computed it, a stall in every call. Without a GPU the tests run every
path on the ``meta`` device, where tensors have shapes and no values: any such read raises there. Where
CUDA runs, the same calls run under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import pytest
import torch

from mha_course import (CausalAttention, FastMultiHeadAttention, GroupedQueryAttention, KVCache,
                        MultiHeadAttention, MultiHeadAttentionWrapper, TiledMultiHeadAttention, tiled_attention)
from mha_course.attention.generation import TinyDecoder


def _on(module_class, use_sdpa, **kwargs):
    module = module_class(6, 8, 12, 0.0, 2, **kwargs)
    module.use_sdpa = use_sdpa
    return module


def _cases(device):
    """Name -> a function that builds the modules and inputs of one forward path on ``device`` and
    returns that forward as a call: every module, with and without padding, caches and positions."""
    x = torch.randn(2, 5, 6).to(device)
    real = torch.ones(2, 5, dtype=torch.long).to(device)
    positions = torch.arange(5).expand(2, -1).to(device)

    def call(module, *args, **kwargs):
        module = module.to(device)
        return lambda: module(*args, **kwargs)

    def tiled_backward():
        q, k, v = (torch.randn(1, 2, 5, 4).to(device).requires_grad_() for _ in range(3))
        return lambda: tiled_attention(q, k, v, block_size=2, attention_mask=real[:1]).sum().backward()

    def decoding(use_sdpa):
        module = _on(GroupedQueryAttention, use_sdpa, num_kv_groups=1, rope_theta=10000.0).to(device)

        def forward():
            cache = KVCache()
            module(x[:, :3], cache, real[:, :3], positions[:, :3])  # a padded prompt
            module(x[:, 3:4], cache, real[:, :4], positions[:, 3:4])  # one token
            return module(x[:, 4:], cache)  # and one without a mask
        return forward

    def chunked(use_sdpa):
        module = _on(GroupedQueryAttention, use_sdpa, num_kv_groups=1).to(device)

        def forward():
            cache = KVCache()
            module(x[:, :2], cache=cache)
            return module(x[:, 2:], cache=cache)  # three new tokens after two cached: rows of the mask
        return forward

    def backward(use_sdpa):
        module = _on(GroupedQueryAttention, use_sdpa, num_kv_groups=1).to(device)
        leaf = x.clone().requires_grad_()
        return lambda: module(leaf, attention_mask=real).sum().backward()

    def tiny_decoder():
        model, ids = TinyDecoder(11, 8, 2, 12).to(device), torch.zeros(2, 5, dtype=torch.long).to(device)
        return lambda: model(ids, [KVCache(), KVCache()], real)

    cases = {
        "causal": lambda: call(CausalAttention(6, 4, 12, 0.0), x),
        "wrapper": lambda: call(MultiHeadAttentionWrapper(6, 4, 12, 0.0, 2), x),
        "multihead": lambda: call(MultiHeadAttention(6, 8, 12, 0.0, 2), x),
        "multihead-padded": lambda: call(MultiHeadAttention(6, 8, 12, 0.0, 2), x, real),
        "tiled-padded": lambda: call(TiledMultiHeadAttention(6, 8, 12, 0.0, 2, block_size=2), x, real),
        "tiled-backward": tiled_backward,
        "tiny-decoder": tiny_decoder,
    }
    for use_sdpa, path in ((True, "sdpa"), (False, "explicit")):
        cases[f"fast-{path}"] = lambda s=use_sdpa: call(_on(FastMultiHeadAttention, s), x)
        cases[f"fast-{path}-padded"] = lambda s=use_sdpa: call(_on(FastMultiHeadAttention, s), x, real)
        cases[f"grouped-{path}"] = lambda s=use_sdpa: call(_on(GroupedQueryAttention, s, num_kv_groups=1), x)
        cases[f"grouped-{path}-decoding"] = lambda s=use_sdpa: decoding(s)
        cases[f"grouped-{path}-chunked"] = lambda s=use_sdpa: chunked(s)
        cases[f"grouped-{path}-backward"] = lambda s=use_sdpa: backward(s)
    return cases


CALLS = sorted(_cases("cpu"))


@pytest.mark.parametrize("name", CALLS)
def test_forward_reads_no_value_on_the_host(name):
    """On the meta device a tensor has no values: a path that read one would raise here."""
    _cases("meta")[name]()()


def test_the_meta_device_catches_a_read():
    """Guards the test above: reading a value of a meta tensor, as an old check of the mask did, raises."""
    mask = torch.ones(2, 5, dtype=torch.long, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        bool(((mask == 0) | (mask == 1)).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
@pytest.mark.parametrize("name", CALLS)
def test_on_the_gpu_forward_never_synchronises(name):
    call = _cases("cuda")[name]()  # the modules and inputs, moved to the GPU before the check
    call()  # a first call: lazy initialisation may synchronise once
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
