"""The causal mask: which earlier positions each token may draw on."""

from __future__ import annotations

import torch

from ._validation import validate_attention_mask, validate_non_negative_int, validate_window


def causal_mask(num_tokens: int, device: torch.device | str | None = None, start: int = 0,
                window: int | None = None) -> torch.Tensor:
    """Boolean mask that is ``True`` where attention is forbidden: ``(num_tokens, start + num_tokens)``.

    Row ``i`` is the query at position ``start + i`` and column ``j`` the key at position ``j``;
    ``mask[i, j]`` is ``True`` when ``j > start + i``, that is, when the key lies in the query's
    future. Every position sees itself and the positions before it. This is the convention of
    ``masked_fill`` (fill where ``True``) and of ``torch.nn.MultiheadAttention``'s boolean
    ``attn_mask``. With ``start = 0`` the mask is square; with ``start`` cached positions before the
    new tokens (chapter 6) it holds only the rows of the new tokens, against every key they may see.

    With a sliding ``window`` (chapter 11) a query also stops seeing the keys ``window`` or more
    positions back: key ``p`` is visible from query ``q`` when ``0 <= q - p < window``, itself and
    the ``window - 1`` positions before it (transformers' convention). The columns that no row
    sees are left out: the mask starts at position ``max(0, start - window + 1)``, and holds the
    columns of the positions a window's cache keeps (:meth:`~mha_course.KVCache.slide`) and of the new tokens.

    Args:
        num_tokens: how many queries, a non-negative integer (0 gives an empty mask).
        device: where to create the mask (default: the CPU).
        start: the position of the first query, the number of positions before it (default 0).
        window: ``None`` (every earlier position is visible), or how many positions a query sees,
            itself included.

    Raises:
        ValueError: for a negative ``num_tokens`` or ``start``, or a ``window`` below 1.

    Example:
        >>> causal_mask(3).int()
        tensor([[0, 1, 1],
                [0, 0, 1],
                [0, 0, 0]], dtype=torch.int32)
        >>> causal_mask(2, start=2).int()  # tokens 2 and 3, after two cached ones
        tensor([[0, 0, 0, 1],
                [0, 0, 0, 0]], dtype=torch.int32)
        >>> causal_mask(4, window=2).int()  # each token sees itself and the one before
        tensor([[0, 1, 1, 1],
                [0, 0, 1, 1],
                [1, 0, 0, 1],
                [1, 1, 0, 0]], dtype=torch.int32)
        >>> causal_mask(1, start=5, window=3).int()  # token 5 sees 3 and 4 (of the cache) and itself
        tensor([[0, 0, 0]], dtype=torch.int32)
    """
    num_tokens = validate_non_negative_int("num_tokens", num_tokens)
    start = validate_non_negative_int("start", start)
    first = 0  # the position of the first column
    window = validate_window(window)
    if window is not None:
        first = max(0, start - window + 1)
    future = torch.ones(num_tokens, start + num_tokens - first,
                        dtype=torch.bool, device=device)
    mask = torch.triu(future, diagonal=start - first + 1)  # keys after the query
    if window is not None:  # and keys window or more positions before it
        mask |= torch.tril(future, diagonal=start - first - window)
    return mask


