"""Answers that are, or call, the package's own answer to the exercise.

Each exercise names its *shortcuts*: the package functions and classes that already do what the
exercise asks (``transfer_weights`` for the weight transfer, ``causal_mask`` for the mask, the
``MultiHeadAttention`` class for the capstone...), and the torch calls that would skip the steps
it is about (``scaled_dot_product_attention`` in a forward pass written by hand, by any of its
entry points: ``torch.nn.functional``, ``torch.ops.aten``, the fused kernels). The building blocks
an exercise is meant to use (``CausalAttention`` inside a wrapper of heads, ``nn.Linear``...) are
simply not on its list. The functions of the checks themselves (the references and catalogue
variants of ``mha_course.exercises``) count as shortcuts for every exercise.

While the probe runs the learner's code, a *guard* notes every shortcut that runs. The guard is an
audit hook (:func:`sys.addaudithook`), installed once when this module is imported: Python offers
no way to remove or replace one. It hears of a shortcut in three ways:

* the package's shortcuts and the checks' own functions *report themselves*: their code is
  compiled again from their source with one call first, ``sys.audit("mha_course.ran", ...)``,
  held as a constant of the code (:func:`reporting`). Whoever runs that code reports, in any
  thread, and so does a copy of it (``code.replace``, ``types.FunctionType``) under any name;
* every call while an answer is being checked goes to the guard too, through a profile function
  that is :func:`sys.audit` itself bound to an event name (so it holds no state an answer could
  change), in the checking thread and in the threads started with :mod:`threading` meanwhile:
  this is how torch's functions on an exercise's list are seen (the fused attention by any of its
  entry points: ``torch.nn.functional``, ``torch.ops.aten``, the fused kernels), and a function
  of another copy of the package (by its *place*, :func:`place`: its file below a folder named
  ``mha_course`` and its qualified name);
* code made while the answer runs (``exec``, ``compile``, ``types.FunctionType``,
  ``code.replace``) is compared with the shortcuts' code by :func:`fingerprint` (instructions,
  constants and names, whatever its name, file or line), for code that carries a docstring or is
  long: ``exec`` of the package's source text is the package's code.

While an answer is checked the guard also refuses, and notes as a tampered check, what would
switch the profile function off or reach into the check: ``sys.setprofile`` and ``sys.settrace``
(but those of :mod:`threading` starting a thread), the garbage collector's object lists,
``ctypes`` reaching into the interpreter, a function's code replaced, and new processes. An
honest answer needs none of them. The guard's state lives in the hook's closure, which no module
attribute reaches; the functions that open and close a watch need the token the check holds.

What this cannot see: code copied out of the package's source and then edited (new code), torch
functions that are not on an exercise's list (and those on it, called from a thread that was
running before the check began), and an answer that goes through the interpreter's internals by
routes the guard does not know (walking the check's frames, for one). It is meant for a learner
who reaches for the package's answer, who is told to write it; copying a solution's text out of
the book cannot be told from writing it.
"""

from __future__ import annotations

import __future__

import ast
import dis
import functools
import inspect
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Iterable

from .records import Failed, plain
from .registry import exercises

# Record keys.
CALLS_KEY = "__shortcuts_called__"  # labels of the watched functions the answer called, in order
IS_KEY = "__answer_is__"  # label of the shortcut the answer itself is (or subclasses), if any
TAMPERED_KEY = "__watch_tampered__"  # what the answer did to switch the guard off or reach into the check

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


#: Copies are recognised for code that carries a docstring of at least this many characters...
DOCSTRING_LENGTH = 20
#: ... or whose instructions take at least this many bytes: short code an honest learner may write alike.
LONG_CODE = 200


#: The instructions whose argument a fingerprint keeps (names, constants, operators); jumps and
#: the call machinery, which compiling in another context may lay out otherwise, are left out.
_KEPT = ("LOAD_", "STORE_", "DELETE_", "IMPORT_", "BINARY_OP", "COMPARE_OP", "IS_OP", "CONTAINS_OP", "KW_NAMES")


@functools.lru_cache(maxsize=4096)
def fingerprint(code: types.CodeType) -> tuple:
    """What a code object *is*, without its name, file or line: its docstring, arguments, local
    names and, in order, the names, constants and operators its instructions use (nested code by
    its fingerprint). A copy (``code.replace``, ``exec`` of the same source text) has the
    fingerprint of the original.

    Example:
        >>> from mha_course import cost
        >>> copy = cost.kv_cache_bytes.__code__.replace(co_name="mine", co_filename="mine.py")
        >>> fingerprint(copy) == fingerprint(cost.kv_cache_bytes.__code__)
        True
    """
    steps = tuple(fingerprint(i.argval) if isinstance(i.argval, types.CodeType) else (i.opname[:5], repr(i.argval))
                  for i in dis.get_instructions(code) if i.opname.startswith(_KEPT))
    first = code.co_consts[0] if code.co_consts and isinstance(code.co_consts[0], str) else None
    return (first, code.co_varnames, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, steps)


