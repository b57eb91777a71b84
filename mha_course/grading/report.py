"""The grader's verdicts and report: the chapters a notebook is graded on, seeds, each score, the table.

Exercises are judged in the grader's process from the answer process's records; a verdict that disagrees
with the line the notebook printed is noted. The grader adds :data:`TIMED_OUT`, :data:`NOT_RUN`,
:data:`NOT_SCORED`, :data:`NOT_CHECKED`, :data:`UNREADABLE` and :data:`WRONG_CHAPTER` to the checks'
statuses. Each exercise's seed derives from the notebook's (:func:`exercise_seeds`), so ``grade --seed``
replays its inputs and verdicts.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..tables import Table
from .. import exercises
from .answer_process import RECORD, TAMPERED, TIMED_OUT, from_message
from .grading_setup import first_line, raise_it, seconds
from ..exercises.framework import ERROR, FAIL_MARK, MISSING, PASS_MARK, PASSED, WAITING_MARK, judge
from ..notebook_files import chapter_number
from .notebook_run import NotebookRun

# The statuses the grader adds to those of the checks (passed, failed, not implemented, missing, error).
NOT_RUN = "not run"  # the cell defining the answer never ran (time-out, dead kernel, exit())
NOT_SCORED = "not scored"  # the notebook changed the package or the checking code
NOT_CHECKED = "not checked"  # the notebook's kernel could not be started
UNREADABLE = "unreadable"  # the file is no notebook (truncated, not JSON): its name's chapter is scored so
WRONG_CHAPTER = "wrong chapter"  # named for this chapter, it answers none of its exercises but another chapter's

#: Seeds are below this bound, as :func:`mha_course.exercises.framework.run_seed` draws them.
SEED_BOUND = 1_000_000


def exercise_seeds(seed: int, exercise_ids: list[str]) -> dict[str, int]:
    """The seed of each exercise's inputs, derived from the grading's ``seed`` and the exercise's id."""
    return {exercise_id: int.from_bytes(hashlib.sha256(f"{seed}:{exercise_id}".encode()).digest()[:8], "big")
            % SEED_BOUND for exercise_id in exercise_ids}


_UNDEFINED = re.compile(r"name '(\w+)' is not defined")
_CHECK_CALL = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")
_PRINTED = re.compile(rf"^({PASS_MARK}|{WAITING_MARK}|{FAIL_MARK}) (\d+\.\d+)\b", re.MULTILINE)


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
    seed: int | None = None  # the seed of the inputs its answer was checked on (see exercise_seeds)
    share: float = 0.0  # the share of its checks of behaviour passed (Exercise.share): --partial's points


@dataclass
class NotebookReport:
    """Everything the grader found out about one notebook."""

    notebook: str
    exercises: list[ExerciseScore] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # what happened while it ran, in order
    seconds: float = 0.0
    seed: int | None = None  # the grading's seed: `grade --seed SEED` draws the same inputs again
    package_version: str | None = None  # mha_course's version that graded it
    checks_sha256: str | None = None  # the SHA-256 of the checks' source (mha_course/exercises/) that judged it
    torch_version: str | None = None  # PyTorch's version, which ran the answers and the references
    sha256: str | None = None  # the notebook file's SHA-256, as graded
    sandbox: str | None = None  # what kept it apart from the other notebooks: bubblewrap, container or none

    @property
    def score(self) -> int:
        return sum(e.points for e in self.exercises)

    @property
    def max_score(self) -> int:
        return len(self.exercises)

    def to_dict(self) -> dict:
        return {**asdict(self), "score": self.score, "max_score": self.max_score, "seconds": round(self.seconds, 1)}

    @classmethod
    def from_dict(cls, data: dict) -> "NotebookReport":
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**fields, "exercises": [ExerciseScore(**e) for e in data["exercises"]]})


def chapters_of(notebook: dict, path: Path) -> set[int]:
    """The chapters of a notebook (or its JSON): its ``check("2.1", ...)`` calls' and its file name's
    (``02_...``), so that deleting a check cell takes no exercise off the score table."""
    chapters = {int(found.split(".")[0]) for cell in notebook.get("cells", []) if cell.get("cell_type") == "code"
                for found in _CHECK_CALL.findall("".join(cell.get("source", "")))}
    return chapters | ({chapter_number(path.name)} if chapter_number(path.name) is not None else set())


def printed_verdicts(notebook) -> dict[str, str]:
    """The last verdict line the executed notebook printed for each exercise."""
    lines = [line for cell in notebook.cells for output in cell.get("outputs", [])
             if output.get("output_type") == "stream" for line in output.get("text", "").splitlines()]
    return {match.group(2): line for line in lines if (match := _PRINTED.match(line))}


def score(exercise_id: str, status: str, line: str, checks_passed: int = 0) -> ExerciseScore:
    """The score of one exercise: a point if ``status`` is passed, and the share of its behaviour passed."""
    exercise = exercises.EXERCISES[exercise_id]
    return ExerciseScore(exercise_id, exercise.title, status, int(status == PASSED), checks_passed,
                         len(exercise.checks), line, share=exercise.share(checks_passed))


def listed(names: list[str]) -> str:
    """The first three names, and ``...`` if there are more."""
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def withhold(report: NotebookReport, exercise_ids: list[str], why: str, status: str = NOT_SCORED) -> None:
    """Score none of the notebook's exercises (``status``), and say why."""
    report.events += [f"not scored: {why}"] if status == NOT_SCORED else []
    report.exercises = [score(eid, status, f"{FAIL_MARK} {eid}: {status}: {why}") for eid in exercise_ids]


