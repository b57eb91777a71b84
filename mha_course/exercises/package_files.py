"""The package's files as the grader found them: a snapshot, private copies, a check for edits.

A notebook being graded runs with the same rights as the grader, so it could edit the package's
files on disk (the checks, or the code that records an answer) and pass every exercise - its own
and, as the edit stays, every notebook graded after it. The grader therefore

* reads every file of the installed package once, when grading starts (:class:`PackageSnapshot`);
* runs each notebook, and each replay of its answers, against a private copy written from that
  snapshot into a fresh temporary folder (:meth:`PackageSnapshot.write_copy`), so an edit to the
  copy reaches nothing else;
* after each notebook compares the installed source files with the snapshot
  (:meth:`PackageSnapshot.changed`), refuses to score a notebook that changed them, and writes them
  back (:meth:`PackageSnapshot.restore`) before the next. Compiled files (``__pycache__``) that are
  new or differ are deleted, so a forged one is never loaded, without counting against the notebook:
  any Python importing the package for the first time writes them, and Python recompiles them.

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
import threading
from pathlib import Path

import mha_course

PACKAGE = "mha_course"


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (compiled ``__pycache__`` files included), by relative path."""
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


class PackageSnapshot:
    """The bytes of every file of the package, read once."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or Path(mha_course.__file__).parent)
        self.files = _files(self.root)
        self.digest = hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in self.files.items()
                                               if "__pycache__" not in name)).hexdigest()

    def write_copy(self, folder: Path) -> Path:
        """Write the package's source files under ``folder/mha_course/``; return ``folder`` (for
        ``sys.path``). Compiled files are left out: the copy's modules are compiled from source."""
        for name, data in self.files.items():
            if "__pycache__" in name:
                continue
            target = folder / PACKAGE / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return folder

    def _differences(self, root: Path, source_only: bool) -> list[str]:
        now = _files(root) if root.is_dir() else {}
        expected = {n: d for n, d in self.files.items() if not (source_only and "__pycache__" in n)}
        if source_only:
            now = {n: d for n, d in now.items() if "__pycache__" not in n}
        return sorted(n for n in expected.keys() | now.keys() if expected.get(n) != now.get(n))

    def changed(self) -> list[str]:
        """The installed package's source files that differ from the snapshot (edited, added or removed)."""
        return self._differences(self.root, source_only=True)

    def changed_in(self, copy: Path) -> list[str]:
        """The source files of a private copy (written by :meth:`write_copy`) that differ."""
        return self._differences(copy / PACKAGE, source_only=True)

    def restore(self) -> None:
        """Write the snapshot's source files back over the installed package, remove source files it did
        not have, and delete compiled files that are new or differ from the snapshot."""
        for name in self.changed():
            path = self.root / name
            if name in self.files:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self.files[name])
            elif path.is_file():
                path.unlink()
        for name in self._differences(self.root, source_only=False):
            path = self.root / name
            if "__pycache__" in name and path.is_file():
                path.unlink()


class EditWatch:
    """Notebooks being graded at the same time, so that an edit to the installed package found by
    one of them withholds the score of every notebook that was running when it was found."""

    def __init__(self, snapshot: PackageSnapshot):
        self.snapshot = snapshot
        self.lock = threading.Lock()
        self.running: dict[int, list[str]] = {}

    def start(self) -> int:
        """A key for a notebook that starts running now."""
        with self.lock:
            key = max(self.running, default=0) + 1
            while key in self.running:
                key += 1
            self.running[key] = []
            return key

    def check(self, key: int) -> list[str]:
        """The installed files changed while ``key`` ran (then written back); ``[]`` if none."""
        with self.lock:
            changed = self.snapshot.changed()
            self.snapshot.restore()  # also deletes compiled files that are new or differ
            if changed:
                for others in self.running.values():
                    others.extend(name for name in changed if name not in others)
            return list(self.running[key])

    def finish(self, key: int) -> list[str]:
        """:meth:`check` a last time, for a notebook that has finished."""
        found = self.check(key)
        with self.lock:
            del self.running[key]
        return found


__all__ = ["PackageSnapshot", "EditWatch"]
