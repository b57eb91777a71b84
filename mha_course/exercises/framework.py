"""How an exercise is checked: probe the learner's answer, then judge what it did.

Checking an answer has two halves:

* the **probe** calls the learner's function or class on fixed and seeded random inputs and writes
  down what happened - the tensors it returned, the errors it raised, which weights received
  gradients - as plain data, the *record* (a dict of tensors, numbers and strings);
* the **judge** compares the record with the package's reference implementation, one named check
  at a time. When a check fails it matches the record against the exercise's catalogue of typical
  mistakes, so the learner reads what probably went wrong, not only which numbers differ.

:func:`run_check` runs both in the learner's process. The grader runs the probe in the notebook's
kernel and the judge in its own process, which never ran any notebook code: nothing a notebook does
to its own namespace (deleting names, redefining ``check``, monkeypatching the package or torch)
can turn a wrong answer into a pass.
"""

from __future__ import annotations

import contextlib
import io
import numbers
import reprlib
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

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

# Record keys the framework itself writes (the probes use plain names).
STATUS_KEY = "__status__"
PROBE_ERROR_KEY = "__probe_error__"
NAME_KEY = "__name__"

# Tolerances for float32 results computed in a different order from the reference.
ATOL = 1e-5
RTOL = 1e-4


class Failed(Exception):
    """Raised by a check: what the check expected, what it got, and an optional hint."""

    def __init__(self, expected: str, got: str, hint: str = ""):
        super().__init__(f"expected {expected}, got {got}")
        self.expected = expected
        self.got = got
        self.hint = hint


@dataclass(frozen=True)
class Check:
    """One named property of a correct answer; ``run(record)`` raises :class:`Failed` if absent."""

    name: str
    run: Callable[[dict], None]


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
        checks: the checks, in the order they are reported.
        mistakes: the catalogue of typical wrong answers, most specific first.
    """

    id: str
    title: str
    answer_name: str
    signature: str
    probe: Callable[[Any, "Recorder"], None]
    checks: tuple[Check, ...]
    mistakes: tuple[Mistake, ...] = ()

    @property
    def chapter(self) -> int:
        return int(self.id.split(".")[0])


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


def error_summary(error: BaseException) -> dict:
    """A raised error as record data."""
    message = str(error).strip().splitlines()
    return {"kind": "error", "type": type(error).__name__, "message": message[0][:300] if message else ""}


def summarise(value: Any, depth: int = 0) -> dict:
    """Turn anything an answer returns into record data (tensors are copied to the CPU)."""
    if isinstance(value, torch.Tensor):
        return {
            "kind": "tensor",
            "value": value.detach().to("cpu", copy=True),
            "device": str(value.device),
            "dtype": str(value.dtype).removeprefix("torch."),
            "requires_grad": bool(value.requires_grad),
        }
    if value is None:
        return {"kind": "none"}
    if isinstance(value, bool):
        return {"kind": "bool", "value": value}
    if isinstance(value, numbers.Integral):
        return {"kind": "int", "value": int(value)}
    if isinstance(value, numbers.Real):
        return {"kind": "float", "value": float(value)}
    if isinstance(value, str):
        return {"kind": "str", "value": value[:200]}
    if depth < 4 and isinstance(value, (list, tuple, range)) and len(value) <= 10_000:
        return {"kind": "sequence", "type": type(value).__name__,
                "value": [summarise(item, depth + 1) for item in value]}
    if depth < 4 and isinstance(value, dict) and len(value) <= 100:
        return {"kind": "dict", "value": {str(k): summarise(v, depth + 1) for k, v in value.items()}}
    return {"kind": "object", "type": type(value).__name__, "repr": reprlib.repr(value)[:200]}


class Recorder:
    """Collects a probe's record. ``call`` runs learner code and never lets its errors escape,
    except ``NotImplementedError``, which means "not implemented yet"."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}

    def call(self, key: str, fn: Callable, *args, **kwargs) -> Any:
        """Call ``fn(*args, **kwargs)``; record its result (or the error it raised) under ``key``.

        Returns the raw result, or ``None`` when it raised.
        """
        try:
            result = fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except (Exception, SystemExit) as error:  # SystemExit: an answer that calls exit()
            self.record[key] = error_summary(error)
            return None
        self.record[key] = summarise(result)
        return result

    def note(self, key: str, value: Any) -> None:
        """Record a value the probe computed itself."""
        self.record[key] = summarise(value)


