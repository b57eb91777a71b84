"""What attention costs: exact parameter counts, multiply-adds and score-tensor memory.

Formulas for the three stages of the course, written out term by term so that a chapter can show
where the cost comes from, and checked by the tests against the real modules (parameters) and
against counted matrix products (multiply-adds).

Two regimes recur in the book, named once here (:data:`REGIMES`) for every module that uses them:

* **head width fixed** (``"head_width_fixed"``: the wrapper, or ``MultiHeadAttention`` with
  ``d_out = num_heads * head_dim`` growing with the heads): parameters and work grow with the
  number of heads;
* **model width fixed** (``"model_width_fixed"``: ``MultiHeadAttention`` with ``d_out`` fixed and
  ``head_dim = d_out // num_heads``): parameters and multiply-adds stay the same whatever the
  number of heads; only the score tensor grows.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .attention._validation import validate_divisible, validate_kv_groups, validate_non_negative_int, validate_positive_int

#: The stages the formulas know: one head, stacked heads, batched heads.
KINDS = ("causal", "wrapper", "batched")

#: Every head keeps its width, so the model grows with the heads.
HEAD_WIDTH_FIXED = "head_width_fixed"
#: The model keeps its width, shared among the heads: ``head_dim = d_out // num_heads``.
MODEL_WIDTH_FIXED = "model_width_fixed"
#: The two ways of adding heads that the book compares, spelled the same everywhere.
REGIMES = (HEAD_WIDTH_FIXED, MODEL_WIDTH_FIXED)
#: How tables and plots name each regime.
REGIME_LABELS = {HEAD_WIDTH_FIXED: "head width fixed", MODEL_WIDTH_FIXED: "model width fixed"}


def validate_regime(regime: str) -> str:
    """Return ``regime`` if it is one of :data:`REGIMES`, else raise an error listing them.

    Example:
        >>> validate_regime("model_width_fixed")
        'model_width_fixed'
    """
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(map(repr, REGIMES))}, got {regime!r}.")
    return regime


def count_parameters(module: nn.Module, trainable_only: bool = True) -> int:
    """Count a module's parameters by walking it (the measured side of the formulas)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def _validate_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}.")
    return kind


def _heads_and_width(kind: str, d_out: int, num_heads: int) -> tuple[int, int]:
    """Return (num_heads, head_dim) for a stage, reading d_out the way that stage's class does."""
    if kind == "causal":
        return 1, d_out
    if kind == "wrapper":
        return num_heads, d_out  # d_out is per head
    return num_heads, validate_divisible(d_out, num_heads)  # d_out is the total


def class_d_out(kind: str, num_heads: int, head_dim: int) -> int:
    """The ``d_out`` a stage's class takes for ``num_heads`` heads of width ``head_dim``.

    The batched module reads ``d_out`` as the total width, ``num_heads * head_dim``; the wrapper
    reads it as the width of each head, and a single causal head as its own width.

    Example:
        >>> class_d_out("batched", 12, 64), class_d_out("wrapper", 12, 64)
        (768, 64)
    """
    _validate_kind(kind)
    num_heads = validate_positive_int("num_heads", num_heads)
    head_dim = validate_positive_int("head_dim", head_dim)
    return num_heads * head_dim if kind == "batched" else head_dim


def parameter_count(kind: str, d_in: int, d_out: int, num_heads: int = 1, qkv_bias: bool = False) -> int:
    """Exact number of trainable parameters of a stage's module, from its constructor arguments.

    * ``causal``: three ``d_in x d_out`` projections.
    * ``wrapper``: ``num_heads`` times that (``d_out`` per head).
    * ``batched``: three ``d_in x d_out`` projections plus the ``d_out x d_out`` output
      projection with its bias (``d_out`` total).

    Example:
        >>> parameter_count("batched", d_in=768, d_out=768, num_heads=12)
        2360064
    """
    _validate_kind(kind)
    d_in = validate_positive_int("d_in", d_in)
    d_out = validate_positive_int("d_out", d_out)
    num_heads = validate_positive_int("num_heads", num_heads)
    heads, head_dim = _heads_and_width(kind, d_out, num_heads)
    width = heads * head_dim  # total width of the Q, K and V projections
    qkv = 3 * (d_in * width + (width if qkv_bias else 0))
    out_proj = width * width + width if kind == "batched" else 0
    return qkv + out_proj


