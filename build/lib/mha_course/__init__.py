"""mha_course: multi-head attention, from one causal head to the efficient batched module.

The package behind the course's book. Every class and function a chapter runs lives here, in
teaching order:

* :class:`CausalAttention` - one causal head (chapter 1);
* :class:`MultiHeadAttentionWrapper` - several heads stacked side by side (chapter 2);
* :class:`MultiHeadAttention` - all heads in one batched module (chapter 3).
* :class:`FastMultiHeadAttention` - the same module on a fused QKV projection and PyTorch's fused
  attention kernel (chapter 4).

``check("1.1", answer)`` grades a learner's answer to an exercise (see :mod:`mha_course.exercises`).
"""

from .causal_attention import CausalAttention
from .data import RUNNING_WORDS, THREE_TOKEN_LABELS, random_batch, running_example, three_token_example
from .device import DEVICE_ENV_VAR, get_device
from .fast import FastMultiHeadAttention
from .grouped_query import GroupedQueryAttention
from .heads import merge_heads, split_heads, stack_qkv, unstack_qkv
from .interop import from_torch_multihead, sdpa_forward, to_torch_multihead, torch_multihead_forward
from .kv_cache import KVCache
from .masking import causal_mask, visibility
from .multihead import MultiHeadAttention, transfer_weights
from .wrapper import MultiHeadAttentionWrapper
from .exercises import check  # noqa: E402  (the tools come after the core they check)

__version__ = "0.1.0"

__all__ = [
    "CausalAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
    "transfer_weights",
    "FastMultiHeadAttention",
    "GroupedQueryAttention",
    "KVCache",
    "split_heads",
    "merge_heads",
    "stack_qkv",
    "unstack_qkv",
    "causal_mask",
    "visibility",
    "get_device",
    "DEVICE_ENV_VAR",
    "running_example",
    "three_token_example",
    "random_batch",
    "RUNNING_WORDS",
    "THREE_TOKEN_LABELS",
    "sdpa_forward",
    "to_torch_multihead",
    "from_torch_multihead",
    "torch_multihead_forward",
    "check",
]
