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
    (folder / "attention").mkdir()
    shutil.copy(Path(mha_course.__file__).parent / "attention" / "_validation.py", folder / "attention")
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
    copied = _load_copy(tmp_path)  # (the package's code is its file's: the checks never change it)
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


# ----------------------------------------------------------------------------------------------
# What the guard promises (see the threat model in mha_course.exercises.guard): the package's answer
# is refused however an honest learner reaches it


def _fails_own_code(exercise_id, answer, words):
    result = run_check(exercise_id, answer)
    assert (result.status, result.failed_check) == ("failed", OWN_CODE), result.line
    assert words in result.line, result.line
    return result


_another_name = mha_course.causal_mask


def _mask_under_another_name(num_tokens, device=None):
    return _another_name(num_tokens, device)


def _mask_through_an_attribute(num_tokens, device=None):
    return mha_course.attention.masking.causal_mask(num_tokens, device=device)


def _mask_through_a_partial(num_tokens, device=None):
    import functools

    return functools.partial(mha_course.causal_mask, device=device)(num_tokens)


def _mask_through_a_lambda(num_tokens, device=None):
    return (lambda n: mha_course.causal_mask(n, device))(num_tokens)


def _mask_from_a_thread(num_tokens, device=None):
    import threading

    out = []
    thread = threading.Thread(target=lambda: out.append(mha_course.causal_mask(num_tokens, device)))
    thread.start()
    thread.join()
    return out[0]


def _mask_from_a_pool(num_tokens, device=None):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return pool.submit(mha_course.causal_mask, num_tokens, device).result()


def _mask_from_the_source_text(num_tokens, device=None):
    import inspect

    namespace = dict(mha_course.attention.masking.__dict__)
    exec(inspect.getsource(mha_course.causal_mask), namespace)
    return namespace["causal_mask"](num_tokens, device)


def _renamed_copy(function, name="my_mask"):
    code = function.__code__.replace(co_name=name, co_qualname=name, co_filename="/home/learner/my_code.py")
    return types.FunctionType(code, function.__globals__, name, function.__defaults__)


def _mask_from_a_renamed_copy(num_tokens, device=None):
    return _renamed_copy(mha_course.causal_mask)(num_tokens, device)


def _fused_attention(x, W_query, W_key, W_value):
    import torch

    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    return torch.nn.functional.scaled_dot_product_attention(queries, keys, values, is_causal=True)


def _fused_attention_through_aten(x, W_query, W_key, W_value):
    import torch

    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    return torch.ops.aten.scaled_dot_product_attention(queries, keys, values, is_causal=True)


def _fused_attention_through_an_overload(x, W_query, W_key, W_value):
    import torch

    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    return torch.ops.aten.scaled_dot_product_attention.default(queries, keys, values, is_causal=True)


def _mask_after_emptying_the_garbage_collectors_lists(num_tokens, device=None):
    import gc

    for thing in gc.get_objects():  # (the guard kept its state there once; it keeps none an answer can clear)
        if isinstance(thing, list) and any(isinstance(item, str) and item == "mha_course's own causal_mask"
                                           for item in thing):
            thing.clear()
    return mha_course.causal_mask(num_tokens, device)


@pytest.mark.parametrize("answer, words", [
    (_mask_under_another_name, "got a call to mha_course's own causal_mask"),
    (_mask_through_an_attribute, "got a call to mha_course's own causal_mask"),
    (_mask_through_a_partial, "got a call to mha_course's own causal_mask"),
    (_mask_through_a_lambda, "got a call to mha_course's own causal_mask"),
    (_mask_from_a_thread, "got a call to mha_course's own causal_mask"),
    (_mask_from_a_pool, "got a call to mha_course's own causal_mask"),
    (_mask_from_the_source_text, "got a call to mha_course's own causal_mask"),
    (_mask_from_a_renamed_copy, "got a call to mha_course's own causal_mask"),
    (_mask_after_emptying_the_garbage_collectors_lists, "got a call to mha_course's own causal_mask"),
    (_another_name, "got mha_course's own causal_mask"),
    (_renamed_copy(mha_course.causal_mask, "build_causal_mask"), "got mha_course's own causal_mask"),
], ids=lambda value: getattr(value, "__name__", "")[:40] if callable(value) else "")
def test_the_packages_answer_is_refused_however_it_is_reached(answer, words):
    _fails_own_code("1.1", answer, words)


@pytest.mark.parametrize("answer", [_fused_attention, _fused_attention_through_aten,
                                    _fused_attention_through_an_overload])
def test_every_entry_point_of_the_fused_attention_is_known(answer):
    _fails_own_code("1.2", answer, "got a call to torch's scaled_dot_product_attention")


def test_a_copy_of_a_checks_reference_is_the_checks_own():
    from mha_course.exercises import chapter1

    copy = _renamed_copy(chapter1.reference_head, "causal_attention_forward")
    _fails_own_code("1.2", copy, "the checks' own chapter1.reference_head")

    def causal_attention_forward(x, W_query, W_key, W_value):
        import threading

        out = []

        def work():
            try:
                out.append(chapter1.reference_head(x, W_query, W_key, W_value))
            except Exception as error:  # (the probe's inputs on another device, say): raised below
                out.append(error)

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        if isinstance(out[0], Exception):
            raise out[0]
        return out[0]

    _fails_own_code("1.2", causal_attention_forward, "the checks' own chapter1.reference_head")


