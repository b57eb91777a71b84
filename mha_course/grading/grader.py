"""The grader: execute completed notebooks and score their exercises.

For each notebook the grader

1. runs a copy of it, in a temporary folder of its own (with a copy of the ``data/`` folder next to
   it), in a Jupyter kernel that imports a private copy of the package
   (:mod:`mha_course.grading.package_files`). Each cell has a time limit and the notebook has one
   as a whole; a cell that raises, or runs too long ("timed out", with the limit and the flag that
   raises it), is reported and the run goes on, as "Run all" would with errors allowed; a kernel that dies, or a cell that calls ``exit()``, ends the run and
   is blamed on the cell that did it (:mod:`mha_course.grading.notebook_run`). The learner's file
   is never written to. What the notebook printed is kept, to compare with the verdicts. The kernel,
   and every process it starts, carries the notebook's token and may write only in the notebook's
   folder (:mod:`mha_course.grading.confinement`); once the kernel is gone, every process holding
   the token is ended;
2. checks that the notebook did not change the package's files, neither its private copy nor the
   installed ones; one that did is not scored. The grader never writes into the installed package
   (often a contributor's working tree): an installed file that changed is reported and left as
   it is (:mod:`mha_course.grading.package_files`);
3. finds the answers in a *fresh* process, started only then and confined likewise
   (:mod:`mha_course.grading.answer_process`, which runs :mod:`mha_course.grading.answer_probing`),
   against another private copy of the package. On Linux that process is forked from the grading's
   answer server, which imported torch and the checks from the snapshot before any notebook ran and
   never runs a notebook's code (:mod:`mha_course.grading.answer_server`). The process replays only
   the statements of the cells that
   ran which define names (imports, ``def``, ``class``, plain assignments, the assignments of what
   those definitions read, every assignment to an answer's name; see
   :mod:`mha_course.exercises.definitions`), probes each answer by its name
   (``build_causal_mask``, ...) as ``check`` does, and sends back what the answer did as plain data.
   Patches of torch or of the package made by the notebook's other cells never run there;
4. judges those records against the package's reference in its own process, which never ran any
   notebook code, and reports every disagreement between the verdict and the line the notebook
   printed, in either direction (:mod:`mha_course.grading.report`);
5. prints a score table (and writes JSON on request).

A notebook's kernel runs its figures' code but draws none (``MPLBACKEND=agg``): the grader shows no
figure, and drawing one takes longer than building it.

Notebooks graded one after another overlap. Once a notebook's kernel has started, the next
notebook's kernel is started too (laid out, confined and given its token as any kernel): it imports
torch, matplotlib, the package's figures and its checks while this one runs, and runs none of its
notebook's code before its turn. And a notebook's answers are checked while the next notebook runs:
its own kernel, and every process that kernel started, are ended by then. Each report's ``seconds``
count from the notebook's turn to its verdict. Where Landlock keeps each notebook's processes apart
(:mod:`mha_course.grading.confinement`), no notebook can reach the other's processes.

Cells are named by their number, counting every cell from the top (Markdown included), and by
their first line, as in ``cell 7 (`ratio = 1 / 0`)``. Grading needs Linux or macOS (WSL on
Windows): see :mod:`mha_course.grading.grading_setup`.

The command line, ``python -m mha_course grade``, is :mod:`mha_course.grading.gradebook`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import sys
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

import mha_course
from tqdm import tqdm
from ..exercises import EXERCISES
from .answer_process import TIMED_OUT, answer_records
from .answer_server import AnswerServer, available
from .answer_probing import replayed_names
from .confinement import TOKEN_VARIABLE, sweep
from ..exercises.definitions import defined_names
from ..exercises.framework import ERROR, MISSING, NOT_IMPLEMENTED
from .grading_setup import (CELL_TIMEOUT, CHECK_TIMEOUT, NOTEBOOK_TIMEOUT, ONE_THREAD, GradingUnavailableError,
                            require_grading_platform)
from ..notebook_files import DATA_FOLDER, data_files
from .notebook_run import NotebookRun, cell_name, first_line, python_source
from .package_files import EditWatch, PackageSnapshot, environment_changes, environment_files, planted_bytecode
from .seeds import exercise_seeds, grading_seed
from .report import (NOT_CHECKED, NOT_RUN, NOT_SCORED, ExerciseScore, NotebookReport, compare_printed,
                     exercises_for, format_report, listed, not_checked, printed_verdicts, verdict, withhold)


def grade_notebook(path: Path, timeout: float = NOTEBOOK_TIMEOUT, check_timeout: float = CHECK_TIMEOUT,
                   cell_timeout: float = CELL_TIMEOUT, snapshot: PackageSnapshot | None = None,
                   watch: EditWatch | None = None, seed: int | None = None, orphans: bool = False,
                   server: AnswerServer | None = None) -> NotebookReport:
    """Execute a copy of the notebook at ``path`` and score its exercises. Never raises for a
    broken or hostile notebook: what went wrong is in the report's ``events``.

    ``snapshot`` is the package as grading found it (read now if not given); ``watch`` is shared by
    notebooks graded at the same time. ``seed`` is the grading's seed (a fresh one if not given; see
    :mod:`mha_course.grading.seeds`): the report records it, the package's version and the notebook's
    SHA-256, and grading the same notebook with the same seed draws the same inputs. ``orphans``:
    this process adopts orphaned processes (:func:`~mha_course.grading.confinement.adopt_orphans`),
    and ends those that carry no token. ``server``: the grading's answer server
    (:mod:`mha_course.grading.answer_server`); one is started for this notebook alone if not given.

    Raises:
        GradingUnavailableError: on a platform that cannot run the grader (Windows; see
            :mod:`mha_course.grading.grading_setup`).
    """
    require_grading_platform()
    report = new_report(path, seed)
    started = time.monotonic()
    grading = NotebookGrading.prepare(path, report, snapshot or PackageSnapshot(), watch,
                               (timeout, cell_timeout, check_timeout), orphans)
    if grading is None:
        return report
    # A notebook with no exercise to check needs no answer server.
    needed = server is None and grading.exercise_ids
    with answer_server(grading.snapshot) if needed else contextlib.nullcontext(server) as own:
        grading.server = own
        grading.grade()
    report.seconds = time.monotonic() - started
    return report


def new_report(path: Path, seed: int | None) -> NotebookReport:
    return NotebookReport(str(path), seed=grading_seed(seed), package_version=mha_course.__version__)


@contextlib.contextmanager
def answer_server(snapshot: PackageSnapshot):
    """An answer server started now from ``snapshot`` and ended on leaving (None where there can be none)."""
    if not available():
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="mha-course-answers-") as folder:
        server = AnswerServer(snapshot, Path(folder), [Path(p) for p in inherited_path(snapshot)])
        try:
            yield server
        finally:
            server.close()


def inherited_path(snapshot: PackageSnapshot) -> list[str]:
    """The grader's ``PYTHONPATH`` without the installed package's folder: the folders a notebook's
    kernel and answer processes find modules in after the package's private copy."""
    return [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if entry and not snapshot.is_installed_at(Path(entry))]