def visibility(num_tokens: int) -> torch.Tensor:
    """Boolean (num_tokens, num_tokens) table that is ``True`` where token ``i`` may see token ``j``.

    The complement of :func:`causal_mask`: a lower triangle including the diagonal. Row ``i`` lists
    the tokens that token ``i`` may draw on: itself and every token before it.

    Example:
        >>> visibility(3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    return ~causal_mask(num_tokens)


#: The side of the mask buffer a module builds when it is made: its whole ``context_length`` up to this,
#: 1 MiB of booleans. A module made for a longer context starts here and grows its buffer to the longest
#: input it is given (:func:`register_causal_mask`), so that no module holds a mask for a context it never
#: sees: a Llama 3.1 layer's 131,072 positions would take 16 GiB.
MASK_BUFFER_SIDE = 1024


def validate_loaded_mask(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                         error_msgs) -> None:
    """Refuse a state dict whose ``mask`` is not the causal pattern (a ``load_state_dict`` pre-hook).

    The mask is not learned, yet it is saved with the module, so a corrupted or hand-edited state
    dict could turn causality off without a word. Registered by every module that holds a ``mask``
    buffer, this hook accepts the causal pattern of any side up to the module's ``context_length``,
    in any dtype (the boolean mask saved by the course's modules, and the float
    ``torch.triu(torch.ones(T, T), diagonal=1)`` of the best-known book chapter's), and reports
    anything else through ``load_state_dict``'s own error, leaving the module's mask as it was.
    """
    key = prefix + "mask"
    loaded = state_dict.get(key)
    if not isinstance(loaded, torch.Tensor) or loaded.is_meta:
        return
    # A module without context_length (a bare holder of the buffer) is as long as its mask.
    error = _not_causal(loaded, key, getattr(module, "context_length", module.mask.shape[0]))
    if error is None or "saved from a module" not in error:
        state_dict[key] = module.mask  # the module keeps its own buffer, of its side; a wrong one fails below
    if error is not None:
        error_msgs.append(error)


def drop_loaded_mask(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                     error_msgs) -> None:
    """Accept a causal ``mask`` in a state dict for a module that keeps none (a ``load_state_dict`` pre-hook).

    ``GroupedQueryAttention`` builds its mask per call. Registered by it, this hook lets it load a
    state dict that holds one, ``MultiHeadAttention``'s or one saved before the module stopped keeping
    a buffer, once :func:`validate_loaded_mask`'s check finds it causal; the entry is then dropped.
    """
    key = prefix + "mask"
    loaded = state_dict.get(key)
    if not isinstance(loaded, torch.Tensor):
        return
    error = None if loaded.is_meta else _not_causal(loaded, key, module.context_length)
    if error is None:
        del state_dict[key]
    else:
        error_msgs.append(error)


def _not_causal(loaded: torch.Tensor, key: str, context_length: int) -> str | None:
    """The error for a loaded mask that is not the causal pattern of a side up to ``context_length``."""
    if loaded.dim() != 2 or loaded.shape[0] != loaded.shape[1]:
        return (f"{key}: a causal mask is a square (T, T) table, got shape {tuple(loaded.shape)}. Delete that "
                "entry and load with strict=False.")
    size = loaded.shape[0]
    if size > context_length:
        return (f"{key}: the state dict was saved from a module with context_length={size}, this one has "
                f"context_length={context_length}. Build it with context_length={size}.")
    expected = causal_mask(size, device=loaded.device).to(loaded.dtype)
    if torch.equal(loaded, expected):
        return None
    wrong = int((loaded != expected).sum())
    return (f"{key}: the loaded mask is not the causal pattern (True, or 1, exactly above the diagonal, "
            f"False or 0 elsewhere): {wrong} of its {loaded.numel()} entries differ, so tokens would see "
            f"the future or lose their past. The mask is never learned: replace it before loading with "
            f"state_dict[{key!r}] = mha_course.causal_mask({size}), or delete that entry and load with "
            "strict=False.")


def register_causal_mask(module: torch.nn.Module, context_length: int) -> None:
    """Give ``module`` a ``mask`` buffer, :func:`causal_mask` of ``context_length``, that stays causal.

    A buffer, not a parameter: it is never trained, but it moves with ``module.to(device)`` and is
    saved in the ``state_dict``. Loading a state dict whose mask is not the causal pattern fails
    (:func:`validate_loaded_mask`, registered here as a ``load_state_dict`` pre-hook).

    The buffer covers the whole ``context_length`` up to :data:`MASK_BUFFER_SIDE` positions. A module
    made for a longer context starts with a buffer of that side and, before a call with a longer
    input, replaces it with the mask of that input's length (a forward pre-hook registered here), so
    its buffer is never larger than the longest input it has seen.

    Example:
        >>> module = torch.nn.Module()
        >>> register_causal_mask(module, 3)
        >>> module.mask.int()
        tensor([[0, 1, 1],
                [0, 0, 1],
                [0, 0, 0]], dtype=torch.int32)
        >>> bad = {"mask": torch.zeros(3, 3, dtype=torch.bool)}  # sees the future
        >>> try:
        ...     module.load_state_dict(bad)
        ... except RuntimeError as error:
        ...     print("not the causal pattern" in str(error))
        True
    """
    module.register_buffer("mask", causal_mask(min(context_length, MASK_BUFFER_SIDE)))
    module.register_load_state_dict_pre_hook(validate_loaded_mask)
    module.register_forward_pre_hook(grow_mask, with_kwargs=True)


def grow_mask(module, args, kwargs) -> None:
    """A forward pre-hook: make ``module.mask`` as long as the input ``x``, up to ``module.context_length``.

    Only sizes are read, never a tensor's values, so the hook never waits for a GPU.
    """
    x = args[0] if args else kwargs.get("x")
    if isinstance(x, torch.Tensor) and x.dim() == 3:
        # a longer input is refused by forward's check; a bare holder of the buffer keeps its side
        needed = min(x.shape[1], getattr(module, "context_length", module.mask.shape[0]))
        if needed > module.mask.shape[0]:
            module.mask = causal_mask(needed, device=module.mask.device)


def with_padding(causal: torch.Tensor, attention_mask: torch.Tensor | None, batch: int,
                 num_positions: int | None = None) -> torch.Tensor:
    """The causal mask ``(T, S)`` combined with a padding mask ``(B, S)``: ``True`` where forbidden.

    Without ``attention_mask`` the causal mask comes back as it is. With one, a key position that is
    padding is forbidden to every query as well, giving a ``(B, 1, T, S)`` mask that broadcasts over
    the heads. A query that is itself padding, at the start of a left-padded sequence, then sees no
    key at all: its row is masked throughout. Every module of the course gives such a row attention
    weights of 0 and a context vector of 0 (``safe_softmax``), as PyTorch's
    ``scaled_dot_product_attention`` does, rather than the ``0/0 = NaN`` of a plain softmax.

    ``num_positions`` is how many positions ``attention_mask`` covers, by default the causal mask's
    ``S``. A sliding window's causal mask holds only the last positions (``causal_mask``'s
    ``window``): pass every position seen, and the padding mask's last ``S`` columns are used.

    Example:
        >>> padding = torch.tensor([[0, 1, 1]])  # one sequence, left-padded by one token
        >>> with_padding(causal_mask(3), padding, batch=1)[0, 0].int()
        tensor([[1, 1, 1],
                [1, 0, 1],
                [1, 0, 0]], dtype=torch.int32)
    """
    if attention_mask is None:
        return causal
    S = causal.shape[-1]  # the keys of the mask: the last S positions
    real = validate_attention_mask(attention_mask, batch, num_positions or S,
                                   causal.device)  # (B, positions), True: real
    return causal | ~real[:, None, None, -S:]  # (B, 1, T, S)


def call_mask(x: torch.Tensor, start: int = 0, window: int | None = None,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """The mask one call of a layer with a cache needs, or ``None`` where the fused kernel needs none.

    ``x`` holds the new tokens, positions ``start`` to ``start + T - 1``. The mask is ``True`` where a
    query may not look: a later key, a key out of the ``window``, or padding (``attention_mask``,
    :func:`with_padding`). It is ``(T, S)``, or ``(B, 1, T, S)`` with padding, its rows the new tokens
    and its columns every position held (:func:`causal_mask` with ``start``). Two calls need none,
    and get ``None``: a prompt without a cache, whose triangle ``scaled_dot_product_attention``
    applies itself with ``is_causal``, and one new token, which sees every position held.

    Example:
        >>> x = torch.zeros(1, 2, 4)  # two new tokens
        >>> call_mask(x) is None, call_mask(x[:, :1], start=3) is None  # a prompt, one new token
        (True, True)
        >>> call_mask(x, start=2).int()  # two new tokens after two cached ones
        tensor([[0, 0, 0, 1],
                [0, 0, 0, 0]], dtype=torch.int32)
    """
    num_tokens = x.shape[1]
    if attention_mask is None and window is None and (not start or num_tokens <= 1):
        return None
    return with_padding(causal_mask(num_tokens, x.device, start=start, window=window),
                        attention_mask, len(x), start + num_tokens)


def safe_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` over the keys ``mask`` leaves visible (``mask`` ``True``: hidden).

    A row with no visible key gets weights 0, not the ``0/0 = NaN`` of ``softmax`` over a row of
    ``-inf``: the rule of PyTorch's ``scaled_dot_product_attention`` and of FlashAttention. Its
    gradient is 0 there too, and no NaN is computed on the way, forward or backward.

    Example:
        >>> scores = torch.zeros(2, 2)
        >>> safe_softmax(scores, torch.tensor([[False, True], [True, True]]))
        tensor([[1., 0.],
                [0., 0.]])
    """
    no_key = mask.all(dim=-1, keepdim=True)  # rows that see nothing: left unmasked, then zeroed
    weights = torch.softmax(scores.masked_fill(mask & ~no_key, float("-inf")), dim=-1)
    return weights.masked_fill(no_key, 0.0)


def padded_softmax(scores: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the keys of ``scores`` ``(B, h, T, S)``, whose causal mask is already filled with
    ``-inf``, with the padded keys of ``attention_mask`` ``(B, S)`` (1 or ``True``: a real token) hidden
    too; a query left with no key to see gets weights of 0 (:func:`safe_softmax`).

    Without ``attention_mask`` this is ``torch.softmax(scores, dim=-1)``: the line a first reader of
    ``MultiHeadAttention`` needs, with the padding that chapter 9 teaches kept out of the listing.

    Example:
        >>> scores = torch.zeros(1, 1, 2, 2).masked_fill(causal_mask(2), float("-inf"))
        >>> padded_softmax(scores, torch.tensor([[0, 1]]))[0, 0]
        tensor([[0., 0.],
                [0., 1.]])
    """
    if attention_mask is None:
        return torch.softmax(scores, dim=-1)
    padded = (attention_mask == 0)[:, None, None, :]  # (B, 1, 1, S)
    return safe_softmax(scores, scores.isneginf() | padded)
