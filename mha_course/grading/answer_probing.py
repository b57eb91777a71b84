"""The grader's answer process: replay a notebook's definitions, probe each answer, send the records.

The grader starts this module in a fresh Python process (``python -I -S -B``, the package imported
from a private copy), in a session of its own, after the notebook's kernel and every process it
started were ended: on Linux a fork of the grading's answer server, which imported all of this before
any notebook ran (:mod:`mha_course.grading.answer_server`); elsewhere a process started for it. Here:

1. everything the probes need is imported; the process confines itself to its working folder
   (:func:`mha_course.grading.confinement.confine`), says ``("ready",)`` and reads its work;
2. the seed of each answer's inputs is drawn, and what each exercise of the table holds (its probe,
   checks, catalogue and shortcuts) is noted;
3. the notebook's *definitions* are replayed, cell by cell (see
   :mod:`mha_course.exercises.definitions`): imports, ``def``, ``class``, plain assignments, the
   assignments of what the definitions read (a constant computed by a call) and every assignment
   to an answer's name, whatever binds it (:func:`replayed_names`). The cells that patched torch
   or the package, printed fake verdicts or called ``check`` do not run;
4. each answer is probed, as ``check`` does; an answer whose code changed the exercise table is not
   scored;
5. each record is sent to the grader as plain data (tensors as their dtype, shape and values). The
   verdict is not given here: the grader judges the records in its own process.

The grader and this process talk over a socket pair (a socket, unlike a pipe, cannot be opened
again through ``/proc/<pid>/fd``), in ``multiprocessing``'s frames (a 4-byte signed big-endian
length, then the payload). The grader sends one frame, the work: ``{"cells": [(number, code),
...], "answers": [(exercise_id, answer_name), ...], "seeds": {exercise_id: seed, ...}}``; this
process answers with ``("ready",)``, ``("replayed", errors)``, then ``("start", id)`` and
``("record", id, data)`` or ``("tampered", id, names)`` for each answer. Every payload is
``marshal`` data: the grader never unpickles.

What the notebook's code does in this process can change this notebook's records only: the process
holds nothing of any other notebook, cannot write outside its working folder, and is ended, with
everything it started, before the next notebook's grading begins.
"""

from __future__ import annotations

import ast
import builtins
import marshal
import os
import struct
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from ..exercises import EXERCISES
from ..exercises.definitions import definitions, used_globals
from ..exercises.framework import MISSING, STATUS_KEY, probe, run_seed
from .confinement import confine

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_EXERCISE_FIELDS = ("id", "answer_name", "probe", "checks", "mistakes", "shortcuts")
_FRAME_HEADER = struct.Struct("!i")  # multiprocessing's: a signed 4-byte length


def _table() -> dict[str, object]:
    """What each exercise of the table holds (its probe, checks, catalogue and shortcuts)."""
    return {f"EXERCISES[{exercise_id}].{field}": getattr(exercise, field)
            for exercise_id, exercise in EXERCISES.items() for field in _EXERCISE_FIELDS}


def _changes(before: dict[str, object]) -> list[str]:
    now = _table()
    return [name for name, value in before.items() if now.get(name) is not value]


def _bound(statement: ast.stmt) -> set[str]:
    targets = statement.targets if isinstance(statement, ast.Assign) else (
        [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value is not None else [])
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _reads(value: ast.expr) -> set[str]:
    """The global names an expression reads (a lambda's own arguments, and a comprehension's
    variables, left out)."""
    nodes = list(ast.walk(value))
    local = {a.arg for n in nodes if isinstance(n, ast.arguments)
             for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg] if a is not None}
    local |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local


def replayed_names(codes: list[str], answer_names: set[str]) -> set[str]:
    """The names whose assignments are replayed whatever their value: those the notebook's ``def``
    and ``class`` statements read (:func:`~mha_course.exercises.definitions.used_globals`), the
    answers' own names (so that ``f = torch.no_grad()(g)``, ``functools.partial(...)`` or
    ``functools.lru_cache(...)(g)`` binds the answer as it did in the notebook), and whatever those
    assignments read in turn (a constant read by a lambda).

    Example:
        >>> sorted(replayed_names(["SCALE = make()", "f = lambda x: x * SCALE"], {"f"}))
        ['SCALE', 'f', 'make']
    """
    used = used_globals(codes) | set(answer_names)
    statements = []
    for code in codes:
        try:
            statements += ast.parse(code).body
        except (SyntaxError, ValueError):
            continue
    while True:
        more = set().union(*(_reads(s.value) for s in statements if _bound(s) & used)) - used
        if not more:
            return used
        used |= more


def to_message(value, depth: int = 0):
    """A record as data ``marshal`` can write, to send to the grader: tensors become
    ``("__tensor__", dtype, shape, values)``. :func:`from_message` turns it back."""
    if isinstance(value, torch.Tensor):
        plain = value.detach().cpu()
        return ("__tensor__", str(plain.dtype).removeprefix("torch."), tuple(plain.shape), plain.reshape(-1).tolist())
    if isinstance(value, _PLAIN) or depth > 20:
        return value if isinstance(value, _PLAIN) else None
    if isinstance(value, dict):
        return {str(k): to_message(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_message(v, depth + 1) for v in value] if isinstance(value, list) else tuple(
            to_message(v, depth + 1) for v in value)
    return {"kind": "object", "type": str(type(value).__name__), "repr": "(not sent)"}


def _send(fd: int, message) -> None:
    """Write ``message`` on ``fd`` as a frame ``multiprocessing``'s ``recv_bytes`` reads."""
    data = marshal.dumps(message)
    frame = _FRAME_HEADER.pack(len(data)) + data
    while frame:  # a write cut short by a signal says how much went
        frame = frame[os.write(fd, frame):]


def run(work: dict, fd: int) -> None:
    """Replay ``work["cells"]``, probe ``work["answers"]`` and send the frames on ``fd``.

    The seed of each answer's inputs is drawn before any of the notebook's code runs: a replayed
    definition that sets ``MHA_COURSE_CHECK_SEED`` or replaces ``secrets.randbelow`` (in a default
    argument, a class body) does not choose them.
    """
    given = work.get("seeds") or {}  # the grader's (see mha_course.grading.seeds); drawn here otherwise
    seeds = {exercise_id: given[exercise_id] if exercise_id in given else run_seed()
             for exercise_id, _ in work["answers"]}
    before = _table()
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    errors = []
    used = replayed_names([code for _, code in work["cells"]], {name for _, name in work["answers"]})
    for number, code in work["cells"]:
        for statement in definitions(code, used):
            try:
                exec(compile(ast.Module(body=[statement], type_ignores=[]), f"<cell {number}>", "exec"), namespace)
            except BaseException as error:  # noqa: BLE001 - a replayed definition that fails is reported
                errors.append((number, statement.lineno, type(error).__name__, str(error)[:200]))
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


def serve(fd: int) -> None:
    """Confine this process to its working folder, read the work from the socket ``fd`` and send
    the frames back on it; then end the process."""
    confine([Path.cwd()])  # before any of the notebook's code runs (nothing is confined where unsupported)
    _send(fd, ("ready",))  # everything is imported: the grader may now send the work
    work = marshal.loads(Connection(os.dup(fd)).recv_bytes())
    run(work, fd)
    sys.stdout.flush()
    os._exit(0)  # no clean-up code of the notebook's (atexit, __del__) runs after the last record


def main() -> None:
    """:func:`serve` on the socket named in ``argv[1]`` (a process started for one notebook)."""
    serve(int(sys.argv[1]))


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
