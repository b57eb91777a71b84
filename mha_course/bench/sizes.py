"""The sizes the benchmark runs: adding a size is one entry in :data:`CONFIGS` (or :data:`QUICK_CONFIGS`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchConfig:
    """One benchmarked size: an input ``(batch, num_tokens, d_in)`` and ``num_heads`` heads."""

    name: str
    batch: int
    num_tokens: int
    d_in: int
    num_heads: int
    head_dim: int
    description: str

    @property
    def d_out(self) -> int:
        """Total width of all heads (``d_out`` of :class:`MultiHeadAttention`)."""
        return self.num_heads * self.head_dim


def _by_name(*configs: BenchConfig) -> dict[str, BenchConfig]:
    return {c.name: c for c in configs}


#: The sizes of the full run, in the order the book shows them.
CONFIGS = _by_name(
    BenchConfig("textbook", 2, 6, 3, 2, 2, "the running example: 2 x 6 tokens, d_in 3, 2 heads of width 2"),
    BenchConfig("small-4", 8, 256, 256, 4, 64, "batch 8, 256 tokens, width 256, 4 heads of 64"),
    BenchConfig("small-16", 8, 256, 256, 16, 16, "batch 8, 256 tokens, width 256, 16 heads of 16"),
    BenchConfig("gpt2-small", 8, 1024, 768, 12, 64, "GPT-2 small: batch 8, 1024 tokens, width 768, 12 heads of 64"),
)

#: The sizes of ``--quick``: small enough for CI.
QUICK_CONFIGS = _by_name(
    CONFIGS["textbook"],
    BenchConfig("tiny", 2, 32, 32, 4, 8, "batch 2, 32 tokens, width 32, 4 heads of 8"),
)

#: Every size by name, full and quick.
ALL_CONFIGS = {**CONFIGS, **QUICK_CONFIGS}


# The decoding benchmark (``bench --decode``, chapter 6): one generated token, with and without a
# key/value cache. ``num_tokens`` is the length of the sequence once the new token is in: the
# cache holds the ``num_tokens - 1`` before it. One sequence, as a chat or a completion generates.
def _decode(num_tokens: int, d_in: int = 768, num_heads: int = 12, head_dim: int = 64,
            shape: str = "GPT-2-small attention layer (width 768, 12 heads of 64)", prefix: str = "decode") -> BenchConfig:
    return BenchConfig(f"{prefix}-{num_tokens}", 1, num_tokens, d_in, num_heads, head_dim,
                       f"{shape}: token {num_tokens} of one sequence, {num_tokens - 1} before it")


#: The lengths of the decoding run: a GPT-2-small attention layer, up to its whole 1024-token context.
DECODE_CONFIGS = _by_name(*(_decode(n) for n in (16, 32, 64, 128, 256, 512, 1024)))

#: The lengths of ``bench --decode --quick``: a tiny layer, for CI.
QUICK_DECODE_CONFIGS = _by_name(*(_decode(n, 32, 4, 8, "a tiny layer (width 32, 4 heads of 8)", "decode-tiny")
                                  for n in (8, 32)))

#: Every decoding size by name, full and quick.
ALL_DECODE_CONFIGS = {**DECODE_CONFIGS, **QUICK_DECODE_CONFIGS}


# The heads map (``bench --heads-map``, chapter 3): the batched module against the stacked heads
# over sequence lengths x numbers of heads, at one model width (h * d_h fixed) and one batch, so
# that only the split into heads and the length change from cell to cell.
def _heads_map(num_tokens: int, num_heads: int, batch: int, width: int, prefix: str) -> BenchConfig:
    return BenchConfig(f"{prefix}-T{num_tokens}-h{num_heads}", batch, num_tokens, width, num_heads,
                       width // num_heads, f"batch {batch}, {num_tokens} tokens, width {width}, "
                       f"{num_heads} head{'s' if num_heads > 1 else ''} of {width // num_heads}")


#: The model width and batch of the heads map: those of the full run's small sizes (small-4, small-16).
HEADS_MAP_WIDTH, HEADS_MAP_BATCH = 256, 8
#: The sequence lengths and numbers of heads of the heads map (every number of heads divides the width).
HEADS_MAP_TOKENS, HEADS_MAP_HEADS = (32, 64, 128, 256, 512), (1, 2, 4, 8, 16, 32)
#: The cells of the heads map, by name (``map-T256-h4`` is the full run's small-4).
HEADS_MAP_CONFIGS = _by_name(*(_heads_map(t, h, HEADS_MAP_BATCH, HEADS_MAP_WIDTH, "map")
                               for t in HEADS_MAP_TOKENS for h in HEADS_MAP_HEADS))
#: The cells of ``bench --heads-map --quick``: a tiny map, for CI.
QUICK_HEADS_MAP_CONFIGS = _by_name(*(_heads_map(t, h, 2, 16, "map-tiny") for t in (8, 16) for h in (1, 2, 4)))
#: Every cell of a heads map by name, full and quick.
ALL_HEADS_MAP_CONFIGS = {**HEADS_MAP_CONFIGS, **QUICK_HEADS_MAP_CONFIGS}
