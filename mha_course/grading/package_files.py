"""The package's files as the grader found them: a snapshot, private copies, a check for edits.

A notebook being graded runs with the same rights as the grader, so it could edit the package's
files on disk (the checks, or the code that records an answer) and pass every exercise - its own
and, as the edit stays, every notebook graded after it. The grader therefore

* reads every source file of the installed package once, when grading starts
  (:class:`PackageSnapshot`), and takes everything it runs from that snapshot;
* runs each notebook, and each replay of its answers, against a private copy written from that
  snapshot into a fresh temporary folder (:meth:`PackageSnapshot.write_copy`): an edit the
  notebook makes through ``mha_course.__file__`` reaches that copy only, and the grader finds it
  there (:meth:`PackageSnapshot.changed_in`) and does not score the notebook;
* after each notebook compares the installed source files with the snapshot
  (:meth:`PackageSnapshot.changed`). It never writes into them: the installed package is often a
  contributor's working tree (an editable install), where an edit saved while grading runs is
  the contributor's work. An installed file that changed while a notebook ran is reported, and
  that notebook is not scored, since the grader cannot tell who changed it.

Compiled files (``__pycache__``) are not compared: any Python that imports the package writes
them. The private copies hold none, and their processes write none. But a compiled file that Python
would load in place of its source must be what that source compiles to: :func:`planted_bytecode`
finds one that is not (planted by a notebook graded where nothing confined it), and the grader
refuses to start until it is deleted.

Notebooks graded at the same time share an :class:`EditWatch`, so that an edit found while one of
them runs withholds the score of every notebook that was running then.

Example:
    >>> import tempfile
    >>> snapshot = PackageSnapshot()
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     copy = snapshot.write_copy(Path(folder))
    ...     (copy / "mha_course" / "__init__.py").exists(), snapshot.changed_in(copy)
    (True, [])
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import site
import threading
from pathlib import Path

import mha_course

PACKAGE = "mha_course"


def _files(root: Path) -> dict[str, bytes]:
    """Every source file under ``root`` by relative path (compiled ``__pycache__`` files left out)."""
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file() and "__pycache__" not in path.parts}


class PackageSnapshot:
    """The bytes of every source file of the package, read once."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or Path(mha_course.__file__).parent)
        self.files = _files(self.root)
        self.digest = hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in self.files.items())
                                     ).hexdigest()

    def write_copy(self, folder: Path) -> Path:
        """Write the package's source files under ``folder/mha_course/``; return ``folder`` (for
        ``sys.path``)."""
        for name, data in self.files.items():
            target = folder / PACKAGE / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return folder

    def _differences(self, root: Path) -> list[str]:
        now = _files(root) if root.is_dir() else {}
        return sorted(n for n in self.files.keys() | now.keys() if self.files.get(n) != now.get(n))

    def is_installed_at(self, folder: Path) -> bool:
        """Whether ``folder`` (a ``sys.path`` entry) is where the installed package lives."""
        try:
            return (folder / PACKAGE).resolve() == self.root.resolve()
        except OSError:
            return False

    def changed(self) -> list[str]:
        """The installed package's source files that differ from the snapshot (edited, added or
        removed). Only reads them."""
        return self._differences(self.root)

    def changed_in(self, copy: Path) -> list[str]:
        """The source files of a private copy (written by :meth:`write_copy`) that differ."""
        return self._differences(copy / PACKAGE)


class EditWatch:
    """Notebooks being graded at the same time, so that an edit to the installed package found by
    one of them withholds the score of every notebook that was running when it was found. Edits
    are found, never undone: the files stay as whoever changed them left them."""

    def __init__(self, snapshot: PackageSnapshot):
        self.snapshot = snapshot
        self.lock = threading.Lock()
        self.running: dict[int, list[str]] = {}
        self.reported: set[str] = set()  # changed files already blamed on the notebooks running then

    def start(self) -> int:
        """A key for a notebook that starts running now."""
        with self.lock:
            key = max(self.running, default=0) + 1
            while key in self.running:
                key += 1
            self.running[key] = []
            return key

    def check(self, key: int) -> list[str]:
        """The installed source files found changed since grading started while ``key`` ran (each
        is reported once, to the notebooks running when it was first found); ``[]`` if none."""
        with self.lock:
            new = [name for name in self.snapshot.changed() if name not in self.reported]
            self.reported.update(new)
            for others in self.running.values():
                others.extend(name for name in new if name not in others)
            return list(self.running[key])

    def finish(self, key: int) -> list[str]:
        """:meth:`check` a last time, for a notebook that has finished."""
        found = self.check(key)
        with self.lock:
            del self.running[key]
        return found


