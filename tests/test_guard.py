"""What the checks promise about the learner's own process (the threat model is the docstring of
:mod:`mha_course.exercises.shortcuts`): importing and running them leaves every function of the
package as its file defines it, leaves no hook behind, and reads no private internals.

The reference for the package's code comes from a second Python process that never imports the
checks; the checks' own modules are compared with their files compiled afresh.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The packages of the checks and of the grader, which imports them: the reference process leaves them out.
CHECKS = ("mha_course.exercises", "mha_course.grading", "mha_course.cli", "mha_course.__main__", "mha_course.edition")


def _functions(module: types.ModuleType) -> dict[str, types.FunctionType]:
    """Every function a module defines, and every method (accessors included) of its classes."""
    found = {}
    for name, value in vars(module).items():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        members = vars(value).items() if isinstance(value, type) else [("", value)]
        for attribute, member in members:
            member = getattr(member, "__func__", member)  # classmethod, staticmethod
            accessors = [member.fget, member.fset, member.fdel] if isinstance(member, property) else [member]
            for index, function in enumerate(accessors):
                if isinstance(function, types.FunctionType):
                    found[f"{module.__name__}:{name}.{attribute}.{index}"] = function
    return found


def _package_functions(names) -> dict[str, types.FunctionType]:
    found = {}
    for name in names:
        found.update(_functions(importlib.import_module(name)))
    return found


def _digest(code: types.CodeType) -> str:
    """What a code object holds (instructions, constants, names, file and lines), the same in every process."""
    def constant(value):
        if isinstance(value, types.CodeType):
            return _digest(value)
        return sorted(map(repr, value)) if isinstance(value, frozenset) else repr(value)

    parts = (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_qualname,
             code.co_filename, code.co_firstlineno, code.co_linetable, [constant(c) for c in code.co_consts])
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _modules(package: types.ModuleType) -> list[str]:
    """The package and its modules, found without importing the checks (``pkgutil.walk_packages`` would)."""
    names = [package.__name__]
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if info.name.startswith(CHECKS):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional library this machine lacks: that module is left out
            continue
        names += _modules(module) if info.ispkg else [info.name]
    return names


def reference() -> None:
    """Run in a fresh process: print the digest of every function of the package outside the checks."""
    import mha_course

    names = _modules(mha_course)
    assert not [name for name in sys.modules if name.startswith(CHECKS[:2])], "the reference imported the checks"
    functions = _package_functions(names)
    print(json.dumps({"file": mha_course.__file__, "modules": names,
                      "digests": {key: _digest(f.__code__) for key, f in functions.items()}}))


def _reference() -> dict:
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_guard; test_guard.reference()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _run_some_checks() -> None:
    """Checks that pass, that refuse the package's answer, and that watch the package's modules run."""
    import torch

    import mha_course
    from mha_course import cost
    from mha_course.exercises import EXERCISES, run_check

    assert len(EXERCISES) > 10

    def build_causal_mask(num_tokens, device=None):
        return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).triu(1)

    def kv_cache_size(num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number):
        return cost.kv_cache_bytes(num_layers, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number)

    assert run_check("1.1", build_causal_mask).passed
    assert not run_check("1.1", mha_course.causal_mask).passed
    assert not run_check("6.3", kv_cache_size).passed
    assert not run_check("3.5", mha_course.MultiHeadAttention).passed


def test_the_checks_leave_the_packages_functions_as_their_files_define_them():
    import mha_course

    expected = _reference()
    assert expected["file"] == mha_course.__file__
    _run_some_checks()
    functions = _package_functions(expected["modules"])
    before = {key: function.__code__ for key, function in functions.items()}
    assert set(expected["digests"]) <= set(functions)
    changed = [key for key, digest in expected["digests"].items() if _digest(functions[key].__code__) != digest]
    assert changed == [], f"{len(changed)} functions of the package run other code than their files': {changed[:5]}"
    _run_some_checks()
    assert [key for key, code in before.items() if functions[key].__code__ is not code] == []


def test_the_checks_own_functions_are_those_of_their_files():
    import mha_course.exercises as exercises

    _run_some_checks()
    for info in pkgutil.iter_modules(exercises.__path__, "mha_course.exercises."):
        module = importlib.import_module(info.name)
        source = Path(module.__file__).read_text(encoding="utf-8")
        compiled = {(c.co_qualname, c.co_firstlineno): c for c in _nested(compile(source, module.__file__, "exec"))}
        for key, function in _functions(module).items():
            code = inspect.unwrap(function).__code__
            if code.co_filename != module.__file__:  # made by a library (a dataclass's __init__)
                continue
            assert compiled.get((code.co_qualname, code.co_firstlineno)) == code, key


def _nested(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _nested(constant)


def test_a_check_leaves_no_profile_function_behind_in_any_thread():
    from mha_course.exercises import run_check

    released, during, after, started = threading.Event(), [], [], []

    def later():
        released.wait(timeout=600)
        len([])  # any call: the watch's function sees the check is over and takes itself out of this thread
        after.append(sys.getprofile())

    def build_causal_mask(num_tokens, device=None):
        import torch

        during.append(sys.getprofile())
        started.append(threading.Thread(target=later, daemon=True))
        started[-1].start()
        return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).triu(1)

    before = (sys.getprofile(), threading.getprofile())
    try:
        assert run_check("1.1", build_causal_mask).passed
        assert (sys.getprofile(), threading.getprofile()) == before
    finally:
        released.set()
    for thread in started:
        thread.join(timeout=600)
    assert during and None not in during  # the answer ran watched...
    assert after == [None] * len(started)  # ...and no thread it started is watched once the check is over


#: Private internals of CPython and torch that the checks do not read, and the process-wide hooks they do not install.
PRIVATE_NAMES = ("sys._getframe", "sys._current_frames", "_bootstrap_inner", "torch._C", "torch._ops",
                 "addaudithook", "KW_NAMES", "opname", "import opcode", "import ctypes", "gc.get_objects", ".__code__ =")
#: The folders of the package whose code runs in the learner's own process when they check an answer.
LEARNER_SIDE = ("exercises",)


@pytest.mark.parametrize("folder", LEARNER_SIDE)
def test_the_checks_read_no_private_internals(folder):
    found = [f"{path.relative_to(REPO)}: {name}" for path in sorted((REPO / "mha_course" / folder).rglob("*.py"))
             for name in PRIVATE_NAMES if name in path.read_text(encoding="utf-8")]
    assert found == []
