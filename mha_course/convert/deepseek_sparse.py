"""The course's :class:`SparseLatentAttention` built from transformers' ``DeepseekV32Attention``.

DeepSeek-V3.2's layer is DeepSeek-V3's latent attention (with the query bottleneck, and the
neighbour-pair rotation ``apply_rotary_pos_emb_interleave`` always) plus an ``indexer``. Its latent
part converts as :func:`~mha_course.from_deepseek_v3_attention` converts V3's. The indexer's
``wq_b``, ``wk``, ``k_norm`` and ``weights_proj`` become the course's ``W_query``, ``W_key``,
``key_norm`` and ``W_head_weights``; it turns the first ``qk_rope_head_dim`` numbers of its heads
with the half-split rotation, which is the course's own, so its rows keep their order. Where yarn
scales cos and sin (``attention_scaling``), the rotated rows of ``wq_b`` and the rotated entries of
``k_norm``'s weight and bias are scaled by it: a rotation is linear, and the norm comes before it.
transformers is imported when the conversion runs.
"""

from __future__ import annotations

import torch

from ..attention.sparse import SparseLatentAttention
from .deepseek import copy_latent_weights, deepseek_rotation
from .transformers import require_layer, transformers_class, unsupported

MODELING = "transformers.models.deepseek_v32.modeling_deepseek_v32"


@torch.no_grad()
def from_deepseek_v32_attention(attention, context_length: int | None = None) -> SparseLatentAttention:
    """A :class:`SparseLatentAttention` that computes what a transformers ``DeepseekV32Attention`` does.

    The module equals ``DeepseekV32Attention`` fed with ``DeepseekV32RotaryEmbedding(config)(x,
    position_ids)``'s cos and sin and the causal mask (with padding), for the rope types ``"default"``
    and ``"yarn"``: the same keys chosen by the indexer, the same outputs; its cache holds what
    transformers' holds (the latent, the rotated key and the indexer's key). Where several keys tie at
    the top-k boundary (few index heads, ``zero_ties`` in ``mha_course.attention.sparse``), the two may
    choose differently. Device, dtype and training mode are ``attention``'s; the weights are copies.

    Args:
        attention: a ``transformers.models.deepseek_v32.modeling_deepseek_v32.DeepseekV32Attention``.
        context_length: the longest sequence the new module accepts; by default the config's
            ``max_position_embeddings``.

    Raises:
        TypeError: if ``attention`` is not a ``DeepseekV32Attention``.
        UnsupportedConfigError: for a ``rope_type`` other than ``"default"`` and ``"yarn"``, or
            ``num_key_value_heads`` other than ``num_attention_heads``.

    Example:
        >>> from transformers import DeepseekV32Config
        >>> from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Attention
        >>> config = DeepseekV32Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
        ...     q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
        ...     index_n_heads=2, index_head_dim=8, index_topk=4, max_position_embeddings=16)
        >>> dsa = from_deepseek_v32_attention(DeepseekV32Attention(config, layer_idx=0))
        >>> dsa.indexer.num_heads, dsa.indexer.topk, dsa.indexer.W_query.weight.shape
        (2, 4, torch.Size([16, 16]))
    """
    require_layer(attention, transformers_class(MODELING, "DeepseekV32Attention"), "from_deepseek_v32_attention")
    config = attention.config
    h = config.num_attention_heads
    if config.num_key_value_heads != h:
        raise unsupported("num_key_value_heads", config.num_key_value_heads, "multi-head latent attention "
                          "expands every head's own key and value from the latent, so transformers' layer "
                          f"runs only with as many key/value heads as heads. Build the config with "
                          f"num_key_value_heads={h}.")
    rope_theta, inv_freq, scaling, softmax_scale = deepseek_rotation(config, MODELING, "DeepseekV32RotaryEmbedding")
    dsa = SparseLatentAttention(
        config.hidden_size, config.max_position_embeddings if context_length is None else context_length,
        config.attention_dropout or 0.0, h, config.kv_lora_rank, config.qk_nope_head_dim,
        config.qk_rope_head_dim, config.v_head_dim, config.q_lora_rank, config.index_n_heads,
        config.index_head_dim, config.index_topk, bias=config.attention_bias, rope_theta=rope_theta,
        softmax_scale=softmax_scale)
    dsa.indexer.rotary.inv_freq.copy_(inv_freq)
    dsa = copy_latent_weights(dsa, attention, inv_freq, interleave=True, scaling=scaling)
    ours, theirs, rope = dsa.indexer, attention.indexer, config.qk_rope_head_dim
    queries = theirs.wq_b.weight.view(ours.num_heads, ours.head_dim, -1).clone()  # (heads, d, q_lora_rank)
    queries[:, :rope] *= scaling
    ours.W_query.weight.copy_(queries.reshape(ours.W_query.weight.shape))
    ours.W_key.weight.copy_(theirs.wk.weight)
    for name in ("weight", "bias"):
        turned = getattr(theirs.k_norm, name).clone()
        turned[:rope] *= scaling
        getattr(ours.key_norm, name).copy_(turned)
    ours.key_norm.eps = theirs.k_norm.eps
    ours.W_head_weights.weight.copy_(theirs.weights_proj.weight)
    return dsa


__all__ = ["from_deepseek_v32_attention"]
