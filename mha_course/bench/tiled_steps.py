"""The three ways of computing attention's middle that ``bench --tiled`` compares, as calls:
forward only (inference), or forward and backward (training).

Built here, apart from the run (:mod:`mha_course.bench.tiled`), so that the memory server
(:mod:`mha_course.bench.memory`) can build them in its child processes without importing the run,
as :mod:`mha_course.bench.steps` does for the main benchmark.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.masking import causal_mask
from ..attention.tiled import tiled_attention
from .sizes import BenchConfig

#: The two modes of a tiled run: the forward pass under ``torch.no_grad`` (inference), and the
#: forward and backward passes (training: the gradients of the queries, keys and values).
TILED_MODE, TRAINING_MODE = "tiled", "tiled-training"

#: The three ways of computing attention's middle, by name.
TILED_IMPLEMENTATIONS = {
    "scores": "the explicit (T, T) scores, mask and softmax, then the weighted sum",
    "tiled": "tiled_attention: a Python loop over tiles with an online softmax",
    "sdpa": "scaled_dot_product_attention(is_causal=True): the fused kernel",
}


def explicit_attention(queries, keys, values):
    """The textbook middle: every head's ``(T, T)`` scores, masked, softmaxed, times the values."""
    num_tokens, head_dim = queries.shape[-2:]
    scores = (queries * head_dim**-0.5) @ keys.transpose(2, 3)  # (B, h, T, T)
    scores.masked_fill_(causal_mask(num_tokens, device=scores.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ values  # (B, h, T, d_h)


def saved_tensor_bytes(call) -> int:
    """What autograd keeps for the backward of ``call()``: the bytes of every distinct storage it saves.

    Seen through ``torch.autograd.graph.saved_tensors_hooks``, which is handed every tensor an
    operation saves for its backward (a custom ``autograd.Function``'s ``save_for_backward``
    included); a storage saved twice, or by two views, counts once.

    Example:
        >>> x = torch.ones(256, requires_grad=True)  # 1 KiB of float32
        >>> saved_tensor_bytes(lambda: (x * x).exp())  # x (once), and exp's output
        2048
    """
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = call()  # kept until the sum: the storages it saved stay alive, their addresses distinct
    del output
    return sum(storages.values())


class _Conversions(torch.overrides.TorchFunctionMode):
    """Adds up the bytes of every tensor that ``Tensor.to`` makes in another dtype while it is active."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        source = args[0] if args else None
        if (func is torch.Tensor.to and isinstance(result, torch.Tensor) and isinstance(source, torch.Tensor)
                and result.dtype != source.dtype):
            self.bytes += result.nbytes
        return result


def conversion_bytes(call) -> int:
    """The bytes of the copies in another dtype (``Tensor.to``) that ``call()`` makes: for half-precision
    inputs, what :func:`~mha_course.tiled_attention` holds in float32 beside them.

    Example:
        >>> x = torch.ones(256, dtype=torch.bfloat16)  # 512 bytes
        >>> conversion_bytes(lambda: x.to(torch.float32) + x.to(torch.bfloat16))  # one new float32 copy
        1024
    """
    with _Conversions() as counter:
        call()
    return counter.bytes


def tiled_inputs(config: BenchConfig, device="cpu", seed: int = 1):
    """Seeded queries, keys and values ``(B, h, T, d_h)`` of one size."""
    g = torch.Generator().manual_seed(seed)
    shape = (config.batch, config.num_heads, config.num_tokens, config.head_dim)
    return tuple(torch.randn(*shape, generator=g).to(device) for _ in range(3))


def tiled_functions(block_size: int) -> dict:
    """Name -> ``f(queries, keys, values)``, attention's middle computed that way."""
    return {"scores": explicit_attention,
            "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=block_size),
            "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}


def tiled_calls(config: BenchConfig, block_size: int, device="cpu", seed: int = 1, mode: str = TILED_MODE) -> dict:
    """Name -> a no-argument callable computing attention's middle that way.

    In ``TILED_MODE`` the call runs the forward pass under ``torch.no_grad`` and returns the output;
    in ``TRAINING_MODE`` it runs the forward and the backward pass (with a seeded gradient of the
    output) and returns the gradients of the queries, keys and values, stacked.

    Example:
        >>> calls = tiled_calls(BenchConfig("tiny", 1, 16, 16, 2, 8, ""), block_size=4)
        >>> torch.allclose(calls["tiled"](), calls["sdpa"](), atol=1e-5), list(calls)
        (True, ['scores', 'tiled', 'sdpa'])
        >>> grads = tiled_calls(BenchConfig("tiny", 1, 16, 16, 2, 8, ""), 4, mode=TRAINING_MODE)
        >>> grads["tiled"]().shape, torch.allclose(grads["tiled"](), grads["sdpa"](), atol=1e-5)
        (torch.Size([3, 1, 2, 16, 8]), True)
    """
    if mode not in (TILED_MODE, TRAINING_MODE):
        raise ValueError(f"mode must be {TILED_MODE!r} or {TRAINING_MODE!r}, got {mode!r}.")
    q, k, v = tiled_inputs(config, device, seed)
    functions = tiled_functions(block_size)
    if mode == TILED_MODE:
        return {name: forward_call(functions[name], q, k, v) for name in TILED_IMPLEMENTATIONS}
    upstream = tiled_inputs(config, device, seed + 1)[0]  # the gradient of the output
    return {name: training_call(functions[name], q, k, v, upstream) for name in TILED_IMPLEMENTATIONS}


def forward_call(fn, q, k, v):
    """A call of ``fn(q, k, v)`` under ``torch.no_grad``: inference."""
    def call():
        with torch.no_grad():
            return fn(q, k, v)
    return call


def training_call(fn, q, k, v, upstream):
    """A call of ``fn`` and its backward from the output's gradient ``upstream``: the gradients of
    ``q``, ``k`` and ``v`` stacked, ``(3, B, h, T, d_h)``."""
    def call():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        return torch.stack(torch.autograd.grad(fn(*leaves), leaves, upstream))
    return call


def tiled_saved_bytes(config: BenchConfig, block_size: int, device="cpu", seed: int = 1) -> dict:
    """Name -> what autograd keeps for the backward of that way (:func:`saved_tensor_bytes`).

    Example:
        >>> saved = tiled_saved_bytes(BenchConfig("tiny", 1, 256, 16, 2, 8, ""), block_size=64)
        >>> saved["tiled"] == saved["sdpa"] < saved["scores"]  # q, k, v, the output; one number a row
        True
    """
    q, k, v = tiled_inputs(config, device, seed)
    functions = tiled_functions(block_size)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    return {name: saved_tensor_bytes(lambda fn=functions[name]: fn(*leaves)) for name in TILED_IMPLEMENTATIONS}


#: The two modes of a window run: forward only, and forward with backward.
WINDOW_MODE, WINDOW_TRAINING_MODE = "window", "window-training"

#: The two ways of attending through a sliding window that ``bench --window`` compares, by name.
WINDOW_IMPLEMENTATIONS = {
    "tiled": "tiled_attention(window=W): the loop skips every tile wholly outside the window",
    "sdpa": "scaled_dot_product_attention with the window's mask (is_causal=True without a window)",
}


def window_functions(block_size: int, window: int | None) -> dict:
    """Name -> ``f(queries, keys, values)``: attention under the causal mask and a sliding ``window``
    (``None``: the causal mask alone), by the tiled loop and by the fused kernel given the mask."""
    def sdpa(q, k, v):
        if window is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        visible = ~causal_mask(q.shape[2], device=q.device, window=window)  # (T, T), built in the call
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)

    return {"tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=block_size, window=window), "sdpa": sdpa}


def window_calls(config: BenchConfig, block_size: int, window: int | None, device="cpu", seed: int = 1,
                 mode: str = WINDOW_MODE) -> dict:
    """Name -> a no-argument callable: attention under ``window`` that way, forward (``WINDOW_MODE``)
    or forward and backward (``WINDOW_TRAINING_MODE``, returning the stacked gradients), as
    :func:`tiled_calls` builds them.

    Example:
        >>> calls = window_calls(BenchConfig("tiny", 1, 16, 16, 2, 8, ""), block_size=4, window=5)
        >>> torch.allclose(calls["tiled"](), calls["sdpa"](), atol=1e-5), list(calls)
        (True, ['tiled', 'sdpa'])
    """
    if mode not in (WINDOW_MODE, WINDOW_TRAINING_MODE):
        raise ValueError(f"mode must be {WINDOW_MODE!r} or {WINDOW_TRAINING_MODE!r}, got {mode!r}.")
    q, k, v = tiled_inputs(config, device, seed)
    functions = window_functions(block_size, window)
    if mode == WINDOW_MODE:
        return {name: forward_call(f, q, k, v) for name, f in functions.items()}
    upstream = tiled_inputs(config, device, seed + 1)[0]  # the gradient of the output
    return {name: training_call(f, q, k, v, upstream) for name, f in functions.items()}
