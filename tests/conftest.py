"""Shared fixtures and helpers for the package tests."""

from __future__ import annotations

import pytest
import torch

from mha_course import CausalAttention, FastMultiHeadAttention, MultiHeadAttention, MultiHeadAttentionWrapper

# tests/notebooks/ holds the grader's test inputs (some raise, hang or tamper on purpose): they are
# read by tests/test_grader.py, never collected by nbval as chapters.
collect_ignore_glob = ["notebooks/*.ipynb"]

# Tests run single-threaded and seeded, so results do not depend on the machine's core count.
torch.set_num_threads(1)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")


def build(kind: str, d_in: int = 3, head_dim: int = 2, num_heads: int = 2, context_length: int = 6,
          dropout: float = 0.0, qkv_bias: bool = False):
    """Build one of the three attention classes with comparable sizes.

    ``head_dim`` is the width of one head; for ``MultiHeadAttention`` the total ``d_out`` is
    ``num_heads * head_dim`` and for ``CausalAttention`` there is one head.
    """
    if kind == "causal":
        return CausalAttention(d_in, head_dim, context_length, dropout, qkv_bias)
    if kind == "wrapper":
        return MultiHeadAttentionWrapper(d_in, head_dim, context_length, dropout, num_heads, qkv_bias)
    if kind == "batched":
        return MultiHeadAttention(d_in, num_heads * head_dim, context_length, dropout, num_heads, qkv_bias)
    if kind in ("fast", "fast-explicit"):
        fast = FastMultiHeadAttention(d_in, num_heads * head_dim, context_length, dropout, num_heads, qkv_bias)
        fast.use_sdpa = kind == "fast"  # "fast-explicit" takes the step-by-step path of the same module
        return fast
    raise ValueError(kind)


KINDS = ["causal", "wrapper", "batched"]
# Every module that must be causal, the fast path (both of its code paths) included.
CAUSAL_KINDS = KINDS + ["fast", "fast-explicit"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
