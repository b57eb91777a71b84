"""Which statements of a notebook define things: what the grader replays to find the answers.

The grader does not take the answers from the kernel that ran the notebook: that kernel also ran
every other cell, which may have patched ``torch``, the package or the grader's own helpers. It
replays, in a fresh process, only the statements that *define* names, cell by cell in notebook
order:

* ``import`` and ``from ... import``;
* ``def``, ``async def`` and ``class`` (with their decorators);
* assignments of plain values to plain names (``NEG_INF = float("-inf")``, ``nn = torch.nn``,
  ``build_causal_mask = my_mask``): constants, names, attributes, operators, containers, lambdas and
  calls of a few builtins such as ``float`` or ``range``;
* ``del name``, so that a deleted answer stays deleted.

Everything else is left out: expressions and calls (``check(...)``, ``print``, training loops),
assignments to attributes or items (``torch.save = ...``), loops, ``with`` and ``try`` blocks.

Example:
    >>> [type(s).__name__ for s in definitions("import torch\\ntorch.save = print\\ndef f(x):\\n    return x\\ncheck('1.1', f)")]
    ['Import', 'FunctionDef']
"""

from __future__ import annotations

import ast

# Builtins whose calls may appear in a replayed assignment: they build plain values.
_PLAIN_CALLS = frozenset({"float", "int", "str", "bool", "complex", "tuple", "list", "dict", "set", "frozenset",
                          "range", "len", "abs", "min", "max", "round", "sum", "sorted", "slice"})

_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _plain_value(node: ast.AST) -> bool:
    """True for an expression that only builds a value (no call except :data:`_PLAIN_CALLS`)."""
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Name) and node.func.id in _PLAIN_CALLS
                and all(_plain_value(a) for a in node.args) and all(_plain_value(k.value) for k in node.keywords))
    if isinstance(node, ast.Lambda):
        return all(_plain_value(d) for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred, ast.UnaryOp, ast.BinOp, ast.BoolOp,
                         ast.Compare, ast.IfExp, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Slice,
                         ast.JoinedStr, ast.FormattedValue)):
        return all(_plain_value(child) for child in ast.iter_child_nodes(node)
                   if isinstance(child, ast.expr))
    return isinstance(node, ast.expr_context)


def _names_only(target: ast.AST) -> bool:
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_names_only(t) for t in target.elts)
    return False


def is_definition(statement: ast.stmt) -> bool:
    """True for a top-level statement the grader replays (see the module's docstring)."""
    if isinstance(statement, _DEFINITIONS):
        return True
    if isinstance(statement, ast.Assign):
        return all(_names_only(t) for t in statement.targets) and _plain_value(statement.value)
    if isinstance(statement, ast.AnnAssign):
        return isinstance(statement.target, ast.Name) and (statement.value is None or _plain_value(statement.value))
    if isinstance(statement, ast.Delete):
        return all(isinstance(t, ast.Name) for t in statement.targets)
    return False


def definitions(code: str) -> list[ast.stmt]:
    """The top-level statements of ``code`` that the grader replays; ``[]`` if it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    return [statement for statement in tree.body if is_definition(statement)]


def defined_names(code: str) -> set[str]:
    """The names that the replayed statements of ``code`` bind (``del`` excluded)."""
    names: set[str] = set()
    for statement in definitions(code):
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in statement.names)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


__all__ = ["definitions", "defined_names", "is_definition"]
