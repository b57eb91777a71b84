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
* ``del name``, so that a deleted answer stays deleted;
* assignments of any other value (a call: ``_FUTURE = torch.ones(64, 64).triu(1)``) to a name that a
  ``def`` or ``class`` of the notebook reads, or that such an assignment reads in turn: what the
  answers use is computed as the notebook computed it (:func:`used_globals`). A call that patches
  ``torch`` or the package there is caught as the notebook's other patches are.

Everything else is left out: expressions and calls (``check(...)``, ``print``, training loops),
assignments to attributes or items (``torch.save = ...``), assignments the answers do not read,
loops, ``with`` and ``try`` blocks.

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


def _parse(code: str) -> list[ast.stmt]:
    try:
        return ast.parse(code).body
    except (SyntaxError, ValueError):
        return []


def _bound(statement: ast.stmt) -> set[str]:
    """The names a top-level assignment to names binds (empty for any other statement)."""
    if isinstance(statement, ast.Assign) and all(_names_only(t) for t in statement.targets):
        return {n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value is not None:
        return {statement.target.id}
    return set()


def _read(node: ast.AST) -> set[str]:
    """The names ``node`` reads that it does not bind itself (a ``def``'s or a lambda's arguments and
    assignments, a comprehension's variables): those it looks up among the notebook's globals."""
    local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    local |= {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments)
              for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg] if a is not None}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local


def used_globals(codes: list[str], answers: set[str] = frozenset()) -> set[str]:
    """The names the notebook's ``def`` and ``class`` statements read (the cells' code in ``codes``),
    the ``answers``' own names (so that ``f = torch.no_grad()(g)``, ``functools.partial(...)`` or
    ``functools.lru_cache(...)(g)`` binds an answer as the notebook did), and those the assignments
    binding them read in turn (a constant read by a lambda).

    Example:
        >>> sorted(used_globals(["MASK = torch.ones(4, 4).triu(1)", "unused = print('x')",
        ...                      "def f(n): return MASK[:n, :n]"]))
        ['MASK', 'torch']
        >>> sorted(used_globals(["SCALE = make()", "f = lambda x: x * SCALE"], {"f"}))
        ['SCALE', 'f', 'make']
    """
    statements = [s for code in codes for s in _parse(code)]
    used = set(answers).union(*(_read(s) for s in statements if isinstance(s, _DEFINITIONS[2:])))
    while True:
        more = set().union(*(_read(s.value) for s in statements if _bound(s) & used)) - used
        if not more:
            return used
        used |= more


def definitions(code: str, used: set[str] = frozenset()) -> list[ast.stmt]:
    """The top-level statements of ``code`` that the grader replays; ``[]`` if it does not parse.
    ``used``: the names the notebook's definitions read (:func:`used_globals`), whose assignments
    are replayed whatever their value."""
    return [statement for statement in _parse(code) if is_definition(statement) or _bound(statement) & used]


def defined_names(code: str, used: set[str] = frozenset()) -> set[str]:
    """The names that the replayed statements of ``code`` bind (``del`` excluded)."""
    names: set[str] = set()
    for statement in definitions(code, used):
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in statement.names)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


__all__ = ["definitions", "defined_names", "is_definition", "used_globals"]
