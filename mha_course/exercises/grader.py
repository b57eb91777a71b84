"""The grader: execute completed notebooks and score their exercises.

For each notebook the grader

1. runs a copy of it, in a temporary folder of its own (with a copy of the ``data/`` folder next to
   it), in a Jupyter kernel that imports a private copy of the package
   (:mod:`mha_course.exercises.package_files`). Each cell has a time limit and the notebook has one
   as a whole; a cell that raises or runs too long is reported and the run goes on, as "Run all"
   would with errors allowed; a kernel that dies, or a cell that calls ``exit()``, ends the run and
   is blamed on the cell that did it. The learner's file is never written to. What the notebook
   printed is kept, to compare with the verdicts;
2. checks that the notebook did not change the package's files, neither the installed ones nor its
   private copy; one that did is not scored, and the installed files are written back before the
   next notebook;
3. finds the answers in a *fresh* process (:mod:`mha_course.exercises.kernel_side`), against
   another private copy of the package: it replays only the statements of the cells that ran which
   define names (imports, ``def``, ``class``, plain assignments; see
   :mod:`mha_course.exercises.definitions`), probes each answer by its name
   (``build_causal_mask``, ...) as ``check`` does, and sends back what the answer did as plain data.
   Patches of torch or of the package made by the notebook's other cells never run there, and an
   answer that changes them while it is checked is not scored;
4. judges those records against the package's reference in its own process, which never ran any
   notebook code, and reports every disagreement between the verdict and the line the notebook
   printed, in either direction;
5. prints a score table (and writes JSON on request).

Cells are named by their number, counting every cell from the top (Markdown included), and by
their first line, as in ``cell 7 (`ratio = 1 / 0`)``.

Command line::

    python -m mha_course grade NOTEBOOK... [--json FILE] [--timeout SECONDS] [--cell-timeout SECONDS]
                                           [--check-timeout SECONDS] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import logging
import marshal
import math
import os
import queue
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync

from ..progress_bar import ProgressBar
from . import EXERCISES
from .definitions import defined_names
from .framework import (ERROR, FAIL_MARK, MISSING, NOT_IMPLEMENTED, PASS_MARK, PASSED, WAITING_MARK, judge)
from .kernel_side import to_record
from .package_files import PackageSnapshot

_QUIET_LOG = logging.getLogger("mha_course.grader.nbclient")
_QUIET_LOG.addHandler(logging.NullHandler())
_QUIET_LOG.propagate = False


def _not_an_interrupted_cell(record: logging.LogRecord) -> bool:
    """Drop asyncio's note about nbclient's output reader of a cell the grader interrupted."""
    return not (record.getMessage().startswith("Task exception was never retrieved") and record.exc_info
                and isinstance(record.exc_info[1], queue.Empty))


logging.getLogger("asyncio").addFilter(_not_an_interrupted_cell)

# The statuses the grader adds to those of the checks (passed, failed, not implemented, missing, error).
TIMED_OUT = "timed out"  # the answer was still running when its check's time was up
NOT_RUN = "not run"  # the cell defining the answer never ran (time-out, dead kernel, exit())
NOT_SCORED = "not scored"  # the notebook changed the package or the checking code
NOT_CHECKED = "not checked"  # the notebook's kernel could not be started

#: Default limits, in seconds. Every chapter runs in well under a minute on a two-core machine and
#: its slowest cell in a few seconds, so these leave a wide margin and still stop a runaway loop soon.
NOTEBOOK_TIMEOUT = 120.0
CELL_TIMEOUT = 30.0
CHECK_TIMEOUT = 30.0
ANSWER_PROCESS_START = 120.0  # for the answer process to import torch and replay the definitions

_CHECK_CALL = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")
_CHAPTER_FILE = re.compile(r"^(\d+)_")
_PRINTED = re.compile(rf"^({PASS_MARK}|{WAITING_MARK}|{FAIL_MARK}) (\d+\.\d+)\b", re.MULTILINE)
_DATA_FOLDER = "data"


@dataclass
class ExerciseScore:
    """The grader's verdict on one exercise of one notebook."""

    id: str
    title: str
    status: str
    points: int
    checks_passed: int
    checks_total: int
    line: str
    notebook_printed: str | None = None  # the verdict line the notebook itself printed, if any


