"""What a fixed state remembers, and what it costs: the recall experiment and the caches of a hybrid (chapter 12).

:func:`recall_experiment` writes ``N`` (key, value) pairs into a memory and asks for every value
back by its key, three ways: softmax attention over a cache that keeps every pair, the state of
causal linear attention (``S += k v^T``), and the state of the delta rule (``beta = 1``). Keys are
random unit vectors of ``key_dim`` numbers, values random; a pair counts as recalled when what the
memory gives back for its key is closer to its own value than to any other. No training, float64,
one seed: the same numbers on every machine (the function checks that no decision is a near tie).

:func:`hybrid_cache_rows` reads what a Gated DeltaNet layer and an attention layer of Qwen3-Next-80B-A3B
keep, measured with :attr:`KVCache.nbytes <mha_course.KVCache.nbytes>` on layers of its published shapes
(:func:`mha_course.todays_caches.measured_layer_bytes`, where every layer's cache is counted and
measured), and adds up what the model's 48 layers keep at 4k, 32k and 128k tokens: three Gated
DeltaNet layers to one attention layer, as published, against attention in every layer.
"""

from __future__ import annotations

import torch

from .attention.delta_rule import delta_rule_step
from .tables import Table
from .todays_caches import LENGTHS, PUBLISHED, cache_layers, measured_layer_bytes

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


#: The hybrid whose caches are compared: three Gated DeltaNet layers to one attention layer.
HYBRID = "Qwen3-Next-80B-A3B"


def hybrid_cache_rows(name: str = HYBRID, lengths=LENGTHS, dtype=torch.bfloat16) -> list[dict]:
    """Bytes kept for one sequence at each length: one Gated DeltaNet layer, one attention layer, the model as
    published (:data:`~mha_course.todays_caches.PUBLISHED`: three Gated DeltaNet layers to one attention
    layer) and the same layers all attention, from the layers measured by
    :func:`~mha_course.todays_caches.measured_layer_bytes`.

    Example:
        >>> row = hybrid_cache_rows(lengths=[4096])[0]
        >>> row["hybrid"] == 36 * row["state layer"] + 12 * row["attention layer"]
        True
    """
    measured = measured_layer_bytes(name, dtype=dtype)
    kinds = [layer.kind for layer in cache_layers(PUBLISHED[name].config())]
    state, full = measured["state"], measured["full"]
    rows = []
    for t in lengths:
        held = {"state layer": state.per_token * t + state.fixed, "attention layer": full.per_token * t + full.fixed}
        rows.append({"tokens": t, **held,
                     "hybrid": kinds.count("state") * held["state layer"] + kinds.count("full") * held["attention layer"],
                     "all attention": len(kinds) * held["attention layer"]})
    return rows


def hybrid_cache_table(rows: list[dict], name: str = HYBRID) -> Table:
    """:func:`hybrid_cache_rows` as a table."""
    config = PUBLISHED[name].config()
    kinds = [layer.kind for layer in cache_layers(config)]
    columns = ["tokens", "state layer", "attention layer", "hybrid", "all attention"]
    return Table(columns, [[r[c] for c in columns] for r in rows],
                 formats={c: "bytes" for c in columns[1:]},
                 title=f"What {name} keeps for one sequence, a bfloat16 model, measured with KVCache.nbytes",
                 notes=["state layer: the state in float32, as transformers and the course keep it, and the convolution's last "
                        f"{config.linear_conv_kernel_dim - 1} inputs.",
                        f"hybrid: {kinds.count('state')} Gated DeltaNet layers and {kinds.count('full')} attention "
                        f"layers, as published; all attention: the {len(kinds)} layers as attention layers."])


__all__ = ["MEMORIES", "recalled", "recall_experiment", "recall_table", "HYBRID", "hybrid_cache_rows",
           "hybrid_cache_table"]
