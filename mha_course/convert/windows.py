"""The course's :class:`GroupedQueryAttention` with a sliding window, built from Mistral's and gpt-oss's layers.

* :func:`from_mistral_attention`: ``MistralAttention`` -> ``GroupedQueryAttention(window=...)``.
  Mistral's layer is Llama's with a sliding window (``config.sliding_window``, Jiang et al. 2023):
  the projections copy over as :func:`~mha_course.from_llama_attention` copies them.
* :func:`from_gpt_oss_attention`: ``GptOssAttention`` -> ``GroupedQueryAttention(window=...,
  sinks=True)``. gpt-oss (OpenAI 2025) alternates windowed layers (``"sliding_attention"``, a window
  of 128) with full ones, gives every projection a bias, and adds one learned sink logit per head
  (``sinks``), copied into the course's ``sinks``.

Both layers are fed by their model with the rotary embedding's cos and sin. Where a rotation scales
them (YaRN's ``attention_scaling``, 1.35 for gpt-oss), the scale is folded into the query and key
projections, weights and biases: a rotation is linear, so turning ``s * q`` is ``s`` times turning
``q``, and the keys cached are the ones transformers caches. transformers is imported when a
conversion runs.
"""

from __future__ import annotations

import torch

from ..attention.grouped_query import GroupedQueryAttention
from .transformers import require_layer, transformers_class, unsupported

#: The rotations whose frequencies are fixed once made, and whose cos and sin are scaled by a constant
#: (``attention_scaling``): those the course's ``RotaryEmbedding`` computes, the scale folded in.
FIXED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def fixed_rotation(config, modeling: str, rotary_class: str) -> tuple[float, torch.Tensor, float]:
    """``(rope_theta, inverse frequencies, attention_scaling)`` of a model's rotary embedding, as
    transformers computes them, for the rope types of :data:`FIXED_ROPE_TYPES`.

    Raises:
        UnsupportedConfigError: for another ``rope_type`` (whose frequencies change with the length).
    """
    parameters = getattr(config, "rope_parameters", None) or {}
    rope_type = parameters.get("rope_type", "default")
    if rope_type not in FIXED_ROPE_TYPES:
        raise unsupported("rope_type", rope_type, "the course's RotaryEmbedding holds one set of frequencies; "
                          f"the conversion carries over the rope types {', '.join(map(repr, FIXED_ROPE_TYPES))}, "
                          "whose frequencies are fixed once made, and no other. Build the config with one of them.")
    rotary = transformers_class(modeling, rotary_class)(config)
    theta = float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    return theta, rotary.inv_freq.float(), float(rotary.attention_scaling)


def _check_sizes(attention, config) -> None:
    if attention.scaling != attention.head_dim**-0.5:
        raise unsupported("scaling", attention.scaling, "the course's modules scale the scores by "
                          f"1/sqrt(head_dim) = {attention.head_dim**-0.5:.6g}.")


@torch.no_grad()
def _grouped_query(attention, config, modeling: str, rotary_class: str, window, sinks: bool,
                   context_length: int | None) -> GroupedQueryAttention:
    """A ``GroupedQueryAttention`` holding ``attention``'s projections, rotation, window (and sinks)."""
    _check_sizes(attention, config)
    rope_theta, inv_freq, scaling = fixed_rotation(config, modeling, rotary_class)
    q_proj = attention.q_proj
    heads, head_dim = config.num_attention_heads, attention.head_dim
    gqa = GroupedQueryAttention(
        config.hidden_size, heads * head_dim,
        config.max_position_embeddings if context_length is None else context_length,
        attention.attention_dropout or 0.0, heads, config.num_key_value_heads,
        qkv_bias=q_proj.bias is not None, rope_theta=rope_theta, window=window, sinks=sinks,
        out_width=config.hidden_size)
    gqa.rotary.inv_freq.copy_(inv_freq)  # float32, as transformers keeps them
    gqa = gqa.to(device=q_proj.weight.device, dtype=q_proj.weight.dtype)
    pairs = ((gqa.W_query, q_proj, scaling), (gqa.W_key, attention.k_proj, scaling),
             (gqa.W_value, attention.v_proj, 1.0), (gqa.out_proj, attention.o_proj, 1.0))
    for ours, theirs, scale in pairs:  # a rotation's scale folded into queries and keys
        ours.weight.copy_(theirs.weight * scale)
        if theirs.bias is not None:
            ours.bias.copy_(theirs.bias * scale)
        elif ours.bias is not None:  # the course's out_proj; Mistral's has none
            ours.bias.zero_()
    if sinks:
        gqa.sinks.copy_(attention.sinks)
    return gqa.train(attention.training)


