"""A key/value cache: what an attention layer keeps of the tokens it has already seen.

When a model generates text it runs one new token at a time through every layer. Causality means
the keys and values of the earlier tokens never change when a token is added, so instead of
recomputing them for the whole prefix at every step, a layer keeps them in a :class:`KVCache` and
computes keys and values for the new tokens only. Queries are not cached: each step needs only the
new tokens' queries.

The cache holds ``(B, g, T_cached, d_h)`` keys and values, where ``g`` is the number of key/value
heads of the layer (``num_kv_groups`` of :class:`GroupedQueryAttention`), so sharing key/value
heads across query heads shrinks it by ``num_heads / num_kv_groups``.
"""

from __future__ import annotations

import weakref

import torch


class KVCache:
    """The keys and values of the positions one attention layer has seen, for one batch of sequences.

    Pass the same cache to every call of the layer while a sequence grows: the layer appends the new
    tokens' keys and values, and its queries attend to every cached position plus the causal part of
    the new tokens. A first call with several tokens (the prompt, or *prefill*) and later calls with
    one token each (decoding) give the outputs that recomputing the whole prefix would.

    Use one cache per attention layer and per batch of sequences; call :meth:`reset` (or make a new
    cache) before the next sequence. The first layer that fills a cache owns it until
    :meth:`reset`: another layer, even one of the same shape, is refused, since its keys would be
    scored against the first layer's. The cache keeps autograd history if it is filled with
    gradients on; generation normally runs under ``torch.no_grad()``, and ``copy.deepcopy`` of a
    cache copies the keys and values without that history.

    Attributes:
        keys: ``(batch, num_kv_groups, num_cached, head_dim)`` tensor, or ``None`` while empty.
        values: the same for values.

    Example:
        >>> from mha_course import GroupedQueryAttention
        >>> gqa = GroupedQueryAttention(8, 8, context_length=6, dropout=0.0, num_heads=4, num_kv_groups=2)
        >>> x = torch.rand(1, 5, 8)
        >>> cache = KVCache()
        >>> prompt = gqa(x[:, :3], cache=cache)  # three tokens at once
        >>> len(cache), tuple(cache.keys.shape)  # (B, g, T_cached, d_h)
        (3, (1, 2, 3, 2))
        >>> step = gqa(x[:, 3:4], cache=cache)  # then one token at a time
        >>> torch.allclose(step, gqa(x[:, :4])[:, 3:], atol=1e-6)  # as if the prefix were recomputed
        True
        >>> cache.reset()
        >>> len(cache)
        0
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self._layer: weakref.ref | None = None  # the layer that fills the cache

    def __deepcopy__(self, memo: dict) -> KVCache:
        """A copy that owns copies of the keys and values, for the same layer.

        When the layer is copied in the same deep copy, and before the cache (a model that holds its
        layers and then its caches, or ``copy.deepcopy((layer, cache))``), the copy serves the
        layer's copy instead. Keys computed with gradients on are not leaves of the autograd graph, which PyTorch refuses
        to deep-copy; the copy holds them detached (the same numbers, no history), as a cache used
        for generation needs.

        Example:
            >>> import copy
            >>> cache = KVCache()
            >>> weight = torch.ones(1, requires_grad=True)
            >>> _ = cache.append(torch.rand(1, 1, 2, 4) * weight, torch.rand(1, 1, 2, 4) * weight)
            >>> twin = copy.deepcopy(cache)
            >>> len(twin), twin.keys.requires_grad, torch.equal(twin.keys, cache.keys)
            (2, False, True)
        """
        owner = None if self._layer is None else self._layer()
        layer = self._layer  # the same layer, unless that layer is being copied too: then its copy
        if owner is not None and id(owner) in memo:
            layer = weakref.ref(memo[id(owner)])
        keys, values = self.keys, self.values
        if keys is not None:
            keys, values = keys.detach().clone(), values.detach().clone()
        twin = KVCache.__new__(KVCache)
        memo[id(self)] = twin
        twin.__setstate__({**self.__dict__, "keys": keys, "values": values, "_layer": layer})
        return twin

    def __getstate__(self) -> dict:
        """What pickling keeps: the keys and values, not the layer (a weak reference cannot be pickled).

        An unpickled cache belongs to no layer: the first layer that calls it owns it, as with a new
        cache, and should be the layer (or the copy of the layer) that filled it.

        Example:
            >>> import pickle
            >>> from mha_course import GroupedQueryAttention
            >>> gqa = GroupedQueryAttention(4, 4, 6, 0.0, 2, 1)
            >>> cache = KVCache()
            >>> _ = gqa(torch.rand(1, 3, 4), cache=cache)
            >>> pickle.loads(pickle.dumps(cache))
            KVCache(3 positions, batch=1, kv_heads=1, head_dim=2)
        """
        return {**self.__dict__, "_layer": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        """How many positions the cache holds (0 when empty)."""
        return 0 if self.keys is None else self.keys.shape[2]

    def __repr__(self) -> str:
        if self.keys is None:
            return "KVCache(empty)"
        batch, groups, _, head_dim = self.keys.shape
        return f"KVCache({len(self)} positions, batch={batch}, kv_heads={groups}, head_dim={head_dim})"

    def reset(self) -> None:
        """Empty the cache, to start a new sequence (or batch of sequences)."""
        self.keys = None
        self.values = None
        self._layer = None

    def start(self, layer, num_new: int, context_length: int) -> int:
        """Where ``layer``'s ``num_new`` new tokens start: the number of positions already cached.

        Called by the attention layer before it appends. The first layer to call it on an empty
        cache owns the cache until :meth:`reset`.

        Raises:
            ValueError: if another layer filled the cache, or the cached and the new positions
                together exceed ``context_length``.

        Example:
            >>> from mha_course import GroupedQueryAttention
            >>> first, second = (GroupedQueryAttention(4, 4, 6, 0.0, 2, 1) for _ in range(2))
            >>> cache = KVCache()
            >>> _ = first(torch.rand(1, 3, 4), cache=cache)
            >>> cache.start(first, num_new=1, context_length=6)
            3
            >>> second(torch.rand(1, 1, 4), cache=cache)
            Traceback (most recent call last):
                ...
            ValueError: this cache holds the keys and values of another layer (GroupedQueryAttention), filled for 3 positions: each attention layer needs its own KVCache(). Make one per layer, e.g. caches = [KVCache() for _ in layers], or call cache.reset() to start a new sequence with this layer.
        """
        owner = None if self._layer is None else self._layer()
        if self._layer is not None and owner is not layer:
            name = "one that no longer exists" if owner is None else type(owner).__name__
            raise ValueError(
                f"this cache holds the keys and values of another layer ({name}), filled for "
                f"{len(self)} positions{self._what_differs(layer)}: each attention layer needs its own "
                "KVCache(). Make one per layer, e.g. caches = [KVCache() for _ in layers], or call "
                "cache.reset() to start a new sequence with this layer."
            )
        if len(self) + num_new > context_length:
            raise ValueError(
                f"the cache holds {len(self)} positions and x adds {num_new} more, {len(self) + num_new} "
                f"in all, but the module was built with context_length={context_length}, so its "
                f"causal mask covers only {context_length} positions. Start a new sequence with "
                f"cache.reset(), or build the module with context_length>={len(self) + num_new}."
            )
        self._layer = weakref.ref(layer)
        return len(self)

    def _what_differs(self, layer) -> str:
        """``", in float32 on cpu, where this layer's weights are float64"``, or ``""`` if neither differs."""
        weight = next(layer.parameters(), None) if isinstance(layer, torch.nn.Module) else None
        if weight is None or self.keys is None:
            return ""
        held = (self.keys.dtype, self.keys.device)
        if (weight.dtype, weight.device) == held:
            return ""
        return (f", in {held[0]} on {held[1]}, where this layer's weights are {weight.dtype} on {weight.device} "
                "(a copy of a layer moved with .to() is another layer, whose keys would differ)")

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' keys and values; return all keys and values held, old then new.

        Called by the attention layer itself. Both arguments are ``(batch, num_kv_groups,
        num_new, head_dim)``; the result is ``(batch, num_kv_groups, len(self), head_dim)`` after
        the append.

        Raises:
            ValueError: if the new keys do not fit what the cache holds (another batch size, number
                of key/value heads, head width or device), or keys and values differ in shape.
            TypeError: if their dtype differs from the cached keys'.

        Example:
            >>> cache = KVCache()
            >>> keys, values = cache.append(torch.rand(2, 1, 3, 4), torch.rand(2, 1, 3, 4))
            >>> keys, values = cache.append(torch.rand(2, 1, 1, 4), torch.rand(2, 1, 1, 4))
            >>> tuple(keys.shape), len(cache)
            ((2, 1, 4, 4), 4)
        """
        self._check(keys, values)
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            # Concatenation copies the whole cache at every step: simple, and
            # small next to recomputing the keys and values of the prefix.
            # (B, g, T_cached + T_new, d_h) each:
            self.keys = torch.cat([self.keys, keys], dim=2)
            self.values = torch.cat([self.values, values], dim=2)
        return self.keys, self.values

    def _check(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 4-D tensor (batch, num_kv_groups, num_new, head_dim), got {got}.")
        if keys.shape != values.shape:
            raise ValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must have the same shape "
                "(batch, num_kv_groups, num_new, head_dim)."
            )
        if self.keys is None:
            return
        batch, groups, _, head_dim = self.keys.shape
        if keys.shape[0] != batch:
            raise ValueError(
                f"the cache holds keys for a batch of {batch} sequences, but the new tokens come in a "
                f"batch of {keys.shape[0]} (x.shape[0]). A cache serves one batch of sequences: call "
                "cache.reset() before starting another, or give each batch its own KVCache()."
            )
        if (keys.shape[1], keys.shape[3]) != (groups, head_dim):
            raise ValueError(
                f"the cache holds {groups} key/value heads of width {head_dim}, the new keys have "
                f"{keys.shape[1]} of width {keys.shape[3]}: the cache was filled by another layer. "
                "Give each attention layer its own KVCache()."
            )
        if keys.device != self.keys.device:
            raise ValueError(
                f"the cache is on {self.keys.device} but the new keys are on {keys.device}: the module "
                "moved since the cache was filled. Call cache.reset() and run the sequence again."
            )
        if keys.dtype != self.keys.dtype:
            raise TypeError(
                f"the cache holds {self.keys.dtype} keys but the new keys are {keys.dtype}: the module "
                "changed dtype since the cache was filled. Call cache.reset() and run the sequence "
                "again."
            )


def cache_start(cache: KVCache | None, layer, num_new: int, context_length: int) -> int:
    """The position of ``layer``'s first new token: 0 without a cache, else :meth:`KVCache.start`.

    Raises:
        TypeError: if ``cache`` is neither ``None`` nor a :class:`KVCache`.

    Example:
        >>> cache_start(None, layer=None, num_new=3, context_length=6)
        0
    """
    if cache is None:
        return 0
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}. Make one with KVCache().")
    return cache.start(layer, num_new, context_length)
