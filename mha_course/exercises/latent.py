"""Exercises 10.1 and 10.2 of chapter 10: what a latent layer caches, and its scores in the latent space.

10.1 asks for ``compress(layer, x, start)``: what a :class:`~mha_course.MultiHeadLatentAttention`
keeps in its cache for the tokens ``x`` at positions ``start, start + 1, ...``: the normalised
latent ``(B, T, kv_lora_rank)`` and the rotated key ``(B, 1, T, qk_rope_head_dim)``, never the
expanded keys and values. The reference is the package's module run with a cache.

10.2 asks for ``absorbed_scores(layer, x, start, latent, rotated_key)``: the scaled scores
``(B, num_heads, T, S)`` of the new tokens ``x`` against all ``S`` cached positions (theirs
included), computed in the latent space, with the key up-projection folded into the queries: the
check counts the multiply-adds of the answer (``torch.utils.flop_counter``) and refuses any that
expand the cached latents. The reference expands them, the other way to the same numbers.

chapter10 lists both in its ``EXERCISES``.
"""

from __future__ import annotations

import copy

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..attention.heads import split_heads
from ..attention.kv_cache import KVCache
from ..attention.latent import MultiHeadLatentAttention, with_shared, yarn_softmax_scale
from ..attention.rotary import RotaryEmbedding
from ..cost import latent_multiply_adds
from .framework import Check, Exercise, Mistake
from .probes import case_seed, chooser, device_check, generator, probe_devices, probe_on_devices
from .records import Failed, Recorder, describe, expect_close_from, format_shape, plain, same, seed_of, value_of
from .shortcuts import package

#: The cases of both exercises: a small readable layer, a prompt after a cache with biases and a
#: query bottleneck, and a long cache after yarn's stretch (its scores' scale corrected).
CASES = ("readable", "cached", "yarn")


def latent_case(seed: int, key: str):
    """``(layer, x_all, start)`` of one case: a seeded layer in eval mode and ``(B, start + T, d_in)``
    inputs, of which the last ``T`` are the new tokens."""
    draw = chooser(seed, f"10 {key}")
    if key == "readable":
        heads, rank, nope, rope, v, start, new, batch, d_in = 2, 4, 2, 2, 2, 0, 2, 1, 6
        q_rank, bias, scale = None, False, None
    elif key == "cached":
        heads, rank, nope, rope, v = draw.randint(2, 3), draw.choice([6, 8]), 4, draw.choice([2, 4]), 3
        start, new, batch, d_in, q_rank, bias, scale = draw.randint(2, 5), draw.randint(2, 3), 2, 8, 5, True, None
    else:
        heads, rank, nope, rope, v = 2, 16, 4, 4, 4
        start, new, batch, d_in, q_rank, bias = draw.randint(40, 60), 1, 1, 8, None, False
        scale = yarn_softmax_scale(nope + rope, factor=draw.choice([8.0, 40.0]), mscale_all_dim=1.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case_seed(seed, f"10 {key} weights"))
        layer = MultiHeadLatentAttention(d_in, start + new, 0.0, heads, rank, nope, rope, v, q_lora_rank=q_rank,
                                         bias=bias, softmax_scale=scale)
        with torch.no_grad():
            layer.kv_norm.weight.uniform_(0.5, 1.5)  # a norm left out shows
    x_all = torch.randn(batch, start + new, d_in, generator=generator(seed, f"10 {key} x"))
    return layer.eval(), x_all, start


