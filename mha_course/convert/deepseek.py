"""The course's :class:`MultiHeadLatentAttention` built from transformers' ``DeepseekV3Attention``.

DeepSeek-V3's attention layer in transformers keeps the latent's down-projection and the rotated
key's in one ``nn.Linear``, ``kv_a_proj_with_mqa`` (rows ``:kv_lora_rank`` and the rest), and both
up-projections in another, ``kv_b_proj``, head by head (each head's key rows, then its value rows).
The conversion cuts them into the course's ``W_latent``, ``W_key_rot``, ``W_up_key`` and
``W_up_value``. Two settings change the weights rather than the module:

* ``rope_interleave=True`` pairs neighbouring numbers of the rotated part, ``(0, 1), (2, 3), ...``,
  and lays the rotated result out evens first, then odds. That is the course's half-split rotation
  of the same numbers reordered evens first: the conversion reorders the rotated rows of the query
  and key projections so, and the rotated keys it caches are transformers' own.
* yarn scales cos and sin by ``attention_scaling`` (1 when ``mscale`` equals ``mscale_all_dim``, as
  in DeepSeek-V3); a rotation is linear, so the conversion scales the same rows by it.

The yarn frequencies themselves are transformers' (``DeepseekV3RotaryEmbedding``), and the scale of
the scores is :func:`~mha_course.attention.latent.yarn_softmax_scale`. transformers is imported when
the conversion runs, never by ``import mha_course``.
"""

from __future__ import annotations

import torch

from ..attention.latent import MultiHeadLatentAttention, yarn_softmax_scale
from .transformers import require_layer, transformers_class, unsupported

MODELING = "transformers.models.deepseek_v3.modeling_deepseek_v3"

#: The rope types whose frequencies do not change with the sequence's length.
SUPPORTED_DEEPSEEK_ROPE_TYPES = ("default", "yarn")


def deepseek_rotation(config, modeling: str = MODELING,
              rotary_class: str = "DeepseekV3RotaryEmbedding") -> tuple[float, torch.Tensor, float, float]:
    """``rope_theta``, the frequencies, transformers' scale of cos and sin, and the scores' scale."""
    parameters = config.rope_parameters or {}
    rope_type = parameters.get("rope_type", "default")
    if rope_type not in SUPPORTED_DEEPSEEK_ROPE_TYPES:
        raise unsupported("rope_type", rope_type, "the conversion carries over DeepSeek's rotations "
                          "'default' and 'yarn', whose frequencies are fixed; others change them with the "
                          "sequence's length. Build the config with rope_parameters={'rope_type': 'yarn', ...} "
                          "or 'default'.")
    rotary = transformers_class(modeling, rotary_class)(config)
    scale = config.qk_head_dim**-0.5
    if rope_type == "yarn":
        scale = yarn_softmax_scale(config.qk_head_dim, parameters["factor"], parameters.get("mscale_all_dim", 0))
    return float(parameters["rope_theta"]), rotary.inv_freq.float(), float(rotary.attention_scaling), scale


def _rotated_rows(weight: torch.Tensor, per_head: int, rope: int, interleave: bool, scaling: float):
    """``weight``'s rows with each head's last ``rope`` rows reordered evens first and scaled."""
    rows = weight.reshape(-1, per_head, *weight.shape[1:]).clone()  # (heads, per_head, ...)
    if interleave:  # pairs (0, 1), (2, 3) ... become half-split pairs (i, i + rope/2)
        order = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
        rows[:, per_head - rope:] = rows[:, per_head - rope:][:, order.to(weight.device)]
    rows[:, per_head - rope:] *= scaling
    return rows.reshape(weight.shape)


