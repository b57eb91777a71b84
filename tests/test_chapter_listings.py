"""The classes a chapter teaches appear on its page as short listings included from the package's source.

A chapter shows a class with a ``{literalinclude}`` of the package file and ``:pyobject:`` (the
class, or ``Class.__init__`` and ``Class.forward`` as separate blocks), trimmed at most of
docstrings and of the methods the class has beside its computation (``:start-at:``, ``:end-at:``
...). These tests read each listing exactly as Sphinx will (its own ``LiteralIncludeReader``), so
they fail when an edit of the package moves the lines a chapter selects: the listings of a taught
class hold every line of its constructor and ``forward`` that is not a docstring, a listing of a
class starts with its ``class`` line, each listing is at most ``MAX_LISTING_LINES`` lines, and
every line fits the book's code column.
"""

from __future__ import annotations

import ast
import re
from types import SimpleNamespace

import pytest
from sphinx.directives.code import LiteralIncludeReader

from book_pages import CODE_COLUMN, DOCNAMES, markdown_of, source_of

#: The class each chapter teaches, and the methods of it that the page must show in full.
TAUGHT = {
    "book/01_one_causal_head": ("../mha_course/attention/causal_attention.py", "CausalAttention", ("__init__", "forward")),
    "book/02_stacked_heads": ("../mha_course/attention/wrapper.py", "MultiHeadAttentionWrapper", ("__init__", "forward")),
    "book/03_batched_heads": ("../mha_course/attention/multihead.py", "MultiHeadAttention", ("__init__", "forward")),
    "book/04_what_heads_cost": ("../mha_course/attention/fast.py", "FastMultiHeadAttention", ("__init__", "forward")),
    "book/06_sharing_keys_and_values": ("../mha_course/attention/grouped_query.py", "GroupedQueryAttention", ("forward",)),
}

#: The longest listing a page may show, comments included: a class a learner can hold in mind.
MAX_LISTING_LINES = 50

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