def verdict(exercise_id: str, result: tuple, run: NotebookRun, definers: dict[int, set[str]],
            check_timeout: float) -> ExerciseScore:
    """The score of one exercise from the answer process's ``result`` and the notebook's ``run``
    (``definers``: each code cell's index -> the names its replayed statements define)."""
    exercise = exercises.EXERCISES[exercise_id]
    name = exercise.answer_name
    kind = result[0]
    if kind == TIMED_OUT:
        what = result[1] if len(result) > 1 else (
            f"{name} was still running after {seconds(check_timeout)} (the limit for checking one answer; "
            f"{raise_it('--check-timeout')})")
        return score(exercise_id, TIMED_OUT, f"{FAIL_MARK} {exercise_id}: timed out: {what}")
    if kind == TAMPERED:
        changed = ", ".join(result[1])
        return score(exercise_id, NOT_SCORED, f"{FAIL_MARK} {exercise_id}: not scored: while {name} was defined or "
                                              f"checked, the notebook's code changed {changed}")
    if kind != RECORD:
        return score(exercise_id, ERROR, f"{FAIL_MARK} {exercise_id}: could not be checked: {result[1]}")
    judged = judge(exercise, from_message(result[1]))
    # An answer that is missing, or reads a name that is not defined, because the cell defining it
    # did not run to its end (a time limit, exit()) is "not run" or "timed out": never failed.
    undefined = _UNDEFINED.findall(judged.line) if judged.status != PASSED else []
    for wanted in ([name] if judged.status == MISSING else []) + undefined:
        unrun = [i for i, names in definers.items() if wanted in names and i not in run.ran]
        if unrun:
            why = run.not_run.get(unrun[0], f"{run.name(unrun[0])} did not run")
            status = TIMED_OUT if unrun[0] in run.timed_out else NOT_RUN
            what = f"{name} is defined in" if wanted == name else f"{name} reads {wanted}, which is defined in"
            return score(exercise_id, status, f"{FAIL_MARK} {exercise_id}: {status}: {why}; {what} "
                                              f"{run.name(unrun[0])}, which did not run to its end")
    if undefined:
        return score(exercise_id, judged.status, f"{judged.line} (The grader runs the answers with only the "
                     "notebook's imports, def and class statements and assignments to names: set what the answer "
                     "uses there, not as a side effect of other code.)", judged.checks_passed)
    return score(exercise_id, judged.status, judged.line, judged.checks_passed)


def wrong_chapter(report: NotebookReport) -> None:
    """Call the exercises of the chapter the notebook's name gives :data:`WRONG_CHAPTER` when it defines
    none of their answers but answers another chapter's (a chapter's notebook saved under another's name)."""
    named = chapter_number(Path(report.notebook).name)
    mine = [e for e in report.exercises if exercises.EXERCISES[e.id].chapter == named]
    others = sorted({exercises.EXERCISES[e.id].chapter for e in report.exercises if e.status != MISSING} - {named})
    if mine and others and all(e.status == MISSING for e in mine):
        for e in mine:
            e.status, e.line = WRONG_CHAPTER, (f"{FAIL_MARK} {e.id}: wrong chapter: the notebook is named for chapter "
                                               f"{named} but answers chapter {listed(list(map(str, others)))}'s "
                                               "exercises; hand in each chapter under its own name")


def compare_printed(report: NotebookReport, printed: dict[str, str]) -> None:
    """Keep the line the notebook printed for each exercise, and note each one that disagrees with
    the grader's verdict, in either direction."""
    for exercise in report.exercises:
        exercise.notebook_printed = printed.get(exercise.id)
        if exercise.notebook_printed:
            printed_pass = exercise.notebook_printed.startswith(PASS_MARK)
            if printed_pass != (exercise.status == PASSED):
                report.events.append(f"{exercise.id}: the notebook printed {'a pass' if printed_pass else 'no pass'} "
                                     f"({first_line(exercise.notebook_printed, 80)}), but the grader's own check "
                                     f"says {exercise.status}")


def notebook_table(report: NotebookReport) -> Table:
    """One notebook's scores: a row per exercise, then the line of each that did not pass and what happened.

    >>> print(notebook_table(NotebookReport("01_mine.ipynb", [score("1.1", PASSED, "✓", 6)], ["cell 3 raised"])))
    01_mine.ipynb: 1/1 exercises passed
    exercise  result  checks  title
    --------  ------  ------  ---------------------
    1.1       passed     6/6  build the causal mask
    ! cell 3 raised
    """
    rows = [[e.id, e.status, f"{e.checks_passed}/{e.checks_total}", e.title] for e in report.exercises]
    notes = [e.line for e in report.exercises if e.status != PASSED] + [f"! {event}" for event in report.events]
    return Table(["exercise", "result", "checks", "title"], rows, align={"checks": "right"}, notes=notes,
                 title=f"{report.notebook}: {report.score}/{report.max_score} exercises passed")


def format_report(reports: list[NotebookReport]) -> str:
    """The score table ``grade`` prints: a :func:`notebook_table` per notebook, then the total."""
    tables = [(report, notebook_table(report)) for report in reports]
    blocks = [str(table) if report.exercises else "\n".join([table.title, *table.notes]) for report, table in tables]
    total = f"{sum(r.score for r in reports)}/{sum(r.max_score for r in reports)}"
    return "\n\n".join([*blocks, f"Total: {total} exercises passed in {len(reports)} notebook(s)"])
