"""One notebook run in its Jupyter kernel (:class:`NotebookRun`): cells with deadlines, and what happened.

Cells run as "Run all" would with errors allowed: a cell that raises or runs past its limit is reported
and the run goes on; a kernel that dies, or ``exit()``, ends it, blamed on that cell. The run notes which
cells ran to their end and why the others did not, so that an answer can be called "not run", and where.
The kernel talks over IPC sockets in its folder (no network needed: it can run in a sandbox whose only
writable folder that is); interrupts travel as messages, since a signal would stop at the sandbox.
"""

from __future__ import annotations

import logging
import math
import json
import queue
import subprocess
import time
from contextlib import suppress
from pathlib import Path
from typing import Callable

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from .grading_setup import first_line

_QUIET_LOG = logging.getLogger("mha_course.grader.nbclient")
_QUIET_LOG.addHandler(logging.NullHandler())
_QUIET_LOG.propagate = False


# asyncio's note about nbclient's output reader of a cell the grader interrupted says nothing to the reader.
logging.getLogger("asyncio").addFilter(lambda record: not (
    record.getMessage().startswith("Task exception was never retrieved") and record.exc_info
    and isinstance(record.exc_info[1], queue.Empty)))


def python_source(source: str) -> str:
    """A cell's source as plain Python: IPython's magics and shell escapes become calls.

    >>> python_source("%time x = 1").strip()
    "get_ipython().run_line_magic('time', 'x = 1')"
    """
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # no IPython, or a cell it cannot read: as it is (it will not parse either)
        return source


def _after(later: list[int]) -> str:
    return f"; the {len(later)} code cell(s) after it did not run" if later else ""


FALLBACK_KERNEL = "python3"  # the kernel a notebook runs on when the one it names is not installed


def kernel_for(notebook: dict, events: list[str]) -> str:
    """The kernel the notebook (its JSON) names, or :data:`FALLBACK_KERNEL` (noted in ``events``) where none
    of that name is installed: the chapters run on any Python kernel with the package."""
    wanted = ((notebook.get("metadata") or {}).get("kernelspec") or {}).get("name") or FALLBACK_KERNEL
    with suppress(Exception):  # no readable kernel specs at all: the fallback still runs
        if wanted == FALLBACK_KERNEL or wanted in KernelSpecManager().find_kernel_specs():
            return wanted
    events.append(f"the notebook names the kernel {wanted!r}, which is not installed here: it ran on "
                  f"{FALLBACK_KERNEL}")
    return FALLBACK_KERNEL


class _WrappedKernelManager(AsyncKernelManager):
    """A kernel manager that starts the kernel's command through ``wrap`` (into a sandbox)."""

    def format_kernel_cmd(self, extra_arguments=None):
        return self.wrap(super().format_kernel_cmd(extra_arguments))


