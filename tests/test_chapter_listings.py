"""The classes a chapter teaches appear on its page as listings included from the package's source.

A chapter shows a class with a ``{literalinclude}`` of the package file and ``:pyobject:``, trimmed
at most of docstrings (``:lines:``, ``:start-at:`` ...). These tests read each listing exactly as
Sphinx will (its own ``LiteralIncludeReader``), so they fail when an edit of the package moves the
lines a chapter selects: a listing must start with the ``class`` line, hold every line of the class
that is not a docstring, and fit the book's code column.
"""

from __future__ import annotations

import ast
import re
from types import SimpleNamespace

import pytest
from sphinx.directives.code import LiteralIncludeReader

from book_pages import CODE_COLUMN, DOCNAMES, markdown_of, source_of

#: The class each chapter teaches and must show in full.
TAUGHT = {
    "book/01_one_causal_head": ("../mha_course/causal_attention.py", "CausalAttention"),
    "book/02_stacked_heads": ("../mha_course/wrapper.py", "MultiHeadAttentionWrapper"),
    "book/03_batched_heads": ("../mha_course/multihead.py", "MultiHeadAttention"),
    "book/04_what_heads_cost": ("../mha_course/fast.py", "FastMultiHeadAttention"),
}

FENCE = re.compile(r"^(`{3,}|:{3,})\{literalinclude\}\s+(\S+)\s*\n(.*?)^\1\s*$", re.MULTILINE | re.DOTALL)
OPTION = re.compile(r"^:([\w-]+):\s*(.*)$")


def _listings(docname: str) -> list[tuple[str, dict[str, str]]]:
    """Every ``{literalinclude}`` of a page: its path and its options."""
    found = []
    for match in FENCE.finditer(markdown_of(docname)):
        options = {}
        for line in match.group(3).splitlines():
            option = OPTION.match(line.strip())
            if option:
                options[option.group(1)] = option.group(2).strip()
        found.append((match.group(2), options))
    return found


def _read(docname: str, path: str, options: dict[str, str]) -> str:
    """The text Sphinx shows for the listing (the same reader the directive uses)."""
    filename = source_of(docname).parent / path
    # Options as the directive converts them: ``:dedent:`` and ``:lineno-start:`` are numbers, and a
    # bare ``:dedent:`` removes the common indentation (None).
    options = {key: (int(value) if value else None) if key in ("dedent", "lineno-start") else value
               for key, value in options.items()}
    text, _ = LiteralIncludeReader(str(filename), options, SimpleNamespace(source_encoding="utf-8")).read()
    return text


def _class_code_lines(filename, name: str) -> list[str]:
    """The lines of class ``name`` in ``filename``, without its own and its methods' docstrings."""
    source = filename.read_text(encoding="utf-8")
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    lines = source.splitlines()
    dropped = set()
    for inner in [node, *ast.walk(node)]:
        body = getattr(inner, "body", None)
        if isinstance(inner, (ast.ClassDef, ast.FunctionDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            dropped.update(range(body[0].lineno, body[0].end_lineno + 1))
    return [lines[i - 1] for i in range(node.lineno, node.end_lineno + 1) if i not in dropped and lines[i - 1].strip()]


LISTINGS = [(name, path, options) for name in DOCNAMES for path, options in _listings(name)]


@pytest.mark.parametrize("docname", sorted(TAUGHT))
def test_the_chapter_shows_the_class_it_teaches(docname):
    path, name = TAUGHT[docname]
    shown = [options.get("pyobject") for listed, options in _listings(docname) if listed == path]
    assert name in shown, f"{docname}: no {{literalinclude}} of {path} with :pyobject: {name}"


@pytest.mark.parametrize("docname, path, options", LISTINGS, ids=[f"{n}:{o.get('pyobject', p)}" for n, p, o in LISTINGS])
def test_a_listing_shows_the_whole_class_and_fits_the_code_column(docname, path, options):
    text = _read(docname, path, options)
    shown = text.splitlines()
    too_wide = [line for line in shown if len(line) > CODE_COLUMN]
    assert not too_wide, f"{docname}: lines of {path} wider than {CODE_COLUMN} characters: {too_wide}"
    name = options.get("pyobject", "")
    filename = source_of(docname).parent / path
    source = filename.read_text(encoding="utf-8")
    if not re.search(rf"^class {re.escape(name)}\b", source, re.MULTILINE):
        return  # a function or a plain file: nothing more to check
    assert shown[0].startswith(f"class {name}"), f"{docname}: the listing of {name} does not start at its class line"
    missing = [line for line in _class_code_lines(filename, name) if line not in shown]
    assert not missing, f"{docname}: the listing of {name} leaves out code, not only docstrings: {missing}"


def test_the_check_sees_a_listing_that_leaves_out_code(tmp_path):
    """Guards the test above: a selection that cuts a method's code is caught."""
    module = tmp_path / "m.py"
    module.write_text('class A:\n    """Doc."""\n\n    def f(self):\n        return 1\n\n    def g(self):\n        return 2\n', encoding="utf-8")
    text, _ = LiteralIncludeReader(str(module), {"pyobject": "A", "lines": "1,4-5"},
                                   SimpleNamespace(source_encoding="utf-8")).read()
    shown = text.splitlines()
    assert [line for line in _class_code_lines(module, "A") if line not in shown] == ["    def g(self):", "        return 2"]


@pytest.mark.parametrize("docname, path, options", LISTINGS, ids=[f"{n}:{o.get('pyobject', p)}" for n, p, o in LISTINGS])
def test_the_jupyter_edition_shows_every_listing_as_the_book_does(docname, path, options):
    """The student edition's Markdown holds each listing exactly as the book shows it (the class line,
    :prepend:, every selected line), read by the same Sphinx reader."""
    from mha_course.edition.jupyter_markdown import BookIndex, to_jupyter

    jupyter = to_jupyter(markdown_of(docname), BookIndex(), source_of(docname).parent)
    book = _read(docname, path, options).rstrip()
    assert f"```{options.get('language', 'python')}\n{book}\n```" in jupyter, (
        f"{docname}: the Jupyter edition's listing of {options.get('pyobject', path)} differs from the book's")
