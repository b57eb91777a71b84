"""What keeps one notebook's grading apart from the next: write confinement and a sweep of its processes.

Every process the grader starts for a notebook (its Jupyter kernel, its answer processes) carries a
random *token* in its environment (:data:`TOKEN_VARIABLE`), and so does every process those start.
When the notebook's grading ends, :func:`sweep` stops, then kills, every process whose environment
holds the token, rescanning until none is left: a daemon that called ``setsid`` or forked twice to
leave its process group is found all the same.

On Linux 5.13 or later the processes are also *confined* with Landlock (:func:`confine`), a
sandbox any process may put itself in, which it and its children can never leave: they may write
only beneath the folders the grader gives them (the notebook's own temporary folder) and in
``/dev``. So a notebook cannot edit the installed package, site-packages (the libraries every later
grading imports), their ``__pycache__``, or another notebook's files; it cannot trace processes
outside its sandbox, nor open TCP connections (to another notebook's kernel; from Linux 6.7), nor
signal them (from Linux 6.12): neither the grader's nor another notebook's. Elsewhere
:func:`landlock_version` is 0 and grading runs without confinement; the grader then still finds the
edits it can see (:mod:`mha_course.grading.package_files`), after the fact.

Two processes outside a notebook's sandbox live while it runs: the grading's answer server
(:mod:`mha_course.grading.answer_server`, which no process of the same user may trace) and, when
notebooks are graded one after another, the kernel started ahead for the next notebook. With
Landlock 4 and 6 a notebook can neither connect to that kernel nor signal either of them. Without,
it can disturb them: the next notebook's exercises may then fail (never pass: its answers are still
replayed from its own cells), and a server that stops leaves the answers to processes started
afresh.

The confinement uses the kernel's documented system calls (``landlock_create_ruleset``,
``landlock_add_rule``, ``landlock_restrict_self``, ``prctl``) through :mod:`ctypes`. This file
imports only the standard library: the grader runs it as a script in front of the kernel's own
command (``python -I -S confinement.py FOLDER... -- COMMAND...``), which then replaces it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

#: The environment variable that holds a notebook's token in every process of its grading.
TOKEN_VARIABLE = "MHA_COURSE_GRADING_TOKEN"

# Linux's numbers for the calls and flags (the same on x86-64 and arm64).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
#: Filesystem rights that change something: write, remove, make (char, dir, file, socket, fifo,
#: block, symlink), then "refer" (links and renames across folders, version 2) and truncate (3).
_WRITE_RIGHTS = {1: sum(1 << bit for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12)), 2: 1 << 13, 3: 1 << 14}
#: Version 4: no TCP connections (to another notebook's kernel, say); version 6: no signals to, nor
#: abstract sockets of, processes outside the sandbox.
_CONNECT_TCP = 1 << 1
_SCOPES = (1 << 0) | (1 << 1)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_version() -> int:
    """The version of Landlock this system offers; 0 where it offers none (not Linux, an old
    kernel, or Landlock switched off)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def confine(writable: list[Path]) -> int:
    """Confine this process and every process it starts, for good: writes only beneath the folders
    in ``writable`` and ``/dev``; no TCP connections, no signals to processes outside (where the
    kernel offers it: Landlock 4 and 6).
    Returns the Landlock version used, 0 if none is offered (nothing is confined then).

    Raises:
        OSError: a call the system offers failed (a folder that does not exist, say).
    """
    version = landlock_version()
    if version < 1:
        return 0
    libc = _libc()
    rights = sum(bits for since, bits in _WRITE_RIGHTS.items() if version >= since)
    attr = _RulesetAttr(rights, _CONNECT_TCP if version >= 4 else 0, _SCOPES if version >= 6 else 0)
    size = 24 if version >= 6 else 16 if version >= 4 else 8
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for folder in [*writable, Path("/dev")]:
            fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(rights, fd)
                if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {folder}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)):
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return version


def adopt_orphans() -> bool:
    """Make this process the *subreaper* of its descendants (Linux): a process whose parent dies is
    handed to it rather than to the system's first process, so that :func:`sweep` can still tell
    it apart. True if that worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _processes() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc (macOS): only the process group can be ended there
        return []


def _environment(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            return file.read()
    except OSError:  # gone, or a zombie
        return None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if fields[0] != b"Z" else None  # a zombie has nothing left to run


def holders(token: str) -> list[int]:
    """The processes whose environment holds ``token`` (and that still run).

    Example:
        >>> holders("no-process-holds-this") == []
        True
    """
    marker = f"{TOKEN_VARIABLE}={token}".encode()
    mine = os.getpid()
    return [pid for pid in _processes() if pid != mine and marker in (_environment(pid) or b"").split(b"\0")]


def _command(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read()
    except OSError:
        return None


def _orphans(grace: float = 2.0) -> list[int]:
    """Processes handed to this one when their parent died (see :func:`adopt_orphans`) that carry no
    token: a notebook's process that started again without its environment.

    A process this one has just forked to start a program (a kernel, on another thread) carries no
    token either until it starts that program: one that still runs this process's own command is
    given ``grace`` seconds to become something else before it counts."""
    mine = os.getpid()
    marker = f"{TOKEN_VARIABLE}=".encode()

    def tokenless(pid: int) -> bool:
        environment = _environment(pid) if _parent(pid) == mine else None  # (None for a zombie)
        return environment is not None and marker not in environment

    own = _command(mine)
    found, starting = [], []
    for pid in _processes():
        if tokenless(pid):
            (starting if _command(pid) == own else found).append(pid)
    deadline = time.monotonic() + grace
    while starting and time.monotonic() < deadline:
        time.sleep(0.01)
        starting = [pid for pid in starting if tokenless(pid) and _command(pid) == own]
    return found + starting


def sweep(token: str, orphans: bool = False, rounds: int = 200) -> list[int]:
    """End every process that holds ``token`` (and, with ``orphans``, every orphan handed to this
    process without one): stop them all first, rescanning until no new one appears (a process
    that forks as fast as it can cannot outrun a stopped parent), then kill them. Returns their
    process ids.
    """
    found: list[int] = []
    for _ in range(rounds):
        new = [pid for pid in [*holders(token), *(_orphans() if orphans else [])] if pid not in found]
        if not new and found:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        found += new
        if not found:
            return []
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 30
    mine = os.getpid()
    for pid in found:  # reap those that are this process's own (orphans it adopted); wait for the rest
        while time.monotonic() < deadline:
            if _parent(pid) == mine:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            if _parent(pid) is None:  # gone, or a zombie whose parent will reap it
                break
            time.sleep(0.01)
    return found


__all__ = ["TOKEN_VARIABLE", "landlock_version", "confine", "adopt_orphans", "holders", "sweep"]


def _main(argv: list[str]) -> None:
    """``confinement.py FOLDER... -- COMMAND...``: confine this process, then become COMMAND."""
    split = argv.index("--")
    confine([Path(folder) for folder in argv[:split]])
    command = argv[split + 1:]
    os.execvp(command[0], command)  # a kernel spec may name its program by name, found on PATH


if __name__ == "__main__":
    _main(sys.argv[1:])
