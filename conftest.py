"""pytest's set-up for the whole repository (the tests' own fixtures are in tests/conftest.py).

The tests come in tiers, by marker (pyproject.toml): ``kernel`` (they start Jupyter kernels: grading, and
the chapters under nbval, whose cells are marked here), ``book`` (they write the student edition of every
chapter, as a book build does), ``browser`` (they drive chromium over the built book) and ``sweep`` (the
checks over many fixed seeds) are left out of ``make check`` and run by ``make test``, which starts them first: they take longest.
Under ``make test`` (pytest-xdist's ``loadfile``) a file's tests run in one worker: a chapter's cells share
one kernel. The browser tests of every file run in one worker too (:class:`BrowserTogether`): they share
one visit of each page, made once per worker.

pytest imports every module of the package to run its docstring examples. The benchmark's memory
probe, ``mha_course/bench/memory.py``, imports the POSIX-only ``resource`` module and is imported by
nothing on a platform without it (Windows): it is not collected there either.

The chapters' kernels run with PyTorch's vector code switched off (``ATEN_CPU_CAPABILITY=default``),
unless the variable is already set. Their stored outputs were printed on a machine with vector code,
so strict nbval then fails on any cell whose printed digits depend on the processor's vector unit:
here, before it fails on another contributor's runner.
"""

import os
import sys

import pytest

from mha_course.bench.machine import cpu_memory_unsupported_reason

collect_ignore = ["mha_course/bench/memory.py"] if cpu_memory_unsupported_reason() else []

#: What the chapters' kernels get, when the environment does not set it.
CHAPTER_CPU_CAPABILITY = "default"


def pytest_configure(config):
    """Under pytest-xdist (not under make test-each's ``-p no:xdist``), hand out the files as below."""
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(BrowserTogether(), "browser-together")


class BrowserTogether:
    """pytest-xdist's ``loadfile``, but with tests/browser/ as one unit of work (pytest-xdist's
    ``pytest_xdist_make_scheduler`` hook). pytest-xdist's own ``loadgroup`` would do it with ``xdist_group``
    marks, but under pytest 9 (3.8.0) it groups nothing: it renames ``item._nodeid``, which pytest 9 no longer
    reads."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling

        class Scheduling(LoadFileScheduling):
            def _split_scope(self, nodeid):
                scope = super()._split_scope(nodeid)
                return "tests/browser" if scope.startswith("tests/browser/") else scope

        return Scheduling(config, log)


def pytest_itemcollected(item):
    """Mark the chapters' cells (nbval) ``kernel``."""
    if type(item).__name__ == "IPyNbCell":
        item.add_marker(pytest.mark.kernel)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The tests marked ``kernel``, ``book``, ``browser`` or ``sweep`` first, in their files' order: pytest-xdist hands out
    the files in this order when told ``--no-loadscope-reorder``."""
    items.sort(key=lambda item: not any(item.get_closest_marker(tier) for tier in ("kernel", "book", "browser", "sweep")))


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


def pytest_runtest_teardown(item):
    """A docstring example that draws a figure leaves it open in pyplot's list: close it with the example."""
    if type(item).__name__ == "DoctestItem" and "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