@dataclass(frozen=True)
class MultiplyAdds:
    """Multiply-adds of one forward pass, split by step. One multiply-add is two FLOPs."""

    projections: int  # x @ W_q, x @ W_k, x @ W_v
    scores: int  # q @ k^T for every head: the full T x T square, as the code computes it
    weighted_sum: int  # attention weights @ v
    out_proj: int  # merged heads @ W_o (batched stage only)

    @property
    def total(self) -> int:
        return self.projections + self.scores + self.weighted_sum + self.out_proj

    @property
    def forward_backward(self) -> int:
        """Multiply-adds of a forward and backward pass when the input needs a gradient too.

        The backward pass of every product ``C = A @ B`` runs two products of the same size,
        ``dA = dC @ B^T`` and ``dB = A^T @ dC``, so a training step costs three forward passes.
        (If the input needs no gradient, the first projections skip ``dA`` and it is a little less.)

        Example:
            >>> macs = multiply_adds("batched", batch=1, num_tokens=6, d_in=3, d_out=4, num_heads=2)
            >>> macs.forward_backward == 3 * macs.total
            True
        """
        return 3 * self.total


def multiply_adds(kind: str, batch: int, num_tokens: int, d_in: int, d_out: int, num_heads: int = 1) -> MultiplyAdds:
    """Multiply-adds of the matrix products in one forward pass of a stage's module.

    Softmax, masking, scaling and dropout are elementwise and left out; they are small next to the
    products except at tiny widths. The score and weighted-sum terms count the full ``T x T``
    square, which is what the masked implementations compute (half of it is then masked away).

    Example:
        >>> multiply_adds("batched", batch=1, num_tokens=6, d_in=3, d_out=4, num_heads=2).total
        600
    """
    _validate_kind(kind)
    batch = validate_positive_int("batch", batch)
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    d_in = validate_positive_int("d_in", d_in)
    d_out = validate_positive_int("d_out", d_out)
    num_heads = validate_positive_int("num_heads", num_heads)
    heads, head_dim = _heads_and_width(kind, d_out, num_heads)
    width = heads * head_dim
    tokens = batch * num_tokens
    return MultiplyAdds(
        projections=3 * tokens * d_in * width,
        scores=batch * heads * num_tokens * num_tokens * head_dim,
        weighted_sum=batch * heads * num_tokens * num_tokens * head_dim,
        out_proj=tokens * width * width if kind == "batched" else 0,
    )


def cost_by_heads(regime: str, num_heads, *, batch: int, num_tokens: int, d_in: int, width: int,
                  kind: str = "batched", bytes_per_element: int = 4) -> list[dict]:
    """Parameters, multiply-adds and score-tensor bytes for each head count, in one regime.

    Args:
        regime: ``"head_width_fixed"`` (every head is ``width`` wide, so the model grows with
            the heads) or ``"model_width_fixed"`` (the model is ``width`` wide, shared among the
            heads: ``head_dim = width // num_heads``).
        num_heads: the head counts to tabulate, e.g. ``[1, 2, 4, 8]``.
        batch, num_tokens, d_in: the input's shape ``(batch, num_tokens, d_in)``.
        width: ``head_dim`` or ``d_out``, depending on ``regime``.
        kind: ``"batched"`` (:class:`MultiHeadAttention`) or ``"wrapper"`` (stacked heads).

    Returns:
        One dict per head count with keys ``num_heads``, ``head_dim``, ``d_out`` (total width),
        ``parameters``, ``multiply_adds`` (forward) and ``score_bytes`` (one
        ``(batch, num_heads, num_tokens, num_tokens)`` tensor).

    Example:
        >>> rows = cost_by_heads("model_width_fixed", [1, 4], batch=1, num_tokens=8, d_in=16, width=16)
        >>> [(r["head_dim"], r["parameters"], r["score_bytes"]) for r in rows]
        [(16, 1040, 256), (4, 1040, 1024)]
    """
    validate_regime(regime)
    if kind not in ("batched", "wrapper"):
        raise ValueError(f"kind must be 'batched' or 'wrapper' (the multi-head stages), got {kind!r}.")
    width = validate_positive_int("width", width)
    rows = []
    for heads in num_heads:
        heads = validate_positive_int("num_heads", heads)
        head_dim = width if regime == HEAD_WIDTH_FIXED else validate_divisible(width, heads)
        total = heads * head_dim
        d_out = class_d_out(kind, heads, head_dim)
        rows.append({
            "num_heads": heads,
            "head_dim": head_dim,
            "d_out": total,
            "parameters": parameter_count(kind, d_in, d_out, heads),
            "multiply_adds": multiply_adds(kind, batch, num_tokens, d_in, d_out, heads).total,
            "score_bytes": score_memory_bytes(batch, heads, num_tokens, bytes_per_element),
        })
    return rows