@dataclass
class NotebookReport:
    """Everything the grader found out about one notebook."""

    notebook: str
    exercises: list[ExerciseScore] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # what happened while it ran, in order
    seconds: float = 0.0

    @property
    def score(self) -> int:
        return sum(e.points for e in self.exercises)

    @property
    def max_score(self) -> int:
        return len(self.exercises)

    def to_dict(self) -> dict:
        return {"notebook": self.notebook, "score": self.score, "max_score": self.max_score,
                "events": self.events, "seconds": round(self.seconds, 1),
                "exercises": [asdict(e) for e in self.exercises]}

    @classmethod
    def from_dict(cls, data: dict) -> "NotebookReport":
        return cls(data["notebook"], [ExerciseScore(**e) for e in data["exercises"]], list(data["events"]),
                   data.get("seconds", 0.0))


def exercises_for(notebook: nbformat.NotebookNode, path: Path) -> list[str]:
    """The exercises to grade: every exercise of each chapter the notebook belongs to.

    A chapter is recognised from the ``check("2.1", ...)`` calls in the notebook and from a file
    name starting with the chapter number (``02_...``), so deleting a check cell does not take
    that exercise off the score table.
    """
    chapters = set()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            chapters.update(int(found.split(".")[0]) for found in _CHECK_CALL.findall(cell.source))
    match = _CHAPTER_FILE.match(path.name)
    if match:
        chapters.add(int(match.group(1)))
    return [eid for eid, exercise in EXERCISES.items() if exercise.chapter in chapters]


