"""Answers to the exercises of chapter 11 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own variants
(:mod:`mha_course.exercises.fewer_keys`), so a test passes only if the catalogue recognises real code.
"""

from __future__ import annotations

import torch

# ----------------------------------------------------------------------------------------------
# 11.1 The window's mask


def window_mask(num_tokens, window, start=0, device=None):
    queries = torch.arange(start, start + num_tokens, device=device)[:, None]  # positions of the new tokens
    keys = torch.arange(start + num_tokens, device=device)[None, :]
    distance = queries - keys
    return (distance < 0) | (distance >= window)  # the future, or out of the window


def _window_mask_with_tril(num_tokens, window, start=0, device=None):  # also correct: a band of ones
    ones = torch.ones(num_tokens, start + num_tokens, dtype=torch.bool, device=device)
    visible = ones.tril(diagonal=start) & ~ones.tril(diagonal=start - window)
    return ~visible


def _window_mask_inclusive(num_tokens, window, start=0, device=None):
    distance = torch.arange(start, start + num_tokens, device=device)[:, None] - torch.arange(start + num_tokens,
                                                                                              device=device)
    return (distance < 0) | (distance > window)


def _window_mask_from_rows(num_tokens, window, start=0, device=None):
    rows = torch.arange(num_tokens, device=device)[:, None]  # forgot that row r is position start + r
    keys = torch.arange(start + num_tokens, device=device)
    future = keys > torch.arange(start, start + num_tokens, device=device)[:, None]
    return future | (rows - keys >= window)


def _window_mask_without_causal(num_tokens, window, start=0, device=None):
    distance = torch.arange(start, start + num_tokens, device=device)[:, None] - torch.arange(start + num_tokens,
                                                                                              device=device)
    return distance >= window


def _window_mask_last_keys(num_tokens, window, start=0, device=None):
    total = start + num_tokens
    keys = torch.arange(total, device=device)
    future = keys > torch.arange(start, total, device=device)[:, None]
    return future | (keys < total - window)  # the cache's view: the last window keys for everyone


def _window_mask_visible(num_tokens, window, start=0, device=None):
    return ~window_mask(num_tokens, window, start, device)


def _window_mask_by_the_package(num_tokens, window, start=0, device=None):
    from mha_course import causal_mask

    return causal_mask(num_tokens, device, start=start, window=window)


# ----------------------------------------------------------------------------------------------
# 11.2 Decoding through a ring of window slots


def _heads(layer, x_t):
    b = x_t.shape[0]
    q = layer.W_query(x_t).view(b, 1, layer.num_heads, layer.head_dim).transpose(1, 2)  # (B, h, 1, d_h)
    k = layer.W_key(x_t).view(b, 1, layer.num_kv_groups, layer.head_dim).transpose(1, 2)  # (B, g, 1, d_h)
    v = layer.W_value(x_t).view(b, 1, layer.num_kv_groups, layer.head_dim).transpose(1, 2)
    return q, k, v


def _attend(layer, q, keys, values, visible):
    r = layer.num_heads // layer.num_kv_groups
    keys, values = keys.repeat_interleave(r, dim=1), values.repeat_interleave(r, dim=1)
    scores = (q @ keys.transpose(-2, -1)) / layer.head_dim ** 0.5
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    b = q.shape[0]
    return layer.out_proj((weights @ values).transpose(1, 2).reshape(b, 1, -1))


def ring_decode(layer, x):
    b, t_total, _ = x.shape
    w = layer.window
    ring_k = x.new_zeros(b, layer.num_kv_groups, w, layer.head_dim)
    ring_v = torch.zeros_like(ring_k)
    position = torch.full((w,), -1, device=x.device)  # which token each slot holds; -1: none yet
    outs = []
    with torch.no_grad():
        for t in range(t_total):
            q, k, v = _heads(layer, x[:, t:t + 1])
            q, k = layer.rotary(q, k, t)  # turned by the token's position
            slot = t % w  # over the key that has just left the window
            ring_k[:, :, slot], ring_v[:, :, slot] = k[:, :, 0], v[:, :, 0]
            position[slot] = t
            outs.append(_attend(layer, q, ring_k, ring_v, position >= 0))
    return torch.cat(outs, dim=1)