def score_memory_bytes(batch: int, num_heads: int, num_tokens: int, bytes_per_element: int = 4) -> int:
    """Bytes of one (batch, num_heads, num_tokens, num_tokens) score or weight tensor.

    The batched module holds this for all heads at once; the stacked wrapper holds one head's
    ``1 / num_heads`` share at a time. Float32 has 4 bytes per element.

    Example:
        >>> score_memory_bytes(8, 12, 1024) / 2**20  # MiB at GPT-2-small size
        384.0
    """
    for name, value in (("batch", batch), ("num_heads", num_heads), ("num_tokens", num_tokens),
                        ("bytes_per_element", bytes_per_element)):
        validate_positive_int(name, value)
    return batch * num_heads * num_tokens * num_tokens * bytes_per_element


def causal_block_share(num_tokens: int, query_block: int, key_block: int) -> float:
    """The share of the ``T x T`` scores a causal blocked loop computes.

    The loop takes the queries ``query_block`` at a time and, for each block of queries, the keys
    ``key_block`` at a time up to the block's last query: a block of keys is skipped when it starts
    after that query, computed whole (and masked where needed) otherwise. The course's loop has
    square tiles, ``query_block == key_block``; PyTorch's CPU kernel has other sizes
    (:func:`torch_cpu_flash_blocks`).

    Example:
        >>> causal_block_share(4096, 64, 64)  # 64 blocks a side: 64 * 65 / 2 of 64 * 64 tiles
        0.5078125
        >>> causal_block_share(1024, 256, 512)  # 6 of 8 blocks of 256 x 512
        0.75
    """
    for name, value in (("num_tokens", num_tokens), ("query_block", query_block), ("key_block", key_block)):
        validate_positive_int(name, value)
    computed = 0
    for start in range(0, num_tokens, query_block):
        rows = min(query_block, num_tokens - start)
        keys = min(-(-(start + rows) // key_block) * key_block, num_tokens)  # whole key blocks
        computed += rows * keys
    return computed / num_tokens**2


def torch_cpu_flash_blocks(num_tokens: int) -> tuple[int, int]:
    """The ``(query_block, key_block)`` PyTorch's CPU flash-attention kernel uses for ``num_tokens`` queries.

    As ``flash_attention_kernel_impl`` in ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``
    (PyTorch 2.x) chooses them: blocks of 256 queries from 768 tokens on, of 64 from 192, of 32
    below; blocks of 512 keys, or all of them when there are fewer.

    Example:
        >>> [torch_cpu_flash_blocks(t) for t in (100, 512, 4096)]
        [(32, 100), (64, 512), (256, 512)]
    """
    validate_positive_int("num_tokens", num_tokens)
    query_block = 256 if num_tokens >= 768 else 64 if num_tokens >= 192 else 32
    return min(query_block, num_tokens), min(512, num_tokens)


def batched_forward_peak_bytes(batch: int, num_tokens: int, num_heads: int, head_dim: int,
                               bytes_per_element: int = 4) -> int:
    """Predicted peak memory of one forward call of the batched module: two score tensors and Q, K, V.

    ``queries @ keys.transpose(2, 3)`` allocates one ``(B, h, T, T)`` score tensor; the mask is
    filled in place; ``torch.softmax`` allocates a second one for the weights while the scores
    are still alive. Beside them live the three projected activations, queries, keys and values,
    of ``B · T · h · d_h`` elements each. Other activations (the merged heads, the output) are
    smaller and left out, so the prediction is close at large sizes and low at the smallest.

    Example:
        >>> batched_forward_peak_bytes(8, 1024, 12, 64) / 2**20  # MiB at GPT-2-small size
        840.0
        >>> 2 * score_memory_bytes(8, 12, 1024) / 2**20  # of which the two score tensors
        768.0
    """
    scores = score_memory_bytes(batch, num_heads, num_tokens, bytes_per_element)
    head_dim = validate_positive_int("head_dim", head_dim)
    return 2 * scores + 3 * bytes_per_element * batch * num_tokens * num_heads * head_dim


# ----------------------------------------------------------------------------------------------
# Sharing keys and values (chapter 6): the key/value cache and the work of one generated token


def kv_cache_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_number: int = 4) -> int:
    """Bytes a key/value cache adds for every token a model has seen: ``2 · layers · kv_heads · d_h · bytes``.

    Every attention layer keeps, for every token, one key and one value of width ``head_dim`` per
    key/value head (the factor 2). Query heads do not count: only ``num_kv_heads`` does, which is
    ``num_heads`` for multi-head attention, ``num_kv_groups`` for grouped-query attention and 1
    for multi-query attention. Float32 has 4 bytes per number, float16 and bfloat16 have 2.

    Example:
        >>> kv_cache_bytes_per_token(num_layers=12, num_kv_heads=12, head_dim=64, bytes_per_number=2)
        36864
        >>> kv_cache_bytes_per_token(12, num_kv_heads=1, head_dim=64, bytes_per_number=2)  # multi-query
        3072
    """
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("bytes_per_number", bytes_per_number)):
        validate_positive_int(name, value)
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_number


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, batch: int = 1,
                   bytes_per_number: int = 4) -> int:
    """Bytes of a full key/value cache: per token (:func:`kv_cache_bytes_per_token`) times tokens times batch.

    The cache grows in proportion to the tokens held, and every sequence of a batch has its own.

    Example:
        >>> kv_cache_bytes(12, 12, 64, num_tokens=1024, bytes_per_number=2) / 2**20  # MiB, GPT-2 small
        36.0
    """
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    batch = validate_positive_int("batch", batch)
    return kv_cache_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_number) * num_tokens * batch


