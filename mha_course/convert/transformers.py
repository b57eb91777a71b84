"""The course's modules built from the attention of production models: transformers' GPT-2 and Llama.

A reader who can write :class:`MultiHeadAttention` and :class:`GroupedQueryAttention` can read the
attention of a production library. These conversions prove it: each copies the weights of a
`transformers <https://huggingface.co/docs/transformers>`_ attention module into the course's
module, which then computes the same function (in eval mode, given the causal mask).

* :func:`from_gpt2_attention`: ``GPT2Attention`` -> :class:`MultiHeadAttention`. GPT-2 keeps the
  query, key and value projections in one ``Conv1D`` named ``c_attn``, whose weight is stored
  ``(d_in, 3 * d_out)``: the transpose of an ``nn.Linear`` weight, because ``Conv1D`` computes
  ``x @ weight + bias``. Its column thirds are the query, key and value weights, transposed.
* :func:`from_llama_attention`: ``LlamaAttention`` -> :class:`GroupedQueryAttention`. Llama's
  ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` are ``nn.Linear`` like the course's, and its
  ``num_key_value_heads`` are the course's ``num_kv_groups``, and its rotary position embeddings
  (``rope_parameters``, types ``"default"`` and ``"llama3"``) become the module's ``rope_theta``
  and frequencies.

transformers is imported when a conversion runs, never by ``import mha_course``. A configuration
the course's modules cannot express raises :class:`UnsupportedConfigError`.
"""

from __future__ import annotations

import importlib

import torch

from ..attention.grouped_query import GroupedQueryAttention
from ..attention.heads import unstack_qkv
from ..attention.multihead import MultiHeadAttention


class UnsupportedConfigError(ValueError):
    """A transformers attention module whose configuration the course's modules cannot express.

    The message names the setting, its value, why the course's module cannot compute the same
    function, and the configuration that converts.

    Example:
        >>> from transformers import GPT2Config
        >>> from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
        >>> unscaled = GPT2Attention(GPT2Config(n_embd=8, n_head=2, scale_attn_weights=False), layer_idx=0)
        >>> try:
        ...     from_gpt2_attention(unscaled)
        ... except UnsupportedConfigError as error:
        ...     print(str(error)[:56])
        scale_attn_weights=False is not supported: this layer (l
    """


def transformers_class(module_path: str, name: str):
    """Import ``name`` from transformers, or say how to install it."""
    try:
        module = importlib.import_module(module_path)
    except ImportError as error:
        raise ImportError(
            f"converting a transformers {name} needs the transformers package: install the course's "
            "pinned requirements (pip install -r requirements.txt) or pip install transformers."
        ) from error
    return getattr(module, name)


def require_layer(attention, cls, function: str):
    """Refuse anything but an instance of ``cls``, naming the class ``function`` converts."""
    if not isinstance(attention, cls):
        raise TypeError(
            f"attention must be a transformers {cls.__name__}, got {type(attention).__name__}. "
            f"{function} converts one attention layer, e.g. model.transformer.h[0].attn of a GPT-2 "
            "model or model.model.layers[0].self_attn of a Llama model."
        )


def unsupported(setting: str, value, why: str) -> UnsupportedConfigError:
    """The error for a setting the course's modules cannot express: its name, its value, and why."""
    return UnsupportedConfigError(f"{setting}={value!r} is not supported: {why}")