class NotebookRun:
    """The kernel of the notebook at ``path`` (then in :attr:`notebook`, with its outputs), working in ``folder``,
    started through ``wrap`` (into a sandbox) before nbclient is imported; what happens goes to ``events``."""

    #: What a kernel imports before the notebook runs (while the notebook before it runs, if started ahead),
    #: binding no name the notebook could read; and the seconds it is given for that.
    WARM_UP = ("import torch as _warm, matplotlib.pyplot as _warm, mha_course.plots as _warm, "
               "mha_course.exercises as _warm; _warm = _warm.EXERCISES; "
               "import mha_course.exercises.probes as _warm; _warm.prepare_meta(); del _warm")
    WARM_UP_TIMEOUT = 120

    def __init__(self, path: Path, folder: Path, events: list[str],
                 wrap: Callable[[list[str]], list[str]] | None = None, env: dict[str, str] | None = None):
        self.path, self.folder, self.events, self.env, self.notebook = path, folder, events, env, None
        kernel = kernel_for(json.loads(path.read_text(encoding="utf-8")), events)
        self.km = _WrappedKernelManager(kernel_name=kernel, transport="ipc",
                                        ip=str(folder / "k"), connection_file=str(folder / "kernel.json"))
        self.km.wrap = wrap or list
        with suppress(Exception):  # no such kernel: starting it says so
            self.km.kernel_spec.interrupt_mode = "message"
        self.ran: set[int] = set()  # cells that ran to their end (with or without an error)
        self.not_run: dict[int, str] = {}  # cell index -> why it did not run to its end
        self.exit_cell: int | None = None  # the cell that called exit(), if one did
        self.timed_out: set[int] = set()  # cells stopped, or never started, because a time limit was up

    def start_kernel(self) -> None:
        """Start the kernel now (ahead of :meth:`run`'s turn, if called then), silent."""
        arguments = [f"--IPKernelApp.exec_lines={self.WARM_UP}", "--HistoryManager.hist_file=:memory:"]
        if not self.km.has_kernel:
            run_sync(self.km.start_kernel)(extra_arguments=arguments, cwd=str(self.folder), env=self.env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def read(self) -> None:
        """Read the notebook (importing nbformat and nbclient the first time), ready to run."""
        import nbformat
        from nbclient import NotebookClient

        if self.notebook is None:
            self.notebook = nbformat.read(self.path, as_version=4)
            self.client = NotebookClient(
                self.notebook, km=self.km, timeout=None, allow_errors=True, interrupt_on_timeout=False,
                record_timing=False, startup_timeout=self.WARM_UP_TIMEOUT, log=_QUIET_LOG,  # errors go in the table
                on_cell_executed=self._executed, shutdown_kernel="immediate")  # killed: no clean-up code of the notebook's runs

    def run(self, timeout: float, cell_timeout: float, then: Callable[[], None] = lambda: None) -> bool:
        """Run every code cell, ``then()`` once the kernel has started; shut it down; True if it started."""
        started = False
        try:
            self.read()
            self.start_kernel()
            with self.client.setup_kernel(cleanup_kc=True):
                started = True
                then()
                self.run_notebook(timeout, cell_timeout)
        except Exception as error:  # the kernel would not start, or died on shutdown
            if not started:
                self.events.append(f"the notebook could not be run: {type(error).__name__}: {first_line(str(error))}")
        finally:
            self.stop_kernel()
        return started

    def stop_kernel(self) -> None:
        """Shut the kernel down (one started ahead and never run, too), and its sandbox with it."""
        with suppress(Exception):  # already gone
            if self.km.has_kernel:
                run_sync(self.km.shutdown_kernel)(now=True)

    def _executed(self, cell, cell_index, execute_reply) -> None:
        payloads = (execute_reply or {}).get("content", {}).get("payload", []) or []
        if any(p.get("source") == "ask_exit" for p in payloads):
            self.exit_cell = cell_index

    def name(self, index: int) -> str:
        """How reports name a cell: its number counting every cell, and its first line: ``cell 7 (`x = 1`)``."""
        first = first_line(self.notebook.cells[index].source, limit=60)
        return f"cell {index + 1} (`{first}`)" if first else f"cell {index + 1} (empty)"

    def execute(self, cell, index: int, timeout: float) -> str:
        """Execute one cell within ``timeout`` seconds; return "ok", "timeout" or "dead"."""
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        self.client.timeout = max(1, int(math.ceil(timeout)))
        try:
            self.client.execute_cell(cell, index)
            return "ok"
        except CellTimeoutError:
            with suppress(Exception):  # the kernel may be gone already
                run_sync(self.km.interrupt_kernel)()  # the manager is asynchronous
            return "timeout"
        except DeadKernelError:
            return "dead"

    def _stop(self, rest: list[int], why: str) -> None:
        self.not_run.update({index: self.not_run.get(index, why) for index in rest})

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
                self.events.append(f"timed out: the notebook's {timeout:g} s were up before {self.name(index)} "
                                   f"(raise it with --timeout SECONDS); it and the {len(later)} code cell(s) after it "
                                   "did not run")
                self._stop([index, *later], f"the notebook timed out ({timeout:g} s, raise it with --timeout SECONDS) "
                                            f"before {self.name(index)}")
                self.timed_out.update([index, *later])
                return
            limit = min(cell_timeout, remaining)
            outcome = self.execute(cell, index, limit)
            if outcome == "timeout":
                which = ("the limit for one cell; raise it with --cell-timeout SECONDS" if limit == cell_timeout else
                         f"the notebook's {timeout:g} s were up; raise it with --timeout SECONDS")
                self.events.append(f"timed out: {self.name(index)} was still running after {limit:g} s "
                                   f"({which}); it was interrupted")
                self.not_run[index] = f"{self.name(index)} timed out after {limit:g} s ({which})"
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
