"""Conversions between the course's attention modules and the layers of other libraries.

* :mod:`.pytorch` - to and from ``torch.nn.MultiheadAttention``, between the course's own classes, and
  the fused kernel ``scaled_dot_product_attention`` side by side with the course's modules (chapters 3-4);
* :mod:`.transformers` - the course's modules built from transformers' attention layers, computing what
  those layers compute (chapter 8); transformers is imported only when a conversion runs;
* :mod:`.deepseek` - multi-head latent attention built from DeepSeek-V3's layer in transformers (chapter 10);
* :mod:`.windows` - sliding windows and attention sinks from Mistral's and gpt-oss's layers (chapter 11);
* :mod:`.deepseek_sparse` - DeepSeek-V3.2's sparse attention, its indexer included (chapter 11);
* :mod:`.qwen3_next` - the course's Gated DeltaNet built from Qwen3-Next's layer (chapter 12).
"""

from .deepseek import from_deepseek_v3_attention
from .deepseek_sparse import from_deepseek_v32_attention
from .qwen3_next import from_qwen3_next_gated_deltanet
from .windows import from_gpt_oss_attention, from_mistral_attention
from .pytorch import from_torch_multihead, sdpa_forward, to_torch_multihead, torch_multihead_forward
from .transformers import UnsupportedConfigError, from_gpt2_attention, from_llama_attention

__all__ = [
    "from_torch_multihead", "to_torch_multihead", "sdpa_forward", "torch_multihead_forward",
    "from_gpt2_attention", "from_llama_attention", "UnsupportedConfigError", "from_deepseek_v3_attention",
    "from_deepseek_v32_attention", "from_mistral_attention", "from_gpt_oss_attention",
    "from_qwen3_next_gated_deltanet",
]
