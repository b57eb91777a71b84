"""Argument and input checks shared by every attention module.

Each check raises an error that names the argument, the value it got and what to do instead, so a
learner sees the cause of a mistake in one line rather than a traceback from inside torch.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch


def validate_positive_int(name: str, value, hint: str = "") -> int:
    """Return ``value`` if it is a positive integer, else raise a ``ValueError``/``TypeError``."""
    if type(value) is int and value > 0:  # the common case, checked without the slower ABC test
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__}). "
            f"Pass a whole number such as {name}=4.{(' ' + hint) if hint else ''}"
        )
    if value <= 0:
        raise ValueError(
            f"{name} must be a positive integer, got {value}. "
            f"Pass a whole number of at least 1.{(' ' + hint) if hint else ''}"
        )
    return int(value)


def validate_non_negative_int(name: str, value) -> int:
    """Return ``value`` if it is an integer of at least 0, else raise a ``ValueError``/``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be a non-negative integer, got {value!r} ({type(value).__name__}). "
            f"Pass a whole number such as {name}=4."
        )
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}. Pass 0 or more.")
    return int(value)


def validate_dropout(value) -> float:
    """Return ``value`` as a float if it is a probability in [0, 1), else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"dropout must be a number in [0, 1), got {value!r} ({type(value).__name__}). "
            "It is the probability of zeroing an attention weight during training; use 0.0 for none."
        )
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(
            f"dropout must be in [0, 1), got {value}. It is the probability of zeroing an attention "
            "weight during training: 0.0 turns it off, 0.1 is a common choice, and 1.0 would drop "
            "every weight."
        )
    return float(value)


def validate_bool(name: str, value) -> bool:
    """Return ``value`` if it is ``True`` or ``False``, else raise a ``TypeError``.

    Switches such as ``qkv_bias`` are strict: ``qkv_bias="no"`` is a non-empty string, hence truthy,
    and would silently create the bias it meant to turn off.
    """
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be True or False, got {value!r} ({type(value).__name__}). "
            f"Pass {name}=True or {name}=False."
        )
    return value


def validate_window(window) -> int | None:
    """``None`` (every earlier key), or ``window`` as a positive ``int``: how many positions a query sees.

    Example:
        >>> validate_window(0)
        Traceback (most recent call last):
            ...
        ValueError: window must be a positive integer, got 0. Pass a whole number of at least 1. It is how many positions a query sees, itself included (e.g. window=4096, Mistral's), or None for every earlier key.
    """
    if window is None:
        return None
    return validate_positive_int("window", window, hint="It is how many positions a query sees, itself included "
                                 "(e.g. window=4096, Mistral's), or None for every earlier key.")


def validate_divisible(d_out: int, num_heads: int) -> int:
    """Return ``head_dim = d_out // num_heads`` or explain why ``d_out`` cannot be split evenly."""
    if d_out % num_heads != 0:
        lower = (d_out // num_heads) * num_heads
        upper = lower + num_heads
        suggestion = f"d_out={upper}" if lower == 0 else f"d_out={lower} or d_out={upper}"
        raise ValueError(
            f"d_out ({d_out}) must be divisible by num_heads ({num_heads}): every head gets "
            f"head_dim = d_out // num_heads columns. Choose a multiple of num_heads, e.g. {suggestion}, "
            f"or a num_heads that divides {d_out}."
        )
    return d_out // num_heads


def validate_kv_groups(num_kv_groups, num_heads: int, name: str = "num_kv_groups") -> int:
    """Return ``num_kv_groups`` if it is a positive integer that divides ``num_heads``, else raise.

    Each key/value head serves ``num_heads // num_kv_groups`` query heads, so the groups must split the
    query heads evenly. ``name`` is the argument the value came from, for the message.

    Example:
        >>> validate_kv_groups(2, 8)
        2
        >>> validate_kv_groups(3, 8)
        Traceback (most recent call last):
            ...
        ValueError: num_kv_groups (3) must divide num_heads (8): each key/value head serves num_heads // num_kv_groups query heads. Choose num_kv_groups among 1, 2, 4, 8 (the divisors of 8): 8 is multi-head attention, 1 is multi-query attention.
    """
    num_heads = validate_positive_int("num_heads", num_heads)
    num_kv_groups = validate_positive_int(name, num_kv_groups)
    if num_heads % num_kv_groups != 0:
        divisors = ", ".join(str(n) for n in range(1, num_heads + 1) if num_heads % n == 0)
        raise ValueError(
            f"{name} ({num_kv_groups}) must divide num_heads ({num_heads}): each key/value head "
            f"serves num_heads // {name} query heads. Choose {name} among {divisors} (the divisors "
            f"of {num_heads}): {num_heads} is multi-head attention, 1 is multi-query attention."
        )
    return num_kv_groups


def validate_input(x, d_in: int, context_length: int | None, like: torch.Tensor | None = None,
                   attention_mask: torch.Tensor | None = None) -> None:
    """Check that ``x`` is a (batch, num_tokens, d_in) float tensor that fits the causal mask.

    ``context_length=None`` skips the length check. ``like``, a weight of the module, adds a check
    that ``x`` has its dtype (unless autocast is on, which casts both itself) and its device. A
    padding mask ``attention_mask`` is checked against ``x``'s batch and length
    (:func:`validate_attention_mask`). Only types, shapes and devices are read, never a value.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"x must be a torch.Tensor of shape (batch, num_tokens, d_in), got {type(x).__name__}. "
            "Convert it first, e.g. x = torch.tensor(data, dtype=torch.float32)."
        )
    if x.dim() != 3:
        fix = (
            " For a single sequence add a batch dimension: x.unsqueeze(0)."
            if x.dim() == 2
            else ""
        )
        raise ValueError(
            f"x must be a 3-D tensor of shape (batch, num_tokens, d_in), got shape "
            f"{tuple(x.shape)} ({x.dim()}-D).{fix}"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"x must be a floating-point tensor, got dtype {x.dtype}. Attention works on embedded "
            "vectors, not token ids: embed the ids first, or convert with x.float()."
        )
    if x.shape[-1] != d_in:
        raise ValueError(
            f"x has {x.shape[-1]} features per token (x.shape[-1]) but the module was built with "
            f"d_in={d_in}. Build the module with d_in={x.shape[-1]}, or pass inputs whose last "
            f"dimension is {d_in}."
        )
    if like is not None:
        validate_same_dtype_and_device(x, like)
    if context_length is not None and x.shape[1] > context_length:
        raise ValueError(
            f"x has {x.shape[1]} tokens (x.shape[1]) but the module was built with "
            f"context_length={context_length}, the longest sequence it accepts. Build it with "
            f"context_length>={x.shape[1]}, or shorten the input."
        )
    if attention_mask is not None:  # a padding mask (chapter 9): one entry per position of x
        validate_attention_mask(attention_mask, x.shape[0], x.shape[1], x.device)


def validate_same_dtype_and_device(x: torch.Tensor, like: torch.Tensor) -> None:
    """Check that input ``x`` has the dtype and device of the module weight ``like``."""
    if x.device != like.device:
        raise ValueError(
            f"x is on {x.device} but the module's weights are on {like.device}. Move the input with "
            f"x.to({str(like.device)!r}), or the module with module.to({str(x.device)!r})."
        )
    if x.dtype != like.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"x has dtype {x.dtype} but the module's weights are {like.dtype}. Convert the input "
            f"with x.to({like.dtype}), or the module with module.to({x.dtype})."
        )


class AttentionSizes(NamedTuple):
    """The checked constructor arguments of an attention module (see :func:`validate_attention_args`)."""

    d_in: int
    d_out: int
    context_length: int
    dropout: float
    qkv_bias: bool
    num_heads: int
    head_dim: int
    num_kv_groups: int


def validate_attention_args(d_in, d_out, context_length, dropout, qkv_bias, num_heads=1, num_kv_groups=None,
                            d_out_hint: str = "", d_out_per_head: bool = False) -> AttentionSizes:
    """Check every constructor argument of an attention module at once; return them checked.

    ``head_dim`` is ``d_out // num_heads`` (``d_out`` must split evenly; with ``d_out_per_head``, as
    in the wrapper, ``d_out`` is one head's width and ``head_dim == d_out``), and ``num_kv_groups``
    defaults to ``num_heads`` (one key/value head per query head) and must divide it. ``d_out_hint``
    says what ``d_out`` means in the calling class, for the message (by default, with several heads,
    that it is their width together). Each error names the argument, the value and the fix.

    Example:
        >>> validate_attention_args(3, 4, 6, 0.0, False, num_heads=2)
        AttentionSizes(d_in=3, d_out=4, context_length=6, dropout=0.0, qkv_bias=False, num_heads=2, head_dim=2, num_kv_groups=2)
        >>> validate_attention_args(3, 5, 6, 0.0, False, num_heads=2)
        Traceback (most recent call last):
            ...
        ValueError: d_out (5) must be divisible by num_heads (2): every head gets head_dim = d_out // num_heads columns. Choose a multiple of num_heads, e.g. d_out=4 or d_out=6, or a num_heads that divides 5.
    """
    num_heads = validate_positive_int("num_heads", num_heads)
    if not d_out_hint and num_heads > 1 and not d_out_per_head:
        d_out_hint = "Here d_out is the width of all heads together: head_dim = d_out // num_heads."
    d_in = validate_positive_int("d_in", d_in)
    d_out = validate_positive_int("d_out", d_out, hint=d_out_hint)
    context_length = validate_positive_int("context_length", context_length)
    head_dim = d_out if d_out_per_head else validate_divisible(d_out, num_heads)
    num_kv_groups = num_heads if num_kv_groups is None else validate_kv_groups(num_kv_groups, num_heads)
    return AttentionSizes(d_in, d_out, context_length, validate_dropout(dropout), validate_bool("qkv_bias", qkv_bias),
                          num_heads, head_dim, num_kv_groups)


def validate_attention_mask(attention_mask, batch: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """Check a padding mask and return it as booleans, ``True`` for the real tokens.

    ``attention_mask`` must be ``(batch, num_keys)``, one entry per position a query may read (the
    cached ones and the new ones), boolean or integer (1 for a real token, 0 for padding, as
    transformers' ``generate`` passes it), on ``device``. Only its type, shape and device are
    checked, never its values: reading a value would make the processor wait for a GPU at every
    call. Any nonzero integer counts as a real token, as ``attention_mask.bool()`` reads it.

    Example:
        >>> validate_attention_mask(torch.tensor([[0, 1, 1]]), 1, 3, torch.device("cpu"))
        tensor([[False,  True,  True]])
    """
    shape = f"(batch, cached + new positions) = ({batch}, {num_keys})"
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor of shape {shape}, 1 (or True) for a real token "
                        f"and 0 (or False) for padding, got {type(attention_mask).__name__}.")
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(
            f"attention_mask must be boolean or integer (1 for a real token, 0 for padding), got "
            f"{attention_mask.dtype}. This is the padding mask of transformers' generate, not a mask added "
            "to the scores: pass attention_mask.bool() of the 1/0 mask, or (additive_mask == 0) of an "
            "additive one.")
    if tuple(attention_mask.shape) != (batch, num_keys):
        raise ValueError(f"attention_mask must have shape {shape}, one entry per position a query may read, "
                         f"got {tuple(attention_mask.shape)}. With a cache, it covers the cached positions too.")
    if attention_mask.device != device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but x is on {device}: move it with "
                         f"attention_mask.to({str(device)!r}).")
    return attention_mask.bool()
