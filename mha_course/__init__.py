"""mha_course: multi-head attention, from one causal head to the efficient batched module.

The package behind the course's book. Every class and function a chapter runs lives here, in
teaching order:

* :class:`CausalAttention` - one causal head (chapter 1);
* :class:`MultiHeadAttentionWrapper` - several heads stacked side by side (chapter 2);
* :class:`MultiHeadAttention` - all heads in one batched module (chapter 3);
* :class:`FastMultiHeadAttention` - the same module on a fused QKV projection and PyTorch's fused
  attention kernel (chapter 4);
* :class:`GroupedQueryAttention` - query heads that share key/value heads in groups, from
  multi-head to multi-query attention, and :class:`KVCache` - the keys and values kept between
  generated tokens (chapter 6);
* :func:`from_gpt2_attention` and :func:`from_llama_attention` - the course's modules built from
  transformers' GPT-2 and Llama attention layers, computing what those do (chapter 8).
* :func:`tiled_attention` - attention one tile of scores at a time, with an online softmax, and
  :class:`TiledMultiHeadAttention` built on it (chapter 7).
* :class:`MultiHeadLatentAttention` - keys and values expanded from one cached latent per token,
  and :func:`from_deepseek_v3_attention`, which builds it from DeepSeek-V3's layer (chapter 10).
* ``GroupedQueryAttention(window=..., sinks=True)`` - sliding windows and attention sinks, with
  :func:`from_mistral_attention` and :func:`from_gpt_oss_attention` (chapter 11).
* :class:`SparseLatentAttention` - latent attention reading only the keys a :class:`LightningIndexer`
  picks, and :func:`from_deepseek_v32_attention` from DeepSeek-V3.2's layer (chapter 11).
* :func:`linear_attention_recurrent`, :func:`recurrent_gated_delta_rule`,
  :func:`chunked_gated_delta_rule` and :class:`GatedDeltaNet` - a state that does not grow, from
  causal linear attention to Qwen3-Next's layer, and :func:`from_qwen3_next_gated_deltanet`
  (chapter 12).

``check("1.1", answer)`` grades a learner's answer to an exercise (see :mod:`mha_course.exercises`).

The attention modules live in :mod:`mha_course.attention`, the conversions from torch's and
transformers' layers in :mod:`mha_course.convert`, and the teaching aids and tools beside them.
Importing the package loads the core (those two subpackages and :mod:`~mha_course.device`) and the
example data, nothing else: the teaching aids (:mod:`~mha_course.cost`, :mod:`~mha_course.plots`,
:mod:`~mha_course.compare`, ...) load when a chapter imports them, and the tools
(:mod:`~mha_course.exercises`, :mod:`~mha_course.bench`, :mod:`~mha_course.experiments`) when they
are used: ``check`` is imported on first use.
"""

from typing import TYPE_CHECKING


from .attention import (
    CausalAttention,
    FastMultiHeadAttention,
    GatedDeltaNet,
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    LightningIndexer,
    MultiHeadLatentAttention,
    RotaryEmbedding,
    SparseLatentAttention,
    TiledMultiHeadAttention,
    causal_mask,
    chunked_gated_delta_rule,
    delta_rule_step,
    elu_feature_map,
    gated_delta_step,
    l2_normalise,
    linear_attention_quadratic,
    linear_attention_recurrent,
    merge_heads,
    recurrent_gated_delta_rule,
    rotate_half,
    softmax_with_sinks,
    split_heads,
    stack_qkv,
    tiled_attention,
    transfer_weights,
    unstack_qkv,
    visibility,
    with_padding,
    yarn_softmax_scale,
)
from .convert import (
    UnsupportedConfigError,
    from_deepseek_v3_attention,
    from_deepseek_v32_attention,
    from_gpt_oss_attention,
    from_gpt2_attention,
    from_llama_attention,
    from_mistral_attention,
    from_qwen3_next_gated_deltanet,
    from_torch_multihead,
    sdpa_forward,
    to_torch_multihead,
    torch_multihead_forward,
)
from .data import RUNNING_WORDS, THREE_TOKEN_LABELS, random_batch, running_example, three_token_example
from .device import DEVICE_ENV_VAR, get_device

if TYPE_CHECKING:
    from .exercises import check

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
    "with_padding",
    "RotaryEmbedding",
    "rotate_half",
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
    "from_gpt2_attention",
    "from_llama_attention",
    "UnsupportedConfigError",
    "check",
    "tiled_attention",
    "TiledMultiHeadAttention",
    "MultiHeadLatentAttention",
    "yarn_softmax_scale",
    "from_deepseek_v3_attention",
    "SparseLatentAttention",
    "LightningIndexer",
    "from_deepseek_v32_attention",
    "from_mistral_attention",
    "from_gpt_oss_attention",
    "softmax_with_sinks",
    "elu_feature_map",
    "linear_attention_quadratic",
    "linear_attention_recurrent",
    "l2_normalise",
    "delta_rule_step",
    "gated_delta_step",
    "recurrent_gated_delta_rule",
    "chunked_gated_delta_rule",
    "GatedDeltaNet",
    "from_qwen3_next_gated_deltanet",
]


def __getattr__(name: str):
    # `check` belongs to the tools (mha_course.exercises, with every chapter's catalogue of
    # mistakes): imported on first use, so that `import mha_course` stays light.
    if name == "check":
        from .exercises import check

        globals()["check"] = check
        return check
    raise AttributeError(f"module 'mha_course' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
