"""The course's :class:`~mha_course.GatedDeltaNet` built from transformers' Qwen3-Next layer.

Qwen3-Next stacks three Gated DeltaNet layers (``Qwen3NextGatedDeltaNet``) for every attention
layer. transformers keeps the layer's projections fused and interleaved by key head: one
``in_proj_qkvz`` whose rows are, for each key head in turn, its query, its key, and the values and
output gates of the value heads it serves; and one ``in_proj_ba`` whose rows are, for each key
head, the ``b`` and then the ``a`` of those value heads. :func:`from_qwen3_next_gated_deltanet`
cuts them apart into the course's separate projections. The convolution, the decay's ``A_log`` and
``dt_bias``, the gated RMSNorm's weight and the output projection carry over as they are.

transformers is imported when the conversion runs, never by ``import mha_course``.
"""

from __future__ import annotations

import torch

from ..attention.gated_deltanet import GatedDeltaNet
from .transformers import transformers_class, unsupported


@torch.no_grad()
def from_qwen3_next_gated_deltanet(layer) -> GatedDeltaNet:
    """A :class:`~mha_course.GatedDeltaNet` that computes what a transformers ``Qwen3NextGatedDeltaNet`` does.

    Device, dtype and training mode are ``layer``'s; the weights are copies. The course's module
    computes the rule in the input's dtype (transformers in float32 always), so outputs agree to
    float32's rounding for float32 layers.

    Args:
        layer: a ``transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextGatedDeltaNet``, e.g.
            ``model.model.layers[0].linear_attn`` of a Qwen3-Next model.

    Raises:
        TypeError: if ``layer`` is not a ``Qwen3NextGatedDeltaNet``.
        UnsupportedConfigError: if its convolution's activation (the config's ``hidden_act``) is not
            SiLU, the one Qwen3-Next uses and the course's module applies.

    Example:
        >>> from transformers import Qwen3NextConfig
        >>> from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
        >>> config = Qwen3NextConfig(hidden_size=16, linear_num_value_heads=4, linear_num_key_heads=2,
        ...                          linear_key_head_dim=8, linear_value_head_dim=6,
        ...                          layer_types=["linear_attention"], num_hidden_layers=1)
        >>> ours = from_qwen3_next_gated_deltanet(Qwen3NextGatedDeltaNet(config, 0))
        >>> ours.num_heads, ours.num_key_heads, ours.key_dim, ours.value_dim, ours.conv_size
        (4, 2, 8, 6, 4)
    """
    cls = transformers_class("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextGatedDeltaNet")
    if not isinstance(layer, cls):
        raise TypeError(f"layer must be a transformers Qwen3NextGatedDeltaNet, got {type(layer).__name__}. "
                        "from_qwen3_next_gated_deltanet converts one linear-attention layer, e.g. "
                        "model.model.layers[0].linear_attn of a Qwen3-Next model.")
    if layer.activation not in ("silu", "swish"):
        raise unsupported("hidden_act", layer.activation, "the short convolution of the course's GatedDeltaNet "
                          "is followed by SiLU, as in Qwen3-Next. Build the config with hidden_act='silu'.")
    heads, key_heads = layer.num_v_heads, layer.num_k_heads
    d_k, d_v, r = layer.head_k_dim, layer.head_v_dim, layer.num_v_heads // layer.num_k_heads
    weight = layer.in_proj_qkvz.weight
    ours = GatedDeltaNet(layer.hidden_size, heads, key_heads, d_k, d_v, conv_size=layer.conv_kernel_size,
                         eps=layer.norm.variance_epsilon).to(device=weight.device, dtype=weight.dtype)
    # Rows by key head: [query d_k | key d_k | values r*d_v | gates r*d_v], then b and a.
    per_key_head = weight.unflatten(0, (key_heads, -1))  # (h_k, 2 d_k + 2 r d_v, d_in)
    parts = per_key_head.split([d_k, d_k, r * d_v, r * d_v], dim=1)
    ba = layer.in_proj_ba.weight.unflatten(0, (key_heads, 2 * r)).split([r, r], dim=1)
    linears = (ours.W_query, ours.W_key, ours.W_value, ours.W_gate, ours.W_beta, ours.W_decay)
    for linear, rows in zip(linears, (*parts, *ba), strict=True):
        linear.weight.copy_(rows.flatten(0, 1))  # back to (out, d_in), head after head
    ours.conv.weight.copy_(layer.conv1d.weight)  # (C, 1, conv_size): queries, keys, values
    ours.A_log.copy_(layer.A_log)
    ours.dt_bias.copy_(layer.dt_bias)
    ours.norm_weight.copy_(layer.norm.weight)
    ours.out_proj.weight.copy_(layer.out_proj.weight)
    return ours.train(layer.training)


__all__ = ["from_qwen3_next_gated_deltanet"]
