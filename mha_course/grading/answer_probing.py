"""The grader's answer process: replay a notebook's definitions, probe each answer, send the records.

The grader starts this module in a fresh Python process (``python -I -S -B``, the package imported from a
private copy that no notebook has run against) and waits until it has imported everything before
the notebook's first cell runs in its own kernel; once the notebook has run, it sends the work.
Here:

1. everything the probes and the sending need is imported, and the functions that send records
   (``marshal.dumps``, ``os.write``, a ``struct.Struct`` packer, the tensor readers of ``torch._C``)
   are kept aside, before any of the notebook's code runs;
2. the names in the modules that checking relies on (``torch``, ``torch.Tensor``, ``nn.Module``,
   ``builtins``, every ``mha_course`` module), the code of the package's functions and what each
   exercise of the table holds (its probe, checks, catalogue and shortcuts) are noted, and the seed
   of each answer's inputs is drawn;
3. the notebook's *definitions* are replayed, cell by cell (see
   :mod:`mha_course.exercises.definitions`): imports, ``def``, ``class``, plain assignments, and
   the assignments of what the definitions read (a constant computed by a call). The cells that
   patched torch or the package, printed fake verdicts or called ``check`` do not run;
4. each answer is probed, as ``check`` does; if the notebook's code changed any of the noted names or
   code while it ran, the record says so and the grader does not score the answer;
5. each record is sent to the grader as plain data (tensors as their dtype, shape and values) on a
   pipe the grader opened, with the functions kept aside in step 1. The verdict is not given here:
   the grader judges the records in its own process.

The grader sends the work on standard input (``marshal``): ``{"cells": [(number, code), ...],
"answers": [(exercise_id, answer_name), ...], "seeds": {exercise_id: seed, ...}}``; frames on the
pipe are ``multiprocessing``'s (a 4-byte signed big-endian length, then the payload; a payload of 2 GiB or more ends this process with
an error), and each payload is ``marshal`` data: ``("ready",)`` once everything is imported,
``("start", id)``, ``("record", id, data)``, ``("tampered", id, names)``, ``("replayed", errors)``.

The library is on the reading side only. The grader reads the frames with a ``multiprocessing``
connection, in its own process, where no notebook code runs, and decodes them with ``marshal``;
here they are written with the functions kept aside in step 1 (``os.write``, the ``pack`` of a
``struct.Struct("!i")``, ``marshal.dumps``), not with a connection: its sending path looks up Python
attributes at every call (``Connection._send``, the module's ``struct.pack``) that the notebook's
code, replayed here, could replace to slip a forged record in front of the real one.
"""

from __future__ import annotations

import ast
import builtins
import marshal
import os
import struct
import sys
import types

import torch

from ..exercises import EXERCISES
from ..exercises.definitions import definitions, used_globals
from ..exercises.framework import MISSING, STATUS_KEY, probe, run_seed

# Kept aside before any notebook code runs (step 1).
_write = os.write
_size = struct.Struct("!i").pack  # multiprocessing's frame header
_compile = compile
_exec = exec
_Module = ast.Module
_dumps = marshal.dumps
_isinstance = isinstance
_len = len
_str = str
_tensor_type = torch._C.TensorBase
_tolist = torch._C.TensorBase.tolist
_reshape = torch._C.TensorBase.reshape
_dtype = torch._C.TensorBase.dtype.__get__
_shape = torch._C.TensorBase.shape.__get__
_items = dict.items
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_EXERCISE_FIELDS = ("id", "answer_name", "probe", "checks", "mistakes", "shortcuts")


def _watched() -> dict[str, object]:
    """Every name in the modules that checking relies on, and the code of the package's functions."""
    spaces: dict[str, dict] = {"builtins": vars(builtins), "torch": vars(torch), "torch.Tensor": vars(torch.Tensor),
                               "torch._C.TensorBase": vars(torch._C.TensorBase),
                               "torch.nn.Module": vars(torch.nn.Module),
                               "torch.nn.functional": vars(torch.nn.functional), "marshal": vars(marshal),
                               "os": vars(os)}
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "mha_course" or name.startswith("mha_course.")):
            spaces[name] = vars(module)
    for exercise_id, exercise in list(_items(EXERCISES)):  # the table of exercises, and what each one holds
        spaces[f"EXERCISES[{exercise_id}]"] = {field: getattr(exercise, field) for field in _EXERCISE_FIELDS}
    watched: dict[str, object] = {}
    for space, names in spaces.items():
        for key, value in list(names.items()):
            watched[f"{space}.{key}"] = value
            if _isinstance(value, types.FunctionType) and space.startswith("mha_course"):
                watched[f"{space}.{key}.__code__"] = value.__code__
                watched[f"{space}.{key}.__defaults__"] = value.__defaults__
            if _isinstance(value, type) and space.startswith("mha_course") and value.__module__.startswith("mha_course"):
                for attribute, member in list(vars(value).items()):
                    watched[f"{space}.{key}.{attribute}"] = member
                    if _isinstance(member, types.FunctionType):
                        watched[f"{space}.{key}.{attribute}.__code__"] = member.__code__
    return watched


