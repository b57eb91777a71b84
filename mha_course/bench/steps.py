"""One call of an implementation, as the benchmark times it: forward, or a training step."""

from __future__ import annotations

import gc
from typing import Callable

import torch

from ..implementations import IMPLEMENTATIONS, Implementation, build_implementations
from .sizes import BenchConfig

#: What one call does: inference (``forward``) or a training step without the optimiser.
MODES = ("forward", "forward+backward")

#: How the tables and chapters name each mode: a forward+backward call is a training step.
MODE_LABELS = {"forward": "forward", "forward+backward": "training"}


def build_for(config: BenchConfig, device, names=None, seed: int = 0):
    """:func:`mha_course.implementations.build_implementations` at a benchmark size.

    Example:
        >>> from mha_course.bench import CONFIGS
        >>> impls, skipped = build_for(CONFIGS["textbook"], "cpu")
        >>> sorted(skipped)
        ['torch_mha', 'torch_mha_weights']
    """
    return build_implementations(d_in=config.d_in, num_heads=config.num_heads, head_dim=config.head_dim,
                                 context_length=config.num_tokens, device=device,
                                 names=IMPLEMENTATIONS if names is None else names, seed=seed)


def make_step(impl: Implementation, mode: str, x: torch.Tensor) -> Callable[[], None]:
    """A no-argument callable that runs ``impl`` once in ``mode`` (``forward`` or ``forward+backward``).

    ``forward`` runs in eval mode under ``torch.no_grad`` (inference). ``forward+backward`` runs in
    training mode with an input that needs a gradient, as attention inside a model does, and
    clears the gradients first, as ``optimizer.zero_grad()`` would.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
    if mode == "forward":
        for module in impl.modules:
            module.eval()

        def step():
            with torch.no_grad():
                impl.forward(x)

        return step
    for module in impl.modules:
        module.train()
    x_grad = x.detach().clone().requires_grad_(True)
    grad_output = torch.ones(*x.shape[:-1], impl.out_features, device=x.device, dtype=x.dtype)
    parameters = [p for module in impl.modules for p in module.parameters()]

    def step():
        for p in parameters:
            p.grad = None
        x_grad.grad = None
        impl.forward(x_grad).backward(grad_output)

    return step


def cuda_peak_memory(step: Callable[[], None], device: torch.device) -> dict:
    """Peak memory of one call on CUDA: the growth of the caching allocator's high-water mark."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return {"peak_bytes": int(torch.cuda.max_memory_allocated(device) - before),
            "minor_faults_per_call": None, "peak_method": "cuda max_memory_allocated growth"}
