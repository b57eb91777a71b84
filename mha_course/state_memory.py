"""What a fixed state remembers, and what it costs: the recall experiment and the caches of a hybrid (chapter 12).

:func:`recall_experiment` writes ``N`` (key, value) pairs into a memory and asks for every value
back by its key, three ways: softmax attention over a cache that keeps every pair, the state of
causal linear attention (``S += k v^T``), and the state of the delta rule (``beta = 1``). Keys are
random unit vectors of ``key_dim`` numbers, values random; a pair counts as recalled when what the
memory gives back for its key is closer to its own value than to any other. No training, float64,
one seed: the same numbers on every machine (the function checks that no decision is a near tie).

:func:`hybrid_cache_rows` measures, with :attr:`KVCache.nbytes <mha_course.KVCache.nbytes>`, what
a Gated DeltaNet layer and an attention layer of Qwen3-Next-80B-A3B keep (its published shapes,
:data:`QWEN3_NEXT_80B_A3B`), and what the model's 48 layers keep at 4k, 32k and 128k tokens:
three Gated DeltaNet layers to one attention layer, as published, against attention in every layer.
"""

from __future__ import annotations

import torch

from .attention.delta_rule import delta_rule_step
from .attention.gated_deltanet import GatedDeltaNet
from .attention.grouped_query import GroupedQueryAttention
from .attention.kv_cache import KVCache
from .tables import Table

#: The ways of remembering the recall experiment compares, by name.
MEMORIES = {"softmax": "softmax attention over the cache of every key and value",
            "linear": "the state of causal linear attention, S += k v^T",
            "delta": "the state of the delta rule, S += k (v - S^T k)^T"}


