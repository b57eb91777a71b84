"""Answers that are, or call, the package's own answer to the exercise: what each exercise refuses.

Each exercise names its *shortcuts*: the package functions and classes that already do what the
exercise asks (``transfer_weights`` for the weight transfer, ``causal_mask`` for the mask, the
``MultiHeadAttention`` class for the capstone...), and the torch calls that would skip the steps
it is about (``scaled_dot_product_attention`` in a forward pass written by hand, by any of its
entry points). The building blocks an exercise is meant to use (``CausalAttention`` inside a
wrapper of heads, ``nn.Linear``...) are simply not on its list. The functions of the checks
themselves (the references and catalogue variants of ``mha_course.exercises``) count as shortcuts
for every exercise. The guard that notes them, and what it promises, is
:mod:`~mha_course.exercises.guard`.
"""

from __future__ import annotations

import sys
import types

from .guard import SUBCLASS, CallWatch, Shortcut, answer_is, fingerprint, place
from .records import Failed, plain
from .registry import exercises

# Record keys.
CALLS_KEY = "__shortcuts_called__"  # labels of the watched functions the answer called, in order
IS_KEY = "__answer_is__"  # label of the shortcut the answer itself is (or subclasses), if any


def package(*targets, why: str = "") -> tuple[Shortcut, ...]:
    """One shortcut per package function or class: "mha_course's own <name>"."""
    return tuple(Shortcut(f"mha_course's own {getattr(t, '__qualname__', getattr(t, '__name__', repr(t)))}",
                          (t,), why) for t in targets)


def check_modules() -> list[str]:
    """The modules of the checks, those where the exercises' probes are written, in the book's order."""
    return list(dict.fromkeys(exercise.probe.__module__ for exercise in exercises().values()))


def check_internals() -> tuple[Shortcut, ...]:
    """The checks' own references and variants: every module-level function of :func:`check_modules`."""
    shortcuts = []
    for name in check_modules():
        module = sys.modules.get(name)
        for attribute, value in sorted(vars(module).items()) if module else ():
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                shortcuts.append(Shortcut(f"the checks' own {name.rsplit('.', 1)[1]}.{attribute}", (value,),
                                          "The checks' references are not an answer: write it yourself."))
    return tuple(shortcuts)


def own_code_check(shortcuts: tuple[Shortcut, ...]):
    """The check every exercise starts with: the answer is not, and does not call, a shortcut."""
    by_label = {s.label: s for s in shortcuts}

    def run(record: dict) -> None:
        is_label = plain(record.get(IS_KEY))
        if isinstance(is_label, str) and is_label.removeprefix(SUBCLASS) in by_label:
            label = is_label.removeprefix(SUBCLASS)
            if label != is_label and by_label[label].forbidden:
                raise Failed("code of your own", is_label, f"This subclasses {label}: write the class yourself.")
            if by_label[label].forbidden:
                raise Failed("code of your own", is_label, by_label[label].hint(is_answer=True))
        for label in plain(record.get(CALLS_KEY)) or []:
            shortcut = by_label.get(label)
            if shortcut is not None and shortcut.forbidden:
                raise Failed("code of your own", f"a call to {label}", shortcut.hint())
    return run


def called(record: dict, label: str) -> bool:
    """True if the answer called the watched function ``label`` while it was probed."""
    return label in (plain(record.get(CALLS_KEY)) or [])


# ----------------------------------------------------------------------------------------------
# Groups of shortcuts that several exercises share


def attention_modules(*, keep: tuple = ()) -> tuple[Shortcut, ...]:
    """The package's attention modules (all but those in ``keep``, the exercise's building blocks)."""
    from ..attention.causal_attention import CausalAttention
    from ..attention.fast import FastMultiHeadAttention
    from ..attention.grouped_query import GroupedQueryAttention
    from ..attention.multihead import MultiHeadAttention
    from ..attention.wrapper import MultiHeadAttentionWrapper
    from ..convert.pytorch import from_torch_multihead, sdpa_forward, to_torch_multihead, torch_multihead_forward

    modules = (CausalAttention, MultiHeadAttentionWrapper, MultiHeadAttention, FastMultiHeadAttention,
               GroupedQueryAttention, sdpa_forward, to_torch_multihead, torch_multihead_forward, from_torch_multihead)
    return package(*(m for m in modules if m not in keep))


#: The ``torch.ops.aten`` operators behind torch's attention, by the fragment their functions' names hold.
_ATEN_OPERATORS = {
    "scaled_dot_product": ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                           "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                           "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable",
                           "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_math_for_mps"),
    "multi_head_attention": ("_native_multi_head_attention",),
}


def _torch_entry_points(fragment: str) -> tuple:
    """The functions of ``torch`` and ``torch.nn.functional`` and the ``torch.ops.aten`` operators
    whose name holds ``fragment`` (forward only): every way to reach one of its kernels."""
    import torch

    found = [getattr(space, name) for space in (torch.nn.functional, torch) for name in sorted(dir(space))
             if fragment in name and "backward" not in name]
    for name in _ATEN_OPERATORS[fragment]:
        try:
            found.append(getattr(torch.ops.aten, name))
        except (AttributeError, RuntimeError):  # an operator this build of torch lacks
            continue
    return tuple(dict.fromkeys(found))


def sdpa_entry_points() -> tuple:
    """``torch.nn.functional.scaled_dot_product_attention`` and every other way to call its kernels
    (``torch.ops.aten.scaled_dot_product_attention``, ``torch._scaled_dot_product_attention_math``...)."""
    return _torch_entry_points("scaled_dot_product")


def torch_attention(why: str) -> tuple[Shortcut, ...]:
    """torch's own attention: the fused call (by any entry point) and ``nn.MultiheadAttention``."""
    from torch import nn

    return (Shortcut("torch's scaled_dot_product_attention", sdpa_entry_points(), why),
            Shortcut("torch's nn.MultiheadAttention",
                     (nn.MultiheadAttention, *_torch_entry_points("multi_head_attention")), why))


__all__ = ["CALLS_KEY", "IS_KEY", "CallWatch", "Shortcut", "answer_is", "attention_modules", "called",
           "check_internals", "check_modules", "fingerprint", "own_code_check", "package", "place",
           "sdpa_entry_points", "torch_attention"]
