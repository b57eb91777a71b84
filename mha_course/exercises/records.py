"""What a probe writes down, and how a check reads it back.

A probe runs the learner's answer and turns whatever came back - tensors, numbers, errors - into
plain data, the *record*: a dict of tensors (copied to the CPU), numbers and strings, which the
grader carries from the process where answers run to its own as ``marshal`` data
(:mod:`mha_course.grading.answer_process`). The readers below (:func:`tensor_of`,
:func:`number_of`, ...) take an entry back out, raising :class:`Failed` with a message for the
learner when it is not what the check needs; the comparers (:func:`expect_close`, :func:`same`)
say where two tensors differ.
"""

from __future__ import annotations

import numbers
import reprlib
from typing import Any, Callable

import torch

# Record keys the framework itself writes (the probes use plain names).
STATUS_KEY = "__status__"
PROBE_ERROR_KEY = "__probe_error__"
NAME_KEY = "__name__"
SEED_KEY = "__seed__"  # the run's seed: the judge rebuilds the probe's random inputs from it

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


# ----------------------------------------------------------------------------------------------
# Writing a record


def error_summary(error: BaseException) -> dict:
    """A raised error as record data."""
    message = str(error).strip().splitlines()
    return {"kind": "error", "type": type(error).__name__, "message": message[0][:300] if message else ""}


