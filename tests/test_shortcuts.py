"""The shortcut watch knows the package's functions in any copy of the package, not only this one.

Code objects compare by their contents, not by their file, so a byte-identical copy of the package
(the grader's private copy) matches as it is. A copy whose code differs (another version of the
package, an edited copy imported under another name) has code objects of its own; the watch knows
its functions by their place: the file below the folder named ``mha_course`` and the qualified name.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import types
from pathlib import Path

import pytest

import mha_course
from mha_course import cost
from mha_course.exercises import run_check
from mha_course.exercises.framework import OWN_CODE
from mha_course.exercises.shortcuts import CallWatch, package, place

COPY = "second_copy_of_mha_course"


def _load_copy(tmp_path, edit=lambda source: source):
    """``cost`` loaded from a copy of the package's files (``cost.py`` edited by ``edit``), under
    another package name."""
    folder = tmp_path / "elsewhere" / "mha_course"
    folder.mkdir(parents=True)
    shutil.copy(Path(mha_course.__file__).parent / "_validation.py", folder)
    (folder / "cost.py").write_text(edit(Path(cost.__file__).read_text(encoding="utf-8")), encoding="utf-8")
    parent = types.ModuleType(COPY)
    parent.__path__ = [str(folder)]  # a package whose __init__ never runs: only the modules asked for load
    sys.modules[COPY] = parent
    return importlib.import_module(f"{COPY}.cost")


@pytest.fixture
def unload():
    yield
    for name in [n for n in sys.modules if n == COPY or n.startswith(COPY + ".")]:
        del sys.modules[name]


@pytest.fixture
def second_copy(tmp_path, unload):
    """Another version of ``cost.py``: one line more at the top, so every function's code differs."""
    return _load_copy(tmp_path, lambda source: "# another version of the file\n" + source)


def _size_with(kv_cache_bytes):
    def kv_cache_size(num_layers, num_heads, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number):
        return kv_cache_bytes(num_layers, num_kv_groups, head_dim, num_tokens, batch_size, bytes_per_number)
    return kv_cache_size


def test_an_identical_copy_has_equal_code(tmp_path, unload):
    copied = _load_copy(tmp_path)
    assert copied.kv_cache_bytes.__code__ == cost.kv_cache_bytes.__code__
    assert "got a call to mha_course's own kv_cache_bytes." in run_check("6.3", _size_with(copied.kv_cache_bytes)).line


def test_another_version_has_other_code_in_the_same_place(second_copy):
    assert second_copy.kv_cache_bytes.__code__ != cost.kv_cache_bytes.__code__
    assert place(second_copy.kv_cache_bytes.__code__) == place(cost.kv_cache_bytes.__code__) == (
        "cost.py", "kv_cache_bytes")


def test_a_call_into_a_second_copy_is_refused(second_copy):
    assert run_check("6.3", _size_with(cost.kv_cache_bytes)).failed_check == OWN_CODE
    result = run_check("6.3", _size_with(second_copy.kv_cache_bytes))
    assert (result.status, result.failed_check) == ("failed", OWN_CODE), result.line
    assert "got a call to mha_course's own kv_cache_bytes." in result.line


def test_an_answer_that_is_a_function_of_a_second_copy_is_refused(second_copy):
    result = run_check("6.3", second_copy.kv_cache_bytes)
    assert (result.status, result.failed_check) == ("failed", OWN_CODE), result.line
    assert "got mha_course's own kv_cache_bytes." in result.line


def test_the_same_name_outside_the_package_is_the_learners(tmp_path):
    def kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch=1, bytes_per_number=4):
        return 2 * num_layers * num_kv_heads * head_dim * bytes_per_number * num_tokens * batch

    assert place(kv_cache_bytes.__code__) is None
    assert run_check("6.3", _size_with(kv_cache_bytes)).passed
    # Another file of a folder named mha_course, or another function of cost.py, is not the shortcut.
    namespace: dict = {}
    exec(compile("def kv_cache_bytes(*args):\n    return 0\n", str(tmp_path / "mha_course" / "other.py"), "exec"),
         namespace)
    with CallWatch(package(cost.kv_cache_bytes)) as watch:
        namespace["kv_cache_bytes"]()
        cost.kv_cache_bytes_per_token(1, 1, 1)
    assert watch.seen == []


def test_every_exercise_refuses_the_checks_own_functions():
    """Every exercise has the "written by you" check first, and among its shortcuts the functions of
    the module of every exercise's probe (whatever chapter adds one)."""
    from mha_course.exercises import EXERCISES
    from mha_course.exercises.shortcuts import check_internals

    watched = {target.__module__ for shortcut in check_internals() for target in shortcut.targets}
    for exercise in EXERCISES.values():
        assert exercise.checks[0].name == OWN_CODE, exercise.id
        assert exercise.probe.__module__ in watched, exercise.id