def installed_edit(names: list[str]) -> str:
    """Why a notebook is not scored when the installed package's files changed while it ran."""
    return (f"the package's installed files changed while this notebook ran ({listed(names)}). The grader "
            "never writes into them, so they are left as they are: if you did not change them yourself, "
            "look at them (git diff) before grading again")


class NotebookGrading:
    """One notebook being graded: its run in a kernel, its answers, and the verdicts, into ``report``.

    :meth:`prepare` lays out its temporary folder (a copy of the notebook and its data, a private
    copy of the package); :meth:`start_kernel` may start its kernel ahead of its turn, while the
    notebook before it is graded; :meth:`grade` runs it and judges it, and ends everything it started.
    """

    def __init__(self, path: Path, exercise_ids: list[str], report: NotebookReport, snapshot: PackageSnapshot,
                 watch: EditWatch, limits: tuple[float, float, float], orphans: bool = False,
                 server: AnswerServer | None = None):
        self.path, self.exercise_ids, self.report = path, exercise_ids, report
        self.snapshot, self.watch = snapshot, watch
        self.timeout, self.cell_timeout, self.check_timeout = limits
        self.token = secrets.token_hex(16)  # in the environment of every process of this grading
        self.orphans = orphans  # this process adopts orphans: end those that come without a token too
        self.server = server
        self.then = None  # called once the kernel has started (to start the next notebook's)
        self.folder = Path(tempfile.mkdtemp(prefix="mha-course-grade-"))
        try:
            self._lay_out(self.folder)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @classmethod
    def prepare(cls, path: Path, report: NotebookReport, snapshot: PackageSnapshot, watch: EditWatch | None,
                limits: tuple[float, float, float], orphans: bool = False) -> NotebookGrading | None:
        """The grading of the notebook at ``path``, laid out; None (and why, in ``report``) if it
        cannot be read."""
        require_grading_platform()
        try:
            report.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
            notebook = nbformat.read(path, as_version=4)
        except Exception as error:
            report.events.append(f"could not read the notebook: {type(error).__name__}: {first_line(str(error))}")
            return None
        exercise_ids = exercises_for(notebook, path)
        if not exercise_ids:
            report.events.append("no exercises found: the notebook calls no check(...) and its name does not "
                                 "start with a chapter number")
        return cls(path, exercise_ids, report, snapshot, watch or EditWatch(snapshot), limits, orphans)

    def _lay_out(self, folder: Path) -> None:
        run_folder, self.scratch = folder / "run", folder / "scratch"
        run_folder.mkdir()
        self.scratch.mkdir()
        # Work on a copy in a folder of its own: files the notebook writes land there, and the
        # learner's notebook is never touched.
        shutil.copyfile(self.path, run_folder / self.path.name)
        for relative, source in data_files(self.path.parent).items():
            target = run_folder / DATA_FOLDER / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        self.package = self.snapshot.write_copy(folder / "package")
        self.answer_folder = folder / "answers"
        self.answer_folder.mkdir()
        # The kernel may write in its own folders only (where the system can confine it).
        launcher = [sys.executable, "-I", "-S", str(self.package / "mha_course" / "grading" / "confinement.py"),
                    str(run_folder), str(self.scratch), "--"]
        self.run = NotebookRun(nbformat.read(run_folder / self.path.name, as_version=4), run_folder,
                               self.report.events, launcher)
        # The kernel finds the private copy first, and not the installed package's folder at all.
        self.inherited = inherited_path(self.snapshot)
        self.env = {**ONE_THREAD, **os.environ, "PYTHONPATH": os.pathsep.join([str(self.package), *self.inherited]),
                    "PYTHONDONTWRITEBYTECODE": "1", TOKEN_VARIABLE: self.token, "TMPDIR": str(self.scratch),
                    "IPYTHONDIR": str(self.scratch / "ipython"),
                    # Figures are built but not drawn: the grader shows none, and drawing one takes longer.
                    "MPLBACKEND": "agg"}

    def start_kernel(self) -> None:
        """Start the kernel now, ahead of the notebook's turn (it imports torch and the checks
        meanwhile); if it does not start, :meth:`grade` starts one and says why."""
        if self.exercise_ids:
            self.run.start_kernel(stderr=subprocess.DEVNULL, env=self.env)

    def grade(self) -> None:
        """Run the notebook and judge it, into the report; then end every process of its grading
        and delete its folder."""
        self.run_kernel()
        self.judge()

    def run_kernel(self) -> None:
        """Run the notebook in its kernel, then end every process that carries its token."""
        self.key = self.watch.start()
        self.environment = environment_files()  # .pth files and the like, as the notebook finds them
        try:
            self.started = self._run()
        except BaseException:
            self.close()
            self.watch.finish(self.key)
            raise

    def judge(self) -> None:
        """Find the answers and judge them, into the report; then end every process of this grading
        and delete its folder."""
        withheld = False
        try:
            withheld = self._judge()
        finally:
            self.close()
            edited = self.watch.finish(self.key)
        if edited and not withheld:
            withhold(self.report, self.exercise_ids, installed_edit(edited))

    def close(self) -> None:
        """End every process of this grading (a kernel started ahead and never used, too) and
        delete its folder."""
        self.run.stop_kernel()
        sweep(self.token, orphans=self.orphans)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self) -> bool:
        """Run the notebook; True if its kernel started."""
        started = False
        try:
            # The kernel's own log lines (e.g. its warning about TCP transport) would clutter the table.
            with self.run.client.setup_kernel(stderr=subprocess.DEVNULL, env=self.env):
                started = True
                if self.then:
                    self.then()
                self.run.run_notebook(self.timeout, self.cell_timeout)
        except Exception as error:  # the kernel would not start, or died on shutdown
            if not started:
                self.report.events.append(f"the notebook could not be run: {type(error).__name__}: "
                                          f"{first_line(str(error))}")
        # Nothing the notebook started runs on once its kernel is gone: not while its answers are
        # checked, nor while the next notebook is graded.
        sweep(self.token, orphans=self.orphans)
        return started

    def _judge(self) -> bool:
        """Judge the notebook that ran; True if its score was withheld."""
        report, exercise_ids, snapshot, inherited = self.report, self.exercise_ids, self.snapshot, self.inherited
        printed = printed_verdicts(self.run.notebook)
        if not self.started:
            not_checked(report, exercise_ids)
            return False
        copy = snapshot.changed_in(self.package)
        installed = self.watch.check(self.key)
        environment = environment_changes(self.environment)
        if copy or installed or environment:
            why = [f"the notebook changed the package's files ({listed(copy)})"] if copy else []
            why += [installed_edit(installed)] if installed else []
            why += [f"the Python environment grading runs in changed while this notebook ran ({listed(environment)}, "
                    "in site-packages): every later Python would run that code"] if environment else []
            withhold(report, exercise_ids, "; ".join(why))
            return True
        if not exercise_ids:
            return False
        codes = [python_source(c.source) for c in self.run.notebook.cells if c.cell_type == "code"]
        cells = [(i + 1, python_source(self.run.notebook.cells[i].source)) for i in sorted(self.run.ran)]
        wanted = [(eid, EXERCISES[eid].answer_name) for eid in exercise_ids]
        seeds = exercise_seeds(report.seed, exercise_ids)
        results = answer_records(snapshot, self.answer_folder, cells, wanted, self.check_timeout,
                                 start_timeout=self.timeout, token=self.token, path=[Path(p) for p in inherited],
                                 seeds=seeds, server=self.server)
        edited = sorted({name for copy in self.answer_folder.glob("process-*/package")
                         for name in snapshot.changed_in(copy)} | set(self.server.changed() if self.server else []))
        if edited:
            withhold(report, exercise_ids, f"while its answers were checked, the notebook's code changed the "
                                           f"package's files ({listed(edited)})")
            return True
        used = replayed_names(codes, {name for _, name in wanted})
        definers = {i: defined_names(python_source(c.source), used) for i, c in enumerate(self.run.notebook.cells)
                    if c.cell_type == "code"}
        for exercise_id in exercise_ids:
            report.exercises.append(verdict(exercise_id, results.get(exercise_id, (ERROR, "no result")), self.run,
                                            definers, self.check_timeout))
            report.exercises[-1].seed = seeds[exercise_id]
        compare_printed(report, printed)
        return False