@dataclass(frozen=True)
class ModelShape:
    """What a model's key/value cache depends on: its attention layers' shape and its context.

    ``num_kv_groups`` is the grouped-query setting to show for the model; :meth:`kv_heads` gives
    the key/value heads of each way of sharing.
    """

    name: str
    num_layers: int
    num_heads: int  # query heads per layer
    head_dim: int
    num_kv_groups: int  # key/value heads of its grouped-query variant
    context_length: int

    def kv_heads(self) -> dict[str, int]:
        """Key/value heads per layer for each kind: multi-head, grouped-query, multi-query.

        Example:
            >>> MODEL_SHAPES["llama-style"].kv_heads()
            {'multi-head': 32, 'grouped-query': 8, 'multi-query': 1}
        """
        return {"multi-head": self.num_heads,
                "grouped-query": validate_kv_groups(self.num_kv_groups, self.num_heads),
                "multi-query": 1}


#: The shapes chapter 6 compares: GPT-2 small (12 layers of 12 heads of width 64, 1024 tokens; its
#: grouped-query variant with 4 groups is for illustration, GPT-2 itself is multi-head) and a
#: Llama-style shape (32 layers, 32 query heads of width 128 in 8 key/value groups, 8192 tokens).
MODEL_SHAPES = {
    "gpt2-small": ModelShape("GPT-2 small", num_layers=12, num_heads=12, head_dim=64, num_kv_groups=4,
                             context_length=1024),
    "llama-style": ModelShape("Llama-style", num_layers=32, num_heads=32, head_dim=128, num_kv_groups=8,
                              context_length=8192),
}


def kv_cache_sizes(shape: ModelShape, bytes_per_number: int = 2, batch: int = 1) -> list[dict]:
    """The cache of each kind of attention at one model shape: per token and at its full context.

    Returns:
        One dict per kind (``multi-head``, ``grouped-query``, ``multi-query``) with keys ``kind``,
        ``kv_heads``, ``bytes_per_token``, ``bytes_at_context`` (``shape.context_length`` tokens
        for ``batch`` sequences) and ``vs_multi_head`` (the fraction of the multi-head cache).

    Example:
        >>> [(r["kind"], r["bytes_per_token"]) for r in kv_cache_sizes(MODEL_SHAPES["gpt2-small"])]
        [('multi-head', 36864), ('grouped-query', 12288), ('multi-query', 3072)]
    """
    rows = []
    for kind, kv_heads in shape.kv_heads().items():
        per_token = kv_cache_bytes_per_token(shape.num_layers, kv_heads, shape.head_dim, bytes_per_number)
        rows.append({"kind": kind, "kv_heads": kv_heads, "bytes_per_token": per_token,
                     "bytes_at_context": per_token * shape.context_length * batch,
                     "vs_multi_head": kv_heads / shape.num_heads})
    return rows