def _code_lines(filename, name: str, methods: tuple[str, ...] | None = None) -> list[str]:
    """The lines of class ``name`` in ``filename`` (only of ``methods``, if given), without docstrings."""
    source = filename.read_text(encoding="utf-8")
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    lines = source.splitlines()
    dropped = set()
    for inner in [node, *ast.walk(node)]:
        body = getattr(inner, "body", None)
        if isinstance(inner, (ast.ClassDef, ast.FunctionDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            dropped.update(range(body[0].lineno, body[0].end_lineno + 1))
    parts = [node] if methods is None else [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in methods]
    assert methods is None or len(parts) == len(methods), f"{name} lacks one of {methods}"
    return [lines[i - 1] for part in parts for i in range(part.lineno, part.end_lineno + 1)
            if i not in dropped and lines[i - 1].strip()]


LISTINGS = [(name, path, options) for name in DOCNAMES for path, options in _listings(name)]


def _shows(options: dict[str, str], name: str) -> bool:
    """Whether a listing's ``:pyobject:`` is class ``name`` or one of its methods."""
    target = options.get("pyobject", "")
    return target == name or target.startswith(f"{name}.")


@pytest.mark.parametrize("docname", sorted(TAUGHT))
def test_the_chapter_shows_the_class_it_teaches(docname):
    path, name, methods = TAUGHT[docname]
    listings = [options for listed, options in _listings(docname) if listed == path and _shows(options, name)]
    assert listings, f"{docname}: no {{literalinclude}} of {path} with :pyobject: {name} (or one of its methods)"
    # Compared without indentation: a method's listing may be dedented (``:dedent:``).
    shown = {line.strip() for options in listings for line in _read(docname, path, options).splitlines()}
    missing = [line for line in _code_lines(source_of(docname).parent / path, name, methods) if line.strip() not in shown]
    assert not missing, f"{docname}: the listings of {name} leave out code of {', '.join(methods)}: {missing}"


@pytest.mark.parametrize("docname, path, options", LISTINGS, ids=[f"{n}:{o.get('pyobject', p)}" for n, p, o in LISTINGS])
def test_a_listing_is_short_starts_at_its_class_and_fits_the_code_column(docname, path, options):
    text = _read(docname, path, options)
    shown = text.splitlines()
    too_wide = [line for line in shown if len(line) > CODE_COLUMN]
    assert not too_wide, f"{docname}: lines of {path} wider than {CODE_COLUMN} characters: {too_wide}"
    assert len(shown) <= MAX_LISTING_LINES, (
        f"{docname}: the listing of {options.get('pyobject', path)} is {len(shown)} lines, more than "
        f"{MAX_LISTING_LINES}: show the constructor and forward as separate blocks, or move what is not "
        "the computation (checks, conversions) out of the class")
    name = options.get("pyobject", "")
    source = (source_of(docname).parent / path).read_text(encoding="utf-8")
    if re.search(rf"^class {re.escape(name)}\b", source, re.MULTILINE):
        assert shown[0].startswith(f"class {name}"), f"{docname}: the listing of {name} does not start at its class line"


def test_the_checks_see_a_listing_that_leaves_out_code_or_runs_long(tmp_path):
    """Guards the tests above: a selection that cuts a method's code is caught, and so is a long class."""
    module = tmp_path / "m.py"
    module.write_text('class A:\n    """Doc."""\n\n    def __init__(self):\n        self.x = 1\n\n'
                      '    def forward(self):\n        """Doc."""\n        return 2\n\n    def other(self):\n'
                      '        return 3\n', encoding="utf-8")
    text, _ = LiteralIncludeReader(str(module), {"pyobject": "A", "lines": "1,4-5"},
                                   SimpleNamespace(source_encoding="utf-8")).read()
    shown = text.splitlines()
    needed = _code_lines(module, "A", ("__init__", "forward"))
    assert needed == ["    def __init__(self):", "        self.x = 1", "    def forward(self):", "        return 2"]
    assert [line for line in needed if line not in shown] == ["    def forward(self):", "        return 2"]
    assert "        return 3" not in needed  # a method beside the computation need not be shown
    long_class = "class B:\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_LISTING_LINES))
    (tmp_path / "b.py").write_text(long_class, encoding="utf-8")
    text, _ = LiteralIncludeReader(str(tmp_path / "b.py"), {"pyobject": "B"}, SimpleNamespace(source_encoding="utf-8")).read()
    assert len(text.splitlines()) > MAX_LISTING_LINES


@pytest.mark.parametrize("docname, path, options", LISTINGS, ids=[f"{n}:{o.get('pyobject', p)}" for n, p, o in LISTINGS])
def test_the_jupyter_edition_shows_every_listing_as_the_book_does(docname, path, options):
    """The student edition's Markdown holds each listing exactly as the book shows it (the class line,
    :prepend:, every selected line), read by the same Sphinx reader."""
    from mha_course.edition.jupyter_markdown import BookIndex, to_jupyter

    jupyter = to_jupyter(markdown_of(docname), BookIndex(), source_of(docname).parent)
    book = _read(docname, path, options).rstrip()
    assert f"```{options.get('language', 'python')}\n{book}\n```" in jupyter, (
        f"{docname}: the Jupyter edition's listing of {options.get('pyobject', path)} differs from the book's")


# --------------------------------------------------------------------------------------------
# Chapter 3: the module a learner memorises is one listing, and exercise 3.5's answer is that listing
# --------------------------------------------------------------------------------------------

#: Chapter 3's listing leaves this many of its 50 lines free, for a later argument of ``forward``.
CHAPTER_3_MAX_LISTING_LINES = 48


def _chapter_3_listing() -> str:
    docname = "book/03_batched_heads"
    found = [options for path, options in _listings(docname)
             if path == "../mha_course/attention/multihead.py" and options.get("pyobject") == "MultiHeadAttention"]
    assert len(found) == 1, f"{docname}: expected one listing of MultiHeadAttention, found {len(found)}"
    return _read(docname, "../mha_course/attention/multihead.py", found[0])


def test_chapter_3_shows_multihead_attention_as_one_listing_whose_forward_calls_no_package_helper():
    """Every line ``forward`` runs is on the page: it calls no function of the package but the check of
    its input, as every module of the course does (the split and the merge are written out)."""
    from mha_course.attention import multihead

    listing = _chapter_3_listing().splitlines()
    assert len(listing) <= CHAPTER_3_MAX_LISTING_LINES, f"the listing is {len(listing)} lines"
    source = (source_of("book/03_batched_heads").parent / "../mha_course/attention/multihead.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    package_names = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                     and node.level > 0 for alias in node.names}
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MultiHeadAttention")
    forward = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    called = {node.func.id for node in ast.walk(forward) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Name)}
    helpers = called & package_names
    assert helpers == {"validate_input"}, f"forward calls package helpers the page does not show: {helpers}"
    assert not forward.decorator_list and not hasattr(multihead.MultiHeadAttention.forward, "__wrapped__")


def _method_lines(cls: ast.ClassDef, name: str, source: str) -> list[str]:
    """A method's body, line by line and stripped: no docstring, blank lines, comments or solution markers."""
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = source.splitlines()[method.body[0].lineno - 1:method.end_lineno]
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith(("#", '"""'))]


def test_exercise_3_5s_answer_is_chapter_3s_listing_but_for_what_the_page_names():
    """The answer differs from the listing only where the page says why: no checks of the arguments
    and the input, no half-precision lines, no padding lines (chapter 9's), and ``register_buffer``
    for ``register_causal_mask``."""
    import json

    notebook = json.loads(source_of("book/03_batched_heads").read_text(encoding="utf-8"))
    answer = "\n".join("".join(c["source"]) for c in notebook["cells"]
                       if c["cell_type"] == "code" and "class BatchedHeads(" in "".join(c["source"]))
    listing = _chapter_3_listing()
    listing_source = listing.replace("class MultiHeadAttention(nn.Module):", "class MultiHeadAttention:")
    listed = ast.parse(listing_source).body[0]

    def half_precision_free(line: str) -> str | None:
        if line.startswith("dtype = "):
            return None
        return line.replace(".to(dtype)", "").replace(".to(values.dtype)", "")

    def comparable(lines):
        return [kept for line in lines if (kept := half_precision_free(line.split("  #")[0].strip())) is not None]

    def padding_free(lines):  # the blocks under `if attention_mask is not None:`, and those lines
        padding = ("if attention_mask is not None:", "padded = ", "no_key = ", "scores.masked_fill_(padded",
                   "weights = weights.masked_fill(no_key")
        return [line for line in lines if not line.startswith(padding)]

    def check_free(lines):  # the calls that check the arguments and the input, and their continuations
        kept, in_call = [], False
        for line in lines:
            if line.startswith(("validate_attention_args(", "validate_input(")):
                in_call = not line.endswith(")")
            elif in_call:
                in_call = not line.endswith(")")
            else:
                kept.append(line)
        return kept

    answer_class = ast.parse(answer).body[0]
    for method in ("__init__", "forward"):
        mine = check_free(padding_free(comparable(_method_lines(listed, method, listing_source))))
        theirs = comparable(_method_lines(answer_class, method, answer))
        if method == "__init__":
            mine.remove("register_causal_mask(self, context_length)")
            assert theirs[-2:] == [
                "future = torch.ones(context_length, context_length, dtype=torch.bool)",
                'self.register_buffer("mask", torch.triu(future, diagonal=1))']
            theirs = theirs[:-2]
        assert theirs == mine, f"{method}: the answer and the listing differ: {set(theirs) ^ set(mine)}"
