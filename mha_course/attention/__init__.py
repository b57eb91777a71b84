"""The attention modules a learner reads, in the order the chapters teach them.

* :mod:`.causal_attention` - one causal head (chapter 1);
* :mod:`.wrapper` - several heads stacked side by side (chapter 2);
* :mod:`.multihead` - all heads in one batched module (chapter 3);
* :mod:`.fast` - the same on a fused QKV projection and PyTorch's fused kernel (chapter 4);
* :mod:`.grouped_query` and :mod:`.kv_cache` - key/value heads shared in groups, and decoding token by
  token (chapter 6);
* :mod:`.tiled` - attention one tile of scores at a time (chapter 7);
* :mod:`.rotary` and :mod:`.generation` - rotary positions, and a padded batch decoded (chapter 9);
* :mod:`.latent` - multi-head latent attention: keys and values from one cached latent per token (chapter 10);
* :mod:`.sinks` - attention sinks: a learned logit per head in the softmax, with no value (chapter 11);
* :mod:`.sparse` - DeepSeek's sparse attention: an indexer picks each query's top-k keys (chapter 11);
* :mod:`.linear`, :mod:`.delta_rule` and :mod:`.gated_deltanet` - a state that does not grow: causal
  linear attention, the gated delta rule in its recurrent and chunked forms, and Qwen3-Next's Gated
  DeltaNet layer (chapter 12);
* :mod:`.heads`, :mod:`.masking` and :mod:`._validation` - what the modules share: reshapes, masks and
  argument checks.

This subpackage imports nothing else of the package; the conversions from torch's and transformers'
layers live in :mod:`mha_course.convert`.
"""

from .causal_attention import CausalAttention
from .fast import FastMultiHeadAttention
from .delta_rule import (chunked_gated_delta_rule, delta_rule_step, gated_delta_step, l2_normalise,
                         recurrent_gated_delta_rule)
from .gated_deltanet import GatedDeltaNet
from .grouped_query import GroupedQueryAttention
from .heads import merge_heads, split_heads, stack_qkv, unstack_qkv
from .kv_cache import KVCache
from .latent import MultiHeadLatentAttention, yarn_softmax_scale
from .linear import elu_feature_map, linear_attention_quadratic, linear_attention_recurrent
from .masking import causal_mask, visibility, with_padding
from .multihead import MultiHeadAttention, transfer_weights
from .rotary import RotaryEmbedding, rotate_half
from .sinks import softmax_with_sinks
from .sparse import LightningIndexer, SparseLatentAttention
from .tiled import TiledMultiHeadAttention, tiled_attention
from .wrapper import MultiHeadAttentionWrapper

__all__ = [
    "CausalAttention", "MultiHeadAttentionWrapper", "MultiHeadAttention", "transfer_weights",
    "FastMultiHeadAttention", "GroupedQueryAttention", "KVCache", "TiledMultiHeadAttention", "tiled_attention",
    "RotaryEmbedding", "rotate_half", "split_heads", "merge_heads", "stack_qkv", "unstack_qkv",
    "causal_mask", "visibility", "with_padding", "MultiHeadLatentAttention", "yarn_softmax_scale",
    "LightningIndexer", "SparseLatentAttention", "softmax_with_sinks",
    "elu_feature_map", "linear_attention_quadratic", "linear_attention_recurrent", "l2_normalise", "delta_rule_step",
    "gated_delta_step", "recurrent_gated_delta_rule", "chunked_gated_delta_rule", "GatedDeltaNet",
]