def grade(paths: list[Path], timeout: float = NOTEBOOK_TIMEOUT, check_timeout: float = CHECK_TIMEOUT,
          progress: bool = True, cell_timeout: float = CELL_TIMEOUT, jobs: int = 1,
          seed: int | None = None, orphans: bool = False) -> list[NotebookReport]:
    """Grade several notebooks (``jobs`` at a time), with a progress bar on stderr; each with ``seed``
    if given, else with a fresh seed of its own (``orphans``: see :func:`grade_notebook`).

    Raises:
        GradingUnavailableError: on a platform that cannot run the grader, or where the package's
            compiled files are not its source (before grading anything).
    """
    require_grading_platform()
    snapshot = PackageSnapshot()
    planted = planted_bytecode(snapshot.root)
    if planted:
        raise GradingUnavailableError(
            f"the package's compiled files {listed(planted)} (in {snapshot.root}) are not what their source files "
            "compile to, and Python loads them in place of the source: code planted there would grade. Delete "
            f"the package's __pycache__ folders (find {snapshot.root} -name __pycache__ -exec rm -r {{}} +) and "
            "grade again")
    watch = EditWatch(snapshot)
    paths = [Path(p) for p in paths]
    limits = (timeout, cell_timeout, check_timeout)
    with tqdm(total=len(paths), desc="Grading", disable=not progress) as bar, answer_server(snapshot) as server:
        def done(report: NotebookReport) -> NotebookReport:
            bar.set_postfix_str(Path(report.notebook).name)
            bar.update()
            return report

        if jobs <= 1 or len(paths) <= 1:
            return [done(report) for report in _one_after_another(paths, snapshot, watch, limits, seed, orphans,
                                                                   server)]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(lambda path: done(grade_notebook(path, timeout, check_timeout, cell_timeout,
                                                                  snapshot, watch, seed, orphans, server)), paths))