def _printed_verdicts(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """The last verdict line the executed notebook printed for each exercise."""
    printed = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                for line in output.get("text", "").splitlines():
                    match = _PRINTED.match(line)
                    if match:
                        printed[match.group(2)] = line
    return printed


def _first_line(text: str, limit: int = 200) -> str:
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
    first = _first_line(notebook.cells[index].source, limit=60)
    return f"cell {index + 1} (`{first}`)" if first else f"cell {index + 1} (empty)"


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _code(source: str) -> str:
    """A cell's source as plain Python: IPython's magics and shell escapes become calls."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # without IPython a cell with magics simply does not parse
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # a cell IPython cannot read: leave it as it is (it will not parse either)
        return source


class _Run:
    """One notebook's kernel: execute cells with deadlines, note what happens."""

    def __init__(self, notebook: nbformat.NotebookNode, folder: Path, report: NotebookReport):
        self.notebook = notebook
        self.report = report
        self.client = NotebookClient(
            notebook, timeout=None, allow_errors=True, interrupt_on_timeout=False, record_timing=False,
            kernel_name=notebook.metadata.get("kernelspec", {}).get("name", "python3"),
            resources={"metadata": {"path": str(folder)}},
            log=_QUIET_LOG,  # time-outs and errors are reported in the score table instead
            on_cell_executed=self._executed, shutdown_kernel="immediate",
        )
        self.ran: set[int] = set()  # cells that ran to their end (with or without an error)
        self.not_run: dict[int, str] = {}  # cell index -> why it did not run to its end
        self.exit_cell: int | None = None  # the cell that called exit(), if one did

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

    def run_notebook(self, timeout: float, cell_timeout: float) -> None:
        deadline = time.monotonic() + timeout
        code = [i for i, c in enumerate(self.notebook.cells) if c.cell_type == "code"]
        for position, index in enumerate(code):
            cell, later = self.notebook.cells[index], code[position + 1:]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.report.events.append(f"ran out of time ({_seconds(timeout)} for the whole notebook) before "
                                          f"{self.name(index)}; it and the {len(later)} code cell(s) after it did "
                                          "not run")
                self._stop([index, *later], f"the notebook ran out of time ({_seconds(timeout)}) before "
                                            f"{self.name(index)}")
                return
            limit = min(cell_timeout, remaining)
            outcome = self.execute(cell, index, limit)
            if outcome == "timeout":
                which = ("the limit for one cell" if limit == cell_timeout else
                         f"the notebook's {_seconds(timeout)} were up")
                self.report.events.append(f"timed out: {self.name(index)} was still running after "
                                          f"{_seconds(limit)} ({which}); it was interrupted")
                self.not_run[index] = f"{self.name(index)} timed out"
                continue
            if outcome == "dead":
                if self.exit_cell is not None:  # exit() ends the kernel only after its cell's reply
                    blamed = self.exit_cell
                    self.report.events.append(f"{self.name(blamed)} called exit(): the kernel stopped"
                                              + _after([i for i in code if i > blamed]))
                    why = f"{self.name(blamed)} called exit(), which stopped the kernel"
                    self._stop([i for i in code if i > blamed], why)
                else:
                    self.report.events.append(f"the kernel died while running {self.name(index)} (did it exit or "
                                              f"crash Python?)" + _after(later))
                    self._stop([index, *later], f"the kernel died in {self.name(index)}")
                return
            self.ran.add(index)
            for output in cell.outputs:
                if output.get("output_type") == "error":
                    self.report.events.append(f"{self.name(index)} raised {output.get('ename')}: "
                                              f"{_first_line(output.get('evalue', ''))}")
            if self.exit_cell is not None:
                self.report.events.append(f"{self.name(self.exit_cell)} called exit(): the kernel stopped" + _after(later))
                self._stop(later, f"{self.name(self.exit_cell)} called exit(), which stopped the kernel")
                return


def _after(later: list[int]) -> str:
    return f"; the {len(later)} code cell(s) after it did not run" if later else ""


def _score(exercise_id: str, status: str, line: str, checks_passed: int = 0) -> ExerciseScore:
    exercise = EXERCISES[exercise_id]
    return ExerciseScore(exercise_id, exercise.title, status, int(status == PASSED), checks_passed,
                         len(exercise.checks), line)


def _data_copy(source: Path, target: Path) -> None:
    data = source.parent / _DATA_FOLDER
    if data.is_dir():
        shutil.copytree(data, target / _DATA_FOLDER, ignore=shutil.ignore_patterns(".*", "__pycache__"))


class _Frames:
    """Reads the answer process's frames (4-byte length, marshal payload) with deadlines."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def next(self, deadline: float):
        """The next frame; ``"timeout"`` when the deadline passes first, ``None`` at the end."""
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + size:
                    data, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
                    try:
                        return marshal.loads(data)
                    except (ValueError, EOFError, TypeError):
                        return None
            if self.closed:
                return None
            wait = deadline - time.monotonic()
            if wait <= 0:
                return "timeout"
            ready, _, _ = select.select([self.fd], [], [], wait)
            if ready:
                chunk = os.read(self.fd, 1 << 20)
                if chunk:
                    self.buffer += chunk
                else:
                    self.closed = True


class _AnswerProcess:
    """One run of :mod:`mha_course.exercises.kernel_side` in a fresh Python process."""

    def __init__(self, package: Path, folder: Path):
        read, write = os.pipe()
        self.stderr = tempfile.TemporaryFile(dir=folder)
        boot = ("import sys; sys.path.insert(0, sys.argv[2]); "
                "from mha_course.exercises.kernel_side import main; main()")
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", boot, str(write), str(package)], cwd=folder, pass_fds=(write,),
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.stderr)
        os.close(write)
        self.frames = _Frames(read)
        self.read = read
        self.is_ready = False

    def ready(self, deadline: float) -> bool:
        """Wait until the process has imported everything (``False`` if it does not in time)."""
        self.is_ready = self.is_ready or self.frames.next(deadline) == ("ready",)
        return self.is_ready

    def send(self, work: dict) -> None:
        try:
            self.process.stdin.write(marshal.dumps(work))
            self.process.stdin.close()
        except OSError:  # it died already; the frames will say so
            pass

    def why_it_ended(self) -> str:
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        self.stderr.seek(0)
        lines = [ln for ln in self.stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        code = self.process.returncode
        return f"exit code {code}" + (f": {_first_line(lines[-1])}" if lines else "")

    def close(self) -> None:
        if self.read < 0:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        os.close(self.read)
        self.read = -1
        self.stderr.close()


def _answer_records(snapshot: PackageSnapshot, folder: Path, cells: list[tuple[int, str]],
                    answers: list[tuple[str, str]], check_timeout: float, first: _AnswerProcess | None = None
                    ) -> dict[str, tuple]:
    """Replay the definitions and probe every answer in fresh processes; one result per exercise:
    ``("record", data)``, ``("tampered", names)``, ``(TIMED_OUT,)`` or ``(ERROR, why)``.

    ``first`` is a process started already. A definition whose replay raises (say ``x = mha.mask``
    after ``mha = ...`` was left out) is not reported: what matters is whether the answers work."""
    results: dict[str, tuple] = {}
    remaining = list(answers)
    attempt = 0
    while remaining:
        attempt += 1
        if attempt == 1 and first is not None:
            process = first
        else:
            process = _AnswerProcess(snapshot.write_copy(folder / f"package-{attempt}"), folder)
        try:
            process.ready(time.monotonic() + ANSWER_PROCESS_START)
            process.send({"cells": cells, "answers": remaining})
            frame = process.frames.next(time.monotonic() + ANSWER_PROCESS_START)
            if not (isinstance(frame, tuple) and frame[0] == "replayed"):
                why = ("it did not start within " + _seconds(ANSWER_PROCESS_START) if frame == "timeout"
                       else process.why_it_ended())
                for exercise_id, _ in remaining:
                    results[exercise_id] = (ERROR, f"the answers could not be replayed ({why})")
                return results
            while remaining:
                exercise_id, answer_name = remaining[0]
                frame = process.frames.next(time.monotonic() + ANSWER_PROCESS_START)
                if frame == ("start", exercise_id):
                    frame = process.frames.next(time.monotonic() + check_timeout)
                if frame == "timeout":
                    results[exercise_id] = (TIMED_OUT,)
                elif isinstance(frame, tuple) and frame[:2] == ("record", exercise_id):
                    results[exercise_id] = ("record", frame[2])
                elif isinstance(frame, tuple) and frame[:2] == ("tampered", exercise_id):
                    results[exercise_id] = ("tampered", list(frame[2]))
                else:
                    results[exercise_id] = (ERROR, f"the process checking {answer_name} ended "
                                                   f"({process.why_it_ended()}); did the answer exit?")
                remaining.pop(0)
                if results[exercise_id][0] not in ("record",):
                    break  # start afresh for the rest: this process is stuck, gone or not to be trusted
        finally:
            process.close()
    return results


class _Watch:
    """Notebooks being graded at the same time, so that an edit to the installed package found by
    one of them withholds the score of every notebook that was running when it was found."""

    def __init__(self, snapshot: PackageSnapshot):
        self.snapshot = snapshot
        self.lock = threading.Lock()
        self.running: dict[int, list[str]] = {}

    def start(self) -> int:
        with self.lock:
            key = max(self.running, default=0) + 1
            while key in self.running:
                key += 1
            self.running[key] = []
            return key

    def check(self, key: int) -> list[str]:
        """The installed files changed while ``key`` ran (then written back); ``[]`` if none."""
        with self.lock:
            changed = self.snapshot.changed()
            self.snapshot.restore()  # also deletes compiled files that are new or differ
            if changed:
                for others in self.running.values():
                    others.extend(name for name in changed if name not in others)
            return list(self.running[key])

    def finish(self, key: int) -> list[str]:
        found = self.check(key)
        with self.lock:
            del self.running[key]
        return found


def grade_notebook(path: Path, timeout: float = NOTEBOOK_TIMEOUT, check_timeout: float = CHECK_TIMEOUT,
                   cell_timeout: float = CELL_TIMEOUT, snapshot: PackageSnapshot | None = None,
                   watch: _Watch | None = None) -> NotebookReport:
    """Execute a copy of the notebook at ``path`` and score its exercises. Never raises for a
    broken or hostile notebook: what went wrong is in the report's ``events``.

    ``snapshot`` is the package as grading found it (read now if not given); ``watch`` is shared by
    notebooks graded at the same time.
    """
    report = NotebookReport(str(path))
    started = time.monotonic()
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as error:
        report.events.append(f"could not read the notebook: {type(error).__name__}: {_first_line(str(error))}")
        return report
    exercise_ids = exercises_for(notebook, path)
    if not exercise_ids:
        report.events.append("no exercises found: the notebook calls no check(...) and its name does not "
                             "start with a chapter number")
    snapshot = snapshot or PackageSnapshot()
    watch = watch or _Watch(snapshot)
    key = watch.start()
    withheld = False
    try:
        with tempfile.TemporaryDirectory(prefix="mha-course-grade-") as folder:
            withheld = _grade_in(Path(folder), path, notebook, exercise_ids, report, snapshot, watch, key,
                                 timeout, cell_timeout, check_timeout)
    finally:
        edited = watch.finish(key)
    if edited and not withheld:
        _withhold(report, exercise_ids, f"the package's installed files were changed while this notebook ran "
                                        f"({_listed(edited)}); they were written back")
    report.seconds = time.monotonic() - started
    return report


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _withhold(report: NotebookReport, exercise_ids: list[str], why: str) -> None:
    report.events.append(f"not scored: {why}")
    report.exercises = [_score(eid, NOT_SCORED, f"{FAIL_MARK} {eid}: not scored: {why}") for eid in exercise_ids]


def _grade_in(folder: Path, path: Path, notebook: nbformat.NotebookNode, exercise_ids: list[str],
              report: NotebookReport, snapshot: PackageSnapshot, watch: _Watch, key: int,
              timeout: float, cell_timeout: float, check_timeout: float) -> bool:
    """Grade into ``report``; True if the notebook's score was withheld."""
    run_folder = folder / "run"
    run_folder.mkdir()
    # Work on a copy in a folder of its own: files the notebook writes land there, and the
    # learner's notebook is never touched.
    shutil.copyfile(path, run_folder / path.name)
    _data_copy(path, run_folder)
    package = snapshot.write_copy(folder / "package")
    run = _Run(nbformat.read(run_folder / path.name, as_version=4), run_folder, report)
    # The answer process starts now, from a copy of its own, and imports everything while the
    # kernel starts; the notebook's first cell runs only once it has.
    answer_folder = folder / "answers"
    answer_folder.mkdir()
    answers = _AnswerProcess(snapshot.write_copy(answer_folder / "package-1"), answer_folder)
    try:
        return _run_and_judge(run, answers, folder, package, answer_folder, exercise_ids, report, snapshot, watch,
                              key, timeout, cell_timeout, check_timeout)
    finally:
        answers.close()


def _run_and_judge(run: _Run, answers: _AnswerProcess, folder: Path, package: Path, answer_folder: Path,
                   exercise_ids: list[str], report: NotebookReport, snapshot: PackageSnapshot, watch: _Watch,
                   key: int, timeout: float, cell_timeout: float, check_timeout: float) -> bool:
    inherited = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(package) + (os.pathsep + inherited if inherited else ""),
           "PYTHONDONTWRITEBYTECODE": "1"}
    started = False
    try:
        # The kernel's own log lines (e.g. its warning about TCP transport) would clutter the table.
        with run.client.setup_kernel(stderr=subprocess.DEVNULL, env=env):
            started = True
            answers.ready(time.monotonic() + ANSWER_PROCESS_START)
            run.run_notebook(timeout, cell_timeout)
    except Exception as error:  # the kernel would not start, or died on shutdown
        if not started:
            report.events.append(f"the notebook could not be run: {type(error).__name__}: "
                                 f"{_first_line(str(error))}")
    printed = _printed_verdicts(run.notebook)
    if not started:
        report.exercises = [_score(eid, NOT_CHECKED, f"{FAIL_MARK} {eid}: not checked: the notebook's kernel "
                                   "did not start") for eid in exercise_ids]
        return False
    installed = watch.check(key)
    copy = sorted({*snapshot.changed_in(package), *snapshot.changed_in(answer_folder / "package-1")})
    if installed or copy:
        _withhold(report, exercise_ids, f"the notebook changed the package's files ({_listed(sorted({*installed, *copy}))})"
                                        + ("; the installed ones were written back" if installed else ""))
        return True
    if not exercise_ids:
        return False
    cells = [(i + 1, _code(run.notebook.cells[i].source)) for i in sorted(run.ran)]
    wanted = [(eid, EXERCISES[eid].answer_name) for eid in exercise_ids]
    results = _answer_records(snapshot, answer_folder, cells, wanted, check_timeout,
                              first=answers if answers.is_ready else None)
    edited = sorted({name for copy in answer_folder.glob("package-*") for name in snapshot.changed_in(copy)})
    if edited:
        _withhold(report, exercise_ids, f"while its answers were checked, the notebook's code changed the package's "
                                        f"files ({_listed(edited)})")
        return True
    definers = {i: defined_names(_code(c.source)) for i, c in enumerate(run.notebook.cells) if c.cell_type == "code"}
    for exercise_id in exercise_ids:
        report.exercises.append(_verdict(exercise_id, results.get(exercise_id, (ERROR, "no result")), run, definers,
                                         check_timeout))
    for score in report.exercises:
        score.notebook_printed = printed.get(score.id)
        if score.notebook_printed:
            printed_pass = score.notebook_printed.startswith(PASS_MARK)
            if printed_pass != (score.status == PASSED):
                report.events.append(f"{score.id}: the notebook printed {'a pass' if printed_pass else 'no pass'} "
                                     f"({_first_line(score.notebook_printed, 80)}), but the grader's own check "
                                     f"says {score.status}")
    return False


