"""A key/value cache: what an attention layer keeps of the tokens it has already seen.

When a model generates text it runs one new token at a time through every layer. Causality means
the keys and values of the earlier tokens never change when a token is added, so instead of
recomputing them for the whole prefix at every step, a layer keeps them in a :class:`KVCache` and
computes keys and values for the new tokens only. Queries are not cached: each step needs only the
new tokens' queries.

:class:`GroupedQueryAttention` keeps ``(B, g, T_cached, d_h)`` keys and values, where ``g`` is the
number of key/value heads of the layer (``num_kv_groups``), so sharing key/value heads across query
heads shrinks the cache by ``num_heads / num_kv_groups``. Other layers keep other tensors under
other names, one row per position on the second-to-last axis: multi-head latent attention keeps one
small latent and one rotated key per token (:meth:`KVCache.extend`); a layer with a sliding window
keeps only the last positions its next token can see (:meth:`KVCache.slide`); a layer with a
recurrent state keeps a tensor that does not grow at all (:meth:`KVCache.hold`).
:attr:`KVCache.nbytes` measures what any of them holds.
"""

from __future__ import annotations

import weakref

import torch

from ._validation import validate_positive_int


class KVCache:
    """What one attention layer keeps of the positions it has seen, for one batch of sequences.

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
        tensors: what the cache holds per position, by name: ``{"keys": ..., "values": ...}`` for
            :class:`GroupedQueryAttention`, each ``(batch, ..., num_cached, width)``.
        states: tensors of a fixed size, by name (a recurrent layer's state), empty for attention.
        keys: ``tensors["keys"]``, ``(batch, num_kv_groups, num_cached, head_dim)``, or ``None``
            while empty; ``values`` the same for values.
        dropped: how many of the first positions a sliding window has let go (:meth:`slide`); 0
            for a cache that keeps everything. ``len(cache)`` counts them too: it is the position
            of the next token.

    Example:
        >>> from mha_course import GroupedQueryAttention
        >>> gqa = GroupedQueryAttention(8, 8, context_length=6, dropout=0.0, num_heads=4, num_kv_groups=2)
        >>> x = torch.rand(1, 5, 8)
        >>> cache = KVCache()
        >>> prompt = gqa(x[:, :3], cache=cache)  # three tokens at once
        >>> len(cache), tuple(cache.keys.shape)  # (B, g, T_cached, d_h)
        (3, (1, 2, 3, 2))
        >>> cache.nbytes  # keys and values: 2 x 1 x 2 x 3 x 2 float32 numbers of 4 bytes
        96
        >>> step = gqa(x[:, 3:4], cache=cache)  # then one token at a time
        >>> torch.allclose(step, gqa(x[:, :4])[:, 3:], atol=1e-6)  # as if the prefix were recomputed
        True
        >>> cache.reset()
        >>> len(cache)
        0
    """

    #: Positions let go at the front by a sliding window (a class default, so old pickles load too).
    dropped: int = 0

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}  # name -> (B, ..., T_cached, width)
        self.states: dict[str, torch.Tensor] = {}  # name -> a tensor that does not grow
        self._held_positions = 0  # positions summarised in the states (hold's new_positions)
        self._layer: weakref.ref | None = None  # the layer that fills the cache

    # GroupedQueryAttention's keys and values under their own names (None while empty)
    keys = property(lambda self: self.tensors.get("keys"),
                    lambda self, keys: self._put("keys", keys))
    values = property(lambda self: self.tensors.get("values"),
                      lambda self, values: self._put("values", values))

    def _put(self, name: str, tensor: torch.Tensor | None) -> None:
        """Set (or, with ``None``, drop) what the cache holds under ``name``."""
        if tensor is None:
            self.tensors.pop(name, None)
        else:
            self.tensors[name] = tensor

    @property
    def nbytes(self) -> int:
        """The bytes of the tensors the cache holds, which is what it costs in memory, measured, not counted.

        Example:
            >>> cache = KVCache()
            >>> _ = cache.extend(latent=torch.rand(2, 5, 16), rotated_key=torch.rand(2, 5, 4))
            >>> cache.nbytes == 2 * 5 * (16 + 4) * 4  # batch x tokens x widths x bytes per float32
            True
        """
        return sum(t.nbytes for t in [*self.tensors.values(), *self.states.values()])

    def __deepcopy__(self, memo: dict) -> KVCache:
        """A copy that owns copies of the tensors, for the same layer.

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
        twin = KVCache.__new__(KVCache)
        memo[id(self)] = twin
        copied = {name: {key: t.detach().clone() for key, t in getattr(self, name).items()}
                  for name in ("tensors", "states")}
        twin.__setstate__({**self.__dict__, **copied, "_layer": layer})
        return twin

    def __getstate__(self) -> dict:
        """What pickling keeps: the tensors, not the layer (a weak reference cannot be pickled).

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
        """How many positions the cache has seen (0 when empty): those it holds, and those a window let go."""
        return self.dropped + self.held

    @property
    def held(self) -> int:
        """How many positions the cache holds: the rows of its per-position tensors (``len(cache)``
        unless a sliding window let some go), or, for a cache of fixed-size states alone, the
        positions those states summarise."""
        return next((t.shape[-2] for t in self.tensors.values()), self.__dict__.get("_held_positions", 0))

    def __repr__(self) -> str:
        if not self.tensors and not self.states:
            return "KVCache(empty)"
        seen = f"{len(self)} positions" + (f", the last {self.held} held" if self.dropped else "")
        if self.tensors.keys() == {"keys", "values"} and not self.states:  # GroupedQueryAttention's
            batch, groups, _, head_dim = self.keys.shape
            return f"KVCache({seen}, batch={batch}, kv_heads={groups}, head_dim={head_dim})"
        held = ", ".join(f"{name}={tuple(t.shape)}" for name, t in [*self.tensors.items(), *self.states.items()])
        return f"KVCache({seen}, {held})"

    def reset(self) -> None:
        """Empty the cache, to start a new sequence (or batch of sequences)."""
        self.tensors, self.states = {}, {}
        self._held_positions = 0
        self._layer = None
        self.dropped = 0

    def start(self, layer, num_new: int, context_length: int | None) -> int:
        """Where ``layer``'s ``num_new`` new tokens start: the number of positions already cached.

        Called by the attention layer before it appends. The first layer to call it on an empty
        cache owns the cache until :meth:`reset`. ``context_length=None`` sets no limit.

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
        if context_length is not None and len(self) + num_new > context_length:
            raise ValueError(
                f"the cache holds {len(self)} positions and x adds {num_new} more, {len(self) + num_new} "
                f"in all, but the module was built with context_length={context_length}, the longest "
                f"sequence it accepts, cached positions included. Start a new sequence with "
                f"cache.reset(), or build the module with context_length>={len(self) + num_new}."
            )
        self._layer = weakref.ref(layer)
        return len(self)

    def _what_differs(self, layer) -> str:
        """``", in float32 on cpu, where this layer's weights are float64"``, or ``""`` if neither differs."""
        weight = next(layer.parameters(), None) if isinstance(layer, torch.nn.Module) else None
        held = next(iter([*self.tensors.values(), *self.states.values()]), None)
        if weight is None or held is None:
            return ""
        if (weight.dtype, weight.device) == (held.dtype, held.device):
            return ""
        return (f", in {held.dtype} on {held.device}, where this layer's weights are {weight.dtype} on "
                f"{weight.device} (a copy of a layer moved with .to() is another layer, whose keys would differ)")

    def append(self, keys: torch.Tensor, values: torch.Tensor,
               window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' keys and values; return all keys and values held, old then new.

        Called by :class:`GroupedQueryAttention` itself. Both arguments are ``(batch,
        num_kv_groups, num_new, head_dim)``; the result is ``(batch, num_kv_groups, len(self),
        head_dim)`` after the append. It is :meth:`extend` under the names ``keys`` and ``values``,
        or, for a layer with a sliding ``window``, :meth:`slide`: the positions held before are then
        at most the last ``window - 1``.

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
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 4-D tensor (batch, num_kv_groups, num_new, head_dim), got {got}.")
        if keys.shape != values.shape:
            raise ValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must have the same shape "
                "(batch, num_kv_groups, num_new, head_dim)."
            )
        if window is not None:
            return self.slide(window, keys=keys, values=values)
        return self.extend(keys=keys, values=values)

    def extend(self, **new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Add the new tokens' tensors, by name; return everything held under those names, old then new.

        Each tensor is ``(batch, ..., num_new, width)``: one row per new token on its second-to-last
        axis, where the cached rows are joined. A layer passes the same names at every call, e.g.
        ``cache.extend(latent=..., rotated_key=...)``.

        Raises:
            ValueError: if a new tensor does not fit what the cache holds under its name (another
                batch size, shape, device, or a name the cache does not hold), or the new tensors
                differ in their number of tokens.
            TypeError: if its dtype differs from the cached one's.

        Example:
            >>> cache = KVCache()
            >>> latent, rotated = cache.extend(latent=torch.rand(2, 3, 16), rotated_key=torch.rand(2, 3, 4))
            >>> latent, rotated = cache.extend(latent=torch.rand(2, 1, 16), rotated_key=torch.rand(2, 1, 4))
            >>> tuple(latent.shape), tuple(rotated.shape), len(cache)
            ((2, 4, 16), (2, 4, 4), 4)
        """
        self._check(new)
        for name, tensor in new.items():
            if name in self.tensors:
                # Concatenation copies the whole cache at every step: simple,
                # and small next to recomputing the keys and values of the
                # prefix. (B, ..., T_cached + T_new, width):
                tensor = torch.cat([self.tensors[name], tensor], dim=-2)
            self.tensors[name] = tensor
        return tuple(self.tensors[name] for name in new)

    def slide(self, window: int, **new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`extend`, then hold only the last ``window - 1`` positions: the cache of a sliding window.

        A layer whose token ``i`` sees the keys ``i - window + 1`` to ``i`` needs, for its next token,
        the ``window - 1`` positions before it, and never an older one. The result is :meth:`extend`'s:
        the positions held, then the new ones, which the new tokens' queries read; afterwards the cache
        holds at most ``window - 1`` positions whatever the sequence's length, so its :attr:`nbytes`
        stops growing. ``len(cache)`` still counts every position seen, the next token's position, and
        :attr:`dropped` those let go. Mistral's rolling buffer keeps the same keys in ``window`` slots
        written in turn (position ``p`` in slot ``p % window``); here they stay in order, as in
        transformers' cache, so that the positions of the rows are ``len(cache) - held`` onwards.

        Raises:
            ValueError: if ``window`` is not a positive integer, or as :meth:`extend`.

        Example:
            >>> cache = KVCache()
            >>> for t in range(6):  # six tokens, one at a time, through a window of 3
            ...     keys, values = cache.slide(3, keys=torch.rand(1, 1, 1, 4), values=torch.rand(1, 1, 1, 4))
            >>> keys.shape[-2], cache.held, len(cache), cache.dropped  # the last token read 3 keys
            (3, 2, 6, 4)
            >>> cache.nbytes == 2 * 2 * 4 * 4  # keys and values of 2 positions: as after 3 tokens
            True
        """
        window = validate_positive_int(
            "window", window, hint="It is how many positions a token sees, itself included.")
        joined = self.extend(**new)
        excess = self.held - (window - 1)
        if excess > 0:  # copies of the last rows: the older ones are freed
            self.tensors = {name: t[..., excess:, :].clone()
                            for name, t in self.tensors.items()}
            self.dropped += excess
        return joined

    def hold(self, new_positions: int = 0, **state: torch.Tensor) -> None:
        """Keep tensors of a fixed size, by name, in place of those held before (a recurrent state).

        A layer that summarises its past in a state of fixed size, rather than in one row per
        position, stores the state after each call here. The cache's length counts the positions of
        :meth:`extend`; a cache of states alone counts the ``new_positions`` each call says it
        summarised (the tokens of ``x``), so that ``len(cache)`` is the positions seen either way.

        Raises:
            ValueError: if a state does not fit the one held under its name (shape or device).
            TypeError: if its dtype differs from the held one's.

        Example:
            >>> cache = KVCache()
            >>> cache.hold(state=torch.zeros(2, 4, 8, 8))
            >>> cache.hold(state=torch.ones(2, 4, 8, 8), new_positions=5)  # replaced, not grown
            >>> cache.nbytes == 2 * 4 * 8 * 8 * 4, len(cache)
            (True, 5)
        """
        if isinstance(new_positions, bool) or not isinstance(new_positions, int) or new_positions < 0:
            raise ValueError(f"new_positions must be a whole number >= 0 (the tokens this call summarised), "
                             f"got {new_positions!r}.")
        for name, tensor in state.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}.")
            held = self.states.get(name)
            self._fits(name, tensor, held, None if held is None else held.shape)
        self.states.update(state)
        self._held_positions = self.__dict__.get("_held_positions", 0) + new_positions

    def _check(self, new: dict[str, torch.Tensor]) -> None:
        """Refuse new tensors that do not fit each other or what the cache holds, before changing anything."""
        for name, t in new.items():
            if not isinstance(t, torch.Tensor) or t.dim() < 2:
                got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a tensor (batch, ..., num_new, width), got {got}.")
        counts = {name: t.shape[-2] for name, t in new.items()}
        if len(set(counts.values())) > 1:
            raise ValueError(f"the new tensors must hold the same number of tokens (their second-to-last "
                             f"axis), got {counts}.")
        if self.tensors and self.tensors.keys() != new.keys():
            raise ValueError(
                f"the cache holds {', '.join(self.tensors)}, and the new tokens bring {', '.join(new)}: "
                "the cache was filled by another kind of layer. Give each attention layer its own KVCache()."
            )
        for name, t in new.items():
            held = self.tensors.get(name)
            self._fits(name, t, held, None if held is None else (*held.shape[:-2], t.shape[-2], held.shape[-1]))

    def _fits(self, name: str, new: torch.Tensor, held: torch.Tensor | None, shape) -> None:
        """Refuse ``new`` unless it has ``held``'s batch, ``shape``, device and dtype."""
        if held is None:
            return
        are = "are" if name.endswith("s") else "is"  # "the new keys are", "the new state is"
        if new.shape[0] != held.shape[0]:
            raise ValueError(
                f"the cache holds {name} for a batch of {held.shape[0]} sequences, but the new tokens come in "
                f"a batch of {new.shape[0]} (x.shape[0]). A cache serves one batch of sequences: call "
                "cache.reset() before starting another, or give each batch its own KVCache()."
            )
        if tuple(new.shape) != tuple(shape):
            raise ValueError(
                f"the cache holds {name} of shape {tuple(held.shape)}, the new {name} {are} of shape "
                f"{tuple(new.shape)}: the cache was filled by another layer. Give each attention layer its "
                "own KVCache()."
            )
        if new.device != held.device:
            raise ValueError(
                f"the cache is on {held.device} but the new {name} {are} on {new.device}: the module "
                "moved since the cache was filled. Call cache.reset() and run the sequence again."
            )
        if new.dtype != held.dtype:
            raise TypeError(
                f"the cache holds {held.dtype} {name} but the new {name} {are} {new.dtype}: the module "
                "changed dtype since the cache was filled. Call cache.reset() and run the sequence "
                "again."
            )


def cache_start(cache: KVCache | None, layer, num_new: int, context_length: int | None) -> int:
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
