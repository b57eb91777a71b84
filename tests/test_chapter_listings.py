"""The classes a chapter teaches appear on its page as short listings, shown by cells from the package's source.

A chapter shows code with a cell that calls ``mha_course.listing.show_source`` (tag ``remove-input``,
its input folded in Jupyter): the output is the package's source, the same in JupyterLab, the
student edition and the HTML. These tests read each listing as the cell makes it, so they fail when
an edit of the package moves the lines a chapter selects: the listings of a taught class hold every
line of its constructor and ``forward`` that is not a docstring, a listing of a class starts with
its ``class`` line, each listing is at most ``MAX_LISTING_LINES`` lines, every line fits the book's
code column, and the stored output is the listing the package gives today.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch

from book_pages import CODE_COLUMN, NOTEBOOKS, source_of

from mha_course.attention.masking import causal_mask
from mha_course.listing import Listing, show_source

#: The class each chapter teaches, and the methods of it that the page must show in full but for the
#: lines a later chapter teaches (a fragment each holds): chapter 6 leaves the rotary lines to chapter 9.
TAUGHT = {
    "book/01_one_causal_head": ("CausalAttention", ("__init__", "forward")),
    "book/02_stacked_heads": ("MultiHeadAttentionWrapper", ("__init__", "forward")),
    "book/03_batched_heads": ("MultiHeadAttention", ("__init__", "forward")),
    "book/04_what_heads_cost": ("FastMultiHeadAttention", ("__init__", "forward")),
    "book/06_sharing_keys_and_values": ("GroupedQueryAttention", ("forward",), ("self.rotary", "position_embeddings)")),
    # where the rotation's cos and sin are made, and where forward applies them
    "book/09_positions_and_padding": ("RotaryEmbedding", ("cos_sin", "forward")),
    "book/10_storing_less_latent_attention": ("MultiHeadLatentAttention", ("__init__", "forward")),
    "book/11_looking_at_fewer_keys": ("SparseLatentAttention", ("forward",)),
    "book/12_a_state_that_does_not_grow": ("GatedDeltaNet", ("__init__", "forward")),
}

#: The longest listing a page may show, comments included: a class a learner can hold in mind.
MAX_LISTING_LINES = 50


def _cells(docname: str) -> list[dict]:
    cells = json.loads(source_of(docname).read_text(encoding="utf-8"))["cells"]
    imports = [node for cell in cells if cell["cell_type"] == "code" for node in _top_level(cell)
               if isinstance(node, (ast.Import, ast.ImportFrom))]
    return [{**cell, "imports": imports} for cell in cells
            if cell["cell_type"] == "code" and "show_source(" in "".join(cell["source"])]


def _top_level(cell: dict) -> list[ast.stmt]:
    try:
        return ast.parse("".join(cell["source"])).body
    except SyntaxError:  # a cell of IPython magic
        return []


def _shown(cell: dict) -> list[tuple[str, Listing]]:
    """The listings a cell shows: each ``show_source(...)`` call, as source text and as the listing it
    makes now (the notebook's imports run first)."""
    tree = ast.parse("".join(cell["source"]))
    namespace: dict = {}
    exec(compile(ast.Module(cell["imports"], []), "<the notebook's imports>", "exec"), namespace)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "show_source"]
    return [(ast.unparse(call), eval(compile(ast.Expression(call), "<listing>", "eval"), namespace)) for call in calls]


def _listings(docname: str) -> list[Listing]:
    return [listing for cell in _cells(docname) for _, listing in _shown(cell)]


LISTINGS = [(name, call, listing) for name in NOTEBOOKS for cell in _cells(name) for call, listing in _shown(cell)]


