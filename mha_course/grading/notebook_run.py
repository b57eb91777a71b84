"""The grader's run of one notebook in its Jupyter kernel: cells with deadlines, and what happened.

:class:`NotebookRun` executes a notebook's code cells one by one, as "Run all" would with errors
allowed: a cell that raises, or runs past its time limit (reported as "timed out", with the limit
and the flag that raises it), is reported and the run goes on; a kernel
that dies, or a cell that calls ``exit()``, ends the run and is blamed on the cell that did it. It
notes which cells ran to their end and why the others did not, so the grader can say that an
answer was "not run" and where.

Reports name a cell by its number, counting every cell from the top (Markdown included), and by
its first line: ``cell 7 (`ratio = 1 / 0`)`` (:func:`cell_name`).
"""

from __future__ import annotations

import logging
import math
import queue
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync

from .grading_setup import raise_it

_QUIET_LOG = logging.getLogger("mha_course.grader.nbclient")
_QUIET_LOG.addHandler(logging.NullHandler())
_QUIET_LOG.propagate = False


def _not_an_interrupted_cell(record: logging.LogRecord) -> bool:
    """Drop asyncio's note about nbclient's output reader of a cell the grader interrupted."""
    return not (record.getMessage().startswith("Task exception was never retrieved") and record.exc_info
                and isinstance(record.exc_info[1], queue.Empty))


logging.getLogger("asyncio").addFilter(_not_an_interrupted_cell)


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of ``text``, cut to ``limit`` characters (``...`` marks a cut)."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def cell_name(notebook: nbformat.NotebookNode, index: int) -> str:
    """How reports name a cell: its number counting every cell from 1, and its first line.

    Example:
        >>> notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"),
        ...                                           nbformat.v4.new_code_cell("\\n\\nratio = 1 / 0")])
        >>> cell_name(notebook, 1)
        'cell 2 (`ratio = 1 / 0`)'
    """
    first = first_line(notebook.cells[index].source, limit=60)
    return f"cell {index + 1} (`{first}`)" if first else f"cell {index + 1} (empty)"


def seconds(value: float) -> str:
    """A time limit as reports write it: ``8 s``, ``0.5 s``."""
    return f"{value:g} s"


def python_source(source: str) -> str:
    """A cell's source as plain Python: IPython's magics and shell escapes become calls.

    Example:
        >>> python_source("%time x = 1").strip()
        "get_ipython().run_line_magic('time', 'x = 1')"
    """
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # without IPython a cell with magics simply does not parse
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # a cell IPython cannot read: leave it as it is (it will not parse either)
        return source


def _after(later: list[int]) -> str:
    return f"; the {len(later)} code cell(s) after it did not run" if later else ""


#: The kernel a notebook runs on when the one its metadata names is not installed.
FALLBACK_KERNEL = "python3"


def kernel_for(notebook: nbformat.NotebookNode, events: list[str]) -> str:
    """The kernel the notebook's metadata names, or :data:`FALLBACK_KERNEL` (with a note in
    ``events``) when no kernel of that name is installed here: a learner's environment may call
    its kernel otherwise, and the chapters run on any Python kernel with the package."""
    wanted = (notebook.metadata.get("kernelspec") or {}).get("name") or FALLBACK_KERNEL
    if wanted == FALLBACK_KERNEL:
        return wanted
    try:
        installed = KernelSpecManager().find_kernel_specs()
    except Exception:  # noqa: BLE001 - no readable kernel specs at all: the fallback still runs
        installed = {}
    if wanted in installed:
        return wanted
    events.append(f"the notebook names the kernel {wanted!r}, which is not installed here: it ran on "
                  f"{FALLBACK_KERNEL}")
    return FALLBACK_KERNEL