def _sketch(code: types.CodeType) -> tuple:
    """A quick test before a fingerprint is worked out: the arguments and the names used."""
    return code.co_argcount, code.co_varnames, frozenset(code.co_names)


def recognisable(code: types.CodeType) -> bool:
    """Whether a copy of ``code`` is told from code a learner wrote alike: it carries a docstring
    (its first constant, a string of at least :data:`DOCSTRING_LENGTH` characters) or is long."""
    first = code.co_consts[0] if code.co_consts else None
    return (isinstance(first, str) and len(first) >= DOCSTRING_LENGTH) or len(code.co_code) >= LONG_CODE


def _nested(code: types.CodeType) -> Iterable[types.CodeType]:
    """``code`` and the code objects inside it (functions defined in it, comprehensions...)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)


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
    sketches: frozenset = field(default=frozenset(), compare=False, repr=False)
    instructions: frozenset = field(default=frozenset(), compare=False, repr=False)

    reports: frozenset = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self):
        codes, builtins, reports = set(), set(), set()
        for target in self.targets:
            found = [_ORIGINALS.get(code, code) for code in _code_objects(target)]
            codes.update(found)
            if not found:
                builtins.update(_builtins_of(target))
            for function in _functions(target):
                report = reporting(function)
                if report is not None:
                    codes.add(function.__code__)
                    reports.add(report)
        object.__setattr__(self, "codes", frozenset(codes))
        object.__setattr__(self, "builtins", frozenset(builtins))
        object.__setattr__(self, "reports", frozenset(reports))
        object.__setattr__(self, "places", frozenset(p for p in map(place, codes) if p is not None))
        copied = [nested for code in codes for nested in _nested(code) if recognisable(nested)]
        object.__setattr__(self, "fingerprints", frozenset(map(fingerprint, copied)))
        object.__setattr__(self, "sketches", frozenset(map(_sketch, copied)))
        object.__setattr__(self, "instructions", frozenset(code.co_code for code in copied))

    def hint(self, is_answer: bool = False) -> str:
        if self.why:
            return self.why
        return f"This {'is' if is_answer else 'calls'} {self.label}: write it yourself."


def _builtins_of(target: Any) -> Iterable[Any]:
    """What a call of a builtin target shows the guard: itself, or for a torch operator
    (``torch.ops.aten.<name>`` and its overloads) the builtin each of them calls."""
    try:
        from torch._ops import OpOverload, OpOverloadPacket
    except ImportError:  # pragma: no cover - torch always has them
        OpOverload = OpOverloadPacket = ()
    if isinstance(target, OpOverloadPacket):
        yield target.op
        for name in target.overloads():
            yield getattr(target, name).op
    elif isinstance(target, OpOverload):
        yield target.op
    else:
        yield target


def _functions(target: Any) -> Iterable[types.FunctionType]:
    """The Python functions behind a function, method or class (every method of the class)."""
    if isinstance(target, (classmethod, staticmethod)):
        target = target.__func__
    if isinstance(target, types.MethodType):
        target = target.__func__
    if isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, types.FunctionType):
        yield inspect.unwrap(target)
    elif isinstance(target, property):
        yield from (accessor for accessor in (target.fget, target.fset, target.fdel)
                    if isinstance(accessor, types.FunctionType))
    elif isinstance(target, type):
        for member in vars(target).values():
            if isinstance(member, (types.FunctionType, classmethod, staticmethod, property)):
                yield from _functions(member)


# ----------------------------------------------------------------------------------------------
# The package's answers report themselves

#: The audit event a shortcut of the package raises each time it runs, with its :func:`place`.
RAN_EVENT = "mha_course.ran"
_RAN = types.MethodType(sys.audit, RAN_EVENT)  # a constant of the reporting code: no name to rebind
_PLACEHOLDER = "__mha_course_reports_here__"
_ORIGINALS: dict[types.CodeType, types.CodeType] = {}  # reporting code -> the code it was made from
_REPORTING: set[types.CodeType] = set()


@functools.lru_cache(maxsize=None)
def _definitions(filename: str) -> dict[int, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions defined in a file, at any depth, by their first line (that of their first
    decorator, as in their code object); empty for a file that cannot be read or parsed."""
    try:
        tree = ast.parse(Path(filename).read_text(encoding="utf-8"), filename)
    except (OSError, SyntaxError, ValueError):
        return {}
    return {(node.decorator_list[0].lineno if node.decorator_list else node.lineno): node
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def reporting(function: types.FunctionType) -> str | None:
    """Make a function of the package report each run to the guard, and return what it reports
    (its :func:`place`, as one string); ``None`` for a function outside the package, or one this
    cannot rewrite (no source, a closure).

    The function's code is compiled again from its source with one call first (after the
    docstring), ``sys.audit("mha_course.ran", "<file>:<qualified name>")``, the call held as a
    constant of the code: a copy of the code (``code.replace``, ``types.FunctionType``) reports too,
    in any thread, with no hook of its own. Lines, names and behaviour stay as they were.

    Example:
        >>> from mha_course import causal_mask
        >>> reporting(causal_mask)
        'masking.py:causal_mask'
    """
    code = function.__code__
    where = place(_ORIGINALS.get(code, code))
    if where is None:
        return None
    report = ":".join(where)
    if code in _REPORTING:
        return report
    if code.co_name == "<lambda>" or set(code.co_freevars) - {"__class__"}:
        return None
    node = _definitions(code.co_filename).pop(code.co_firstlineno, None)  # each is rewritten once, in place
    if node is None or node.name != code.co_name:
        return None
    docstring = (isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                 and isinstance(node.body[0].value.value, str))
    at = node.body[1 if docstring and len(node.body) > 1 else 0]
    call = ast.Expr(ast.Call(func=ast.Constant(_PLACEHOLDER), args=[ast.Constant(report)], keywords=[]))
    node.body.insert(1 if docstring else 0, ast.fix_missing_locations(ast.copy_location(call, at)))
    owner = code.co_qualname.split(".")[-2] if "." in code.co_qualname else None
    if owner is not None and owner != "<locals>":  # a method: compiled in a class of its class's name
        node = ast.copy_location(ast.ClassDef(owner, [], [], [node], []), node)  # (super(), private names)
    elif code.co_freevars:
        return None
    tree = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "'str' object is not callable": the constant is replaced below
        compiled = compile(tree, code.co_filename, "exec", dont_inherit=True,
                           flags=code.co_flags & __future__.annotations.compiler_flag)
    new = next((c for c in _nested(compiled) if c.co_name == code.co_name and c.co_firstlineno == code.co_firstlineno
                and c is not compiled), None)
    if new is None or (new.co_varnames, new.co_freevars, new.co_argcount, new.co_kwonlyargcount) != (
            code.co_varnames, code.co_freevars, code.co_argcount, code.co_kwonlyargcount):
        return None
    new = new.replace(co_qualname=code.co_qualname,
                      co_consts=tuple(_RAN if isinstance(c, str) and c == _PLACEHOLDER else c for c in new.co_consts))
    _ORIGINALS[new] = code
    _REPORTING.add(new)
    function.__code__ = new
    return report


def report_runs(module_name: str) -> None:
    """Make every function of a module of the checks report when it runs (:func:`reporting`).
    Each such module calls it last, on import, so that the checks' own functions report before any
    answer runs."""
    module = sys.modules[module_name]
    for value in list(vars(module).values()):
        if isinstance(value, types.FunctionType) and value.__module__ == module_name:
            reporting(inspect.unwrap(value))  # a decorated function: the function underneath


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


#: The audit event the guard's profile function raises for every call while an answer is checked.
WATCH_EVENT = "mha_course.watch"

#: Audit events an answer is refused while it is checked: they would switch the guard off, look
#: through the interpreter's objects for the check's state, or run work the guard cannot see.
REFUSED_EVENTS = frozenset({
    "sys.setprofile", "sys.settrace", "sys.addaudithook", "sys._current_frames", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn",
    "os.spawn", "subprocess.Popen"})


def _make_guard():
    """Install the guard (an audit hook, for the life of the process) and return the two functions
    that open and close a watch. Everything the guard knows lives in this closure."""
    import _thread
    import threading

    audit, setprofile, getprofile, getframe, ident = sys.audit, sys.setprofile, sys.getprofile, sys._getframe, _thread.get_ident
    profile = types.MethodType(audit, WATCH_EVENT)  # stateless: nothing in it for an answer to change
    bootstrap = threading.Thread._bootstrap_inner.__code__
    code_type, str_type = types.CodeType, str
    sessions: list[dict] = []  # the open watches, innermost last
    own: set[int] = set()  # threads making the guard's own calls to sys.setprofile
    busy: set[int] = set()  # threads inside the hook (its own audited reads raise events too)

    def label_of(session: dict, code) -> str | None:
        known = session["cache"].get(id(code))
        if known is not None and known[0] is code:
            return known[1]
        label = session["codes"].get(code)
        if label is None and code.co_qualname in session["names"]:
            label = session["places"].get(place(code))
        if label is None and _sketch(code) in session["sketches"]:
            label = session["fingerprints"].get(fingerprint(code))
        session["cache"][id(code)] = (code, label)  # the code is kept, so its id is not reused
        return label

    def made(session: dict, code) -> str | None:
        return next((label for nested in _nested(code) if (label := label_of(session, nested))), None)

    def note(key: str, value: str) -> None:
        for session in sessions:
            if value not in session[key]:
                session[key].append(value)

    def refuse(event: str, what: str) -> None:
        note("tampered", what)
        raise RuntimeError(f"{what} is not available while mha_course checks an answer (the check watches "
                           f"which functions the answer calls).")

    def seen(label: str | None) -> None:
        if label is not None:
            for session in sessions:
                if label not in session["seen"]:
                    session["seen"].append(label)

    def hook(event: str, args: tuple) -> None:
        if not sessions:
            return
        if event == WATCH_EVENT:  # the profile function: one event per call and return
            what = args[1]
            if what == "call":
                code = args[0].f_code  # (an audited read: its own event falls through below)
                for session in sessions:
                    seen(label_of(session, code))
            elif what == "c_call":
                for session in sessions:
                    try:
                        seen(session["builtins"].get(args[2]))
                    except TypeError:  # an unhashable callable: never one of ours
                        pass
        elif event == RAN_EVENT:  # a shortcut of the package ran, in whatever thread
            for session in sessions:
                seen(session["reports"].get(args[0]))
        elif event in ("exec", "function.__new__") and args and isinstance(args[0], code_type):
            for session in sessions:
                seen(made(session, args[0]))
        elif event == "code.__new__" and args:
            for session in sessions:
                seen(session["instructions"].get(args[0]))
        elif event in REFUSED_EVENTS:
            thread = ident()
            if thread in busy:
                return
            if event in ("sys.setprofile", "sys.settrace"):
                if thread in own:
                    return
                busy.add(thread)
                try:
                    caller = getframe(1).f_code
                finally:
                    busy.discard(thread)
                if caller is bootstrap:  # threading starting a thread, with the hook it was given
                    return
            refuse(event, event)
        elif event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
            refuse(event, "replacing a function's __code__")
        elif event == "ctypes.dlsym" and len(args) > 1 and isinstance(args[1], str_type) and (
                args[1].startswith(("Py", "_Py"))):
            refuse(event, f"ctypes ({args[1]})")

    sys.addaudithook(hook)

    def open_watch(tables: dict) -> object:
        """Start noting calls; returns the token :func:`close_watch` needs."""
        token = object()
        session = {**tables, "token": token, "seen": [], "tampered": [],
                   "previous": (getprofile(), threading.getprofile())}
        thread = ident()
        own.add(thread)
        try:
            sessions.append(session)
            setprofile(profile)
            threading.setprofile(profile)
        finally:
            own.discard(thread)
        return token

    def close_watch(token: object) -> tuple[list[str], list[str]]:
        """Stop the watch opened with ``token``; the labels seen and what was tampered with."""
        session = next((s for s in sessions if s["token"] is token), None)
        if session is None:
            raise ValueError("no watch is open with this token")
        if getprofile() is not profile:
            note("tampered", "the check's profile function replaced")
        if threading.getprofile() is not profile:
            note("tampered", "threading's profile function replaced")
        thread = ident()
        own.add(thread)
        try:
            sessions.remove(session)
            previous, previous_threading = session["previous"]
            setprofile(profile if sessions else previous)
            threading.setprofile(profile if sessions else previous_threading)
        finally:
            own.discard(thread)
        return list(session["seen"]), list(session["tampered"])

    return open_watch, close_watch


_open_watch, _close_watch = _make_guard()


class CallWatch:
    """Notes the calls of watched functions made while it is active (``with watch: ...``), in this
    thread and in threads started meanwhile: by code object, by a copy's fingerprint, or by
    :func:`place` for a function of another copy of the package. ``tampered`` lists what the code
    did to switch the watch off (refused, see :data:`REFUSED_EVENTS`).

    Example:
        >>> from mha_course import cost
        >>> with CallWatch(package(cost.kv_cache_bytes_per_token)) as watch:
        ...     _ = cost.kv_cache_bytes(2, 2, 4, num_tokens=3)
        >>> watch.seen
        ["mha_course's own kv_cache_bytes_per_token"]
    """

    def __init__(self, shortcuts: Iterable[Shortcut]):
        tables: dict[str, Any] = {"codes": {}, "builtins": {}, "places": {}, "fingerprints": {}, "instructions": {},
                                  "sketches": set(), "cache": {}, "reports": {}}
        for shortcut in shortcuts:
            tables["codes"].update(dict.fromkeys(shortcut.codes, shortcut.label))
            tables["builtins"].update(dict.fromkeys(shortcut.builtins, shortcut.label))
            tables["places"].update(dict.fromkeys(shortcut.places, shortcut.label))
            tables["fingerprints"].update(dict.fromkeys(shortcut.fingerprints, shortcut.label))
            tables["instructions"].update(dict.fromkeys(shortcut.instructions, shortcut.label))
            tables["sketches"].update(shortcut.sketches)
            tables["reports"].update(dict.fromkeys(shortcut.reports, shortcut.label))
        tables["names"] = {name for _, name in tables["places"]}  # a quick test before the place is worked out
        self._tables = tables
        self.seen: list[str] = []
        self.tampered: list[str] = []
        self._tokens: list[object] = []

    def __enter__(self) -> "CallWatch":
        self._tokens.append(_open_watch(self._tables))
        return self

    def __exit__(self, *exc) -> None:
        seen, tampered = _close_watch(self._tokens.pop())
        self.seen.extend(label for label in seen if label not in self.seen)
        self.tampered.extend(what for what in tampered if what not in self.tampered)


SUBCLASS = "a subclass of "


def answer_is(answer: Any, shortcuts: Iterable[Shortcut]) -> str | None:
    """The label of the shortcut the answer itself is (or ``"a subclass of <label>"``); ``None`` if none.

    A function is matched by its code, a copy of it (:func:`fingerprint`) or its :func:`place`; a class by the classes it derives from
    (the class of another copy of the package is caught by the calls of its methods).
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


def own_code_check(shortcuts: tuple[Shortcut, ...]):
    """The check every exercise starts with: the answer is not, and does not call, a shortcut."""
    by_label = {s.label: s for s in shortcuts}

    def run(record: dict) -> None:
        tampered = plain(record.get(TAMPERED_KEY)) or []
        if tampered:
            raise Failed("code of your own, with the check's watch left alone", f"an answer that used {tampered[0]}",
                         "The check notes which functions your answer calls, and refuses what would switch it "
                         "off: remove that line and write the code yourself.")
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


#: The ``torch.ops.aten`` operators behind torch's attention, by the fragment their functions' names hold.
_ATEN_OPERATORS = {
    "scaled_dot_product": ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                           "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                           "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable",
                           "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_math_for_mps"),
    "multi_head_attention": ("_native_multi_head_attention",),
}


def _torch_entry_points(fragment: str) -> tuple:
    """torch's functions and ``torch.ops.aten`` operators whose name holds ``fragment`` (forward
    only): every way to reach one of its kernels."""
    import torch

    found = []
    for space in (torch._C._nn, torch._C._VariableFunctions):
        found += [getattr(space, name) for name in sorted(dir(space)) if fragment in name and "backward" not in name]
    for name in _ATEN_OPERATORS[fragment]:
        try:
            found.append(getattr(torch.ops.aten, name))
        except (AttributeError, RuntimeError):  # an operator this build of torch lacks
            continue
    return tuple(dict.fromkeys(found))


def sdpa_entry_points() -> tuple:
    """``torch.nn.functional.scaled_dot_product_attention`` and every other way to call its kernels
    (``torch.ops.aten.scaled_dot_product_attention``, ``torch._scaled_dot_product_attention_math``...)."""
    import torch.nn.functional as F

    return (F.scaled_dot_product_attention, *_torch_entry_points("scaled_dot_product"))


def torch_attention(why: str) -> tuple[Shortcut, ...]:
    """torch's own attention: the fused call (by any entry point) and ``nn.MultiheadAttention``."""
    import torch.nn.functional as F
    from torch import nn

    return (Shortcut("torch's scaled_dot_product_attention", sdpa_entry_points(), why),
            Shortcut("torch's nn.MultiheadAttention",
                     (nn.MultiheadAttention, F.multi_head_attention_forward, *_torch_entry_points("multi_head_attention")),
                     why))