@torch.no_grad()
def from_gpt2_attention(attention, context_length: int | None = None) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` that computes what a transformers ``GPT2Attention`` does.

    The fused ``c_attn`` (a ``Conv1D``, weight ``(d, 3d)``) is cut into thirds along its columns
    and each third transposed into the query, key and value ``nn.Linear`` (weight ``(d, d)``);
    ``c_proj`` becomes ``out_proj``, transposed too. The biases come along (``qkv_bias=True``).
    Dropout on the attention weights is ``attn_pdrop``; GPT-2's ``resid_dropout`` on the output
    belongs to the block around attention in the course and does not carry over (eval mode has
    neither). Device, dtype and training mode are ``attention``'s; the weights are copies.

    Args:
        attention: a ``transformers.models.gpt2.modeling_gpt2.GPT2Attention`` (self-attention).
        context_length: the longest sequence the new module accepts; by default the config's
            ``n_positions``.

    Returns:
        A new ``MultiHeadAttention(d, d, context_length, attn_pdrop, n_head, qkv_bias=True)``.

    Raises:
        TypeError: if ``attention`` is not a ``GPT2Attention``.
        UnsupportedConfigError: for a cross-attention layer, ``reorder_and_upcast_attn=True``, or
            a scale other than ``1/sqrt(head_dim)`` (``scale_attn_weights=False``, or
            ``scale_attn_by_inverse_layer_idx=True`` past the first layer).

    Example:
        >>> from transformers import GPT2Config
        >>> from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
        >>> gpt2 = GPT2Attention(GPT2Config(n_embd=8, n_head=2, n_positions=6), layer_idx=0)
        >>> mha = from_gpt2_attention(gpt2.eval())
        >>> mha.d_in, mha.num_heads, mha.context_length, mha.W_query.bias is not None
        (8, 2, 6, True)
    """
    gpt2_attention = transformers_class("transformers.models.gpt2.modeling_gpt2", "GPT2Attention")
    require_layer(attention, gpt2_attention, "from_gpt2_attention")
    config = attention.config
    if attention.is_cross_attention:
        raise unsupported("is_cross_attention", True, "the course's modules attend within one "
                           "sequence. Convert a self-attention layer (is_cross_attention=False).")
    if attention.reorder_and_upcast_attn:
        raise unsupported("reorder_and_upcast_attn", True, "that path computes the scores in "
                           "float32 with the scale folded into the product, which the course's "
                           "modules do not. Convert a layer built with reorder_and_upcast_attn=False.")
    if attention.scaling != attention.head_dim**-0.5:
        setting, value = (("scale_attn_weights", False) if not attention.scale_attn_weights else
                          ("scale_attn_by_inverse_layer_idx", True))
        raise unsupported(setting, value, f"this layer (layer_idx={attention.layer_idx}) scales the "
                           f"scores by {attention.scaling:.6g}, the course's modules by "
                           f"1/sqrt(head_dim) = {attention.head_dim**-0.5:.6g}. Build the GPT-2 config "
                           "with scale_attn_weights=True and scale_attn_by_inverse_layer_idx=False.")
    weight = attention.c_attn.weight  # (d, 3d): Conv1D computes x @ W + b
    d, h = attention.embed_dim, attention.num_heads
    if context_length is None:
        context_length = config.n_positions
    mha = MultiHeadAttention(d, d, context_length, attention.attn_dropout.p,
                             h, qkv_bias=True)
    mha = mha.to(device=weight.device, dtype=weight.dtype)
    # Query, key, value: the column thirds of c_attn, each (d, d), transposed
    # to nn.Linear's (out, in); the biases in the same thirds.
    weights = unstack_qkv(weight.T)  # three (d, d)
    biases = unstack_qkv(attention.c_attn.bias)  # three (d,)
    ours = (mha.W_query, mha.W_key, mha.W_value)
    for linear, w, b in zip(ours, weights, biases, strict=True):
        linear.weight.copy_(w)
        linear.bias.copy_(b)
    # c_proj is a Conv1D too: transposed as well.
    mha.out_proj.weight.copy_(attention.c_proj.weight.T)  # (d, d)
    mha.out_proj.bias.copy_(attention.c_proj.bias)
    return mha.train(attention.training)


#: The rotations whose frequencies the course's RotaryEmbedding holds as they are: Llama 3's rescales
#: them once, when they are made, and neither scales cos and sin (``attention_scaling`` is 1).
SUPPORTED_ROPE_TYPES = ("default", "llama3")


def _llama_rotation(config) -> tuple[float, torch.Tensor]:
    """``rope_theta`` and the inverse frequencies of a Llama config, as transformers computes them."""
    parameters = getattr(config, "rope_parameters", None) or {}
    rope_type = parameters.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise unsupported("rope_type", rope_type, "the course's RotaryEmbedding holds one set of "
                           "frequencies and leaves cos and sin unscaled; the conversion carries over the rope "
                           f"types {' and '.join(repr(t) for t in SUPPORTED_ROPE_TYPES)}, which do, and no "
                           "other (some rescale cos and sin, or change the frequencies with the sequence's "
                           "length). Build the config with rope_parameters={'rope_type': 'default', "
                           "'rope_theta': ...} or Llama 3's 'llama3'.")
    rotary_embedding = transformers_class("transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding")
    rotary = rotary_embedding(config)
    if rotary.attention_scaling != 1.0:
        raise unsupported("attention_scaling", rotary.attention_scaling, "the course's rotation does not "
                           "scale cos and sin.")
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0))), rotary.inv_freq.float()


@torch.no_grad()
def from_llama_attention(attention, context_length: int | None = None) -> GroupedQueryAttention:
    """A :class:`GroupedQueryAttention` that computes what a transformers ``LlamaAttention`` does,
    rotary position embeddings included.

    ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` are copied into ``W_query``, ``W_key``,
    ``W_value`` and ``out_proj``; ``num_key_value_heads`` becomes ``num_kv_groups`` (Llama's
    ``repeat_kv`` orders the heads of a group as the course's ``repeat_interleave`` does). Llama's
    projections have biases only with ``attention_bias=True``; without them the course's output
    projection, which always has one, gets a zero bias. The rotation by position carries over:
    ``rope_theta`` from the config's ``rope_parameters``, and the frequencies themselves from
    transformers' ``LlamaRotaryEmbedding`` of the same config (so Llama 3's scaled ones too), so
    the module equals ``LlamaAttention`` fed with ``LlamaRotaryEmbedding(config)(x,
    position_ids)``'s cos and sin. Dropout is ``attention_dropout``; device, dtype and training
    mode are ``attention``'s; the weights are copies.

    Args:
        attention: a ``transformers.models.llama.modeling_llama.LlamaAttention``.
        context_length: the longest sequence the new module accepts; by default the config's
            ``max_position_embeddings``.

    Returns:
        A new ``GroupedQueryAttention(hidden_size, hidden_size, context_length, attention_dropout,
        num_attention_heads, num_key_value_heads, qkv_bias=attention_bias)``.

    Raises:
        TypeError: if ``attention`` is not a ``LlamaAttention``.
        UnsupportedConfigError: for a ``head_dim`` other than ``hidden_size // num_attention_heads``
            (the course's output projection maps ``d_out`` to ``d_out``), a scale other than
            ``1/sqrt(head_dim)``, or a ``rope_type`` other than ``"default"`` and ``"llama3"``.

    Example:
        >>> from transformers import LlamaConfig
        >>> from transformers.models.llama.modeling_llama import LlamaAttention
        >>> config = LlamaConfig(hidden_size=8, num_attention_heads=4, num_key_value_heads=2,
        ...                      max_position_embeddings=6)
        >>> gqa = from_llama_attention(LlamaAttention(config, layer_idx=0))
        >>> gqa.num_heads, gqa.num_kv_groups, gqa.W_key.weight.shape
        (4, 2, torch.Size([4, 8]))
        >>> gqa.rotary
        RotaryEmbedding(head_dim=2, rope_theta=10000)
    """
    llama_attention = transformers_class("transformers.models.llama.modeling_llama", "LlamaAttention")
    require_layer(attention, llama_attention, "from_llama_attention")
    config = attention.config
    hidden, num_heads, head_dim = config.hidden_size, config.num_attention_heads, attention.head_dim
    if num_heads * head_dim != hidden:
        raise unsupported("head_dim", head_dim, f"{num_heads} heads of width {head_dim} make "
                           f"{num_heads * head_dim}, not hidden_size={hidden}, and the course's output "
                           "projection maps the merged heads back to their own width. Build the config "
                           f"with head_dim={hidden // num_heads} (or leave it out).")
    if attention.scaling != head_dim**-0.5:
        raise unsupported("scaling", attention.scaling, "the course's modules scale the scores by "
                           f"1/sqrt(head_dim) = {head_dim**-0.5:.6g}.")
    rope_theta, inv_freq = _llama_rotation(config)
    q_proj = attention.q_proj
    if context_length is None:
        context_length = config.max_position_embeddings
    gqa = GroupedQueryAttention(
        hidden, hidden, context_length, attention.attention_dropout or 0.0,
        num_heads, config.num_key_value_heads,
        qkv_bias=q_proj.bias is not None, rope_theta=rope_theta,
    )
    gqa.rotary.inv_freq.copy_(inv_freq)  # float32, as Llama's, in any dtype
    gqa = gqa.to(device=q_proj.weight.device, dtype=q_proj.weight.dtype)
    pairs = ((gqa.W_query, q_proj), (gqa.W_key, attention.k_proj),
             (gqa.W_value, attention.v_proj), (gqa.out_proj, attention.o_proj))
    for ours, theirs in pairs:
        ours.weight.copy_(theirs.weight)  # both nn.Linear (out, in): as is
        if theirs.bias is not None:
            ours.bias.copy_(theirs.bias)
        elif ours.bias is not None:  # the course's out_proj; Llama's has none
            ours.bias.zero_()
    return gqa.train(attention.training)


__all__ = ["from_gpt2_attention", "from_llama_attention", "UnsupportedConfigError"]