@torch.no_grad()
def from_mistral_attention(attention, context_length: int | None = None) -> GroupedQueryAttention:
    """A :class:`GroupedQueryAttention` with Mistral's sliding window that computes what a transformers
    ``MistralAttention`` does.

    The projections copy over as :func:`~mha_course.from_llama_attention` copies Llama's, the output
    projection to ``out_width = hidden_size`` (Mistral NeMo's 32 heads of 128 make 4096 in a width
    of 5120); ``config.sliding_window`` becomes ``window`` (``None``: every earlier position). The
    module equals ``MistralAttention`` fed with ``MistralRotaryEmbedding(config)(x, position_ids)``'s
    cos and sin and the mask of transformers' ``create_sliding_window_causal_mask``, for a prompt, for
    decoding with a :class:`KVCache` (which keeps ``window - 1`` positions, as transformers' does) and
    for a left-padded batch. Dropout is ``attention_dropout``; device, dtype and training mode are
    ``attention``'s; the weights are copies.

    Args:
        attention: a ``transformers.models.mistral.modeling_mistral.MistralAttention``.
        context_length: the longest sequence the new module accepts; by default the config's
            ``max_position_embeddings``.

    Raises:
        TypeError: if ``attention`` is not a ``MistralAttention``.
        UnsupportedConfigError: for a scale other than ``1/sqrt(head_dim)``, or a ``rope_type``
            whose frequencies change with the length (``"dynamic"``, ``"longrope"``).

    Example:
        >>> from transformers import MistralConfig
        >>> from transformers.models.mistral.modeling_mistral import MistralAttention
        >>> config = MistralConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
        ...                        sliding_window=4, max_position_embeddings=32)
        >>> gqa = from_mistral_attention(MistralAttention(config, layer_idx=0))
        >>> gqa.window, gqa.num_kv_groups, gqa.sinks is None
        (4, 2, True)
    """
    modeling = "transformers.models.mistral.modeling_mistral"
    require_layer(attention, transformers_class(modeling, "MistralAttention"), "from_mistral_attention")
    config = attention.config
    return _grouped_query(attention, config, modeling, "MistralRotaryEmbedding", config.sliding_window or None,
                          False, context_length)


@torch.no_grad()
def from_gpt_oss_attention(attention, context_length: int | None = None) -> GroupedQueryAttention:
    """A :class:`GroupedQueryAttention` with gpt-oss's sinks (and window) that computes what a
    transformers ``GptOssAttention`` does.

    The projections and their biases copy over, the output projection to ``out_width =
    hidden_size`` (gpt-oss-120b's 64 heads of 64 make 4096 in a width of 2880); ``sinks``, one
    logit per head, becomes the module's ``sinks``; a ``"sliding_attention"`` layer gets
    ``window = config.sliding_window`` and a ``"full_attention"`` layer none. gpt-oss's YaRN rotation
    scales cos and sin by ``attention_scaling``: that scale is folded into the query and key
    projections (see the module's docstring). The module equals ``GptOssAttention`` fed with
    ``GptOssRotaryEmbedding(config)(x, position_ids)``'s cos and sin and its model's mask (sliding or
    causal, by layer type), for a prompt, for decoding with a :class:`KVCache` and for a left-padded
    batch, gradients of the sinks included. Device, dtype and training mode are ``attention``'s.

    Args:
        attention: a ``transformers.models.gpt_oss.modeling_gpt_oss.GptOssAttention``.
        context_length: the longest sequence the new module accepts; by default the config's
            ``max_position_embeddings``.

    Raises:
        TypeError: if ``attention`` is not a ``GptOssAttention``.
        UnsupportedConfigError: for a scale other than ``1/sqrt(head_dim)``, or a ``rope_type`` whose
            frequencies change with the length.

    Example:
        >>> from transformers import GptOssConfig
        >>> from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention
        >>> config = GptOssConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        ...                       sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        ...                       num_hidden_layers=2)
        >>> windowed, full = (GptOssAttention(config, layer_idx=i) for i in (0, 1))
        >>> for layer in (windowed, full):
        ...     _ = torch.nn.init.zeros_(layer.sinks)  # transformers leaves them uninitialised
        >>> [(gqa.window, gqa.sinks.shape, gqa.out_width) for gqa in map(from_gpt_oss_attention, (windowed, full))]
        [(4, torch.Size([4]), 16), (None, torch.Size([4]), 16)]
    """
    modeling = "transformers.models.gpt_oss.modeling_gpt_oss"
    require_layer(attention, transformers_class(modeling, "GptOssAttention"), "from_gpt_oss_attention")
    return _grouped_query(attention, attention.config, modeling, "GptOssRotaryEmbedding", attention.sliding_window,
                          True, context_length)


__all__ = ["from_mistral_attention", "from_gpt_oss_attention"]
