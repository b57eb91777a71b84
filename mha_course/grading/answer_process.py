"""The answer process, both sides: the fresh process that replays a notebook's definitions and probes its
answers (:func:`main`, :func:`run`), and the grader's side (:class:`AnswerProcess`, :func:`answer_records`).

It starts (``python -I -S -B``) in a sandbox and folder of its own with one end of a socket pair, imports
torch and the checks while the notebook's kernel runs, says ``("ready",)`` and waits: the notebook's code
reaches it only with the work, once the kernel's sandbox has ended. It replays the definitions of the cells
that ran (:mod:`mha_course.exercises.definitions`), probes each answer as ``check`` does on the grader's
seeds, and sends each record as plain data (``tampered`` if its code changed the exercise table). Frames
are a 4-byte length and ``marshal`` data, never a pickle; the grader's reads keep a deadline mid-frame. A
stuck, gone or untrusted process costs one answer: the rest go to a new one. The notebook's code here can
change this notebook's records only.
"""

from __future__ import annotations

import ast
import builtins
import marshal
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Callable

import torch

from .. import exercises
from ..exercises.definitions import definitions, used_globals
from ..exercises.framework import ERROR, MISSING, STATUS_KEY, probe
from ..exercises.probes import prepare_meta
from .grading_setup import ONE_THREAD, first_line
from .sandbox import Sandbox

#: What :func:`answer_records` gives for an answer besides :data:`~mha_course.exercises.framework.ERROR`.
RECORD, TAMPERED, TIMED_OUT = "record", "tampered", "timed out"
#: What the process runs, given its end of the socket, the package's copy and the rest of its path.
BOOT = ("import sys; sys.path.insert(0, sys.argv[2]); sys.path.extend(sys.argv[3:]); "
        "from mha_course.grading.answer_process import main; main()")
_HEADER = struct.Struct("!i")
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def send(connection: socket.socket, message) -> None:
    data = marshal.dumps(message)
    connection.sendall(_HEADER.pack(len(data)) + data)


def _exactly(connection: socket.socket, size: int, deadline: float | None) -> bytes:
    data = bytearray()
    while len(data) < size:
        if deadline is not None:
            if deadline <= time.monotonic():
                raise TimeoutError
            connection.settimeout(deadline - time.monotonic())
        chunk = connection.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


def receive(connection: socket.socket, deadline: float | None = None):
    """The next frame's data; ``"timeout"`` past ``deadline``, even mid-frame; ``None`` at the end or for junk."""
    try:
        return marshal.loads(_exactly(connection, _HEADER.unpack(_exactly(connection, 4, deadline))[0], deadline))
    except TimeoutError:
        return "timeout"
    except (EOFError, OSError, ValueError, TypeError):
        return None


def to_message(value, depth: int = 0):
    """A record as ``marshal`` data: tensors become ``("__tensor__", dtype, shape, values)``."""
    if isinstance(value, torch.Tensor):
        plain = value.detach().cpu()
        return ("__tensor__", str(plain.dtype).removeprefix("torch."), tuple(plain.shape), plain.reshape(-1).tolist())
    if isinstance(value, _PLAIN) or depth > 20:
        return value if isinstance(value, _PLAIN) else None
    if isinstance(value, (dict, list, tuple)):
        items = {str(k): to_message(v, depth + 1) for k, v in value.items()} if isinstance(value, dict) else [
            to_message(v, depth + 1) for v in value]
        return items if not isinstance(value, tuple) else tuple(items)
    return {"kind": "object", "type": str(type(value).__name__), "repr": "(not sent)"}


