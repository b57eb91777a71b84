"""The grader's side of the answer process: start it, send it the work, read its frames with deadlines.

The answers are found in a *fresh* Python process (:mod:`mha_course.grading.answer_probing`, run with
``python -I -S -B`` against a private copy of the package), never in the kernel that ran the notebook,
and only once that kernel and every process it started have been ended. On Linux it is forked from
the grading's answer server (:mod:`mha_course.grading.answer_server`, a :class:`Answering` too),
which has imported everything already; elsewhere, or when the server cannot give one, it is started
afresh as below.
:class:`AnswerProcess` starts one in a session of its own, with the notebook's token in its
environment (:mod:`mha_course.grading.confinement`), and hands it one end of a socket pair
(``pass_fds``; a socket, unlike a pipe, cannot be opened again through ``/proc/<pid>/fd``). The
process imports everything, confines itself to its working folder, says ``("ready",)``, reads the
work and answers in frames. The frames are ``multiprocessing``'s own (a 4-byte length, then the
payload), read here by its connection (``poll``, ``recv_bytes``) and decoded with ``marshal`` only,
never unpickled (``recv`` would run what a forged pickle asks for).

:class:`Frames` reads on a thread of its own, so that a deadline holds even while a frame is half
read: a process that starts a frame and never finishes it gives ``"timeout"`` at the deadline, and
closing the process kills its whole process group, then every process holding its token, so that
the reading ends with the end of the socket. Were ``recv_bytes`` called where the deadline is kept,
a process the notebook forked into a session of its own, holding the socket, could stall the
grader for good.

The process is started by :mod:`subprocess`, not by ``multiprocessing``'s spawn context: spawn
starts the child with the grader's own interpreter flags and, before anything else, sets its
``sys.path`` to the grader's and imports the grader's ``__main__`` (the installed package), so the
child would neither run with ``-I -S -B`` nor import the private copy first. ``pass_fds``,
``start_new_session`` and ``os.killpg`` are POSIX's: see :mod:`mha_course.grading.grading_setup`.

:func:`answer_records` drives the processes for one notebook and returns one result per exercise:
``("record", data)``, ``("tampered", names)``, ``(TIMED_OUT,)`` (or ``(TIMED_OUT, why)``) or
``(ERROR, why)``. An answer that
times out, or a process that ends or cannot be trusted, costs that answer only: the rest are asked
of a new process.
"""

from __future__ import annotations

import marshal
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..exercises.framework import ERROR
from .grading_setup import ONE_THREAD, raise_it
from .notebook_run import first_line, seconds
from .confinement import TOKEN_VARIABLE, sweep
from .package_files import PackageSnapshot, site_folders

#: The status of an answer that was still running when its check's time was up.
TIMED_OUT = "timed out"
#: The kinds of result :func:`answer_records` gives besides ``TIMED_OUT`` and ``ERROR``.
RECORD = "record"
TAMPERED = "tampered"

#: Seconds for an answer process to import torch and the package, and to replay the definitions,
#: unless told otherwise (the grader gives it the notebook's ``--timeout``).
ANSWER_PROCESS_START = 120.0


class Frames:
    """The answer process's frames, read from ``connection`` (the grader's end of a
    ``multiprocessing`` socket pair) on a thread that owns it and closes it when the frames end.

    A frame still half read when the process is closed keeps the thread until the socket's last
    writer is gone: at once, unless the notebook's code moved a process holding it out of the
    process group."""

    def __init__(self, connection):
        self.frames: queue.SimpleQueue = queue.SimpleQueue()
        self.ended = False
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(connection,), name="answer-frames", daemon=True)
        self.thread.start()

    def _read(self, connection) -> None:
        try:
            while not self.stopped.is_set():
                if connection.poll(0.2):  # a while at a time, to notice stop() when nothing comes
                    self.frames.put(marshal.loads(connection.recv_bytes()))
        except (EOFError, OSError, ValueError, TypeError):
            pass  # the end of the socket, a frame cut short, or one that is not marshal data: no more frames
        finally:
            connection.close()
            self.frames.put(None)

    def next(self, deadline: float):
        """The next frame; ``"timeout"`` when the deadline passes first, ``None`` at the end."""
        if self.ended:
            return None
        try:
            frame = self.frames.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return "timeout"
        self.ended = frame is None
        return frame

    def stop(self) -> None:
        """Read no further frame: the thread ends after the one it is reading, if any."""
        self.stopped.set()