@contextlib.contextmanager
def _isolated():
    """Run learner code without printing, warning or moving the caller's random state."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            torch.manual_seed(0)
            yield


def probe(exercise: Exercise, answer: Any) -> dict:
    """Run ``exercise``'s probe on ``answer`` and return the record. Never raises."""
    if answer is None or answer is Ellipsis:
        return {STATUS_KEY: NOT_IMPLEMENTED}
    recorder = Recorder()
    recorder.record[NAME_KEY] = getattr(answer, "__name__", type(answer).__name__)
    try:
        with _isolated():
            exercise.probe(answer, recorder)
    except NotImplementedError:
        return {STATUS_KEY: NOT_IMPLEMENTED}
    except (Exception, SystemExit) as error:
        # The answer returned something so unusual that the probe's own code tripped over it;
        # the checks that need the missing entries will say so.
        recorder.record[PROBE_ERROR_KEY] = error_summary(error)
    return recorder.record


# ----------------------------------------------------------------------------------------------
# The judge side: compare the record with the reference.


def describe(summary: dict | None) -> str:
    """A few words for what an answer returned, e.g. ``"a bool tensor of shape (3, 3)"``."""
    if summary is None:
        return "nothing (the check did not get that far)"
    kind = summary.get("kind")
    if kind == "tensor":
        return f"a {summary['dtype']} tensor of shape {format_shape(summary['value'].shape)}"
    if kind == "error":
        return f"{summary['type']}: {summary['message']}" if summary["message"] else summary["type"]
    if kind == "none":
        return "None"
    if kind in ("int", "float", "bool", "str"):
        return f"the {kind} {summary['value']!r}"
    if kind == "sequence":
        return f"a {summary['type']} of {len(summary['value'])} items"
    if kind == "dict":
        return f"a dict with keys {sorted(summary['value'])}"
    return f"an object of type {summary.get('type', '?')}: {summary.get('repr', '')}"


def entry(record: dict, key: str) -> dict:
    """The record entry ``key``; a :class:`Failed` if the probe stopped before writing it."""
    if key in record:
        return record[key]
    if PROBE_ERROR_KEY in record:
        raise Failed("the answer to run through this check",
                     f"a probe stopped by {describe(record[PROBE_ERROR_KEY])}")
    raise Failed("the answer to run through this check", "no result: an earlier step failed")


def value_of(record: dict, key: str, what: str = "the call") -> dict:
    """The entry ``key``; a :class:`Failed` naming the error if the learner's code raised."""
    summary = entry(record, key)
    if summary.get("kind") == "error":
        raise Failed(f"{what} to run", f"{describe(summary)}")
    return summary


def tensor_of(record: dict, key: str, what: str = "the call") -> torch.Tensor:
    """The tensor the answer returned under ``key``; a :class:`Failed` for anything else."""
    summary = value_of(record, key, what)
    if summary.get("kind") != "tensor":
        raise Failed("a torch.Tensor", describe(summary))
    return summary["value"]


def int_of(record: dict, key: str, what: str = "the call") -> int:
    """The integer the answer returned under ``key`` (an integer-valued 0-d tensor counts too)."""
    summary = value_of(record, key, what)
    if summary.get("kind") == "int":
        return summary["value"]
    if summary.get("kind") == "tensor" and summary["value"].numel() == 1 and not summary["value"].is_floating_point():
        return int(summary["value"].item())
    if summary.get("kind") == "float" and float(summary["value"]).is_integer():
        return int(summary["value"])
    raise Failed("a whole number (int)", describe(summary))