def _used_bytecode(source: Path, data: bytes) -> bool:
    """Whether Python would load the compiled file ``data`` (PEP 552's header) for ``source``."""
    if data[:4] != importlib.util.MAGIC_NUMBER or len(data) < 16:
        return False
    flags = int.from_bytes(data[4:8], "little")
    raw = source.read_bytes()
    if flags & 1:  # hash-based: used as it is, unless Python checks the hash and it differs
        return not flags & 2 or data[8:16] == importlib.util.source_hash(raw)
    stat = source.stat()
    return (int.from_bytes(data[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(data[12:16], "little") == len(raw) & 0xFFFFFFFF)


def planted_bytecode(root: Path) -> list[str]:
    """The compiled files under ``root`` that Python would load in place of their source but that
    are not what the source compiles to, by path relative to ``root``.

    Example:
        >>> import py_compile, sys, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     source, forged = Path(folder) / "mine.py", Path(folder) / "forged.py"
        ...     _ = source.write_text("X = 1\\n"), forged.write_text("X = 2\\n")
        ...     _ = py_compile.compile(str(source), doraise=True)
        ...     fine = planted_bytecode(Path(folder))
        ...     _ = py_compile.compile(str(forged), cfile=importlib.util.cache_from_source(str(source)),
        ...                            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        ...     fine, planted_bytecode(Path(folder)) == [f"__pycache__/mine.{sys.implementation.cache_tag}.pyc"]
        ([], True)
    """
    planted = []
    for source in sorted(root.rglob("*.py")):
        compiled = Path(importlib.util.cache_from_source(str(source)))
        try:
            data = compiled.read_bytes()
            if not _used_bytecode(source, data):
                continue
            if marshal.loads(data[16:]) != compile(source.read_bytes(), str(source), "exec", dont_inherit=True):
                planted.append(compiled.relative_to(root).as_posix())
        except (OSError, ValueError, EOFError, TypeError, SyntaxError):
            continue
    return planted


__all__ = ["PackageSnapshot", "EditWatch", "planted_bytecode"]


# ----------------------------------------------------------------------------------------------
# The Python environment grading runs in


def site_folders() -> list[Path]:
    """The folders whose ``.pth`` files every Python started here reads: site-packages (and the
    user's, if it exists)."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(f) for f in dict.fromkeys(folders) if Path(f).is_dir()]


def environment_files(folders: list[Path] | None = None) -> dict[str, str]:
    """What in the environment runs code at every Python start: each ``.pth`` file and any
    ``sitecustomize.py`` or ``usercustomize.py`` in the site folders, by path, with a hash of its
    contents. A notebook that adds or changes one would run its code in every later process, the
    grader's answer processes included (they start with ``-S``, and read none of them, but the next
    notebook's kernel would)."""
    found = {}
    for folder in site_folders() if folders is None else folders:
        try:
            paths = sorted(p for p in folder.iterdir()
                           if p.suffix == ".pth" or p.name in ("sitecustomize.py", "usercustomize.py"))
        except OSError:
            continue
        for path in paths:
            try:
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                found[str(path)] = "unreadable"
    return found


def environment_changes(before: dict[str, str], folders: list[Path] | None = None) -> list[str]:
    """The names of the files :func:`environment_files` finds added, changed or removed since ``before``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     before = environment_files([Path(folder)])
        ...     _ = (Path(folder) / "switch_off.pth").write_text("import os\\n", encoding="utf-8")
        ...     environment_changes(before, [Path(folder)])
        ['switch_off.pth']
    """
    now = environment_files(folders)
    return sorted(Path(p).name for p in set(before) | set(now) if before.get(p) != now.get(p))
