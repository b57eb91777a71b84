"""Listings: the package's own source, shown on the page by a notebook cell.

A chapter walks through the code it teaches. The cell ``show_source(CausalAttention,
members=("__init__", "forward"))`` displays that code, read from the installed package with
:mod:`inspect`, so what a reader sees is what ran. JupyterLab, the student edition and the HTML
book show the same listing: the cell's output is a Markdown code block (highlighted by JupyterLab
and by Sphinx), with the plain code as its ``text/plain`` form (what a terminal and nbval read).
The book hides the cell's input (tag ``remove-input``) and shows the output.

A listing is code, not documentation: docstrings are left out (the API page shows them).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class Listing:
    """Lines of the package's source as a notebook shows them: a Markdown code block under a caption.

    ``print(listing)`` and ``repr`` give the code alone; in a notebook the cell's output is the
    Markdown (``_repr_markdown_``).
    """

    code: str
    caption: str = ""
    language: str = "python"

    @property
    def lines(self) -> list[str]:
        return self.code.splitlines()

    def __str__(self) -> str:
        return self.code

    def __repr__(self) -> str:  # the text/plain form a notebook stores beside the Markdown
        return self.code

    def _repr_markdown_(self) -> str:
        fence = "`" * max(3, _longest_backtick_run(self.code) + 1)
        caption = f"*{self.caption}*\n\n" if self.caption else ""
        return f"{caption}{fence}{self.language}\n{self.code}\n{fence}\n"


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for character in text:
        run = run + 1 if character == "`" else 0
        longest = max(longest, run)
    return longest


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers (1-based, in ``tree``'s source) of every docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _member_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _first_line(node: ast.stmt, lines: list[str]) -> int:
    """Where a statement starts as a reader sees it: at its first decorator, or at the comment lines
    right above it (``#:`` documents an attribute)."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    while first > 1 and lines[first - 2].strip().startswith("#"):
        first -= 1
    return first


def _class_listing(source: str, name: str, members) -> list[str]:
    """The class header and the chosen members of the class in ``source``, in source order."""
    tree = ast.parse(source)
    node = tree.body[0]
    lines = source.splitlines()
    dropped = _docstring_lines(tree)
    if members is None:
        numbers = range(_first_line(node, lines), node.end_lineno + 1)
        return [lines[i - 1] for i in numbers if i not in dropped]
    wanted = list(members)
    by_name = {_member_name(n): n for n in node.body}
    missing = [m for m in wanted if m not in by_name]
    if missing:
        raise ValueError(f"members={tuple(wanted)!r}: {name} has no member {missing[0]!r}; name methods or "
                         f"class attributes defined in its body: {sorted(n for n in by_name if n)}.")
    header_end = node.body[0].lineno - 1  # the class line (and a signature broken over lines)
    shown = [lines[i - 1] for i in range(_first_line(node, lines), header_end + 1)
             if i not in dropped and lines[i - 1].strip()]
    chosen = [n for n in node.body if _member_name(n) in wanted]
    for number, member in enumerate(chosen):
        part = [lines[i - 1] for i in range(_first_line(member, lines), member.end_lineno + 1) if i not in dropped]
        if number and isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
            shown.append("")
        shown += part
    return shown


def _cut(lines: list[str], start_at: str | None, end_at: str | None, name: str) -> list[str]:
    first, last = 0, len(lines) - 1
    if start_at is not None:
        first = next((i for i, line in enumerate(lines) if start_at in line), None)
        if first is None:
            raise ValueError(f"start_at={start_at!r} is not in the source of {name}: pick a line that is.")
    if end_at is not None:
        last = next((i for i in range(first, len(lines)) if end_at in lines[i]), None)
        if last is None:
            raise ValueError(f"end_at={end_at!r} is not in the source of {name} after start_at: pick a line "
                             "that is.")
    return lines[first:last + 1]


def source_path(obj) -> str:
    """Where ``obj`` is defined, as the repository names the file: ``mha_course/attention/fast.py``."""
    path = Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve()
    package = Path(__file__).resolve().parent
    try:
        return (Path(package.name) / path.relative_to(package)).as_posix()
    except ValueError:
        return path.name


def show_source(obj, members=None, start_at: str | None = None, end_at: str | None = None,
                caption: str | None = None) -> Listing:
    """The source of a class, function or method, without its docstrings, as a :class:`Listing`.

    Args:
        obj: a class (its header and body), a function, or a method (``Class.method``: shown at
            the left margin).
        members: for a class, the names of the methods and class attributes to show, after the
            ``class`` line (in the order the source defines them); ``None`` shows the whole class.
        start_at, end_at: show only the lines from the first that holds ``start_at`` to the next
            that holds ``end_at`` (both included).
        caption: the line above the code; by default the file that defines ``obj``.

    Raises:
        ValueError: for a member the class does not define, or a ``start_at`` or ``end_at`` the
            source does not hold (the package changed: pick lines that are there).

    Example:
        >>> from mha_course import CausalAttention
        >>> listing = show_source(CausalAttention, members=("__init__", "forward"))
        >>> listing.lines[0], listing.lines[1].strip()
        ('class CausalAttention(nn.Module):', 'def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):')
        >>> "Context vectors for" in listing.code  # the docstrings are on the API page
        False
        >>> print(show_source(CausalAttention.forward, start_at="weights = torch.softmax", end_at="return"))
        weights = torch.softmax(scores, dim=-1)  # (B, T, T), rows sum to 1
        weights = weights.to(values.dtype)
        return self.dropout(weights) @ values  # (B, T, d_out)
    """
    target = inspect.unwrap(obj)
    name = getattr(obj, "__qualname__", repr(obj))
    source = textwrap.dedent(inspect.getsource(target))
    if inspect.isclass(target):
        lines = _class_listing(source, name, members)
    else:
        if members is not None:
            raise ValueError(f"members= selects parts of a class, but {name} is not a class: pass the class, "
                             "or leave members out.")
        dropped = _docstring_lines(ast.parse(source))
        lines = [line for number, line in enumerate(source.splitlines(), start=1) if number not in dropped]
    lines = _cut(lines, start_at, end_at, name)
    code = textwrap.dedent("\n".join(lines)).strip("\n")
    return Listing(code, source_path(obj) if caption is None else caption)


__all__ = ["Listing", "show_source", "source_path"]