def _one_after_another(paths: list[Path], snapshot: PackageSnapshot, watch: EditWatch,
                       limits: tuple[float, float, float], seed: int | None, orphans: bool, server):
    """Grade the notebooks one at a time, yielding each report as it is done. The gradings overlap
    where no notebook's code can reach another's processes but through the system (see the module's
    text): once a notebook's kernel has started, the next notebook's is started too, so that it
    imports torch and the checks meanwhile; and a notebook's answers are checked while the next one
    runs. Each report's ``seconds`` count from the notebook's turn to its verdict."""
    ahead: dict[int, tuple[NotebookReport, NotebookGrading | None]] = {}

    def prepare(index: int) -> tuple[NotebookReport, NotebookGrading | None]:
        report = new_report(paths[index], seed)
        return report, NotebookGrading.prepare(paths[index], report, snapshot, watch, limits, orphans)

    def start_next(index: int) -> None:
        if index < len(paths) and index not in ahead:
            try:
                ahead[index] = prepare(index)
                if ahead[index][1]:
                    ahead[index][1].start_kernel()
            except Exception:  # noqa: BLE001 - it is prepared again, at its turn, and says why there
                _, grading = ahead.pop(index, (None, None))
                if grading:
                    grading.close()

    def judged(report: NotebookReport, judging, started: float) -> NotebookReport:
        ended = judging.result() if judging else time.monotonic()  # its error, if any, is raised here
        report.seconds = ended - started
        return report

    def judge_it(grading: NotebookGrading) -> float:
        grading.judge()
        return time.monotonic()

    previous = None  # the report, the judging (a future) and the turn of the notebook before
    with ThreadPoolExecutor(max_workers=1) as judge:
        try:
            for index in range(len(paths)):
                started = time.monotonic()
                report, grading = ahead.pop(index) if index in ahead else prepare(index)
                if grading:
                    grading.server, grading.then = server, lambda after=index + 1: start_next(after)
                    grading.run_kernel()
                if previous:
                    yield judged(*previous)
                previous = (report, judge.submit(judge_it, grading) if grading else None, started)
            if previous:
                yield judged(*previous)
                previous = None
        finally:
            if previous and previous[1]:
                previous[1].result()
            for _, grading in ahead.values():
                if grading:
                    grading.close()


__all__ = ["grade", "grade_notebook", "format_report", "cell_name", "exercises_for", "NotebookReport", "ExerciseScore",
           "GradingUnavailableError", "NOTEBOOK_TIMEOUT", "CELL_TIMEOUT", "CHECK_TIMEOUT", "MISSING", "NOT_RUN",
           "NOT_SCORED", "TIMED_OUT", "NOT_CHECKED", "NOT_IMPLEMENTED"]
