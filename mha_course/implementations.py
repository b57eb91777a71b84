"""Every way the course computes causal multi-head attention, by name: the one registry.

The benchmark (chapter 4) times these, and the head-count sweeps (chapter 2) build them, so an
implementation is spelled the same everywhere:

========================  ==================================================================
``stacked``               :class:`MultiHeadAttentionWrapper`: the heads one after another
``batched``               :class:`MultiHeadAttention`: the textbook batched module
``fused_qkv``             :class:`FastMultiHeadAttention` with ``use_sdpa = False``: one fused
                          QKV projection, then the explicit scores, mask and softmax
``fast``                  :class:`FastMultiHeadAttention`: fused QKV + ``scaled_dot_product_attention``
``raw_sdpa``              :func:`sdpa_forward`: the textbook module's own three projections
                          around a bare ``scaled_dot_product_attention`` call
``torch_mha_weights``     ``torch.nn.MultiheadAttention(need_weights=True)``
``torch_mha``             ``torch.nn.MultiheadAttention(need_weights=False)``
========================  ==================================================================

All of them compute the same function on the same weights: the stacked wrapper is built first
(seeded) and every other one takes its weights from it. **Adding an implementation** is one entry
in :data:`IMPLEMENTATIONS`: a name, a description, the cost formula that counts its work
(:data:`mha_course.cost.KINDS`), and a function that builds it from the two reference modules
(raising :class:`NotApplicable` with the reason where it cannot run at a size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from .attention.fast import FastMultiHeadAttention
from .convert.pytorch import sdpa_forward, to_torch_multihead
from .attention.masking import causal_mask
from .attention.multihead import MultiHeadAttention
from .attention.wrapper import MultiHeadAttentionWrapper


class NotApplicable(Exception):
    """An implementation cannot run at this size; the message says why."""


@dataclass
class Implementation:
    """A built implementation: a callable ``x -> output`` and the modules whose parameters it trains."""

    name: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    modules: list[nn.Module]
    cost_kind: str  # which formula of mha_course.cost counts its multiply-adds
    out_features: int  # width of the output, to shape the gradient of a training step


@dataclass(frozen=True)
class References:
    """The two seeded modules every implementation takes its weights from."""

    wrapper: MultiHeadAttentionWrapper
    batched: MultiHeadAttention


@dataclass(frozen=True)
class Spec:
    """One entry of the registry: how to build an implementation and how to count its work."""

    name: str
    description: str
    cost_kind: str
    build: Callable[[References], tuple[Callable[[torch.Tensor], torch.Tensor], list[nn.Module]]]
    #: Its attention is a fused kernel that may skip the fully masked tiles of the score matrix, so
    #: FLOP/s from the cost formula (the full square) count work it may not have done.
    fused: bool = False


def _fast(refs: References, use_sdpa: bool):
    module = FastMultiHeadAttention.from_multihead(refs.batched)
    module.use_sdpa = use_sdpa
    return module, [module]


def _torch_mha(refs: References, need_weights: bool):
    batched = refs.batched
    if batched.d_in != batched.d_out:
        raise NotApplicable(f"torch.nn.MultiheadAttention needs d_in == d_out; this size has "
                            f"d_in={batched.d_in}, d_out={batched.d_out}")
    module = to_torch_multihead(batched)
    mask = causal_mask(batched.context_length, device=batched.out_proj.weight.device)

    def forward(x):
        t = x.shape[1]
        return module(x, x, x, attn_mask=mask[:t, :t], need_weights=need_weights)[0]

    return forward, [module]


#: Every implementation, in the order of the course.
IMPLEMENTATIONS: dict[str, Spec] = {
    spec.name: spec
    for spec in (
        Spec("stacked", "MultiHeadAttentionWrapper: heads stacked, computed one after another", "wrapper",
             lambda refs: (refs.wrapper, [refs.wrapper])),
        Spec("batched", "MultiHeadAttention: the textbook batched module", "batched",
             lambda refs: (refs.batched, [refs.batched])),
        Spec("fused_qkv", "FastMultiHeadAttention(use_sdpa=False): fused QKV, explicit attention", "batched",
             lambda refs: _fast(refs, use_sdpa=False)),
        Spec("fast", "FastMultiHeadAttention: fused QKV + scaled_dot_product_attention", "batched",
             lambda refs: _fast(refs, use_sdpa=True), fused=True),
        Spec("raw_sdpa", "scaled_dot_product_attention on MultiHeadAttention's own projections", "batched",
             lambda refs: (lambda x: sdpa_forward(refs.batched, x), [refs.batched]), fused=True),
        Spec("torch_mha_weights", "torch.nn.MultiheadAttention, need_weights=True", "batched",
             lambda refs: _torch_mha(refs, need_weights=True)),
        Spec("torch_mha", "torch.nn.MultiheadAttention, need_weights=False", "batched",
             lambda refs: _torch_mha(refs, need_weights=False)),
    )
}


def validate_names(names: Iterable[str], known, what: str) -> list[str]:
    """Return ``names`` as a list if every one is in ``known``, else an error listing the choices.

    Example:
        >>> validate_names(["fastest"], IMPLEMENTATIONS, "implementations")
        Traceback (most recent call last):
            ...
        ValueError: unknown implementations ['fastest']: choose from stacked, batched, fused_qkv, fast, raw_sdpa, torch_mha_weights, torch_mha.
    """
    names = list(names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}: choose from {', '.join(known)}.")
    return names


def build_implementations(*, d_in: int, num_heads: int, head_dim: int, context_length: int, device="cpu",
                          names: Iterable[str] | None = None, seed: int = 0):
    """Build implementations of one size on ``device``, all computing the same function.

    The stacked wrapper is built first (seeded with ``seed``); the textbook module gets its
    weights by :meth:`MultiHeadAttention.from_wrapper`, the fast path by
    :meth:`FastMultiHeadAttention.from_multihead` and PyTorch's module by
    :func:`to_torch_multihead`. Every module is left in eval mode.

    Returns:
        ``(implementations, skipped)``: name -> :class:`Implementation` for those that can run at
        this size, and name -> the reason for those that cannot, both in the order of ``names``
        (default: every name of :data:`IMPLEMENTATIONS`).

    Example:
        >>> impls, skipped = build_implementations(d_in=3, num_heads=2, head_dim=2, context_length=6)
        >>> list(impls), sorted(skipped)
        (['stacked', 'batched', 'fused_qkv', 'fast', 'raw_sdpa'], ['torch_mha', 'torch_mha_weights'])
    """
    names = validate_names(IMPLEMENTATIONS if names is None else names, IMPLEMENTATIONS, "implementations")
    with torch.random.fork_rng(devices=[]):  # seeded weights, the caller's random state untouched
        torch.manual_seed(seed)
        wrapper = MultiHeadAttentionWrapper(d_in, head_dim, context_length, 0.0, num_heads).to(device)
    refs = References(wrapper=wrapper, batched=MultiHeadAttention.from_wrapper(wrapper))
    built, skipped = {}, {}
    for name in names:
        spec = IMPLEMENTATIONS[name]
        try:
            forward, modules = spec.build(refs)
        except NotApplicable as reason:
            skipped[name] = str(reason)
            continue
        for module in modules:
            module.eval()
        built[name] = Implementation(name, forward, modules, spec.cost_kind, num_heads * head_dim)
    return built, skipped
