"""Every text file the package and its tests read or write names its encoding.

Without ``encoding=`` Python uses the platform's locale encoding, which on Windows is cp1252: the
chapters, the stored results and the verdict lines hold non-ASCII text (``✓``, ``µs``, ``·``), which
would then be read wrongly or fail to write. This test reads the source of every module of
``mha_course/`` and ``tests/`` and lists each ``read_text``, ``write_text`` or ``open`` in text mode
that does not pass an encoding.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(REPO / "mha_course").rglob("*.py"), *(REPO / "tests").rglob("*.py")])

# Modules whose ``open`` is not a text file's (``os.open`` opens a descriptor, ``webbrowser.open`` a page)
# or opens in binary by default.
_NOT_TEXT_OPEN = {"os", "webbrowser", "gzip", "bz2", "lzma", "tarfile", "zipfile", "Image"}


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[position] if len(call.args) > position else None


def _missing_encoding(call: ast.Call) -> str | None:
    """The name of the call if it reads or writes a text file without naming the encoding."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name == "read_text":
        return None if _argument(call, 0, "encoding") is not None else name
    if name == "write_text":
        return None if _argument(call, 1, "encoding") is not None else name
    if name != "open":
        return None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in _NOT_TEXT_OPEN:
        return None
    # open(file, mode, buffering, encoding) and io.open; path.open(mode, buffering, encoding).
    builtin = isinstance(func, ast.Name) or (isinstance(func.value, ast.Name) and func.value.id == "io")
    mode = _argument(call, 1 if builtin else 0, "mode")
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "b" in mode.value:
        return None  # binary: bytes have no encoding
    return None if _argument(call, 3 if builtin else 2, "encoding") is not None else name


def unencoded_calls(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: call`` for each text read or write in ``source`` without an explicit encoding."""
    tree = ast.parse(source, filename=filename)
    calls = sorted((node.lineno, name) for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and (name := _missing_encoding(node)))
    return [f"{filename}:{line}: {name}(...) without encoding=" for line, name in calls]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO).as_posix()))
def test_every_text_file_is_read_and_written_with_an_explicit_encoding(path):
    found = unencoded_calls(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not found, ('pass encoding="utf-8" (the locale encoding is cp1252 on Windows):\n' + "\n".join(found))


def test_the_check_finds_each_kind_of_call_without_an_encoding():
    source = "\n".join([
        "p.read_text()",                          # 1: found
        "p.write_text('✓')",                      # 2: found
        "open('f')",                              # 3: found
        "open('f', 'w')",                         # 4: found
        "p.open()",                               # 5: found
        "io.open('f', mode='r')",                 # 6: found
        "p.read_text(encoding='utf-8')",
        "p.read_text('utf-8')",
        "p.write_text('✓', encoding='utf-8')",
        "open('f', 'rb')",
        "p.open('wb')",
        "open('f', 'w', encoding='utf-8')",
        "p.open(encoding='utf-8', newline='')",
        "os.open('f', os.O_RDONLY)",
        "p.read_bytes()",
    ])
    assert unencoded_calls(source) == [f"<source>:{line}: {name}(...) without encoding=" for line, name in
                                       [(1, "read_text"), (2, "write_text"), (3, "open"), (4, "open"), (5, "open"),
                                        (6, "open")]]
