"""The causal mask: which earlier positions each token may draw on."""

from __future__ import annotations

import torch

from ._validation import validate_attention_mask, validate_non_negative_int


def causal_mask(num_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (num_tokens, num_tokens) mask that is ``True`` where attention is forbidden.

    Row ``i`` is the query position and column ``j`` the key position; ``mask[i, j]`` is ``True``
    when ``j > i``, that is, when the key lies in the query's future. Every position sees itself
    and the positions before it. This is the convention of ``masked_fill`` (fill where ``True``)
    and of ``torch.nn.MultiheadAttention``'s boolean ``attn_mask``.

    Args:
        num_tokens: sequence length, a non-negative integer (0 gives an empty mask).
        device: where to create the mask (default: the CPU).

    Example:
        >>> causal_mask(3).int()
        tensor([[0, 1, 1],
                [0, 0, 1],
                [0, 0, 0]], dtype=torch.int32)
    """
    num_tokens = validate_non_negative_int("num_tokens", num_tokens)
    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)


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


def validate_loaded_mask(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                         error_msgs) -> None:
    """Refuse a state dict whose ``mask`` is not the causal pattern (a ``load_state_dict`` pre-hook).

    The mask is not learned, yet it is saved with the module, so a corrupted or hand-edited state
    dict could turn causality off without a word. Registered by every module that holds a ``mask``
    buffer, this hook accepts the causal pattern in any dtype (the boolean mask saved by the course's
    modules, and the float ``torch.triu(torch.ones(T, T), diagonal=1)`` of the best-known book
    chapter's) and reports anything else through ``load_state_dict``'s own error, leaving the
    module's mask as it was.
    """
    key = prefix + "mask"
    loaded = state_dict.get(key)
    if not isinstance(loaded, torch.Tensor) or loaded.is_meta:
        return
    size = module.mask.shape[0]
    if loaded.shape != module.mask.shape:
        if loaded.dim() == 2 and loaded.shape[0] == loaded.shape[1]:
            error_msgs.append(
                f"{key}: the state dict was saved from a module with context_length={loaded.shape[0]}, "
                f"this one has context_length={size}. Build it with context_length={loaded.shape[0]}."
            )
        return  # load_state_dict reports the size mismatch itself
    expected = causal_mask(size, device=loaded.device).to(loaded.dtype)
    if torch.equal(loaded, expected):
        return
    wrong = int((loaded != expected).sum())
    state_dict[key] = module.mask  # keep the module's own mask; the load fails below
    error_msgs.append(
        f"{key}: the loaded mask is not the causal pattern (True, or 1, exactly above the diagonal, "
        f"False or 0 elsewhere): {wrong} of its {loaded.numel()} entries differ, so tokens would see "
        f"the future or lose their past. The mask is never learned: replace it before loading with "
        f"state_dict[{key!r}] = mha_course.causal_mask({size}), or delete that entry and load with "
        "strict=False."
    )


def register_causal_mask(module: torch.nn.Module, context_length: int) -> None:
    """Give ``module`` a ``mask`` buffer, :func:`causal_mask` of ``context_length``, that stays causal.

    A buffer, not a parameter: it is never trained, but it moves with ``module.to(device)`` and is
    saved in the ``state_dict``. Loading a state dict whose mask is not the causal pattern fails
    (:func:`validate_loaded_mask`, registered here as a ``load_state_dict`` pre-hook).

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
    module.register_buffer("mask", causal_mask(context_length))
    module.register_load_state_dict_pre_hook(validate_loaded_mask)


def with_padding(causal: torch.Tensor, attention_mask: torch.Tensor | None, batch: int) -> torch.Tensor:
    """The causal mask ``(T, S)`` combined with a padding mask ``(B, S)``: ``True`` where forbidden.

    Without ``attention_mask`` the causal mask comes back as it is. With one, a key position that is
    padding is forbidden to every query as well, giving a ``(B, 1, T, S)`` mask that broadcasts over
    the heads. A query that is itself padding, at the start of a left-padded sequence, may then see
    no key at all: its scores would all be ``-inf`` and its softmax ``NaN``, which would spread to
    every later layer. Such a row is left unmasked instead (its output is padding, read by nobody),
    as transformers' ``_unmask_unattended`` does for PyTorch's fused kernel.

    Example:
        >>> padding = torch.tensor([[0, 1, 1]])  # one sequence, left-padded by one token
        >>> with_padding(causal_mask(3), padding, batch=1)[0, 0].int()
        tensor([[0, 0, 0],
                [1, 0, 1],
                [1, 0, 0]], dtype=torch.int32)
    """
    if attention_mask is None:
        return causal
    real = validate_attention_mask(attention_mask, batch, causal.shape[-1],
                                   causal.device)  # (B, S), True: real
    mask = causal | ~real[:, None, None, :]  # (B, 1, T, S)
    return mask & ~mask.all(dim=-1, keepdim=True)  # no row without a visible key