def from_message(data):
    """The record :func:`to_message` sent, as ``probe`` made it."""
    if isinstance(data, tuple) and len(data) == 4 and data[0] == "__tensor__":
        return torch.tensor(data[3], dtype=getattr(torch, data[1])).reshape(data[2])
    if isinstance(data, dict):
        return {k: from_message(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(from_message(v) for v in data)
    return data


def run(work: dict, connection: socket.socket) -> None:
    """Replay ``work["cells"]``, probe ``work["answers"]`` on ``work["seeds"]``, send the frames."""
    def table() -> dict:  # what each exercise holds: its probe, checks, catalogue and shortcuts
        return {f"EXERCISES[{eid}].{field}": getattr(e, field) for eid, e in exercises.EXERCISES.items()
                for field in ("id", "answer_name", "probe", "checks", "mistakes", "shortcuts")}

    before, namespace, errors = table(), {"__name__": "__main__", "__builtins__": builtins}, []
    used = used_globals([code for _, code in work["cells"]], {name for _, name in work["answers"]})
    for number, code in work["cells"]:
        for statement in definitions(code, used):
            try:
                exec(compile(ast.Module(body=[statement], type_ignores=[]), f"<cell {number}>", "exec"), namespace)
            except BaseException as error:  # noqa: BLE001 - a replayed definition that fails is reported
                errors.append((number, statement.lineno, type(error).__name__, str(error)[:200]))
    send(connection, ("replayed", errors))
    for exercise_id, answer_name in work["answers"]:
        send(connection, ("start", exercise_id))
        changed = [name for name, value in before.items() if table().get(name) is not value]
        if not changed:
            record = (probe(exercises.EXERCISES[exercise_id], namespace[answer_name], seed=work["seeds"][exercise_id])
                      if answer_name in namespace else {STATUS_KEY: MISSING})
            changed = [name for name, value in before.items() if table().get(name) is not value]
        send(connection, ("tampered", exercise_id, changed[:5]) if changed else
             ("record", exercise_id, to_message(record)))


def main() -> None:
    """The process: say ``("ready",)`` on the socket numbered ``argv[1]``, read the work, run it, end."""
    import matplotlib.pyplot  # noqa: F401 - the chapters' figures' module: imported before the work arrives
    prepare_meta()  # and PyTorch's meta machinery, which the device probes need

    connection = socket.socket(fileno=int(sys.argv[1]))
    send(connection, ("ready",))  # everything is imported: the grader may now send the work
    run(receive(connection), connection)
    sys.stdout.flush()
    os._exit(0)  # no clean-up code of the notebook's (atexit, __del__) runs after the last record


class AnswerProcess:
    """``python -I -S -B -c code SOCKET *arguments`` (:data:`BOOT`'s: its path) in ``box``, inside ``sandbox``."""

    def __init__(self, sandbox: Sandbox, box: Path, arguments: list[str], code: str = BOOT,
                 env: dict[str, str] | None = None):
        box.mkdir(parents=True, exist_ok=True)
        self.connection, theirs = socket.socketpair()
        self.stderr = tempfile.TemporaryFile(dir=box)  # to say why it ended
        env = env or {**ONE_THREAD, **os.environ, "TMPDIR": str(box), "HOME": str(box)}
        try:
            self.popen = subprocess.Popen(
                sandbox.wrap(box, ["nice", "-n", "10",  # below the kernels: it works once the kernel has ended
                                   sys.executable, "-I", "-S", "-B", "-c", code, str(theirs.fileno()), *arguments]),
                cwd=box, pass_fds=(theirs.fileno(),), start_new_session=True, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        except BaseException:
            self.connection.close()
            self.stderr.close()
            raise
        finally:
            theirs.close()

    def next(self, deadline: float):
        return receive(self.connection, deadline)

    def why_it_ended(self) -> str:
        try:
            code = self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        self.stderr.seek(0)
        lines = [ln for ln in self.stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return f"exit code {code}" + (f": {first_line(lines[-1])}" if lines else "")

    def close(self) -> None:
        """Kill the process's group (its own since it started, not reaped yet) and with it its sandbox."""
        if self.popen.poll() is None:
            with suppress(OSError):  # it ended meanwhile
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        self.connection.close()
        self.stderr.close()


def _replayed(process: AnswerProcess, work: dict, start_timeout: float):
    """The process's first frame after the work (``"timeout"`` while it still imports; None if it ended)."""
    if process.next(time.monotonic() + start_timeout) != ("ready",):
        return "timeout" if process.popen.poll() is None else None
    try:
        process.connection.settimeout(start_timeout)
        send(process.connection, work)
        return process.next(time.monotonic() + start_timeout)
    except OSError:  # it ended, or stopped reading: why_it_ended says which
        return None


def answer_records(start: Callable[[], AnswerProcess], cells: list[tuple[int, str]], answers: list[tuple[str, str]],
                   check_timeout: float, start_timeout: float, seeds: dict[str, int]) -> dict[str, tuple]:
    """One result per exercise of ``answers`` (``(id, answer name)``), from processes ``start()`` gives,
    replaying ``cells`` (``(number, source)``): ``(RECORD, data)``, ``(TAMPERED, names)``, ``(TIMED_OUT[,
    why])`` or ``(ERROR, why)``. A process gets ``start_timeout`` s to import and replay everything."""
    results: dict[str, tuple] = {}
    remaining = list(answers)
    while remaining:
        process = start()
        try:
            frame = _replayed(process, {"cells": cells, "answers": remaining, "seeds": seeds}, start_timeout)
            if frame == "timeout":
                return {**results, **{eid: (TIMED_OUT, f"the process that checks the answers had not imported the "
                                                       f"package and replayed the notebook's definitions after "
                                                       f"{start_timeout:g} s (raise it with --timeout SECONDS)")
                                      for eid, _ in remaining}}
            if not (isinstance(frame, tuple) and frame[0] == "replayed"):
                why = process.why_it_ended()
                return {**results, **{e: (ERROR, f"the answers could not be replayed ({why})") for e, _ in remaining}}
            while remaining:
                exercise_id, answer_name = remaining.pop(0)
                frame = process.next(time.monotonic() + start_timeout)
                if frame == ("start", exercise_id):
                    frame = process.next(time.monotonic() + check_timeout)
                if frame == "timeout":
                    results[exercise_id] = (TIMED_OUT,)
                elif isinstance(frame, tuple) and frame[:2] in ((RECORD, exercise_id), (TAMPERED, exercise_id)):
                    results[exercise_id] = (frame[0], frame[2])
                else:
                    results[exercise_id] = (ERROR, f"the process checking {answer_name} ended "
                                                   f"({process.why_it_ended()}); did the answer exit?")
                if results[exercise_id][0] != RECORD:
                    break  # start afresh for the rest: this process is stuck, gone or not to be trusted
        finally:
            process.close()
    return results


if __name__ == "__main__":
    main()