def _changes(before: dict[str, object]) -> list[str]:
    now = _watched()
    return [name for name, value in _items(before) if name not in now or now[name] is not value]


def to_message(value, depth: int = 0):
    """A record as data ``marshal`` can write, to send to the grader: tensors become
    ``("__tensor__", dtype, shape, values)``. :func:`from_message` turns it back."""
    if _isinstance(value, _tensor_type):
        return ("__tensor__", _str(_dtype(value)).removeprefix("torch."), tuple(_shape(value)),
                _tolist(_reshape(value, (-1,))))
    if _isinstance(value, _PLAIN) or depth > 20:
        return value if _isinstance(value, _PLAIN) else None
    if _isinstance(value, dict):
        return {_str(k): to_message(v, depth + 1) for k, v in _items(value)}
    if _isinstance(value, (list, tuple)):
        return [to_message(v, depth + 1) for v in value] if _isinstance(value, list) else tuple(
            to_message(v, depth + 1) for v in value)
    return {"kind": "object", "type": _str(type(value).__name__), "repr": "(not sent)"}


def _send(fd: int, message) -> None:
    """Write ``message`` on ``fd`` as a frame ``multiprocessing``'s ``recv_bytes`` reads."""
    data = _dumps(message)
    frame = _size(_len(data)) + data
    while frame:  # a write cut short by a signal says how much went
        frame = frame[_write(fd, frame):]


def run(work: dict, fd: int) -> None:
    """Replay ``work["cells"]``, probe ``work["answers"]`` and send the frames on ``fd``.

    The seed of each answer's inputs is drawn before any of the notebook's code runs: a replayed
    definition that sets ``MHA_COURSE_CHECK_SEED`` or replaces ``secrets.randbelow`` (in a default
    argument, a class body) does not choose them.
    """
    given = work.get("seeds") or {}  # the grader's (see mha_course.grading.seeds); drawn here otherwise
    seeds = {exercise_id: given[exercise_id] if exercise_id in given else run_seed()
             for exercise_id, _ in work["answers"]}
    before = _watched()
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    errors = []
    used = used_globals([code for _, code in work["cells"]])
    for number, code in work["cells"]:
        for statement in definitions(code, used):
            try:
                _exec(_compile(_Module(body=[statement], type_ignores=[]), f"<cell {number}>", "exec"), namespace)
            except BaseException as error:  # noqa: BLE001 - a replayed definition that fails is reported
                errors.append((number, statement.lineno, type(error).__name__, _str(error)[:200]))
    _send(fd, ("replayed", errors))
    changed = _changes(before)
    for exercise_id, answer_name in work["answers"]:
        _send(fd, ("start", exercise_id))
        if changed:
            _send(fd, ("tampered", exercise_id, changed[:5]))
            continue
        if answer_name in namespace:
            record = probe(EXERCISES[exercise_id], namespace[answer_name], seed=seeds[exercise_id])
        else:
            record = {STATUS_KEY: MISSING}
        changed = _changes(before)
        if changed:
            _send(fd, ("tampered", exercise_id, changed[:5]))
            continue
        _send(fd, ("record", exercise_id, to_message(record)))


def main() -> None:
    """Read the work from standard input and send the frames on the pipe named in ``argv[1]``."""
    fd = int(sys.argv[1])
    _send(fd, ("ready",))  # everything is imported: the grader may now run the notebook
    work = marshal.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    run(work, fd)
    sys.stdout.flush()
    os._exit(0)  # no clean-up code of the notebook's (atexit, __del__) runs after the last record


def from_message(data):
    """The grader's side: a record as ``probe`` made it, from what :func:`to_message` sent."""
    if isinstance(data, tuple) and len(data) == 4 and data[0] == "__tensor__":
        _, dtype, shape, values = data
        return torch.tensor(values, dtype=getattr(torch, dtype)).reshape(shape)
    if isinstance(data, dict):
        return {k: from_message(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        converted = [from_message(v) for v in data]
        return converted if isinstance(data, list) else tuple(converted)
    return data


if __name__ == "__main__":
    main()