def test_honest_answers_that_use_threads_exec_profilers_or_short_code_like_the_packages_pass():
    """The guard refuses nothing an honest answer does: threads of its own, exec of its own text, a
    profiler of its own, a function short enough that a learner may write it like the package does."""
    import threading

    import torch

    def build_causal_mask(num_tokens, device=None):
        out = []
        worker = threading.Thread(target=lambda: out.append(
            torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).triu(1)))
        worker.start()
        worker.join()
        return out[0]

    assert run_check("1.1", build_causal_mask).passed
    namespace = {"torch": torch}
    exec("def build_causal_mask(num_tokens, device=None):\n"
         "    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)\n",
         namespace)
    assert run_check("1.1", namespace["build_causal_mask"]).passed

    def profiled(num_tokens, device=None):
        import cProfile

        with cProfile.Profile():
            return namespace["build_causal_mask"](num_tokens, device)

    assert run_check("1.1", profiled).passed


def test_the_watch_is_on_only_while_the_answer_runs():
    inside = []

    def answer(num_tokens, device=None):
        import torch

        inside.append(sys.getprofile())
        return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).triu(1)

    before = sys.getprofile()
    assert run_check("1.1", answer).passed
    assert inside and None not in inside and before not in inside
    assert sys.getprofile() is before  # put back once the check is over


def test_a_watch_inside_a_watch_leaves_the_outer_one_watching():
    outer, inner = CallWatch(package(cost.kv_cache_bytes)), CallWatch(package(cost.kv_cache_bytes_per_token))
    with outer:
        with inner:
            cost.kv_cache_bytes(2, 2, 4, num_tokens=3)  # (which calls kv_cache_bytes_per_token)
        assert sys.getprofile() is outer
    assert outer.seen == ["mha_course's own kv_cache_bytes"]
    assert inner.seen == ["mha_course's own kv_cache_bytes_per_token"]


def test_the_packages_function_reads_and_behaves_as_its_file():
    import inspect

    from mha_course.exercises import EXERCISES

    assert EXERCISES  # the checks are imported: the package's code is still its file's
    assert all(isinstance(c, (str, int, float, tuple, type(None), types.CodeType))
               for c in mha_course.causal_mask.__code__.co_consts)
    source = Path(mha_course.attention.masking.__file__).read_text(encoding="utf-8").splitlines(keepends=True)
    lines, first = inspect.getsourcelines(mha_course.causal_mask)
    assert lines == source[first - 1:first - 1 + len(lines)] and lines[0].startswith("def causal_mask(")
    assert mha_course.causal_mask(3).int().tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    with pytest.raises(ValueError, match="num_tokens") as raised:
        mha_course.causal_mask(-1)
    frame = raised.traceback[1]  # the line in causal_mask that raised is the file's
    assert "validate_non_negative_int" in source[frame.lineno]


# ----------------------------------------------------------------------------------------------
# What the guard does not promise: sabotage of one's own check from inside one's own process. The
# check was refusing these answers before; it is feedback for an honest learner, not a proctor (for
# marks that count, the grader runs the notebook's answers in processes of its own). These tests
# document the limit, and that the check still ends cleanly, leaving no hook behind.


def _mask_after_switching_the_watch_off(num_tokens, device=None):
    sys.setprofile(None)
    return mha_course.causal_mask(num_tokens, device)


def _mask_after_switching_the_watch_off_and_back(num_tokens, device=None):
    watch = sys.getprofile()
    sys.setprofile(None)
    mask = mha_course.causal_mask(num_tokens, device)
    sys.setprofile(watch)
    return mask


def _mask_from_a_thread_without_threadings_profile(num_tokens, device=None):
    import threading

    watch = threading.getprofile()
    threading.setprofile(None)
    try:
        return _mask_from_a_thread(num_tokens, device)
    finally:
        threading.setprofile(watch)


_POOL = []


def _mask_from_a_pool_made_before_the_check(num_tokens, device=None):
    return _POOL[0].submit(mha_course.causal_mask, num_tokens, device).result()


@pytest.mark.parametrize("answer", [_mask_after_switching_the_watch_off, _mask_after_switching_the_watch_off_and_back,
                                    _mask_from_a_thread_without_threadings_profile,
                                    _mask_from_a_pool_made_before_the_check], ids=lambda answer: answer.__name__[9:49])
def test_sabotage_from_inside_the_process_is_out_of_scope(answer):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    before = (sys.getprofile(), threading.getprofile())
    with ThreadPoolExecutor(1) as pool:
        pool.submit(int).result()  # the worker thread exists before the check
        _POOL.append(pool)
        try:
            result = run_check("1.1", answer)
        finally:
            _POOL.clear()
    assert result.passed, result.line  # not caught: the threat model says so
    assert (sys.getprofile(), threading.getprofile()) == before
