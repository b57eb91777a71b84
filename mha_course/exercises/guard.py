"""The guard of the checks: an answer that is, or calls, the package's own answer does not pass.

Each exercise names its *shortcuts* (see :mod:`~mha_course.exercises.shortcuts`): the package's
functions and classes that already do what it asks, and the torch calls that would skip the steps
it is about. The checks' own references count as shortcuts for every exercise.

What ``check()`` promises. It is feedback for an honest learner. It refuses the package's answer
however such a learner reaches it: called directly, under another name, through an attribute or a
wrapper (``functools.partial``, a lambda, a decorator), or from a thread the answer starts. So it
does in another copy of the package, in a renamed copy of its code (``code.replace``,
``types.FunctionType``) and in its source text run with ``exec``. Where an exercise forbids
torch's ``scaled_dot_product_attention``, every entry point of it is refused
(``torch.nn.functional``, ``torch.ops.aten`` and its overloads, the fused kernels' functions).

What it does not promise. ``check()`` is not a proctor. Whoever sets out to fool their own check
from inside their own process can: switch the watch off (``sys.setprofile``), reach into it
(closures, frame walks, ``ctypes``), call the package from a thread started before the check or
from another process, or run the package's code copied and edited by a program. Copying a
solution's text out of the book cannot be told from writing it either. For marks that count, the
grader runs each notebook's kernel and answer process in sandboxes of their own (the threat model is
:mod:`mha_course.grading`'s): the learner's process never judges itself there.

How. While the learner's code runs, a profile function (:func:`sys.setprofile`, and
:func:`threading.setprofile` for the threads started meanwhile) looks at every call: Python code by
its code object, by its :func:`place` in a copy of the package, or by its :func:`fingerprint`;
a builtin (torch's fused attention) by identity. The previous profile functions are put back when
the check ends, and a thread that outlives the check drops the watch at its next call. The
package's code is never changed, and nothing private of Python or torch is read.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Iterable

#: The package's folder, in every copy of it (the grader's private copy, a copy imported under another name).
PACKAGE_FOLDER = "mha_course"
#: A copy is recognised for code with a docstring of at least this many characters, or this many bytes
#: of instructions: shorter code an honest learner may write alike.
DOCSTRING_LENGTH, LONG_CODE = 20, 200


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


@functools.lru_cache(maxsize=4096)
def fingerprint(code: types.CodeType) -> tuple:
    """What a code object *is*, without its name, file or lines: its arguments, local names, the
    names it reads and its constants (nested code by its fingerprint). A copy (``code.replace``,
    ``exec`` of the same source text) has the fingerprint of the original. The instructions are
    left out: the same text compiled in another context may be laid out otherwise.

    Example:
        >>> from mha_course import cost
        >>> copy = cost.kv_cache_bytes.__code__.replace(co_name="mine", co_filename="mine.py")
        >>> fingerprint(copy) == fingerprint(cost.kv_cache_bytes.__code__)
        True
    """
    constants = tuple(fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    return (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_varnames,
            code.co_names, constants)


def recognisable(code: types.CodeType) -> bool:
    """Whether a copy of ``code`` is told from code a learner wrote alike (see :data:`DOCSTRING_LENGTH`)."""
    first = code.co_consts[0] if code.co_consts else None
    return (isinstance(first, str) and len(first) >= DOCSTRING_LENGTH) or len(code.co_code) >= LONG_CODE


def _nested(code: types.CodeType) -> Iterable[types.CodeType]:
    """``code`` and the code objects inside it (functions defined in it, comprehensions...)."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _nested(constant)


def _code_objects(target: Any) -> Iterable[types.CodeType]:
    """The code objects behind a function, method or class (every method of the class); a decorated
    function by the function underneath (the decorator's code is shared by every function it wraps)."""
    target = getattr(target, "__func__", target)  # classmethod, staticmethod, bound method
    if isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, types.FunctionType):
        yield inspect.unwrap(target).__code__
    elif isinstance(target, property):
        yield from (accessor.__code__ for accessor in (target.fget, target.fset, target.fdel) if accessor)
    elif isinstance(target, type):
        for member in vars(target).values():
            if isinstance(member, (types.FunctionType, classmethod, staticmethod, property)):
                yield from _code_objects(member)


def names_in(target: Any) -> set[str]:
    """The names the code of ``target`` refers to (the functions and methods it calls among them), with
    the code defined inside it: what it was written with, read without running it."""
    return {name for code in _code_objects(target) for nested in _nested(code) for name in nested.co_names}


