"""pytest's set-up for the whole repository (the tests' own fixtures are in tests/conftest.py).

pytest imports every module of the package to run its docstring examples. The benchmark's memory
probe, ``mha_course/bench/memory.py``, imports the POSIX-only ``resource`` module and is imported by
nothing on a platform without it (Windows): it is not collected there either.

The chapters' kernels run with PyTorch's vector code switched off (``ATEN_CPU_CAPABILITY=default``),
unless the variable is already set. Their stored outputs were printed on a machine with vector code,
so strict nbval then fails on any cell whose printed digits depend on the processor's vector unit:
here, before it fails on another contributor's runner.
"""

import os

import pytest

from mha_course.bench.machine import cpu_memory_unsupported_reason

collect_ignore = ["mha_course/bench/memory.py"] if cpu_memory_unsupported_reason() else []

#: What the chapters' kernels get, when the environment does not set it.
CHAPTER_CPU_CAPABILITY = "default"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """nbval starts a chapter's kernel while its first cell is set up: that kernel (and nothing else)
    inherits ``ATEN_CPU_CAPABILITY``."""
    is_chapter_cell = type(item).__name__ == "IPyNbCell"
    if not is_chapter_cell or "ATEN_CPU_CAPABILITY" in os.environ:
        yield
        return
    os.environ["ATEN_CPU_CAPABILITY"] = CHAPTER_CPU_CAPABILITY
    try:
        yield
    finally:
        del os.environ["ATEN_CPU_CAPABILITY"]