def _ring_by_hand_rotation(layer, x):  # also correct: the rotation written out, a list as the ring
    b, t_total, _ = x.shape
    w, d = layer.window, layer.head_dim
    inv = layer.rotary.inv_freq.to(x.device)
    slots = [None] * w
    outs = []
    with torch.no_grad():
        for t in range(t_total):
            q, k, v = _heads(layer, x[:, t:t + 1])
            angle = torch.cat([t * inv, t * inv])
            q, k = (z * angle.cos() + torch.cat([-z[..., d // 2:], z[..., :d // 2]], -1) * angle.sin()
                    for z in (q, k))
            slots[t % w] = (k, v)
            held = [s for s in slots if s is not None]
            keys, values = torch.cat([s[0] for s in held], 2), torch.cat([s[1] for s in held], 2)
            outs.append(_attend(layer, q, keys, values, torch.ones(len(held), dtype=torch.bool, device=x.device)))
    return torch.cat(outs, dim=1)


def _ring_rotated_by_slot(layer, x):
    b, t_total, _ = x.shape
    w = layer.window
    ring_k = x.new_zeros(b, layer.num_kv_groups, w, layer.head_dim)
    ring_v = torch.zeros_like(ring_k)
    position = torch.full((w,), -1, device=x.device)
    outs = []
    with torch.no_grad():
        for t in range(t_total):
            q, k, v = _heads(layer, x[:, t:t + 1])
            slot = t % w
            q, k = layer.rotary(q, k, slot)  # the slot, not the token's position
            ring_k[:, :, slot], ring_v[:, :, slot] = k[:, :, 0], v[:, :, 0]
            position[slot] = t
            outs.append(_attend(layer, q, ring_k, ring_v, position >= 0))
    return torch.cat(outs, dim=1)


def _ring_keeping_the_oldest(layer, x):
    b, t_total, _ = x.shape
    w = layer.window
    ring_k = x.new_zeros(b, layer.num_kv_groups, w, layer.head_dim)
    ring_v = torch.zeros_like(ring_k)
    position = torch.full((w,), -1, device=x.device)
    outs = []
    with torch.no_grad():
        for t in range(t_total):
            q, k, v = _heads(layer, x[:, t:t + 1])
            q, k = layer.rotary(q, k, t)
            keys, values = torch.cat([ring_k, k], 2), torch.cat([ring_v, v], 2)  # attend first...
            visible = torch.cat([position >= 0, torch.ones(1, dtype=torch.bool, device=x.device)])
            outs.append(_attend(layer, q, keys, values, visible))
            slot = t % w  # ... then write
            ring_k[:, :, slot], ring_v[:, :, slot] = k[:, :, 0], v[:, :, 0]
            position[slot] = t
    return torch.cat(outs, dim=1)


def _ring_reading_empty_slots(layer, x):
    b, t_total, _ = x.shape
    w = layer.window
    ring_k = x.new_zeros(b, layer.num_kv_groups, w, layer.head_dim)
    ring_v = torch.zeros_like(ring_k)
    outs = []
    with torch.no_grad():
        for t in range(t_total):
            q, k, v = _heads(layer, x[:, t:t + 1])
            q, k = layer.rotary(q, k, t)
            ring_k[:, :, t % w], ring_v[:, :, t % w] = k[:, :, 0], v[:, :, 0]
            outs.append(_attend(layer, q, ring_k, ring_v, torch.ones(w, dtype=torch.bool, device=x.device)))
    return torch.cat(outs, dim=1)


def _ring_by_the_package(layer, x):
    from mha_course import KVCache

    cache = KVCache()
    with torch.no_grad():
        return torch.cat([layer(x[:, t:t + 1], cache=cache) for t in range(x.shape[1])], dim=1)


# ----------------------------------------------------------------------------------------------
# 11.3 The sink column


def attend_with_sinks(queries, keys, values, sinks, mask):
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5  # (B, h, T, S)
    scores = scores.masked_fill(mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)  # (B, h, T, 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # the sink has no value
    return weights @ values


def _sinks_by_the_formula(queries, keys, values, sinks, mask):  # also correct: exp / (sum exp + exp(sink))
    scores = (queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5).masked_fill(mask, float("-inf"))
    top = torch.maximum(scores.amax(-1, keepdim=True), sinks.view(1, -1, 1, 1))  # for exp's sake
    e = torch.exp(scores - top)
    weights = e / (e.sum(-1, keepdim=True) + torch.exp(sinks.view(1, -1, 1, 1) - top))
    return weights @ values


def _sinks_left_out(queries, keys, values, sinks, mask):
    scores = (queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5).masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values


def _sink_given_to_the_first_key(queries, keys, values, sinks, mask):
    scores = (queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5).masked_fill(mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)
    out = weights[..., :-1] @ values
    visible = ~mask.expand(scores.shape)
    first = visible.float().argmax(-1)  # the first key each query sees: StreamingLLM's sink token
    first_values = torch.gather(values, 2, first.unsqueeze(-1).expand(*first.shape, values.shape[-1]))
    return out + weights[..., -1:] * first_values


def _sinks_unscaled(queries, keys, values, sinks, mask):
    scores = (queries @ keys.transpose(-2, -1)).masked_fill(mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ values


def _sinks_by_the_package(queries, keys, values, sinks, mask):
    from mha_course.attention.sinks import softmax_with_sinks

    return softmax_with_sinks(queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5, sinks, mask) @ values


# ----------------------------------------------------------------------------------------------
# 11.4 Top-k over the visible keys


def top_k_visible(scores, hidden, k):
    ranked = scores.masked_fill(hidden, float("-inf"))  # a hidden key never takes a place
    best = ranked.topk(min(k, scores.shape[-1]), dim=-1).indices  # (B, T, k)
    kept = torch.zeros_like(hidden).scatter(-1, best, True)
    return hidden | ~kept


def _top_k_by_threshold(scores, hidden, k):  # also correct: the k-th best visible score as a threshold
    ranked = scores.masked_fill(hidden, float("-inf"))
    kth = ranked.sort(dim=-1, descending=True).values[..., min(k, scores.shape[-1]) - 1:][..., :1]
    return hidden | (ranked < kth)


def _top_k_over_every_key(scores, hidden, k):
    best = scores.topk(min(k, scores.shape[-1]), dim=-1).indices  # the future competes too
    kept = torch.zeros_like(hidden).scatter(-1, best, True)
    return hidden | ~kept


def _top_k_forgetting_the_hidden(scores, hidden, k):
    best = scores.masked_fill(hidden, float("-inf")).topk(min(k, scores.shape[-1]), dim=-1).indices
    return ~torch.zeros_like(hidden).scatter(-1, best, True)


def _top_k_kept_as_true(scores, hidden, k):
    best = scores.masked_fill(hidden, float("-inf")).topk(min(k, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(hidden).scatter(-1, best, True) & ~hidden


def _top_k_by_the_package(scores, hidden, k):
    from mha_course.attention.sparse import keep_top_k

    return keep_top_k(scores, hidden, k)


CORRECT = {"11.1": window_mask, "11.2": ring_decode, "11.3": attend_with_sinks, "11.4": top_k_visible}

#: More correct answers, written differently.
ALSO_CORRECT = {"11.1": [_window_mask_with_tril], "11.2": [_ring_by_hand_rotation],
                "11.3": [_sinks_by_the_formula], "11.4": [_top_k_by_threshold]}

WRONG = {
    ("11.1", "off-by-one"): _window_mask_inclusive,
    ("11.1", "window-on-query-rows"): _window_mask_from_rows,
    ("11.1", "no-causal"): _window_mask_without_causal,
    ("11.1", "same-keys-for-all"): _window_mask_last_keys,
    ("11.1", "inverted"): _window_mask_visible,
    ("11.2", "rotated-by-slot"): _ring_rotated_by_slot,
    ("11.2", "oldest-kept"): _ring_keeping_the_oldest,
    ("11.2", "empty-slots-read"): _ring_reading_empty_slots,
    ("11.3", "no-sink"): _sinks_left_out,
    ("11.3", "sink-to-a-value"): _sink_given_to_the_first_key,
    ("11.3", "unscaled"): _sinks_unscaled,
    ("11.4", "top-k-over-masked"): _top_k_over_every_key,
    ("11.4", "hidden-forgotten"): _top_k_forgetting_the_hidden,
    ("11.4", "inverted"): _top_k_kept_as_true,
}

#: Answers that are, or call, the package's own answer: refused, naming what they use.
BY_THE_PACKAGE = {
    "11.1 calls causal_mask": ("11.1", _window_mask_by_the_package, "mha_course's own causal_mask"),
    "11.2 runs the layer with the package's cache": ("11.2", _ring_by_the_package,
                                                     "mha_course's own KVCache"),
    "11.3 calls softmax_with_sinks": ("11.3", _sinks_by_the_package, "mha_course's own softmax_with_sinks"),
    "11.4 calls keep_top_k": ("11.4", _top_k_by_the_package, "mha_course's own keep_top_k"),
}