def summarise(value: Any, depth: int = 0) -> dict:
    """Turn anything an answer returns into record data (tensors are copied to the CPU).

    A tensor on PyTorch's ``meta`` device has a shape but no numbers; its entry holds zeros of its
    shape and ``"has_values": False``, so that no check compares them.
    """
    if isinstance(value, torch.Tensor):
        has_values = value.device.type != "meta"
        copy = (value.detach().to("cpu", copy=True) if has_values
                else torch.zeros(tuple(value.shape), dtype=value.dtype))
        return {
            "kind": "tensor",
            "value": copy,
            "device": str(value.device),
            "dtype": str(value.dtype).removeprefix("torch."),
            "requires_grad": bool(value.requires_grad),
            "has_values": has_values,
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
    except ``NotImplementedError``, which means "not implemented yet".

    ``seed`` is the run's seed: probes draw their random inputs from it (see
    :mod:`mha_course.exercises.probes`), and the judge draws the same ones from the record.
    ``watch`` wraps every call into learner code (it notes calls of the package's own answers).
    """

    def __init__(self, seed: int = 0, watch=None) -> None:
        self.record: dict[str, Any] = {SEED_KEY: {"kind": "int", "value": int(seed)}}
        self.seed = int(seed)
        self._watch = watch

    def call(self, key: str, fn: Callable, *args, **kwargs) -> Any:
        """Call ``fn(*args, **kwargs)``; record its result (or the error it raised) under ``key``.

        Returns the raw result, or ``None`` when it raised.
        """
        try:
            if self._watch is None:
                result = fn(*args, **kwargs)
            else:
                with self._watch:
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


# ----------------------------------------------------------------------------------------------
# Reading a record back


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
    if not summary.get("has_values", True):
        raise Failed(f"numbers from {what}", "a tensor on the meta device, which has none")
    return summary["value"]


def number(summary: dict | None) -> float | None:
    """The number in a summary (an int, a float or a one-element tensor), or ``None``."""
    if not isinstance(summary, dict):
        return None
    if summary.get("kind") in ("int", "float"):
        return float(summary["value"])
    if summary.get("kind") == "tensor" and summary["value"].numel() == 1 and summary.get("has_values", True):
        return float(summary["value"].item())
    return None


def number_text(summary: dict | None, decimals: int | None = None) -> str:
    """A number as the learner returned it: an int as an int, a float as a float (rounded to
    ``decimals`` if given), a one-element tensor as a tensor of its dtype.

    Example:
        >>> number_text(summarise(768)), number_text(summarise(768.0)), number_text(summarise(torch.tensor(768)))
        ('768', '768.0', 'tensor(768)')
    """
    if not isinstance(summary, dict):
        return repr(summary)
    kind, value = summary.get("kind"), summary.get("value")
    if kind == "int":
        return f"{value:,}"
    if kind == "float":
        return f"{value:,.{decimals}f}" if decimals is not None else f"{value:,}"
    if kind == "tensor" and value.numel() == 1 and summary.get("has_values", True):
        item = value.reshape(()).item()
        text = f"{item:.{decimals}f}" if decimals is not None and isinstance(item, float) else f"{item}"
        return f"tensor({text}" + ("" if summary["dtype"] in ("float32", "int64", "bool") else f", dtype={summary['dtype']}") + ")"
    return describe(summary)


def number_pair(expected: float, summary: dict | None, decimals: int = 3) -> tuple[str, str]:
    """An expected number and the learner's (a record entry, shown by :func:`number_text`) with as many
    decimals as it takes for the two to read differently, from ``decimals`` up to :data:`MOST_DECIMALS`.

    Example:
        >>> number_pair(0.25, summarise(0.2504), 3)
        ('0.2500', '0.2504')
    """
    got = number(summary)
    places = decimals
    while got is not None and places < MOST_DECIMALS and round(got, places) == round(expected, places):
        places += 1
    return f"{expected:,.{places}f}", number_text(summary, places)


def number_of(record: dict, key: str, what: str = "the call", kind: str = "a number") -> float:
    """The number the answer returned under ``key``; a :class:`Failed` naming ``kind`` otherwise."""
    summary = value_of(record, key, what)
    got = number(summary)
    if got is None:
        raise Failed(kind, describe(summary))
    return got


def int_of(record: dict, key: str, what: str = "the call") -> int:
    """The integer the answer returned under ``key`` (an integer-valued 0-d tensor counts too)."""
    summary = value_of(record, key, what)
    if summary.get("kind") == "int":
        return summary["value"]
    if (summary.get("kind") == "tensor" and summary["value"].numel() == 1
            and not summary["value"].is_floating_point() and summary.get("has_values", True)):
        return int(summary["value"].item())
    if summary.get("kind") == "float" and float(summary["value"]).is_integer():
        return int(summary["value"])
    raise Failed("a whole number (int)", describe(summary))


def dict_of(record: dict, key: str, keys, what: str = "the call") -> dict:
    """The dict the answer returned under ``key``, holding at least ``keys``; a :class:`Failed` otherwise."""
    summary = value_of(record, key, what)
    answer = plain(summary)
    if not isinstance(answer, dict) or any(k not in answer for k in keys):
        raise Failed(f"a dict with the keys {', '.join(keys)}", describe(summary))
    return answer


def raised(record: dict, key: str, *fragments: str) -> bool:
    """Whether the entry ``key`` is an error whose message holds one of ``fragments`` (any error
    when none is given); the mistake detectors' way of reading a learner's error.

    Example:
        >>> record = {"out": error_summary(RuntimeError("shape mismatch: [2, 3] vs [3, 2]"))}
        >>> raised(record, "out", "must match the size", "shape mismatch"), raised(record, "out", "stride")
        (True, False)
    """
    got = record.get(key)
    return (isinstance(got, dict) and got.get("kind") == "error"
            and (not fragments or any(f in got["message"] for f in fragments)))


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


def seed_of(record: dict) -> int:
    """The seed the probe drew its random inputs from."""
    return int(plain(record[SEED_KEY]))


# ----------------------------------------------------------------------------------------------
# Formatting and comparing


def format_shape(shape) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + (",)" if len(shape) == 1 else ")")


def format_number(value: float, decimals: int = 3) -> str:
    if value != value:  # NaN
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    rounded = round(float(value), decimals)
    return f"{rounded + 0.0:.{decimals}f}"  # + 0.0 turns -0.0 into 0.0


def format_values(t: torch.Tensor, limit: int = 6, decimals: int = 3, start: int = 0) -> str:
    """``limit`` entries of a tensor, flattened, from entry ``start`` on: ``[0.123, -0.400, ...]``."""
    flat = t.reshape(-1).tolist()
    shown = flat[start:start + limit]
    if t.dtype == torch.bool:
        items = [str(v) for v in shown]
    elif t.is_floating_point():
        items = [format_number(v, decimals) for v in shown]
    else:
        items = [str(v) for v in shown]
    return ("[" + ("..., " if start else "") + ", ".join(items)
            + (", ...]" if len(flat) > start + limit else "]"))


#: The most decimals :func:`format_pair` shows; the checks' tolerances are far coarser.
MOST_DECIMALS = 9


def format_pair(expected, got, limit: int = 6, decimals: int = 3, start: int = 0) -> tuple[str, str]:
    """``expected`` and ``got`` (numbers, or tensors as :func:`format_values` shows them) as text with
    as many decimals as it takes for the two to read differently: from ``decimals`` up to
    :data:`MOST_DECIMALS`. A check that found them different never prints two equal numbers.

    Example:
        >>> format_pair(torch.tensor([0.3312, 0.042]), torch.tensor([0.3309, 0.042]))
        ('[0.3312, 0.0420]', '[0.3309, 0.0420]')
        >>> format_pair(0.25, 0.5)
        ('0.250', '0.500')
    """
    def text(value, places: int) -> str:
        if isinstance(value, torch.Tensor):
            return format_values(value, limit, places, start)
        return format_number(value, places)

    for places in range(decimals, MOST_DECIMALS + 1):
        pair = text(expected, places), text(got, places)
        if pair[0] != pair[1]:
            break
    return pair


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


def expect_close(got: torch.Tensor, expected: torch.Tensor, labels: tuple[str, ...] = ("row",),
                 where: str = "") -> None:
    """Raise :class:`Failed` showing the first row (all but the last axis) that differs.

    ``labels`` name the leading axes, counted from 1 as the book counts tokens and heads, with the
    tensor's own index after them: ``("sequence", "token")`` gives ``"sequence 1, token 3 (index [0,
    2]) = [0.310, 0.120]"``. ``where`` names the input, e.g. ``"on random_batch(2, 5, 4, seed=812)"``,
    so the learner can rerun the case. Expected and got are printed with as many decimals as it
    takes for them to differ (:func:`format_pair`).

    Example:
        >>> expected = torch.zeros(2, 3, 2)
        >>> got = expected.clone()
        >>> got[1, 2, 0] = 0.0004
        >>> try:
        ...     expect_close(got, expected, labels=("sequence", "token"))
        ... except Failed as failed:
        ...     print(failed.expected, "|", failed.got)
        sequence 2, token 3 (index [1, 2]) = [0.0000, 0.0000] | [0.0004, 0.0000]
    """
    expect_shape(got, tuple(expected.shape))
    agree = close(got, expected)
    if bool(agree.all()):
        return
    suffix = f" {where}" if where else ""
    if expected.dim() <= 1:
        shown, seen = format_pair(expected, got, limit=8, start=_window(agree.reshape(-1), 8))
        raise Failed(shown + suffix, seen)
    rows = agree.reshape(-1, expected.shape[-1]).all(dim=-1)
    first = int((~rows).nonzero()[0])
    index = []
    for size in reversed(expected.shape[:-1]):
        index.append(first % size)
        first //= size
    index = tuple(reversed(index))
    names = list(labels)[-len(index):] if len(labels) >= len(index) else ["index"] * len(index)
    at = ", ".join(f"{name} {i + 1}" for name, i in zip(names, index))
    at += f" (index [{', '.join(map(str, index))}])"
    shown, seen = format_pair(expected[index], got[index], start=_window(agree[index], 6))
    raise Failed(f"{at} = {shown}{suffix}", seen)


def expect_close_from(got: torch.Tensor, expected: torch.Tensor, call: str, labels: tuple[str, ...] = ("row",),
                      name: str = "") -> None:
    """:func:`expect_close`, its expected side ending with ``from <call>``, the call that gave ``got``, and
    starting with ``name``, the part of the answer ``got`` is (``"new_state"``), if given.

    Example:
        >>> try:
        ...     expect_close_from(torch.ones(2), torch.zeros(2), "f(2)", name="output")
        ... except Failed as failed:
        ...     print(failed.expected)
        output [0.000, 0.000] from f(2)
    """
    try:
        expect_close(got, expected, labels=labels)
    except Failed as failure:
        raise Failed(" ".join(filter(None, (name, failure.expected, f"from {call}"))), failure.got) from None


def _window(agree: torch.Tensor, limit: int) -> int:
    """Where a shown stretch of ``limit`` entries starts so that it holds the first disagreement."""
    first = int((~agree.reshape(-1)).nonzero()[0]) if not bool(agree.all()) else 0
    return 0 if first < limit else first - limit + 1
