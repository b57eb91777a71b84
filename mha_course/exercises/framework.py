"""How an exercise is checked: probe the learner's answer, then judge what it did.

Checking an answer has two halves:

* the **probe** calls the learner's function or class on inputs drawn from a seed chosen afresh
  for every run, and writes down what happened - the tensors it returned, the errors it raised,
  which weights received gradients, which of the package's own answers it called - as plain
  data, the *record* (see :mod:`~mha_course.exercises.records`);
* the **judge** rebuilds the same inputs from the record's seed and compares the record with the
  package's reference implementation, one named check at a time. When a check fails it matches
  the record against the exercise's catalogue of typical mistakes, so the learner reads what
  probably went wrong, not only which numbers differ. Messages show the inputs (sizes, and the
  seed of a random batch) and both results; the next run draws other inputs, so a number copied
  from a message is no answer.

An exercise that names its *shortcuts* (even none) starts with the check "written by you": the
answer must not be, nor call, the package's own answer to it, nor the checks' own references (see
:mod:`~mha_course.exercises.shortcuts`; what this promises, and what not, is written in
:mod:`~mha_course.exercises.guard`).

:func:`run_check` runs both in the learner's process. The grader runs the probe where the
notebook's answers live and the judge in its own process, which never ran any notebook code.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import secrets
import threading
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from .records import NAME_KEY, PROBE_ERROR_KEY, STATUS_KEY, Failed, Recorder, error_summary
from .shortcuts import CALLS_KEY, IS_KEY, CallWatch, Shortcut, answer_is, check_internals, own_code_check

# The status of one checked exercise.
PASSED = "passed"
FAILED = "failed"
NOT_IMPLEMENTED = "not implemented"
MISSING = "missing"  # the grader found no answer under the exercise's name
ERROR = "error"  # the exercise could not be checked at all (unknown id, broken notebook)

# The mark that opens each verdict line. Plain symbols that common fonts (DejaVu, Liberation)
# have, not emoji: a page without an emoji font would show empty boxes.
PASS_MARK = "✓"
WAITING_MARK = "○"
FAIL_MARK = "✗"

#: The first line of the stub the student edition puts in place of a solution.
STUB_MESSAGE = "Replace this line with your solution."

#: Set this environment variable to a whole number to make every check draw the same inputs.
SEED_ENV_VAR = "MHA_COURSE_CHECK_SEED"

#: The name of the check every exercise starts with (see :mod:`~mha_course.exercises.shortcuts`).
OWN_CODE = "written by you"


@dataclass(frozen=True)
class Check:
    """One named property of a correct answer; ``run(record)`` raises :class:`Failed` if absent.

    A *gate* checks the answer's form, not its behaviour: that it is the learner's own, has the type
    asked for, builds, runs, or leaves its inputs alone. An answer that does nothing of the task (it
    returns None, a constant or an empty container, or raises) can pass a gate, so passing one earns
    no partial credit (:meth:`Exercise.share`); failing one stops the checks as any check does.
    """

    name: str
    run: Callable[[dict], None]
    gate: bool = False


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer: ``detect(record)`` recognises it, ``message`` explains the fix.

    ``only_for`` names the checks whose failure the mistake can explain; empty means any.
    """

    key: str
    message: str
    detect: Callable[[dict], bool]
    only_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exercise:
    """An exercise: what the learner writes, how to probe it, and how to judge the record.

    Attributes:
        id: ``"chapter.number"``, e.g. ``"1.2"``.
        title: a few words for score tables.
        answer_name: the name the learner's answer has in the chapter notebook.
        signature: how the answer is called, e.g. ``"build_causal_mask(num_tokens, device=None)"``.
        probe: ``probe(answer, recorder)`` runs the answer and records what it did.
        checks: the checks, in the order they are reported; with ``shortcuts`` given, the check
            "written by you" comes first.
        mistakes: the catalogue of typical wrong answers, most specific first.
        shortcuts: the package's functions and classes (and torch calls) that already do what the
            exercise asks; an answer that is or calls one, or one of the checks' own functions,
            fails "written by you".
    """

    id: str
    title: str
    answer_name: str
    signature: str
    probe: Callable[[Any, Recorder], None]
    checks: tuple[Check, ...]
    mistakes: tuple[Mistake, ...] = ()
    shortcuts: tuple[Shortcut, ...] = ()

    def __post_init__(self):
        if not self.checks or self.checks[0].name != OWN_CODE:
            own = Check(OWN_CODE, lambda record: own_code_check(self.all_shortcuts())(record), gate=True)
            object.__setattr__(self, "checks", (own, *self.checks))

    @property
    def chapter(self) -> int:
        return int(self.id.split(".")[0])

    def share(self, checks_passed: int) -> float:
        """The share of the exercise's behaviour that passing its first ``checks_passed`` checks shows: the
        checks of its behaviour among them, over all of them (gates count for nothing).

        >>> from mha_course.exercises import EXERCISES
        >>> [c.gate for c in EXERCISES["2.3"].checks][:3], EXERCISES["2.3"].share(2), EXERCISES["2.3"].share(5)
        ([True, True, False], 0.0, 0.6)
        """
        behaviour = [not check.gate for check in self.checks]
        return round(sum(behaviour[:checks_passed]) / max(1, sum(behaviour)), 4)

    def all_shortcuts(self) -> tuple[Shortcut, ...]:
        """The exercise's shortcuts and the checks' own functions."""
        return (*self.shortcuts, *check_internals())


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise. ``line`` is the one line :func:`check` printed.

    Displaying the result in a notebook shows nothing, because ``check`` has already printed
    ``line``; read ``result.passed`` or ``result.line`` instead.
    """

    exercise: str
    status: str
    checks_passed: int
    checks_total: int
    line: str
    failed_check: str | None = None
    expected: str | None = None
    got: str | None = None
    mistake: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __bool__(self) -> bool:
        return self.passed

    def to_dict(self) -> dict:
        return asdict(self)

    def _ipython_display_(self) -> None:
        # check() already printed self.line; a notebook cell ending in check(...) would
        # otherwise show the verdict twice.
        return None


# ----------------------------------------------------------------------------------------------
# The probe side: run the answer, record plain data.


@contextlib.contextmanager
def _collector_paused():
    """Pause Python's cycle collector: an answer that recurses without end would otherwise let it
    run some other object's finaliser at the recursion limit, which then fails for want of stack
    ("Exception ignored in ..."). What the collector finds is collected after the answer returns."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _isolated():
    """Run learner code without printing, warning or moving the caller's random state."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), _collector_paused():
            torch.manual_seed(0)
            yield


#: The operating system's randomness, bound on import: code that later replaces ``secrets.randbelow``
#: or reseeds ``random`` does not choose the inputs of the checks.
_draw_seed = secrets.SystemRandom().randrange


def run_seed() -> int:
    """A fresh seed for one check run (or the one in ``MHA_COURSE_CHECK_SEED``)."""
    fixed = os.environ.get(SEED_ENV_VAR, "").strip()
    if fixed:
        try:
            return int(fixed) % 1_000_000
        except ValueError:
            raise ValueError(f"{SEED_ENV_VAR} must be a whole number, got {fixed!r}; unset it for "
                             "fresh inputs on every run.") from None
    return _draw_seed(1_000_000)


def probe(exercise: Exercise, answer: Any, seed: int | None = None) -> dict:
    """Run ``exercise``'s probe on ``answer`` and return the record. Never raises.

    Args:
        exercise: the exercise.
        answer: the learner's function or class (``None`` or ``...`` count as not done yet).
        seed: the seed of the random inputs; by default a fresh one (see :func:`run_seed`).
    """
    if answer is None or answer is Ellipsis:
        return {STATUS_KEY: NOT_IMPLEMENTED}
    shortcuts = exercise.all_shortcuts()
    watch = CallWatch(shortcuts)
    recorder = Recorder(run_seed() if seed is None else seed, watch)
    recorder.record[NAME_KEY] = getattr(answer, "__name__", type(answer).__name__)
    recorder.note(IS_KEY, answer_is(answer, shortcuts))
    try:
        with _isolated():
            exercise.probe(answer, recorder)
    except NotImplementedError:
        return {STATUS_KEY: NOT_IMPLEMENTED}
    except (Exception, SystemExit) as error:
        # The answer returned something so unusual that the probe's own code tripped over it;
        # the checks that need the missing entries will say so.
        recorder.record[PROBE_ERROR_KEY] = error_summary(error)
    recorder.note(CALLS_KEY, list(watch.seen))
    return recorder.record


# ----------------------------------------------------------------------------------------------
# The judge side: compare the record with the reference.


def detect_safely(mistake: Mistake, record: dict) -> bool:
    try:
        return bool(mistake.detect(record))
    except Exception:  # a detector that cannot read this record simply does not match
        return False


#: A judge replays the probe's dropout from torch's global random state, which every thread of a
#: process shares: one judge at a time, so that records judged side by side (the grader's jobs)
#: get the verdicts they get alone.
_ONE_JUDGE_AT_A_TIME = threading.RLock()


def judge(exercise: Exercise, record: dict) -> CheckResult:
    """Run ``exercise``'s checks on ``record`` in order and return the verdict. Never raises.

    The references are computed with gradients on and without moving the caller's random state,
    one judge at a time in a process (they seed torch's global random state to replay dropout).
    """
    with _ONE_JUDGE_AT_A_TIME, torch.random.fork_rng(devices=[]), torch.enable_grad():
        return _judge(exercise, record)


def _judge(exercise: Exercise, record: dict) -> CheckResult:
    total = len(exercise.checks)
    status = record.get(STATUS_KEY)
    if status == NOT_IMPLEMENTED:
        return CheckResult(exercise.id, NOT_IMPLEMENTED, 0, total, f"{WAITING_MARK} {exercise.id} not implemented yet")
    if status == MISSING:
        line = (f"{FAIL_MARK} {exercise.id}: no {exercise.answer_name} is defined in the notebook (deleted or "
                f"renamed?): define {exercise.signature}")
        return CheckResult(exercise.id, MISSING, 0, total, line, failed_check="answer defined",
                           expected=f"a definition of {exercise.answer_name}", got="no such name")
    for passed, item in enumerate(exercise.checks):
        try:
            item.run(record)
            continue
        except Failed as raised:
            failure = raised
        except Exception as error:  # an answer so unusual that the check could not read it
            failure = Failed("an answer this check can read", f"{type(error).__name__}: {error}")
        mistake = None
        if item.name != OWN_CODE:  # a shortcut is its own explanation
            mistake = next((m for m in exercise.mistakes
                            if (not m.only_for or item.name in m.only_for) and detect_safely(m, record)), None)
        hint = mistake.message if mistake else failure.hint
        line = f"{FAIL_MARK} {exercise.id}: {item.name}: expected {failure.expected}, got {failure.got.rstrip('.')}."
        if hint:
            line += f" {hint}"
        return CheckResult(exercise.id, FAILED, passed, total, " ".join(line.split()), item.name,
                           failure.expected, failure.got, mistake.key if mistake else None)
    return CheckResult(exercise.id, PASSED, total, total, f"{PASS_MARK} {exercise.id} passed ({total} checks)")


def error_result(exercise_id: str, message: str, checks_total: int = 0) -> CheckResult:
    return CheckResult(str(exercise_id), ERROR, 0, checks_total, f"{FAIL_MARK} {exercise_id}: {message}")
