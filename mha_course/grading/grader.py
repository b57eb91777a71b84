"""The grader: execute completed notebooks and score their exercises (CONTRIBUTING.md, "How grading works",
draws its processes; :mod:`mha_course.grading` states its threat model).

A grading (:class:`GradingRun`) writes the package's compiled copy and chooses the sandbox. Each notebook
(:class:`NotebookGrading`) gets a folder of its own (a copy of the notebook and its ``data/``), a kernel in
a sandbox whose only writable folder that is, and an answer process in a sandbox of its own. The kernel
runs the notebook and ends with its sandbox; the answer process replays the definitions of the cells that
ran and probes each answer; the grader judges the records and compares each verdict with the line the
notebook printed. Notebooks graded one after another overlap: once a kernel has started, the next
notebook's kernel and answer process start too, and a notebook is judged while the next one runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

import mha_course
from .. import exercises
from ..exercises.definitions import defined_names, used_globals
from ..exercises.framework import ERROR, run_seed
from ..notebook_files import DATA_FOLDER, chapter_number, data_files
from .answer_process import AnswerProcess, answer_records
from .grading_setup import (CELL_TIMEOUT, CHECK_TIMEOUT, NOTEBOOK_TIMEOUT, ONE_THREAD, GradingUnavailableError,
                            first_line, platform_problem)
from .notebook_run import NotebookRun, python_source
from .report import (NOT_CHECKED, SEED_BOUND, UNREADABLE, NotebookReport, chapters_of, compare_printed,
                     exercise_seeds, listed, printed_verdicts, verdict, withhold, wrong_chapter)
from .sandbox import NO_SANDBOX, NONE, PackageSnapshot, Sandbox, choose_sandbox, python_folders, site_folders


class GradingRun:
    """One run of the grader: the package's copy, the rest of ``PYTHONPATH``, the sandbox, a folder of its own."""

    def __init__(self, in_container: bool = False, sandbox: Sandbox | None = None):
        self.snapshot = PackageSnapshot()
        # The kernels' sockets live in its folders, and a socket's address holds at most 107 bytes.
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) < 70 else "/tmp"
        self.folder = Path(tempfile.mkdtemp(prefix="mha-grading-", dir=base))
        self.package = self.snapshot.write_copy(self.folder / "package")
        self.path = [Path(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                     if entry and not self.snapshot.is_installed_at(Path(entry))]
        self.sandbox = sandbox or choose_sandbox([self.package, *self.path, *python_folders()], in_container)
        self.numbers = itertools.count(1)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class NotebookGrading:
    """One notebook being graded, into ``report``: :meth:`start` (maybe ahead), :meth:`run_kernel`, :meth:`judge`."""

    def __init__(self, grading: GradingRun, path: Path, report: NotebookReport, limits: tuple[float, float, float]):
        self.grading, self.path, self.report, self.first = grading, path, report, None
        self.timeout, self.cell_timeout, self.check_timeout = limits
        report.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        self.chapters = chapters_of(json.loads(path.read_bytes()), path)  # its exercises once the checks load
        number = next(grading.numbers)
        self.box, self.answers = grading.folder / str(number), grading.folder / f"{number}-answers"
        env = {**figures(self.box), "PYTHONPATH": os.pathsep.join(map(str, [grading.package, *grading.path])),
               "PYTHONDONTWRITEBYTECODE": "1", "IPYTHONDIR": str(self.box / ".ipython")}
        shutil.copyfile(path, self.box / path.name)  # files the notebook writes land beside a copy
        for relative, source in data_files(path.parent).items():
            (self.box / DATA_FOLDER / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, self.box / DATA_FOLDER / relative)
        self.run = NotebookRun(self.box / path.name, self.box, report.events,
                               lambda command: grading.sandbox.wrap(self.box, command), env)
        found = [str(grading.package), *map(str, [*grading.path, *site_folders()])]  # where it imports from
        self.processes = (AnswerProcess(grading.sandbox, box, found, env=figures(box))
                          for box in map(lambda n: self.answers / str(n), itertools.count(1)))

    def start(self) -> None:
        """Start the kernel and the first answer process now (what does not start starts, or says why, later)."""
        try:
            self.run.start_kernel()
            self.first = next(self.processes) if self.chapters else None
        except Exception:  # noqa: BLE001
            pass

    def run_kernel(self, then=lambda: None) -> None:
        """Run the notebook in its kernel (``then()`` once it has started), the checks loading meanwhile."""
        try:
            self.run.read()
        except Exception:  # noqa: BLE001 - run() says why
            pass
        threading.Thread(target=getattr, args=(exercises, "EXERCISES"), daemon=True).start()
        self.started = self.run.run(self.timeout, self.cell_timeout, then)

    def judge(self) -> float:
        """Judge the answers, into the report; end this notebook's processes and folders; return the time."""
        try:
            self._judge()
        finally:
            self.close()
        return time.monotonic()

    def close(self) -> None:
        self.run.stop_kernel()
        if self.first:
            self.first.close()
        shutil.rmtree(self.box, ignore_errors=True)
        shutil.rmtree(self.answers, ignore_errors=True)

    def _answer_process(self) -> AnswerProcess:
        process, self.first = self.first, None
        return process or next(self.processes)

    def _judge(self) -> None:
        report = self.report
        exercise_ids = [eid for eid, e in exercises.EXERCISES.items() if e.chapter in self.chapters]
        if not exercise_ids:
            report.events.append("no exercises found: the notebook calls no check(...) and its name does not "
                                 "start with a chapter number")
        if not self.started:
            return withhold(report, exercise_ids, "the notebook's kernel did not start", NOT_CHECKED)
        if self._edited():
            return withhold(report, exercise_ids, f"the notebook changed the package's files ({listed(self.edited)})")
        if not exercise_ids:
            return
        notebook = self.run.notebook
        codes = {i: python_source(c.source) for i, c in enumerate(notebook.cells) if c.cell_type == "code"}
        wanted = [(eid, exercises.EXERCISES[eid].answer_name) for eid in exercise_ids]
        seeds = exercise_seeds(report.seed, exercise_ids)
        results = answer_records(self._answer_process, [(i + 1, codes[i]) for i in sorted(self.run.ran)], wanted,
                                 self.check_timeout, self.timeout, seeds)
        if self._edited():
            return withhold(report, exercise_ids, f"while its answers were checked, the notebook's code changed the "
                                                  f"package's files ({listed(self.edited)})")
        used = used_globals(list(codes.values()), {name for _, name in wanted})
        definers = {i: defined_names(code, used) for i, code in codes.items()}
        for exercise_id in exercise_ids:
            report.exercises.append(verdict(exercise_id, results.get(exercise_id, (ERROR, "no result")), self.run,
                                            definers, self.check_timeout))
            report.exercises[-1].seed = seeds[exercise_id]
        compare_printed(report, printed_verdicts(notebook))
        wrong_chapter(report)

    def _edited(self) -> list[str]:
        """The files of the package's copy the notebook changed (unsandboxed), the copy then written afresh."""
        self.edited = self.grading.snapshot.changed_in(self.grading.package)
        if self.edited:
            shutil.rmtree(self.grading.package / "mha_course", ignore_errors=True)
            self.grading.snapshot.write_copy(self.grading.package)
        return self.edited


def figures(box: Path) -> dict[str, str]:
    """The environment of a process working in ``box``: its home and temporary folder, one PyTorch thread,
    matplotlib's font list as the grader's user has it (building one takes a while), figures not drawn."""
    fonts = Path(os.environ.get("MPLCONFIGDIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "matplotlib")
    (box / ".matplotlib").mkdir(parents=True)
    for found in fonts.glob("fontlist-*.json"):
        shutil.copyfile(found, box / ".matplotlib" / found.name)
    return {**ONE_THREAD, **os.environ, "HOME": str(box), "TMPDIR": str(box), "MPLCONFIGDIR": str(box / ".matplotlib"),
            "MPLBACKEND": "agg"}


def prepared(grading: GradingRun, path: Path, seed: int | None,
             limits) -> tuple[NotebookReport, NotebookGrading | None]:
    """The report of the notebook at ``path`` and its grading, laid out (None, and why, if it cannot be read)."""
    report = NotebookReport(str(path), seed=run_seed() if seed is None else seed % SEED_BOUND,
                            package_version=mha_course.__version__, checks_sha256=grading.snapshot.checks_digest,
                            torch_version=torch.__version__, sandbox=grading.sandbox.kind)
    try:
        return report, NotebookGrading(grading, path, report, limits)
    except Exception as error:
        why = f"could not read the notebook: {type(error).__name__}: {first_line(str(error))}"
        report.events.append(why)
        withhold(report, [e for e, x in exercises.EXERCISES.items() if x.chapter == chapter_number(path.name)], why,
                 UNREADABLE)
        return report, None


def grade(paths: list[Path], timeout: float = NOTEBOOK_TIMEOUT, check_timeout: float = CHECK_TIMEOUT,
          progress: bool = True, cell_timeout: float = CELL_TIMEOUT, jobs: int = 1, seed: int | None = None,
          in_container: bool = False, require_sandbox: bool = False) -> list[NotebookReport]:
    """Grade notebooks (``jobs`` at a time, ``seed`` or fresh seeds; ``in_container``: no sandbox needed), a
    progress bar on stderr. GradingUnavailableError: no POSIX, or ``require_sandbox`` and no sandbox."""
    if platform_problem():
        raise GradingUnavailableError(platform_problem())
    grading, paths, limits = GradingRun(in_container), [Path(p) for p in paths], (timeout, cell_timeout, check_timeout)
    try:
        if grading.sandbox.kind == NONE and require_sandbox:
            raise GradingUnavailableError(f"{NO_SANDBOX} (bubblewrap cannot start here: install it, sudo apt-get "
                                          "install bubblewrap, or grade without --require-sandbox)")
        if grading.sandbox.kind == NONE:
            print(f"note: {NO_SANDBOX}", file=sys.stderr)
        with tqdm(total=len(paths), desc="Grading", disable=not progress) as bar:
            def done(report: NotebookReport) -> NotebookReport:
                bar.set_postfix_str(Path(report.notebook).name)
                bar.update()
                return report

            if jobs <= 1 or len(paths) <= 1:
                return [done(report) for report in _one_after_another(grading, paths, seed, limits)]
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                return list(pool.map(lambda path: done(*_one_after_another(grading, [path], seed, limits)), paths))
    finally:
        grading.close()


def grade_notebook(path: Path, **options) -> NotebookReport:
    """Grade one notebook (``options`` as :func:`grade`'s); what went wrong is in its report's ``events``."""
    return grade([path], progress=False, **options)[0]


def _one_after_another(grading: GradingRun, paths: list[Path], seed: int | None, limits):
    """Grade the notebooks one at a time (overlapping as the module says), yielding each report once judged."""
    ahead: dict[int, tuple[NotebookReport, NotebookGrading | None]] = {}

    def start(index: int) -> None:
        if index < len(paths) and index not in ahead:
            ahead[index] = prepared(grading, paths[index], seed, limits)
            if ahead[index][1]:
                ahead[index][1].start()

    pending = []  # (report, its judging, its turn), in order
    with ThreadPoolExecutor(max_workers=1) as judge:
        try:
            for index in range(len(paths)):
                turn = time.monotonic()
                start(index)
                report, notebook = ahead.pop(index)
                if notebook:
                    notebook.run_kernel(then=lambda after=index + 1: start(after))
                pending.append((report, judge.submit(notebook.judge) if notebook else time.monotonic(), turn))
                while len(pending) > 1 or (pending and index == len(paths) - 1):
                    report, judging, turn = pending.pop(0)  # an unread notebook's time ended at once
                    report.seconds = (judging if isinstance(judging, float) else judging.result()) - turn  # raises
                    yield report
        finally:
            for _, judging, _ in pending:
                if not isinstance(judging, float):
                    judging.result()
            for _, notebook in ahead.values():
                if notebook:
                    notebook.close()
