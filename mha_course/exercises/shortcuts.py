"""Answers that are, or call, the package's own answer to the exercise.

Each exercise names its *shortcuts*: the package functions and classes that already do what the
exercise asks (``transfer_weights`` for the weight transfer, ``causal_mask`` for the mask, the
``MultiHeadAttention`` class for the capstone...), and the torch calls that would skip the steps
it is about (``scaled_dot_product_attention`` in a forward pass written by hand). While the probe
runs the learner's code, a profile hook (:func:`sys.setprofile`) notes every call whose *code
object* is one of theirs. Matching code objects rather than names catches an answer however it
reaches the reference: imported under another name, through a subclass, ``functools.partial``,
a module attribute, or a package function that calls it in turn. Code objects compare by their
contents, not their file, so a byte-identical copy of the package (the grader's private copy, a
module reloaded) matches as it is; a function is also known by its *place* (:func:`place`: its file
below a folder named ``mha_course`` and its qualified name), so that a copy whose code differs
(another version of the package, an edited copy imported under another name) counts too. The
building blocks an exercise is meant to use (``CausalAttention`` inside a wrapper of heads,
``nn.Linear``...) are simply not on its list.

The functions of the checks themselves (the references and catalogue variants of
``mha_course.exercises``) count as shortcuts for every exercise.

What this cannot see: code copied out of the package's source and pasted into the notebook (new
code objects), work done in another thread or process, and torch functions that are not on an
exercise's list.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Iterable

from .records import Failed, plain

# Record keys.
CALLS_KEY = "__shortcuts_called__"  # labels of the watched functions the answer called, in order
IS_KEY = "__answer_is__"  # label of the shortcut the answer itself is (or subclasses), if any

#: The package's folder, in every copy of it (the grader's private copy, a copy imported under another name).
PACKAGE_FOLDER = "mha_course"


def place(code: types.CodeType) -> tuple[str, str] | None:
    """Where ``code`` sits in a copy of the package: its file below the (last) folder named
    ``mha_course``, and its qualified name; ``None`` for code outside any such folder.

    Example:
        >>> from mha_course import cost
        >>> place(cost.kv_cache_bytes.__code__)
        ('cost.py', 'kv_cache_bytes')
    """
    parts = PurePath(code.co_filename).parts
    folders = parts[:-1]
    if PACKAGE_FOLDER not in folders:
        return None
    last = len(folders) - 1 - folders[::-1].index(PACKAGE_FOLDER)
    return "/".join(parts[last + 1:]), code.co_qualname


@dataclass(frozen=True)
class Shortcut:
    """A function or class whose use the probe notes.

    Attributes:
        label: how messages name it, e.g. ``"mha_course's own transfer_weights"``.
        targets: the functions, classes or builtins it stands for.
        why: the hint when an answer uses it; empty gives "This calls <label>: write it yourself."
        forbidden: ``False`` for a call the exercise *wants* noted (e.g. the fused attention in an
            exercise that asks for it): the probe records it, nothing fails because of it.
    """

    label: str
    targets: tuple = ()
    why: str = ""
    forbidden: bool = True
    codes: frozenset = field(default=frozenset(), compare=False, repr=False)
    builtins: frozenset = field(default=frozenset(), compare=False, repr=False)
    places: frozenset = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self):
        codes, builtins = set(), set()
        for target in self.targets:
            found = list(_code_objects(target))
            codes.update(found)
            if not found:
                builtins.add(target)
        object.__setattr__(self, "codes", frozenset(codes))
        object.__setattr__(self, "builtins", frozenset(builtins))
        object.__setattr__(self, "places", frozenset(p for p in map(place, codes) if p is not None))

    def hint(self, is_answer: bool = False) -> str:
        if self.why:
            return self.why
        return f"This {'is' if is_answer else 'calls'} {self.label}: write it yourself."


def _code_objects(target: Any) -> Iterable[types.CodeType]:
    """The code objects behind a function, method or class (every method of the class)."""
    if isinstance(target, (classmethod, staticmethod)):
        target = target.__func__
    if isinstance(target, types.MethodType):
        target = target.__func__
    if isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, types.FunctionType):
        # A decorated function (torch.no_grad, functools.wraps) runs the decorator's code first, the
        # same code object for every function it decorates: watch the function underneath.
        yield inspect.unwrap(target).__code__
    elif isinstance(target, property):
        for accessor in (target.fget, target.fset, target.fdel):
            if accessor is not None:
                yield accessor.__code__
    elif isinstance(target, type):
        for member in vars(target).values():
            if isinstance(member, (types.FunctionType, classmethod, staticmethod, property)):
                yield from _code_objects(member)


def package(*targets, why: str = "") -> tuple[Shortcut, ...]:
    """One shortcut per package function or class: "mha_course's own <name>"."""
    return tuple(Shortcut(f"mha_course's own {getattr(t, '__qualname__', getattr(t, '__name__', repr(t)))}",
                          (t,), why) for t in targets)


def check_modules() -> list[str]:
    """The modules of the checks, those where the exercises' probes are written, in the book's order."""
    from . import EXERCISES  # here, not at the top: the check modules import this one

    return list(dict.fromkeys(exercise.probe.__module__ for exercise in EXERCISES.values()))


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


class CallWatch:
    """Notes the calls of watched functions made while it is active (``with watch: ...``): by code
    object, or by :func:`place` for a function of another copy of the package.

    Example:
        >>> from mha_course import cost
        >>> with CallWatch(package(cost.kv_cache_bytes_per_token)) as watch:
        ...     _ = cost.kv_cache_bytes(2, 2, 4, num_tokens=3)
        >>> watch.seen
        ["mha_course's own kv_cache_bytes_per_token"]
    """

    def __init__(self, shortcuts: Iterable[Shortcut]):
        self._codes: dict[types.CodeType, str] = {}
        self._builtins: dict[Any, str] = {}
        self._places: dict[tuple[str, str], str] = {}
        for shortcut in shortcuts:
            self._codes.update(dict.fromkeys(shortcut.codes, shortcut.label))
            self._builtins.update(dict.fromkeys(shortcut.builtins, shortcut.label))
            self._places.update(dict.fromkeys(shortcut.places, shortcut.label))
        self._names = {name for _, name in self._places}  # a quick test before the place is worked out
        self.seen: list[str] = []
        self._previous = None

    def _hook(self, frame, event, arg):
        if self._previous is not None:
            self._previous(frame, event, arg)
        label = None
        if event == "call":
            code = frame.f_code
            label = self._codes.get(code)
            if label is None and code.co_qualname in self._names:
                label = self._places.get(place(code))
        elif event == "c_call":
            try:
                label = self._builtins.get(arg)
            except TypeError:  # an unhashable callable: never one of ours
                label = None
        if label is not None and label not in self.seen:
            self.seen.append(label)

    def __enter__(self) -> "CallWatch":
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)
        self._previous = None


SUBCLASS = "a subclass of "


def answer_is(answer: Any, shortcuts: Iterable[Shortcut]) -> str | None:
    """The label of the shortcut the answer itself is (or ``"a subclass of <label>"``); ``None`` if none.

    A function is matched by its code or its :func:`place`; a class by the classes it derives from
    (the class of another copy of the package is caught by the calls of its methods).
    """
    codes = set(_code_objects(answer)) if not isinstance(answer, type) else set()
    places = {p for p in map(place, codes) if p is not None}
    for shortcut in shortcuts:
        if codes & shortcut.codes or places & shortcut.places:
            return shortcut.label
        if isinstance(answer, type):
            for target in shortcut.targets:
                if isinstance(target, type) and issubclass(answer, target):
                    return shortcut.label if answer is target else SUBCLASS + shortcut.label
    return None


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
    from ..causal_attention import CausalAttention
    from ..fast import FastMultiHeadAttention
    from ..grouped_query import GroupedQueryAttention
    from ..multihead import MultiHeadAttention
    from ..wrapper import MultiHeadAttentionWrapper
    from ..interop import from_torch_multihead, sdpa_forward, to_torch_multihead, torch_multihead_forward

    modules = (CausalAttention, MultiHeadAttentionWrapper, MultiHeadAttention, FastMultiHeadAttention,
               GroupedQueryAttention, sdpa_forward, to_torch_multihead, torch_multihead_forward, from_torch_multihead)
    return package(*(m for m in modules if m not in keep))


def torch_attention(why: str) -> tuple[Shortcut, ...]:
    """torch's own attention: the fused call and ``nn.MultiheadAttention``."""
    import torch.nn.functional as F
    from torch import nn

    return (Shortcut("torch's scaled_dot_product_attention", (F.scaled_dot_product_attention,), why),
            Shortcut("torch's nn.MultiheadAttention", (nn.MultiheadAttention, F.multi_head_attention_forward), why))