def _verdict(exercise_id: str, result: tuple, run: _Run, definers: dict[int, set[str]],
             check_timeout: float) -> ExerciseScore:
    exercise = EXERCISES[exercise_id]
    name = exercise.answer_name
    kind = result[0]
    if kind == TIMED_OUT:
        return _score(exercise_id, TIMED_OUT, f"{FAIL_MARK} {exercise_id}: {name} was still running after "
                                              f"{_seconds(check_timeout)} (--check-timeout)")
    if kind == "tampered":
        changed = ", ".join(result[1])
        return _score(exercise_id, NOT_SCORED, f"{FAIL_MARK} {exercise_id}: not scored: while {name} was defined or "
                                               f"checked, the notebook's code changed {changed}")
    if kind == ERROR:
        return _score(exercise_id, ERROR, f"{FAIL_MARK} {exercise_id}: could not be checked: {result[1]}")
    verdict = judge(exercise, to_record(result[1]))
    if verdict.status != PASSED and "is not defined" in verdict.line:
        return _score(exercise_id, verdict.status, f"{verdict.line} (The grader runs the answers with only the "
                      "notebook's imports, def and class statements and plain assignments: set what the answer uses "
                      "there, not as a side effect of other code.)", verdict.checks_passed)
    if verdict.status == MISSING:
        unrun = [i for i, names in definers.items() if name in names and i not in run.ran]
        if unrun:
            why = run.not_run.get(unrun[0], f"{run.name(unrun[0])} did not run")
            return _score(exercise_id, NOT_RUN, f"{FAIL_MARK} {exercise_id}: not run: {why}; {name} is defined in "
                                                f"{run.name(unrun[0])}, which did not run to its end")
    return _score(exercise_id, verdict.status, verdict.line, verdict.checks_passed)