def _written(num_pairs: int, key_dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(num_pairs, key_dim, generator=g, dtype=torch.float64)
    keys = keys / keys.norm(dim=-1, keepdim=True)  # unit length, as the layer's normalised keys
    return keys, torch.randn(num_pairs, key_dim, generator=g, dtype=torch.float64)


def recalled(keys: torch.Tensor, values: torch.Tensor, memory: str) -> torch.Tensor:
    """``(N,)`` booleans: whether each pair's value comes back from ``memory`` (a name of :data:`MEMORIES`)
    closer to itself than to any other value; raises if a decision is closer than 1e-9 to a tie.

    Example:
        >>> keys, values = _written(8, 32, seed=0)
        >>> recalled(keys, values, "delta").all().item()
        True
    """
    if memory == "softmax":  # scores d_k * cos(q, k): a query as sharp as training makes it
        read = torch.softmax(keys @ keys.T * keys.shape[-1], dim=-1) @ values
    else:
        state = keys.new_zeros(keys.shape[-1], values.shape[-1])  # (d_k, d_v), whatever N
        for k, v in zip(keys, values):
            state = state + k[:, None] * v[None, :] if memory == "linear" else \
                delta_rule_step(state, k, v, torch.ones((), dtype=k.dtype))
        read = keys @ state  # what the state gives back for each key
    distances = torch.cdist(read, values)  # (N, N): to every value written
    nearest = distances.topk(2, dim=-1, largest=False).values if len(values) > 1 else None
    if nearest is not None and (nearest[:, 1] - nearest[:, 0]).min() < 1e-9:
        raise RuntimeError("a recall decision is a near tie: choose another seed.")
    return distances.argmin(dim=-1) == torch.arange(len(values))


def recall_experiment(num_pairs=(8, 16, 32, 64, 128, 256), key_dim: int = 32, seed: int = 0) -> list[dict]:
    """For each ``N`` of ``num_pairs``: the share of the ``N`` pairs each memory recalls, and the share
    of the last ``key_dim`` pairs written (``"<memory> recent"``).

    Example:
        >>> rows = recall_experiment(num_pairs=(8, 256), key_dim=32)
        >>> [r["softmax"] for r in rows], [r["delta"] for r in rows][0], rows[1]["delta"] < 0.5
        ([1.0, 1.0], 1.0, True)
    """
    rows = []
    for n in num_pairs:
        keys, values = _written(n, key_dim, seed)
        row = {"pairs": n, "key_dim": key_dim}
        for memory in MEMORIES:
            hits = recalled(keys, values, memory).double()
            row[memory], row[f"{memory} recent"] = hits.mean().item(), hits[-key_dim:].mean().item()
        rows.append(row)
    return rows


def _per_cent(share: float) -> str:
    return f"{100 * share:.0f} %"


def recall_table(rows: list[dict]) -> Table:
    """The recall experiment as a table: pairs recalled, in per cent, by each memory."""
    columns = ["pairs written", "softmax over the cache", "linear-attention state", "delta-rule state",
               "delta-rule state, last d_k pairs"]
    body = [[r["pairs"]] + [r[key] for key in ("softmax", "linear", "delta", "delta recent")] for r in rows]
    return Table(columns, body, formats={c: _per_cent for c in columns[1:]}, title=f"Pairs recalled by their keys, keys and values of {rows[0]['key_dim']} "
                 "numbers (d_k = d_v)", notes=["recalled: what comes back for a key is nearer its own value than "
                                               "any other value written."])


#: Qwen3-Next-80B-A3B's attention shapes, as published in its config.json
#: (https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct): 48 layers, every fourth one attention.
QWEN3_NEXT_80B_A3B = dict(num_layers=48, attention_every=4, num_key_value_heads=2, head_dim=256,
                          linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128,
                          linear_value_head_dim=128, linear_conv_kernel_dim=4)

#: The lengths the caches are compared at.
LENGTHS = (4096, 32768, 131072)


def measured_layer_bytes(shapes: dict = QWEN3_NEXT_80B_A3B, dtype=torch.bfloat16,
                         prompts=(6, 600)) -> dict[str, int]:
    """What one layer of each kind keeps, measured with ``KVCache.nbytes`` on small layers of the model's
    cache shapes (their width ``d_in`` is 8: the cache does not depend on it).

    Returns ``{"state": bytes after each prompt of prompts (one number if they agree), "kv_per_token":
    bytes per token of an attention layer}``; raises if the state's bytes change with the prompt.

    Example:
        >>> sizes = measured_layer_bytes(dict(QWEN3_NEXT_80B_A3B, linear_num_value_heads=2,
        ...                                   linear_num_key_heads=1, linear_key_head_dim=4,
        ...                                   linear_value_head_dim=4), prompts=(3, 70))
        >>> sizes["state"]  # a float32 state of 2 x 4 x 4, and 3 bfloat16 inputs of 2 x 4 + 8 channels
        224
        >>> sizes["kv_per_token"]  # a key and a value of 256 for each of 2 heads, in bfloat16
        2048
    """
    s = shapes
    torch.manual_seed(0)
    layer = GatedDeltaNet(8, s["linear_num_value_heads"], s["linear_num_key_heads"], s["linear_key_head_dim"],
                          s["linear_value_head_dim"], conv_size=s["linear_conv_kernel_dim"]).to(dtype).eval()
    held = set()
    for tokens in prompts:
        cache = KVCache()
        with torch.no_grad():
            layer(torch.randn(1, tokens, 8, dtype=dtype), cache=cache)
        held.add(cache.nbytes)
    if len(held) != 1:
        raise RuntimeError(f"the state's bytes changed with the prompt: {sorted(held)}")
    heads, tokens = s["num_key_value_heads"], prompts[0]
    attention = GroupedQueryAttention(8, heads * s["head_dim"], tokens, 0.0, heads, heads).to(dtype).eval()
    cache = KVCache()
    with torch.no_grad():
        attention(torch.randn(1, tokens, 8, dtype=dtype), cache=cache)
    return {"state": held.pop(), "kv_per_token": cache.nbytes // tokens}


def hybrid_cache_rows(shapes: dict = QWEN3_NEXT_80B_A3B, lengths=LENGTHS, dtype=torch.bfloat16) -> list[dict]:
    """Bytes kept for one sequence at each length: one Gated DeltaNet layer, one attention layer, the model as
    published (three Gated DeltaNet layers to one attention layer) and the same layers all attention."""
    measured = measured_layer_bytes(shapes, dtype)
    attention_layers = shapes["num_layers"] // shapes["attention_every"]
    state_layers = shapes["num_layers"] - attention_layers
    rows = []
    for t in lengths:
        kv = measured["kv_per_token"] * t
        rows.append({"tokens": t, "state layer": measured["state"], "attention layer": kv,
                     "hybrid": state_layers * measured["state"] + attention_layers * kv,
                     "all attention": shapes["num_layers"] * kv})
    return rows


def hybrid_cache_table(rows: list[dict]) -> Table:
    """:func:`hybrid_cache_rows` as a table."""
    columns = ["tokens", "state layer", "attention layer", "hybrid", "all attention"]
    return Table(columns, [[r[c] for c in columns] for r in rows],
                 formats={c: "bytes" for c in columns[1:]},
                 title="What Qwen3-Next-80B-A3B keeps for one sequence, a bfloat16 model, measured with "
                 "KVCache.nbytes",
                 notes=["state layer: the state in float32, as transformers keeps it, and the convolution's last "
                        "3 inputs.",
                        "hybrid: 36 Gated DeltaNet layers and 12 attention layers, as published; all attention: "
                        "the 48 layers as attention layers."])


__all__ = ["MEMORIES", "recalled", "recall_experiment", "recall_table", "QWEN3_NEXT_80B_A3B", "LENGTHS",
           "measured_layer_bytes", "hybrid_cache_rows", "hybrid_cache_table"]