@torch.no_grad()
def reference_compress(layer: MultiHeadLatentAttention, x_all: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the package's layer caches for all of ``x_all``: ``(latent, rotated_key)``."""
    cache = KVCache()
    layer(x_all, cache=cache)
    return cache.tensors["latent"], cache.tensors["rotated_key"]


@torch.no_grad()
def compress_variant(layer, x, start, *, norm: bool = True, rotate_latent: bool = False, offset: bool = True,
                     rotate_key: bool = True, expanded: bool = False):
    """10.1 written with a chosen mistake; the defaults give the right answer."""
    first = start if offset else 0
    latent = layer.W_latent(x)
    latent = layer.kv_norm(latent) if norm else latent  # (B, T, r)
    key = layer.W_key_rot(x).unsqueeze(1)  # (B, 1, T, d_rope)
    if rotate_key:
        _, key = layer.rotary(key, key, first)
    if rotate_latent:  # turned by position like a key, at the latent's own width
        turn = RotaryEmbedding(latent.shape[-1], layer.rotary.rope_theta)
        latent = turn(latent.unsqueeze(1), latent.unsqueeze(1), first)[0].squeeze(1)
    if expanded:  # every head's keys and values instead of the latent
        keys = split_heads(layer.W_up_key(latent), layer.num_heads)  # (B, h, T, d_nope)
        keys = torch.cat([keys, key.expand(-1, layer.num_heads, -1, -1)], dim=-1)
        return keys, split_heads(layer.W_up_value(latent), layer.num_heads)
    return latent, key


@torch.no_grad()
def scores_variant(layer, x, start, latent, rotated_key, *, scale: str = "layer", rotary_part: bool = True,
                   rotate_query: bool = True):
    """10.2 written with a chosen mistake, the keys expanded; the defaults give the right scores."""
    h, nope = layer.num_heads, layer.qk_nope_head_dim
    queries = split_heads(layer.W_query(x), h)  # (B, h, T, d_nope + d_rope)
    q_nope, q_rot = queries.split([nope, layer.qk_rope_head_dim], dim=-1)
    if rotate_query:
        q_rot, _ = layer.rotary(q_rot, q_rot, start)
    keys = split_heads(layer.W_up_key(latent), h)  # (B, h, S, d_nope): expanded, as the reference may
    scores = q_nope @ keys.transpose(2, 3)
    if rotary_part:
        scores = scores + q_rot @ rotated_key.transpose(2, 3)
    factor = {"layer": layer.softmax_scale, "plain": (nope + layer.qk_rope_head_dim) ** -0.5}[scale]
    return scores * factor


def _inputs(seed: int, key: str):
    """``(layer, x_new, start, latent, rotated_key)`` of a case: the cache holds every position."""
    layer, x_all, start = latent_case(seed, key)
    latent, rotated = reference_compress(layer, x_all)
    return layer, x_all[:, start:], start, latent, rotated


def _describe(seed: int, key: str, name: str) -> str:
    layer, x_all, start = latent_case(seed, key)
    sizes = (f"{layer.num_heads} heads, latent {layer.kv_lora_rank}, rotated {layer.qk_rope_head_dim}"
             + (", yarn's scale" if key == "yarn" else ""))
    return f"{name}(layer with {sizes}, x of shape {format_shape(x_all[:, start:].shape)}, start={start})"


# ----------------------------------------------------------------------------------------------
# 10.1 What the cache keeps


def _probe_compress(compress, rec: Recorder) -> None:
    for key in CASES:
        layer, x_all, start = latent_case(rec.seed, key)
        rec.call(key, compress, layer, x_all[:, start:], start)
    layer, x_all, start = latent_case(rec.seed, "cached")
    moved = {d.type: (copy.deepcopy(layer).to(d), x_all[:, start:].to(d), start) for d in probe_devices()}
    probe_on_devices(rec, "on", lambda device: compress(*moved[device.type])[0])


def _two(record, key: str) -> list[torch.Tensor]:
    what = _describe(seed_of(record), key, "compress")
    got = value_of(record, key, what)
    items = plain(got) if got.get("kind") == "sequence" else None
    if not (isinstance(items, list) and len(items) == 2 and all(isinstance(t, torch.Tensor) for t in items)):
        raise Failed(f"two tensors (latent, rotated_key) from {what}", describe(got))
    return items


def _compress_check(key: str, roles: tuple[int, ...] = (0, 1)):
    names, labels = ("latent", "rotated_key"), (("sequence", "token"), ("sequence", "head", "token"))

    def run(record):
        got = _two(record, key)
        layer, x_all, start = latent_case(seed_of(record), key)
        expected = [t[..., start:, :] for t in reference_compress(layer, x_all)]
        for i in roles:
            expect_close_from(got[i], expected[i], _describe(seed_of(record), key, 'compress'), labels[i], names[i])
    return run


def _compress_like(keys=("readable", "cached"), **how):
    def detect(record):
        for key in keys:
            got = plain(record.get(key))
            layer, x_all, start = latent_case(seed_of(record), key)
            variant = compress_variant(layer, x_all[:, start:], start, **how)
            if not isinstance(got, list) or len(got) != 2 or not all(same(g, v) for g, v in zip(got, variant)):
                return False
        return True
    return detect


_KEY = "the rotated key: one for all heads, turned by position"

COMPRESS = Exercise(
    id="10.1",
    title="what a latent layer caches",
    answer_name="compress",
    signature="compress(layer, x, start)",
    probe=_probe_compress,
    checks=(
        Check("returns the latent and the rotated key", lambda record: _two(record, "readable")),
        Check("the latent: down-projected and normalised", _compress_check("readable", (0,))),
        Check(_KEY, _compress_check("readable", (1,))),
        Check("after a cache: positions start, start + 1, ...; biases and a query bottleneck",
              _compress_check("cached")),
        Check("a long cache, other sizes", _compress_check("yarn")),
        Check("latent on the inputs' device", device_check("on", "compress(...)[0]")),
    ),
    mistakes=(
        Mistake("expanded",
                "You returned every head's keys and values: what grouped-query attention caches, and what the "
                "latent layer is built to avoid. Cache the latent, layer.kv_norm(layer.W_latent(x)), and the "
                "rotated key; the up-projections run when the scores are taken.",
                _compress_like(expanded=True)),
        Mistake("rotated-latent",
                "The latent was turned by position too. Only the rotated key is: the latent is shared by the "
                "keys and the values and must stay free of positions, so that W_UK can be folded into the "
                "queries (a rotation between them would not let it).",
                _compress_like(rotate_latent=True)),
        Mistake("no-norm",
                "The latent is not normalised: DeepSeek's layer passes W_latent(x) through an RMSNorm "
                "(layer.kv_norm) before caching it.",
                _compress_like(norm=False)),
        Mistake("no-offset",
                "The new tokens were turned from position 0, but start tokens are already cached: they are "
                "at positions start, start + 1, ...",
                _compress_like(keys=("cached",), offset=False)),
        Mistake("unrotated-key",
                "The rotated key was not turned by its position: pass it through the layer's rotation "
                "(layer.rotary) at positions start, start + 1, ...",
                _compress_like(rotate_key=False)),
    ),
    shortcuts=package(MultiHeadLatentAttention, KVCache.extend,
                      why="Running the layer (or the package's cache) is the package's answer: compute what it "
                      "caches from its parts, layer.W_latent, layer.kv_norm, layer.W_key_rot and layer.rotary."),
)

# ----------------------------------------------------------------------------------------------
# 10.2 Scores in the latent space


def _probe_scores(absorbed_scores, rec: Recorder) -> None:
    for key in CASES:
        inputs = _inputs(rec.seed, key)
        with FlopCounterMode(display=False) as counter:
            rec.call(key, absorbed_scores, *inputs)
        rec.note(f"{key}:flops", counter.get_total_flops())
    layer, x, start, latent, rotated = _inputs(rec.seed, "cached")
    moved = {d.type: (copy.deepcopy(layer).to(d), x.to(d), start, latent.to(d), rotated.to(d))
             for d in probe_devices()}
    probe_on_devices(rec, "on", lambda device: absorbed_scores(*moved[device.type]))


def _scores_got(record, key: str) -> torch.Tensor:
    what = _describe(seed_of(record), key, "absorbed_scores")
    got = value_of(record, key, what)
    if got.get("kind") != "tensor":
        raise Failed(f"a tensor of scores from {what}", describe(got))
    return plain(got)


def _scores_check(key: str):
    def run(record):
        got = _scores_got(record, key)
        expect_close_from(got, scores_variant(*_inputs(seed_of(record), key)),
                          _describe(seed_of(record), key, "absorbed_scores"), ("sequence", "head", "token"))
    return run


def absorbed_bound(layer, num_new: int, num_cached: int, batch: int) -> int:
    """FLOPs an answer may spend: the absorbed form's, plus less than expanding the latents would add."""
    sizes = dict(d_in=layer.d_in, num_heads=layer.num_heads, kv_lora_rank=layer.kv_lora_rank,
                 qk_nope_head_dim=layer.qk_nope_head_dim, qk_rope_head_dim=layer.qk_rope_head_dim,
                 v_head_dim=layer.v_head_dim)
    q_rank = layer.W_query[0].out_features if isinstance(layer.W_query, torch.nn.Sequential) else None
    absorbed = latent_multiply_adds(batch, num_new, q_lora_rank=q_rank, num_cached=num_cached - num_new,
                                    absorb=True, **sizes)
    queries = absorbed.projections - batch * num_new * layer.d_in * (layer.kv_lora_rank + layer.qk_rope_head_dim)
    queries -= batch * num_new * layer.num_heads * layer.kv_lora_rank * layer.v_head_dim  # no W_UV in the scores
    expanding = batch * num_cached * layer.kv_lora_rank * layer.num_heads * layer.qk_nope_head_dim
    return 2 * (queries + absorbed.scores + expanding // 2)


def _no_expansion(record):
    layer, x, start, latent, _ = _inputs(seed_of(record), "yarn")
    spent, bound = plain(record.get("yarn:flops")), absorbed_bound(layer, x.shape[1], latent.shape[1], len(x))
    _scores_got(record, "yarn")
    if isinstance(spent, int) and spent > bound:
        raise Failed(f"at most {bound:,} FLOPs for {_describe(seed_of(record), 'yarn', 'absorbed_scores')}, "
                     "the latents never expanded", f"{spent:,} FLOPs",
                     "Your scores multiply every cached latent by W_UK: the keys are expanded. Fold W_UK into "
                     "the queries instead, q_nope @ W_UK (h, d_nope, r), and score against the latents.")


def _scores_like(keys=("readable", "cached", "yarn"), **how):
    def detect(record):
        for key in keys:
            got = plain(record.get(key))
            if not same(got, scores_variant(*_inputs(seed_of(record), key), **how)):
                return False
        return True
    return detect


_YARN = "after yarn's stretch: the layer's softmax_scale"

ABSORBED = Exercise(
    id="10.2",
    title="scores in the latent space",
    answer_name="absorbed_scores",
    signature="absorbed_scores(layer, x, start, latent, rotated_key)",
    probe=_probe_scores,
    checks=(
        Check("returns the scores, (batch, heads, new tokens, cached tokens)",
              lambda record: _scores_got(record, "readable")),
        Check("the scores of a small layer", _scores_check("readable")),
        Check("after a cache, with biases and a query bottleneck", _scores_check("cached")),
        Check(_YARN, _scores_check("yarn")),
        Check("the latents never expanded into keys (its multiply-adds counted)", _no_expansion),
        Check("scores on the inputs' device", device_check("on", "absorbed_scores")),
    ),
    mistakes=(
        Mistake("yarn-scale",
                "The scores are scaled by 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), but yarn's stretch of "
                "the positions flattens attention and DeepSeek sharpens it again: use the layer's own "
                "layer.softmax_scale (yarn_softmax_scale: times (0.1 ln(factor) + 1)^2).",
                _scores_like(keys=("yarn",), scale="plain"), (_YARN,)),
        Mistake("rope-absorbed",
                "Your scores are the latent part alone. The rotated part cannot be folded into the latent: "
                "its rotation depends on each key's position, so no fixed matrix moves across it. Add each "
                "head's rotated query against the one rotated key: q_rot @ rotated_key.transpose(-2, -1).",
                _scores_like(rotary_part=False)),
        Mistake("unrotated-query",
                "The rotated part of the queries was not turned by the new tokens' positions (start, start + "
                "1, ...): the cached keys were, so the scores lose the relative positions.",
                _scores_like(keys=("cached", "yarn"), rotate_query=False)),
    ),
    shortcuts=package(MultiHeadLatentAttention, with_shared,
                      why="Running the layer is the package's answer: compute the scores from its parts, "
                      "layer.W_query, layer.W_up_key.weight and layer.rotary."),
)

__all__ = ["COMPRESS", "ABSORBED", "latent_case", "reference_compress", "compress_variant", "scores_variant",
           "absorbed_bound"]