def plain(summary: Any) -> Any:
    """Record data back to Python values: ints, floats, lists, dicts and CPU tensors."""
    if not isinstance(summary, dict) or "kind" not in summary:
        return summary
    kind = summary["kind"]
    if kind == "sequence":
        return [plain(item) for item in summary["value"]]
    if kind == "dict":
        return {k: plain(v) for k, v in summary["value"].items()}
    if kind in ("tensor", "int", "float", "bool", "str"):
        return summary["value"]
    if kind == "none":
        return None
    return summary


def format_shape(shape) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + (",)" if len(shape) == 1 else ")")


def format_number(value: float, decimals: int = 3) -> str:
    if value != value:  # NaN
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    rounded = round(float(value), decimals)
    return f"{rounded + 0.0:.{decimals}f}"  # + 0.0 turns -0.0 into 0.0


def format_values(t: torch.Tensor, limit: int = 6) -> str:
    """The first ``limit`` entries of a tensor, flattened: ``[0.123, -0.400, ...]``."""
    flat = t.reshape(-1).tolist()
    if t.dtype == torch.bool:
        items = [str(v) for v in flat[:limit]]
    elif t.is_floating_point():
        items = [format_number(v) for v in flat[:limit]]
    else:
        items = [str(v) for v in flat[:limit]]
    return "[" + ", ".join(items) + (", ...]" if len(flat) > limit else "]")


def close(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise agreement; NaN never agrees with a number."""
    if got.dtype == torch.bool or expected.dtype == torch.bool:
        return got.to(torch.bool) == expected.to(torch.bool)
    return torch.isclose(got.double(), expected.double(), atol=ATOL, rtol=RTOL)


def same(got: torch.Tensor | None, expected: torch.Tensor | None) -> bool:
    """True if both are tensors of one shape with equal values (NaN where the other has NaN)."""
    if not isinstance(got, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return False
    if got.shape != expected.shape:
        return False
    if got.dtype == torch.bool or expected.dtype == torch.bool:
        return bool((got.to(torch.bool) == expected.to(torch.bool)).all())
    return bool(torch.allclose(got.double(), expected.double(), atol=ATOL, rtol=RTOL, equal_nan=True))


def expect_shape(got: torch.Tensor, shape: tuple) -> None:
    if tuple(got.shape) != tuple(shape):
        raise Failed(f"shape {format_shape(shape)}", f"shape {format_shape(got.shape)}")


def expect_close(got: torch.Tensor, expected: torch.Tensor, labels: tuple[str, ...] = ("row",)) -> None:
    """Raise :class:`Failed` showing the first row (all but the last axis) that differs.

    ``labels`` name the leading axes, e.g. ``("sequence", "token")`` gives
    ``"sequence 0, token 2 = [0.310, 0.120]"``.
    """
    expect_shape(got, tuple(expected.shape))
    agree = close(got, expected)
    if bool(agree.all()):
        return
    if expected.dim() <= 1:
        raise Failed(format_values(expected, limit=8), format_values(got, limit=8))
    rows = agree.reshape(-1, expected.shape[-1]).all(dim=-1)
    first = int((~rows).nonzero()[0])
    index = []
    for size in reversed(expected.shape[:-1]):
        index.append(first % size)
        first //= size
    index = tuple(reversed(index))
    names = list(labels)[-len(index):] if len(labels) >= len(index) else ["index"] * len(index)
    where = ", ".join(f"{name} {i}" for name, i in zip(names, index))
    raise Failed(f"{where} = {format_values(expected[index])}", format_values(got[index]))


def detect_safely(mistake: Mistake, record: dict) -> bool:
    try:
        return bool(mistake.detect(record))
    except Exception:  # a detector that cannot read this record simply does not match
        return False


def judge(exercise: Exercise, record: dict) -> CheckResult:
    """Run ``exercise``'s checks on ``record`` in order and return the verdict. Never raises.

    The references are computed with gradients on and without moving the caller's random state.
    """
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
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