@torch.no_grad()
def from_deepseek_v3_attention(attention, context_length: int | None = None) -> MultiHeadLatentAttention:
    """A :class:`MultiHeadLatentAttention` that computes what a transformers ``DeepseekV3Attention`` does.

    The module equals ``DeepseekV3Attention`` fed with ``DeepseekV3RotaryEmbedding(config)(x,
    position_ids)``'s cos and sin, for the rope types ``"default"`` and ``"yarn"``, with
    ``rope_interleave`` on or off and ``q_lora_rank`` ``None`` or set, and its cache holds what
    transformers' holds: the normalised latent and the rotated key. Dropout is ``attention_dropout``;
    device, dtype and training mode are ``attention``'s; the weights are copies.

    Args:
        attention: a ``transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention``.
        context_length: the longest sequence the new module accepts; by default the config's
            ``max_position_embeddings``.

    Raises:
        TypeError: if ``attention`` is not a ``DeepseekV3Attention``.
        UnsupportedConfigError: for a ``rope_type`` other than ``"default"`` and ``"yarn"``, or
            ``num_key_value_heads`` other than ``num_attention_heads`` (every head has its own keys).

    Example:
        >>> from transformers import DeepseekV3Config
        >>> from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
        >>> config = DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
        ...     q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
        ...     max_position_embeddings=16)
        >>> mla = from_deepseek_v3_attention(DeepseekV3Attention(config, layer_idx=0))
        >>> mla.num_heads, mla.kv_lora_rank, mla.W_up_key.weight.shape
        (4, 8, torch.Size([16, 8]))
    """
    require_layer(attention, transformers_class(MODELING, "DeepseekV3Attention"), "from_deepseek_v3_attention")
    config = attention.config
    h, rank = config.num_attention_heads, config.kv_lora_rank
    nope, rope, v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    if config.num_key_value_heads != h:
        raise unsupported("num_key_value_heads", config.num_key_value_heads, "multi-head latent attention "
                          "expands every head's own key and value from the latent, so transformers' layer "
                          f"runs only with as many key/value heads as heads. Build the config with "
                          f"num_key_value_heads={h}.")
    rope_theta, inv_freq, scaling, softmax_scale = deepseek_rotation(config)
    mla = MultiHeadLatentAttention(
        config.hidden_size, config.max_position_embeddings if context_length is None else context_length,
        config.attention_dropout or 0.0, h, rank, nope, rope, v, q_lora_rank=config.q_lora_rank,
        bias=config.attention_bias, rope_theta=rope_theta, softmax_scale=softmax_scale)
    return copy_latent_weights(mla, attention, inv_freq, interleave=bool(config.rope_interleave), scaling=scaling)


@torch.no_grad()
def copy_latent_weights(mla: MultiHeadLatentAttention, attention, inv_freq: torch.Tensor, interleave: bool,
                        scaling: float) -> MultiHeadLatentAttention:
    """Copy a DeepSeek attention layer's weights into ``mla`` (moved to the layer's device and dtype):
    its latent attention's, those DeepSeek-V3 and V3.2 share."""
    config = attention.config
    h, rank = config.num_attention_heads, config.kv_lora_rank
    nope, rope, v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    weight = attention.kv_b_proj.weight
    mla.rotary.inv_freq.copy_(inv_freq)  # float32 in any dtype, as transformers'
    mla = mla.to(device=weight.device, dtype=weight.dtype)
    turn = dict(interleave=interleave, scaling=scaling)
    if config.q_lora_rank is None:
        mla.W_query.weight.copy_(_rotated_rows(attention.q_proj.weight, nope + rope, rope, **turn))
    else:
        down, norm, up = mla.W_query
        _copy(down, attention.q_a_proj)
        norm.weight.copy_(attention.q_a_layernorm.weight)
        norm.eps = attention.q_a_layernorm.variance_epsilon
        up.weight.copy_(_rotated_rows(attention.q_b_proj.weight, nope + rope, rope, **turn))
    # kv_a_proj_with_mqa: the latent's rows, then the rotated key's
    compressed = attention.kv_a_proj_with_mqa
    mla.W_latent.weight.copy_(compressed.weight[:rank])
    mla.W_key_rot.weight.copy_(_rotated_rows(compressed.weight[rank:], rope, rope, **turn))
    if compressed.bias is not None:
        mla.W_latent.bias.copy_(compressed.bias[:rank])
        mla.W_key_rot.bias.copy_(_rotated_rows(compressed.bias[rank:], rope, rope, **turn))
    mla.kv_norm.weight.copy_(attention.kv_a_layernorm.weight)
    mla.kv_norm.eps = attention.kv_a_layernorm.variance_epsilon
    # kv_b_proj: each head's key rows, then its value rows
    keys, values = weight.view(h, nope + v, rank).split([nope, v], dim=1)
    mla.W_up_key.weight.copy_(keys.reshape(h * nope, rank))
    mla.W_up_value.weight.copy_(values.reshape(h * v, rank))
    _copy(mla.out_proj, attention.o_proj)
    return mla.train(attention.training)


def _copy(ours: torch.nn.Linear, theirs: torch.nn.Linear) -> None:
    ours.weight.copy_(theirs.weight)
    if theirs.bias is not None:
        ours.bias.copy_(theirs.bias)


__all__ = ["from_deepseek_v3_attention"]
