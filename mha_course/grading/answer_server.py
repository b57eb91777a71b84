"""The answer server: answer processes forked from one that has already imported everything.

An answer process (:mod:`mha_course.grading.answer_probing`) spends most of its life importing torch
and the checks (two seconds or more on a quiet two-core machine) before it runs any of the
notebook's code. On Linux the grader therefore starts one *server* per grading, when grading
starts: a Python process (``python -I -S -B``) that imports everything from a private copy of the
package, written from the grader's snapshot before any notebook ran, and then only forks. Each
answer process is a fork of it, ready within a few milliseconds, and exactly as fresh as a process
started for it: the server never runs any notebook's code, so a fork holds nothing of any notebook.

The server and its forks:

* the server reads requests from the grader only, over a socket pair of its own (Unix
  ``SOCK_SEQPACKET``, which keeps each request whole and carries file descriptors): ``("start",
  folder, token)`` with the answer process's end of its socket and its standard error, answered
  by the fork's process id; ``("status", pid)``, answered by its exit code, or ``None`` while it
  runs. A fork is reaped only when the grader asks for its status after it ended, so its number
  stays its own (a zombie's) until then and ``os.killpg`` cannot reach another process;
* it makes itself undumpable (``PR_SET_DUMPABLE``): no process of the same user can trace it or
  read its memory, even where Landlock does not keep the notebooks' processes apart;
* a fork leaves the server's socket, starts a session of its own, moves to its working folder,
  takes the notebook's token into its environment (written over a placeholder in the environment
  block the kernel shows in ``/proc/<pid>/environ``, so that :func:`~mha_course.grading.confinement.sweep`
  finds it, and every process it forks, as it finds any answer process), reseeds Python's
  ``random``, and then serves as a fresh answer process does
  (:func:`~mha_course.grading.answer_probing.serve`: confine, ``ready``, work, records).

Python's own ``multiprocessing`` forkserver is not used: it starts its server with the grader's
interpreter flags and ``sys.path`` (the installed package, not the private copy, and ``.pth``
files), and passes each child its work as a pickle.

When the server cannot be used (not Linux, it died, or it did not answer in time) the grader starts
each answer process afresh (:class:`~mha_course.grading.answer_process.AnswerProcess`): slower, the
same verdicts. A notebook whose code edited the server's copy of the package is not scored, and the
server is ended: later answers are found in processes started afresh (:meth:`AnswerServer.changed`).
"""

from __future__ import annotations

import ctypes
import marshal
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from .answer_process import Answering
from .confinement import TOKEN_VARIABLE
from .grading_setup import ONE_THREAD
from .package_files import PackageSnapshot, site_folders

#: The value of the token variable in the server's environment: room for any fork's token.
PLACEHOLDER = "0" * 64
_PR_SET_DUMPABLE = 4


def available() -> bool:
    """Whether answer processes can be forked from a server here (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SOCK_SEQPACKET") and hasattr(socket, "send_fds")


def _dumpable(value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, value, 0, 0, 0)


def _take_token(token: str) -> None:
    """Put ``token`` in this process's environment: in ``os.environ`` (for the processes it starts)
    and over the placeholder in the environment block the kernel shows in ``/proc/<pid>/environ``
    (for this process, and for those it forks without starting a new program)."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_void_p
    address = libc.getenv(TOKEN_VARIABLE.encode())
    raw = token.encode() + b"\0"
    if address and len(raw) <= len(PLACEHOLDER) + 1:
        ctypes.memmove(address, raw, len(raw))
    os.environ[TOKEN_VARIABLE] = token