class Answering:
    """What every answer process offers the grader, however it was started: its frames, ``ready``,
    ``send``, ``running``, ``why_it_ended`` and ``close``. A subclass sets ``pid`` (the leader of
    the process's own session), ``connection``, ``stderr`` and ``token``, and says how to learn
    the exit code (:meth:`exit_code`)."""

    pid: int
    token: str = ""
    stderr = None

    def _begin(self, connection) -> None:
        self.connection = connection
        self.frames = Frames(connection)
        self.closed = False
        self.is_ready = False

    def exit_code(self, timeout: float = 0.0) -> int | None:
        """The process's exit code once it has ended (waiting up to ``timeout`` seconds), else None."""
        raise NotImplementedError

    def running(self) -> bool:
        return self.exit_code() is None

    def ready(self, deadline: float) -> bool:
        """Wait until the process has imported everything (``False`` if it does not in time)."""
        self.is_ready = self.is_ready or self.frames.next(deadline) == ("ready",)
        return self.is_ready

    def send(self, work: dict) -> None:
        try:
            self.connection.send_bytes(marshal.dumps(work))
        except OSError:  # it died already; the frames will say so
            pass

    def why_it_ended(self) -> str:
        code = self.exit_code(timeout=5)
        if code is None:
            return "it stopped answering"
        self.stderr.seek(0)
        lines = [ln for ln in self.stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return f"exit code {code}" + (f": {first_line(lines[-1])}" if lines else "")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.frames.stop()
        if self.exit_code() is None:  # not reaped yet: its process group's number is still its own
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:  # the group is gone already
                pass
        self.exit_code(timeout=30)
        if self.token:  # and whatever it started that left its process group
            sweep(self.token)
        self.stderr.close()


class AnswerProcess(Answering):
    """One run of :mod:`mha_course.grading.answer_probing` in a fresh Python process.

    Args:
        package: the folder holding the private copy of the package it imports.
        folder: its working folder, the only one it may write in once it is confined (its
            standard error is kept there, to say why it ended).
        token: the notebook's token (:mod:`mha_course.grading.confinement`), put in its environment.
        path: folders it finds modules in after the package's copy, before site-packages (those
            the notebook's kernel had on its ``PYTHONPATH``).
    """

    #: The code it runs (``python -c``), given its end of the socket, the package's folder and the
    #: other folders of its path as arguments.
    BOOT = ("import sys; sys.path.insert(0, sys.argv[2]); sys.path.extend(sys.argv[3:]); "
            "from mha_course.grading.answer_probing import main; main()")

    def __init__(self, package: Path, folder: Path, token: str = "", path: list[Path] = ()):
        # A socket pair, not a pipe: a pipe's end can be opened again by any process of the same
        # user through /proc/<pid>/fd/<n>, a socket's cannot.
        mine, theirs = multiprocessing.Pipe(duplex=True)
        self.stderr = tempfile.TemporaryFile(dir=folder)
        env = {**ONE_THREAD, **os.environ, TOKEN_VARIABLE: token, "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(folder)}
        # -S: no .pth file of site-packages runs here (a notebook may have written one); the
        # site folders are put on the path as they are. A session of its own: close() kills
        # whatever the notebook's code started there too.
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", self.BOOT, str(theirs.fileno()), str(package),
                 *map(str, [*path, *site_folders()])],
                cwd=folder, pass_fds=(theirs.fileno(),), start_new_session=True, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        except BaseException:
            mine.close()
            self.stderr.close()
            raise
        finally:
            theirs.close()
        self.pid, self.token = self.process.pid, token
        self._begin(mine)

    def exit_code(self, timeout: float = 0.0) -> int | None:
        try:
            return self.process.wait(timeout=timeout) if timeout else self.process.poll()
        except subprocess.TimeoutExpired:
            return None


def answer_records(snapshot: PackageSnapshot, folder: Path, cells: list[tuple[int, str]],
                   answers: list[tuple[str, str]], check_timeout: float, start_timeout: float = ANSWER_PROCESS_START,
                   token: str = "", path: list[Path] = (), seeds: dict[str, int] | None = None,
                   server=None) -> dict[str, tuple]:
    """Replay the definitions and probe every answer in fresh processes; one result per exercise:
    ``(RECORD, data)``, ``(TAMPERED, names)``, ``(TIMED_OUT,)`` or ``(ERROR, why)``.

    ``cells`` are the cells that ran, as ``(number, python source)``; ``answers`` the exercises
    wanted, as ``(exercise id, answer name)``; ``seeds`` the seed of each one's inputs (drawn in the
    answer process when not given). Process ``N`` works in ``folder/process-N/work``: forked from
    ``server`` (an :class:`~mha_course.grading.answer_server.AnswerServer`) if one is given and
    answers, else started afresh, importing a copy of the package written to
    ``folder/process-N/package``; ``token`` and ``path`` are given to each (see
    :class:`AnswerProcess`). A process
    gets ``start_timeout`` seconds (the notebook's ``--timeout``) to import everything and replay
    the definitions; one that takes longer gives ``(TIMED_OUT, why)`` for every answer left. A definition
    whose replay raises (say ``x = mha.mask`` after ``mha = ...`` was left out) is not reported:
    what matters is whether the answers work."""
    results: dict[str, tuple] = {}
    remaining = list(answers)
    attempt = 0
    while remaining:
        attempt += 1
        base = folder / f"process-{attempt}"
        (base / "work").mkdir(parents=True)
        # Forked from the grading's answer server when it has one that answers; else started afresh.
        process = server.start(base / "work", token, time.monotonic() + start_timeout) if server else None
        process = process or AnswerProcess(snapshot.write_copy(base / "package"), base / "work", token, path)
        try:
            if process.ready(time.monotonic() + start_timeout):
                # Ready, it reads all of its standard input before any of the notebook's code runs.
                process.send({"cells": cells, "answers": remaining, "seeds": seeds or {}})
                frame = process.frames.next(time.monotonic() + start_timeout)
            else:  # still importing, or gone: the work is not sent (a write it never reads would block)
                frame = "timeout" if process.running() else None
            if frame == "timeout":
                for exercise_id, _ in remaining:
                    results[exercise_id] = (TIMED_OUT, f"the process that checks the answers had not imported the "
                                                       f"package and replayed the notebook's definitions after "
                                                       f"{seconds(start_timeout)} ({raise_it('--timeout')})")
                return results
            if not (isinstance(frame, tuple) and frame[0] == "replayed"):
                for exercise_id, _ in remaining:
                    results[exercise_id] = (ERROR, f"the answers could not be replayed ({process.why_it_ended()})")
                return results
            while remaining:
                exercise_id, answer_name = remaining[0]
                frame = process.frames.next(time.monotonic() + start_timeout)
                if frame == ("start", exercise_id):
                    frame = process.frames.next(time.monotonic() + check_timeout)
                if frame == "timeout":
                    results[exercise_id] = (TIMED_OUT,)
                elif isinstance(frame, tuple) and frame[:2] == (RECORD, exercise_id):
                    results[exercise_id] = (RECORD, frame[2])
                elif isinstance(frame, tuple) and frame[:2] == (TAMPERED, exercise_id):
                    results[exercise_id] = (TAMPERED, list(frame[2]))
                else:
                    results[exercise_id] = (ERROR, f"the process checking {answer_name} ended "
                                                   f"({process.why_it_ended()}); did the answer exit?")
                remaining.pop(0)
                if results[exercise_id][0] != RECORD:
                    break  # start afresh for the rest: this process is stuck, gone or not to be trusted
        finally:
            process.close()
    return results


__all__ = ["Answering", "AnswerProcess", "Frames", "answer_records", "ANSWER_PROCESS_START", "TIMED_OUT", "RECORD",
           "TAMPERED"]