def _builtins_of(target: Any) -> list:
    """What the profile function is shown when a builtin target is called: itself, or for a
    ``torch.ops.aten`` operator the builtin behind it and behind each of its overloads."""
    if hasattr(target, "overloads"):
        return [target.op, *(getattr(target, name).op for name in target.overloads())]
    return [getattr(target, "op", target)]


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
    fingerprints: frozenset = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self):
        codes = {code for target in self.targets for code in _code_objects(target)}
        builtins = [b for t in self.targets if not any(_code_objects(t)) for b in _builtins_of(t)]
        copies = [nested for code in codes for nested in _nested(code) if recognisable(nested)]
        object.__setattr__(self, "codes", frozenset(codes))
        object.__setattr__(self, "builtins", frozenset(builtins))
        object.__setattr__(self, "places", frozenset(p for p in map(place, codes) if p is not None))
        object.__setattr__(self, "fingerprints", frozenset(map(fingerprint, copies)))

    def hint(self, is_answer: bool = False) -> str:
        return self.why or f"This {'is' if is_answer else 'calls'} {self.label}: write it yourself."


class CallWatch:
    """Notes the shortcuts called while it is active (``with watch: ...``), in this thread and in
    the threads started meanwhile; ``seen`` lists their labels in order.

    Example:
        >>> from mha_course import cost
        >>> own = Shortcut("mha_course's own kv_cache_bytes_per_token", (cost.kv_cache_bytes_per_token,))
        >>> with CallWatch([own]) as watch:
        ...     _ = cost.kv_cache_bytes(2, 2, 4, num_tokens=3)
        >>> watch.seen
        ["mha_course's own kv_cache_bytes_per_token"]
    """

    def __init__(self, shortcuts: Iterable[Shortcut]):
        self._codes, self._builtins, self._places, self._fingerprints = {}, {}, {}, {}
        for shortcut in shortcuts:
            for table, keys in ((self._codes, shortcut.codes), (self._builtins, shortcut.builtins),
                                (self._places, shortcut.places), (self._fingerprints, shortcut.fingerprints)):
                table.update(dict.fromkeys(keys, shortcut.label))
        self._names = {name for _, name in self._places}  # a quick test before a place is worked out
        self._known: dict[int, tuple] = {}  # id(code) -> (code, label): the code is kept, so its id is not reused
        self.seen: list[str] = []
        self._depth, self._previous = 0, (None, None)

    def _label(self, code: types.CodeType) -> str | None:
        known = self._known.get(id(code))
        if known is not None and known[0] is code:
            return known[1]
        label = self._codes.get(code)
        if label is None and code.co_qualname in self._names:
            label = self._places.get(place(code))
        if label is None and recognisable(code):
            label = self._fingerprints.get(fingerprint(code))
        self._known[id(code)] = (code, label)
        return label

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        """The profile function: note the call of a shortcut."""
        if not self._depth:  # a thread that outlived the check: leave it alone from now on
            sys.setprofile(None)
            return
        if isinstance(self._previous[0], CallWatch):  # a check run inside a checked answer: the outer one sees it too
            self._previous[0](frame, event, arg)
        label = None
        if event == "call":
            label = self._label(frame.f_code)
        elif event == "c_call" and self._builtins:
            try:
                label = self._builtins.get(arg)
            except TypeError:  # an unhashable callable: never one of ours
                pass
        if label is not None and label not in self.seen:
            self.seen.append(label)

    def __enter__(self) -> "CallWatch":
        self._depth += 1
        if self._depth == 1:
            self._previous = (sys.getprofile(), threading.getprofile())
            sys.setprofile(self)
            threading.setprofile(self)
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if not self._depth:
            sys.setprofile(self._previous[0])
            threading.setprofile(self._previous[1])


SUBCLASS = "a subclass of "


def answer_is(answer: Any, shortcuts: Iterable[Shortcut]) -> str | None:
    """The label of the shortcut the answer itself is (or ``"a subclass of <label>"``); ``None`` if none.

    A function is matched by its code, a copy of it (:func:`fingerprint`) or its :func:`place`; a class by
    the classes it derives from (the class of another copy of the package is caught by its methods' calls).
    """
    codes = set(_code_objects(answer)) if not isinstance(answer, type) else set()
    places = {p for p in map(place, codes) if p is not None}
    fingerprints = {fingerprint(code) for code in codes if recognisable(code)}
    for shortcut in shortcuts:
        if codes & shortcut.codes or places & shortcut.places or fingerprints & shortcut.fingerprints:
            return shortcut.label
        if isinstance(answer, type):
            for target in shortcut.targets:
                if isinstance(target, type) and issubclass(answer, target):
                    return shortcut.label if answer is target else SUBCLASS + shortcut.label
    return None