def launched_by(launcher: list[str]) -> type[AsyncKernelManager]:
    """A kernel manager that starts the kernel's command behind ``launcher`` (a command that ends
    by running the rest of its arguments, such as :mod:`mha_course.grading.confinement`)."""

    class Launched(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            return [*launcher, *super().format_kernel_cmd(extra_arguments)]

    return Launched


class NotebookRun:
    """One notebook's kernel: execute cells with deadlines, and note what happens in ``events``.

    Args:
        notebook: the notebook to run (its cells receive their outputs).
        folder: the kernel's working folder.
        events: the list that what happened is appended to, in order, as readable lines.
        launcher: a command the kernel's own command is started behind (none by default).
    """

    def __init__(self, notebook: nbformat.NotebookNode, folder: Path, events: list[str],
                 launcher: list[str] | None = None):
        self.notebook = notebook
        self.events = events
        managers = {"kernel_manager_class": launched_by(launcher)} if launcher else {}
        self.client = NotebookClient(
            notebook, timeout=None, allow_errors=True, interrupt_on_timeout=False, record_timing=False,
            kernel_name=kernel_for(notebook, events),
            resources={"metadata": {"path": str(folder)}},
            log=_QUIET_LOG,  # time-outs and errors are reported in the score table instead
            on_cell_executed=self._executed, shutdown_kernel="immediate", **managers,
        )
        self.ran: set[int] = set()  # cells that ran to their end (with or without an error)
        self.not_run: dict[int, str] = {}  # cell index -> why it did not run to its end
        self.exit_cell: int | None = None  # the cell that called exit(), if one did
        self.timed_out: set[int] = set()  # cells stopped, or never started, because a time limit was up

    #: What a kernel started ahead of its notebook's turn imports meanwhile (torch, matplotlib, the
    #: package's figures and its checks), binding no name the notebook could read.
    WARM_UP = ("import torch as _warm, matplotlib.pyplot as _warm, mha_course.plots as _warm, "
               "mha_course.exercises as _warm; _warm = _warm.EXERCISES; del _warm")
    #: Seconds a kernel started ahead is given to import all that and answer.
    WARM_UP_TIMEOUT = 120

    def start_kernel(self, **kwargs) -> None:
        """Start the kernel now, ahead of :meth:`run_notebook`'s turn (``kwargs`` as for
        ``setup_kernel``); an IPython kernel imports :data:`WARM_UP` meanwhile. If it does not
        start, ``setup_kernel`` starts one later, as usual."""
        client = self.client
        try:
            client.km = client.create_kernel_manager()
            if getattr(client.km, "ipykernel", False):
                client.extra_arguments = [*client.extra_arguments, f"--IPKernelApp.exec_lines={self.WARM_UP}"]
                client.startup_timeout = max(client.startup_timeout, self.WARM_UP_TIMEOUT)
            run_sync(client.async_start_new_kernel)(**kwargs)
        except Exception:  # noqa: BLE001 - setup_kernel tries again, and reports what goes wrong then
            self.stop_kernel()
            client.km = None

    def stop_kernel(self) -> None:
        """Shut down a kernel that was started and is still running (one started ahead and never run)."""
        km = self.client.km
        try:
            if km is not None and km.has_kernel:
                run_sync(km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001 - its processes are swept by their token all the same
            pass

    def _executed(self, cell, cell_index, execute_reply) -> None:
        payloads = (execute_reply or {}).get("content", {}).get("payload", []) or []
        if any(p.get("source") == "ask_exit" for p in payloads):
            self.exit_cell = cell_index

    def name(self, index: int) -> str:
        return cell_name(self.notebook, index)

    def execute(self, cell, index: int, timeout: float) -> str:
        """Execute one cell within ``timeout`` seconds; return "ok", "timeout" or "dead"."""
        self.client.timeout = max(1, int(math.ceil(timeout)))
        try:
            self.client.execute_cell(cell, index)
        except CellTimeoutError:
            try:
                run_sync(self.client.km.interrupt_kernel)()  # the manager is asynchronous
            except Exception:  # the kernel may be gone already
                pass
            return "timeout"
        except DeadKernelError:
            return "dead"
        return "ok"

    def _stop(self, rest: list[int], why: str) -> None:
        for index in rest:
            self.not_run.setdefault(index, why)

    def _exited(self, code: list[int]) -> None:
        """The kernel stopped after the cell that called ``exit()``: the cells after it did not run."""
        blamed = self.exit_cell
        later = [i for i in code if i > blamed]
        self.events.append(f"{self.name(blamed)} called exit(): the kernel stopped" + _after(later))
        self._stop(later, f"{self.name(blamed)} called exit(), which stopped the kernel")

    def run_notebook(self, timeout: float, cell_timeout: float) -> None:
        """Run every code cell, each within ``cell_timeout`` and all within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        code = [i for i, c in enumerate(self.notebook.cells) if c.cell_type == "code"]
        for position, index in enumerate(code):
            cell, later = self.notebook.cells[index], code[position + 1:]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.events.append(f"timed out: the notebook's {seconds(timeout)} were up before {self.name(index)} "
                                   f"({raise_it('--timeout')}); it and the {len(later)} code cell(s) after it did "
                                   "not run")
                self._stop([index, *later], f"the notebook timed out ({seconds(timeout)}, {raise_it('--timeout')}) "
                                            f"before {self.name(index)}")
                self.timed_out.update([index, *later])
                return
            limit = min(cell_timeout, remaining)
            outcome = self.execute(cell, index, limit)
            if outcome == "timeout":
                which = (f"the limit for one cell; {raise_it('--cell-timeout')}" if limit == cell_timeout else
                         f"the notebook's {seconds(timeout)} were up; {raise_it('--timeout')}")
                self.events.append(f"timed out: {self.name(index)} was still running after {seconds(limit)} "
                                   f"({which}); it was interrupted")
                self.not_run[index] = f"{self.name(index)} timed out after {seconds(limit)} ({which})"
                self.timed_out.add(index)
                continue
            if outcome == "dead":
                if self.exit_cell is not None:  # exit() ends the kernel only after its cell's reply
                    self._exited(code)
                else:
                    self.events.append(f"the kernel died while running {self.name(index)} (did it exit or "
                                       f"crash Python?)" + _after(later))
                    self._stop([index, *later], f"the kernel died in {self.name(index)}")
                return
            self.ran.add(index)
            for output in cell.outputs:
                if output.get("output_type") == "error":
                    self.events.append(f"{self.name(index)} raised {output.get('ename')}: "
                                       f"{first_line(output.get('evalue', ''))}")
            if self.exit_cell is not None:
                self._exited(code)
                return


__all__ = ["NotebookRun", "launched_by", "cell_name", "first_line", "seconds", "python_source"]