def _fork(folder: str, token: str, fds: list[int], control: socket.socket) -> int:
    """Fork an answer process; return its process id (in the server)."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the fork: nothing of the server's is left that the notebook's code could reach
        control.close()
        os.setsid()
        os.chdir(folder)
        answer, stderr = fds
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(stderr, 2)
        os.close(null)
        os.close(stderr)
        _take_token(token)
        os.environ["TMPDIR"] = folder
        tempfile.tempdir = None
        random.seed()
        _dumpable(1)  # so that the grader may read its environment, as it reads any answer process's
        from .answer_probing import serve
        serve(answer)
    except BaseException:  # noqa: BLE001 - said on its standard error, for the grader's report
        traceback.print_exc()
    finally:
        os._exit(1)


def _status(pid: int) -> int | None:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status) if done else None


def main() -> None:
    """The server: import everything, then answer the grader's requests on the socket ``argv[1]``
    until the grader closes it."""
    from . import answer_probing  # noqa: F401 - everything an answer process needs, imported once

    control = socket.socket(fileno=int(sys.argv[1]))
    _dumpable(0)
    control.send(marshal.dumps(("ready",)))
    while True:
        message, fds, _, _ = socket.recv_fds(control, 65536, 2)
        if not message:
            os._exit(0)  # the grader is gone
        request = marshal.loads(message)
        if request[0] == "start" and len(fds) == 2:
            reply = ("started", _fork(request[1], request[2], fds, control))
        elif request[0] == "status":
            reply = ("status", _status(request[1]))
        else:
            reply = ("refused",)
        for fd in fds:
            os.close(fd)
        control.send(marshal.dumps(reply))


class AnswerServer:
    """The grading's answer server (see the module's text), started now from a private copy of
    ``snapshot`` written into ``folder``; ``path`` as for
    :class:`~mha_course.grading.answer_process.AnswerProcess`. Shared by the notebooks graded at
    the same time; :meth:`close` ends it."""

    BOOT = ("import sys; sys.path.insert(0, sys.argv[2]); sys.path.extend(sys.argv[3:]); "
            "from mha_course.grading.answer_server import main; main()")

    def __init__(self, snapshot: PackageSnapshot, folder: Path, path: list[Path] = ()):
        self.snapshot, self.folder = snapshot, folder
        self.package = snapshot.write_copy(folder / "package")
        self.log = tempfile.TemporaryFile(dir=folder)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**ONE_THREAD, **os.environ, TOKEN_VARIABLE: PLACEHOLDER, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", self.BOOT, str(theirs.fileno()), str(self.package),
                 *map(str, [*path, *site_folders()])],
                cwd=folder, pass_fds=(theirs.fileno(),), start_new_session=True, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        finally:
            theirs.close()
        self.control = mine
        self.lock = threading.Lock()
        self.is_ready = False
        self.broken = False

    def ask(self, request: tuple, fds: list[int], deadline: float):
        """Send one request and read its reply, within ``deadline``; None (and the server is no
        longer used) when it does not answer in time or is gone."""
        with self.lock:
            if self.broken:
                return None
            try:
                if not self.is_ready:
                    self.control.settimeout(max(0.001, deadline - time.monotonic()))
                    self.is_ready = marshal.loads(self.control.recv(65536)) == ("ready",)
                    if not self.is_ready:
                        raise OSError("the answer server did not start")
                socket.send_fds(self.control, [marshal.dumps(request)], fds)
                self.control.settimeout(max(0.001, deadline - time.monotonic()))
                return marshal.loads(self.control.recv(65536))
            except (OSError, EOFError, ValueError, TypeError):
                self.broken = True
                self._end()
                return None

    def start(self, folder: Path, token: str, deadline: float) -> ServedProcess | None:
        """A fresh answer process working in ``folder`` with ``token``, forked from the server; None
        if the server cannot give one by ``deadline`` (the caller then starts one itself)."""
        if len(token) > len(PLACEHOLDER):
            return None
        process = ServedProcess(self, folder, token, deadline)
        return process if process.pid else None

    def status(self, pid: int, timeout: float = 0.0) -> int | None:
        """The exit code of the fork ``pid`` once it ended (waiting up to ``timeout`` s), else None."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self.ask(("status", pid), [], time.monotonic() + max(timeout, 10))
            if reply is None:
                return -1  # the server is gone, and with it the means to know
            if reply[1] is not None or time.monotonic() >= deadline:
                return reply[1]
            time.sleep(0.02)

    def changed(self) -> list[str]:
        """The package files that differ, in the server's copy, from the snapshot: if any does, the
        server is ended (later answers are found in processes started afresh)."""
        names = self.snapshot.changed_in(self.package)
        if names:
            with self.lock:
                self.broken = True
                self._end()
        return names

    def _end(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.wait()

    def close(self) -> None:
        with self.lock:
            self.broken = True
            self.control.close()
            self._end()
            self.log.close()


class ServedProcess(Answering):
    """An answer process forked from an :class:`AnswerServer` (``pid`` is 0 if the server gave none)."""

    def __init__(self, server: AnswerServer, folder: Path, token: str, deadline: float):
        self.server, self.token = server, token
        mine, theirs = multiprocessing.Pipe(duplex=True)
        self.stderr = tempfile.TemporaryFile(dir=folder)
        try:
            reply = server.ask(("start", str(folder), token), [theirs.fileno(), self.stderr.fileno()], deadline)
        finally:
            theirs.close()
        self.pid = reply[1] if reply and reply[0] == "started" else 0
        if not self.pid:
            mine.close()
            self.stderr.close()
            return
        self._begin(mine)

    def exit_code(self, timeout: float = 0.0) -> int | None:
        return self.server.status(self.pid, timeout)


__all__ = ["AnswerServer", "ServedProcess", "available", "PLACEHOLDER"]