def _code_lines(cls, methods: tuple[str, ...]) -> list[str]:
    """The lines of ``methods`` of class ``cls``, without docstrings."""
    source = Path(inspect.getsourcefile(cls)).read_text(encoding="utf-8")
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    lines = source.splitlines()
    dropped = set()
    for inner in [node, *ast.walk(node)]:
        body = getattr(inner, "body", None)
        if isinstance(inner, (ast.ClassDef, ast.FunctionDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            dropped.update(range(body[0].lineno, body[0].end_lineno + 1))
    parts = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in methods]
    assert len(parts) == len(methods), f"{cls.__name__} lacks one of {methods}"
    return [lines[i - 1] for part in parts for i in range(part.lineno, part.end_lineno + 1)
            if i not in dropped and lines[i - 1].strip()]


@pytest.mark.parametrize("docname", sorted(TAUGHT))
def test_the_chapter_shows_the_class_it_teaches(docname):
    import mha_course

    name, methods, *later = TAUGHT[docname]
    later = later[0] if later else ()
    cls = getattr(mha_course, name)
    shown = {line.strip() for listing in _listings(docname) for line in listing.lines}
    code = _code_lines(cls, methods)
    missing = [line for line in code if line.strip() not in shown and not any(f in line for f in later)]
    assert not missing, f"{docname}: the listings of {name} leave out code of {', '.join(methods)}: {missing}"
    for fragment in later:  # what the page leaves to a later chapter is in the class, and not shown
        assert any(fragment in line for line in code), f"{name} has no line with {fragment!r}: update TAUGHT"
        assert not any(fragment in line for line in shown), f"{docname} shows {fragment!r}, left to a later chapter"


@pytest.mark.parametrize("docname, call, listing", LISTINGS, ids=[f"{n}:{c[:60]}" for n, c, _ in LISTINGS])
def test_a_listing_is_short_starts_at_its_class_and_fits_the_code_column(docname, call, listing):
    too_wide = [line for line in listing.lines if len(line) > CODE_COLUMN]
    assert not too_wide, f"{docname}: {call} shows lines wider than {CODE_COLUMN} characters: {too_wide}"
    assert len(listing.lines) <= MAX_LISTING_LINES, (
        f"{docname}: {call} is {len(listing.lines)} lines, more than {MAX_LISTING_LINES}: show the constructor "
        "and forward as separate listings, or move what is not the computation (checks, conversions) out of "
        "the class")
    if "members=" in call:
        assert listing.lines[0].startswith("class "), f"{docname}: {call} does not start at its class line"


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_a_listing_cell_shows_its_output_not_its_input_and_stores_what_the_package_holds(docname):
    """In the book the cell's input is removed; in Jupyter it is folded. Its stored output is the
    listing as the package gives it today (in Markdown, highlighted, and as plain code)."""
    for cell in _cells(docname):
        assert "remove-input" in cell["metadata"].get("tags", []), f"{docname}: a listing cell without remove-input"
        assert cell["metadata"].get("jupyter", {}).get("source_hidden"), f"{docname}: a listing cell shows its input"
        markdown = "".join("".join(o.get("data", {}).get("text/markdown", "")) for o in cell["outputs"])
        for call, listing in _shown(cell):
            assert listing._repr_markdown_() in markdown, f"{docname}: the stored output of {call} is not the listing"


def test_no_chapter_includes_source_with_a_directive_jupyter_cannot_show():
    """A {literalinclude} shows only in the HTML; a chapter shows code with a listing cell."""
    for docname in NOTEBOOKS:
        notebook = json.loads(source_of(docname).read_text(encoding="utf-8"))
        assert not any("{literalinclude}" in "".join(c["source"]) for c in notebook["cells"]), docname


def test_the_checks_see_a_listing_that_leaves_out_code_or_runs_long(tmp_path, monkeypatch):
    """Guards the tests above: a selection that cuts a method's code is caught, and so is a long class."""
    import importlib
    import sys

    (tmp_path / "listed_module.py").write_text(
        'class A:\n    """Doc."""\n\n    def __init__(self):\n        self.x = 1\n\n'
        '    def forward(self):\n        """Doc."""\n        return 2\n\n    def other(self):\n'
        '        return 3\n' + "class B:\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_LISTING_LINES)),
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("listed_module")
    try:
        needed = _code_lines(module.A, ("__init__", "forward"))
        assert needed == ["    def __init__(self):", "        self.x = 1", "    def forward(self):", "        return 2"]
        shown = {line.strip() for line in show_source(module.A, members=("__init__",)).lines}
        assert [line for line in needed if line.strip() not in shown] == ["    def forward(self):", "        return 2"]
        assert "return 3" not in "\n".join(needed)  # a method beside the computation need not be shown
        assert len(show_source(module.B).lines) > MAX_LISTING_LINES
    finally:
        sys.modules.pop("listed_module", None)


# --------------------------------------------------------------------------------------------
# Chapter 3: the module a learner memorises is one listing, and exercise 3.5's answer is that listing
# --------------------------------------------------------------------------------------------

#: Chapter 3's listing leaves this many of its 50 lines free, for a later argument of ``forward``.
CHAPTER_3_MAX_LISTING_LINES = 48


def _chapter_3_listing() -> str:
    docname = "book/03_batched_heads"
    found = [listing for cell in _cells(docname) for call, listing in _shown(cell)
             if call.startswith("show_source(MultiHeadAttention,")]
    assert len(found) == 1, f"{docname}: expected one listing of MultiHeadAttention, found {len(found)}"
    return found[0].code


def test_chapter_3_shows_multihead_attention_as_one_listing_whose_forward_calls_no_package_helper():
    """Every line ``forward`` runs on an unpadded batch is on the page: it calls no function of the
    package but the check of its input, as every module of the course does (the split and the merge
    are written out), and ``padded_softmax``, which is ``torch.softmax`` itself without a padding mask
    and holds the padding lines of chapter 9 out of the listing."""
    from mha_course.attention import multihead

    listing = _chapter_3_listing().splitlines()
    assert len(listing) <= CHAPTER_3_MAX_LISTING_LINES, f"the listing is {len(listing)} lines"
    source = inspect.getsource(multihead)
    tree = ast.parse(source)
    package_names = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                     and node.level > 0 for alias in node.names}
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MultiHeadAttention")
    forward = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    called = {node.func.id for node in ast.walk(forward) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Name)}
    helpers = called & package_names
    assert helpers == {"validate_input", "padded_softmax"}, (
        f"forward calls package helpers the page does not show: {helpers}")
    scores = torch.randn(2, 3, 5, 5).masked_fill(causal_mask(5), float("-inf"))
    assert torch.equal(multihead.padded_softmax(scores, None), torch.softmax(scores, dim=-1))
    assert not forward.decorator_list and not hasattr(multihead.MultiHeadAttention.forward, "__wrapped__")


def _method_lines(cls: ast.ClassDef, name: str, source: str) -> list[str]:
    """A method's body, line by line and stripped: no docstring, blank lines, comments or solution markers."""
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = source.splitlines()[method.body[0].lineno - 1:method.end_lineno]
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith(("#", '"""'))]


def test_exercise_3_5s_answer_is_chapter_3s_listing_but_for_what_the_page_names():
    """The answer differs from the listing only where the page says why: no checks of the arguments
    and the input, no half-precision lines, ``torch.softmax`` for ``padded_softmax`` (which adds
    chapter 9's padding), and ``register_buffer`` for ``register_causal_mask``."""
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

    def padding_free(lines):  # padded_softmax is torch.softmax without a padding mask
        return [line.replace("padded_softmax(scores, attention_mask)", "torch.softmax(scores, dim=-1)")
                for line in lines]

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
