"""The package as grading found it: its source files read once (:class:`PackageSnapshot`), and the
compiled copy every kernel and answer process of a grading imports first (:meth:`~PackageSnapshot.write_copy`).

A contributor who saves a module while a class is graded changes no grade of that run, and the grader
never writes into the installed package (often a contributor's working tree). The sandboxes see the
copy read-only; without a sandbox the grader compares it with the snapshot after each notebook.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     snapshot = PackageSnapshot()
    ...     copy = snapshot.write_copy(Path(folder))
    ...     (copy / "mha_course" / "__init__.py").exists(), snapshot.changed_in(copy)
    (True, [])
"""

from __future__ import annotations

import compileall
import hashlib
import site
from pathlib import Path

import mha_course

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
        self.digest = hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in self.files.items())
                                     ).hexdigest()

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