def grade(paths: list[Path], timeout: float = NOTEBOOK_TIMEOUT, check_timeout: float = CHECK_TIMEOUT,
          progress: bool = True, cell_timeout: float = CELL_TIMEOUT, jobs: int = 1) -> list[NotebookReport]:
    """Grade several notebooks (``jobs`` at a time), with a progress bar on stderr."""
    snapshot = PackageSnapshot()
    watch = _Watch(snapshot)
    paths = [Path(p) for p in paths]
    with ProgressBar(len(paths), "Grading", enabled=progress) as bar:
        def one(path: Path) -> NotebookReport:
            report = grade_notebook(path, timeout, check_timeout, cell_timeout, snapshot, watch)
            bar.set_note(path.name)
            bar.update()
            return report

        if jobs <= 1 or len(paths) <= 1:
            return [one(path) for path in paths]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, paths))


def format_report(reports: list[NotebookReport]) -> str:
    """The score table printed by ``python -m mha_course grade``."""
    lines = []
    for report in reports:
        lines.append(f"{report.notebook}: {report.score}/{report.max_score}")
        if report.exercises:
            lines.append(f"  {'exercise':<9}{'result':<18}{'checks':>7}  title")
            for score in report.exercises:
                checks = f"{score.checks_passed}/{score.checks_total}"
                lines.append(f"  {score.id:<9}{score.status:<18}{checks:>7}  {score.title}")
            for score in report.exercises:
                if score.status != PASSED:
                    lines.append(f"    {score.line}")
        for event in report.events:
            lines.append(f"  ! {event}")
        lines.append("")
    total = sum(r.score for r in reports)
    maximum = sum(r.max_score for r in reports)
    lines.append(f"Total: {total}/{maximum} exercises passed in {len(reports)} notebook(s)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        print(f"No such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    limits = {"--timeout": args.timeout, "--cell-timeout": args.cell_timeout, "--check-timeout": args.check_timeout}
    bad = {flag: value for flag, value in limits.items() if not value > 0}
    if bad or args.jobs < 1:
        print(", ".join(f"{flag} must be a positive number of seconds, got {value:g}" for flag, value in bad.items())
              or f"--jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    reports = grade(args.notebooks, args.timeout, args.check_timeout, cell_timeout=args.cell_timeout, jobs=args.jobs)
    print(format_report(reports))
    if args.json:
        payload = {"score": sum(r.score for r in reports), "max_score": sum(r.max_score for r in reports),
                   "notebooks": [r.to_dict() for r in reports]}
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"Scores written to {args.json}")
    return 0


__all__ = ["grade", "grade_notebook", "format_report", "cell_name", "NotebookReport", "ExerciseScore", "MISSING",
           "NOT_RUN", "NOT_SCORED", "TIMED_OUT", "NOT_CHECKED", "NOT_IMPLEMENTED"]