def grouped_query_multiply_adds(batch: int, num_new: int, d_in: int, d_out: int, num_heads: int,
                                num_kv_groups: int, num_cached: int = 0) -> MultiplyAdds:
    """Multiply-adds of one call of ``GroupedQueryAttention`` on ``num_new`` tokens after ``num_cached`` cached ones.

    The new tokens get queries, keys and values (the key and value projections are
    ``num_kv_groups * head_dim`` wide); each new token's query meets the keys of all
    ``num_cached + num_new`` positions (the full rectangle, as the code computes it before the
    mask). Generating one token *without* a cache recomputes the whole sequence
    (``num_new = T, num_cached = 0``); *with* a cache it is ``num_new = 1, num_cached = T - 1``.

    Example:
        >>> recompute = grouped_query_multiply_adds(1, 1024, 768, 768, 12, 12)
        >>> cached = grouped_query_multiply_adds(1, 1, 768, 768, 12, 12, num_cached=1023)
        >>> recompute.total / cached.total  # the whole sequence is 1024 tokens' work
        1024.0
    """
    batch = validate_positive_int("batch", batch)
    num_new = validate_positive_int("num_new", num_new)
    d_in = validate_positive_int("d_in", d_in)
    d_out = validate_positive_int("d_out", d_out)
    head_dim = validate_divisible(d_out, validate_positive_int("num_heads", num_heads))
    kv_width = validate_kv_groups(num_kv_groups, num_heads) * head_dim
    num_cached = validate_non_negative_int("num_cached", num_cached)
    tokens = batch * num_new
    positions = num_cached + num_new
    return MultiplyAdds(
        projections=tokens * d_in * (d_out + 2 * kv_width),
        scores=batch * num_heads * num_new * positions * head_dim,
        weighted_sum=batch * num_heads * num_new * positions * head_dim,
        out_proj=tokens * d_out * d_out,
    )


def latent_multiply_adds(batch: int, num_new: int, d_in: int, num_heads: int, kv_lora_rank: int,
                         qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, *,
                         q_lora_rank: int | None = None, num_cached: int = 0, absorb: bool = False) -> MultiplyAdds:
    """Multiply-adds of one call of ``MultiHeadLatentAttention`` on ``num_new`` tokens after ``num_cached`` ones.

    The new tokens get queries, a latent and a rotated key. Expanded (``absorb=False``), every
    position's latent is multiplied up into every head's key and value (counted in
    ``projections``: ``S * r * h * (d_nope + d_v)`` for ``S = num_cached + num_new``), and the
    scores and weighted sum are multi-head attention's. Absorbed, the queries are carried into the
    latent space (``h * d_nope * r`` each) and scored against the ``S`` latents of width ``r`` plus
    the rotated key; the weighted latents are multiplied up once per query (``h * r * d_v``).

    Example:
        >>> sizes = dict(d_in=2048, num_heads=16, kv_lora_rank=512, qk_nope_head_dim=128,
        ...              qk_rope_head_dim=64, v_head_dim=128, num_cached=4095)
        >>> expanded = latent_multiply_adds(1, 1, **sizes)
        >>> absorbed = latent_multiply_adds(1, 1, absorb=True, **sizes)
        >>> round(expanded.total / absorbed.total, 1)  # one token after 4095: expanding every latent
        101.4
    """
    sizes = {name: validate_positive_int(name, value) for name, value in (
        ("batch", batch), ("num_new", num_new), ("d_in", d_in), ("num_heads", num_heads),
        ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
        ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim))}
    b, t, h, r = sizes["batch"], sizes["num_new"], sizes["num_heads"], sizes["kv_lora_rank"]
    nope, rope, v = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    positions = validate_non_negative_int("num_cached", num_cached) + t
    query = d_in * h * (nope + rope) if q_lora_rank is None else \
        validate_positive_int("q_lora_rank", q_lora_rank) * (d_in + h * (nope + rope))
    projections = b * t * (query + d_in * (r + rope))
    if absorb:
        projections += b * t * h * r * (nope + v)  # W_UK into each query, W_UV out of each context
        scores, weighted = b * h * t * positions * (r + rope), b * h * t * positions * r
    else:
        projections += b * positions * r * h * (nope + v)  # every position's keys and values, expanded
        scores, weighted = b * h * t * positions * (nope + rope), b * h * t * positions * v
    return MultiplyAdds(projections=projections, scores=scores, weighted_sum=weighted,
                        out_proj=b * t * h * v * d_in)
