"""The layer contract: the core imports nothing else of the package, an aid imports only the core and
other aids, and every module belongs to a layer.

The layers are defined once, in ``[tool.mha_course.layers]`` of ``pyproject.toml``. Every import
statement of every module counts, at the top of the file or inside a function.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mha_course"
_CONTRACT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mha_course"]
LAYERS: dict[str, list[str]] = _CONTRACT["layers"]
# Within the tools: what each of the exercises' packages may import of the others.
TOOL_LAYERS: dict[str, list[str]] = _CONTRACT["tool_layers"]
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}
MAY_IMPORT = {"core": {"core"}, "aids": {"core", "aids"}, "tools": {"core", "aids", "tools"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import of the package in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # `from . import bench` imports the submodule bench: count each imported name that is one.
            names = [f"{module}.{a.name}" for a in node.names if _is_module(f"{module}.{a.name}")]
            found += [(node.lineno, name) for name in names] or [(node.lineno, module)]
    return [(line, name) for line, name in found if name == "mha_course" or name.startswith("mha_course.")]


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return "root" if len(parts) == 1 else LAYER_OF.get(parts[1])


def violations(path: Path) -> list[str]:
    """Every import in ``path`` that its layer may not make, as readable lines."""
    source = module_name(path)
    layer = layer_of(source)
    if layer == "root":  # the package's face: core and aids at import time, tools only lazily
        layer, imports = "aids", imported_modules(path, top_level_only=True)
    else:
        imports = imported_modules(path)
    bad = []
    for line, target in imports:
        target_layer = layer_of(target)
        if target_layer == "root":
            target_layer = "aids"  # importing the package's public names runs its __init__
        if target_layer not in MAY_IMPORT[layer]:
            bad.append(f"{path.relative_to(REPO)}:{line}: {source} ({layer}) imports {target} ({target_layer})")
        elif layer == "tools" and not _tool_may_import(source, target):
            bad.append(f"{path.relative_to(REPO)}:{line}: {source} ({_tool_of(source)}) imports {target} "
                       f"({_tool_of(target)})")
    return bad


def _tool_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _tool_may_import(source: str, target: str) -> bool:
    """Between the packages listed in [tool.mha_course.tool_layers]: each imports itself and those it lists."""
    mine, theirs = _tool_of(source), _tool_of(target)
    if mine not in TOOL_LAYERS or theirs not in TOOL_LAYERS or mine == theirs:
        return True
    return theirs in TOOL_LAYERS[mine]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    unassigned = sorted({module_name(p).split(".")[1] for p in MODULES
                         if module_name(p) != "mha_course" and layer_of(module_name(p)) is None})
    assert not unassigned, (f"mha_course.{', mha_course.'.join(unassigned)} belongs to no layer: add it to "
                            "core, aids or tools in [tool.mha_course.layers] of pyproject.toml (see CONTRIBUTING.md).")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_respect_the_layers(path):
    bad = violations(path)
    assert not bad, ("the core imports nothing else of the package and an aid imports only the core and "
                     "other aids (pyproject.toml, [tool.mha_course.layers]):\n" + "\n".join(bad))


def test_the_contract_catches_a_bad_import(tmp_path, monkeypatch):
    """The check itself: a core module importing an aid, and an aid importing a tool, are both caught."""
    fake = tmp_path / "mha_course"
    for name in ("attention/masking", "cost", "bench/__init__", "bench/run", "__init__"):
        (fake / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
    (fake / "attention" / "masking.py").write_text("from ..cost import KINDS\n", encoding="utf-8")
    (fake / "cost.py").write_text("def f():\n    from .bench import run  # lazily, still a violation\n", encoding="utf-8")
    (fake / "bench" / "__init__.py").write_text("", encoding="utf-8")
    (fake / "bench" / "run.py").write_text("from ..cost import KINDS\nfrom ..attention import masking\n", encoding="utf-8")
    (fake / "__init__.py").write_text("from .attention.masking import x\ndef __getattr__(name):\n    from .bench import run\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert violations(fake / "attention" / "masking.py") == [
        "mha_course/attention/masking.py:1: mha_course.attention.masking (core) imports mha_course.cost (aids)"]
    assert violations(fake / "cost.py") == [
        "mha_course/cost.py:2: mha_course.cost (aids) imports mha_course.bench.run (tools)"]
    assert violations(fake / "bench" / "run.py") == []  # a tool may import the core and the aids
    assert violations(fake / "__init__.py") == []  # the root loads tools lazily only


# --- No import circles ---------------------------------------------------------------------------------


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, every import counted (at the top or inside a function).

    Importing a package's module also runs the package's ``__init__``; only the imports written in a
    file are edges, so a module is not in a circle with the package it belongs to.
    """
    graph = {module_name(path): set() for path in paths}
    for path in paths:
        source = module_name(path)
        graph[source] |= {target for _, target in imported_modules(path) if target != source and target in graph}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of imports, each once, as the modules in order of import (strongly connected parts)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.append(member)
                if member == node:
                    break
            if len(part) > 1 or node in graph[node]:
                cycles.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_no_module_imports_one_that_imports_it_back():
    """Not even inside a function: a circle means two modules that can only be understood together."""
    cycles = import_cycles(import_graph(MODULES))
    assert not cycles, ("modules that import each other, directly or through others (move what both need into "
                        "one module, or split reading from writing):\n" + "\n".join(" <-> ".join(c) for c in cycles))


def test_the_circle_check_catches_a_planted_circle(tmp_path, monkeypatch):
    """The check itself: the circles the package once had, planted in a copy, are found; a chain is not."""
    fake = tmp_path / "mha_course"
    files = {
        "__init__": "from .attention.multihead import MultiHeadAttention\nfrom .attention.fast import FastMultiHeadAttention\n",
        "attention/multihead": "def from_fast(fast):\n    from .fast import FastMultiHeadAttention  # lazily: still a circle\n",
        "attention/fast": "from .multihead import MultiHeadAttention\n",
        "attention/masking": "",
        "bench/__init__": "from .run import run\n",
        "bench/results": "def write():\n    from .plots import save_plot\n",
        "bench/plots": "from .results import lookup\ndef plot():\n    from .decode import decode_rows\n",
        "bench/decode": "from .results import select\nfrom .run import observed_run\n",
        "bench/run": "from .results import add_ratios\nfrom ..attention.masking import causal_mask\n",
    }
    for name, text in files.items():
        (fake / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (fake / f"{name}.py").write_text(text, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    paths = sorted(fake.rglob("*.py"))
    assert import_cycles(import_graph(paths)) == [
        ["mha_course.attention.fast", "mha_course.attention.multihead"],
        ["mha_course.bench.decode", "mha_course.bench.plots", "mha_course.bench.results", "mha_course.bench.run"],
    ]
    (fake / "attention" / "multihead.py").write_text("", encoding="utf-8")  # the conversion moved out
    (fake / "bench" / "results.py").write_text("", encoding="utf-8")  # writing files moved out
    assert import_cycles(import_graph(paths)) == []
def test_the_contract_keeps_the_checks_grading_and_the_edition_apart(tmp_path, monkeypatch):
    """The checks import neither grading nor the edition; grading and the edition never import each other."""
    fake = tmp_path / "mha_course"
    for name in ("exercises/chapter1", "grading/grader", "edition/student", "notebook_files", "cli"):
        (fake / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
    (fake / "exercises" / "chapter1.py").write_text("from ..grading import grader\n", encoding="utf-8")
    (fake / "grading" / "grader.py").write_text(
        "from ..exercises import chapter1\nfrom ..notebook_files import x\nfrom ..edition import student\n",
        encoding="utf-8")
    (fake / "edition" / "student.py").write_text("from ..exercises import chapter1\n", encoding="utf-8")
    (fake / "notebook_files.py").write_text("", encoding="utf-8")
    (fake / "cli.py").write_text("def f():\n    from .grading import grader\n    from .edition import student\n",
                                 encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert violations(fake / "exercises" / "chapter1.py") == [
        "mha_course/exercises/chapter1.py:1: mha_course.exercises.chapter1 (exercises) imports "
        "mha_course.grading.grader (grading)"]
    assert violations(fake / "grading" / "grader.py") == [
        "mha_course/grading/grader.py:3: mha_course.grading.grader (grading) imports mha_course.edition.student "
        "(edition)"]
    assert violations(fake / "edition" / "student.py") == []
    assert violations(fake / "cli.py") == []  # the command line runs them all


# --- No module reaches into another's private names --------------------------------------------------


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_reach_ins(source: str, filename: str) -> list[str]:
    """Every use of another package module's private name (``_name``) in ``source``, as readable lines.

    A module's own privates (``self._x``, ``cls._x``, ``super()._x``, its own ``_helper``) are fine, and so are those of
    the libraries it imports (``os._exit``, ``torch._C``). What counts: ``from .multihead import
    _helper``, and ``obj._name`` on anything that is not ``self``/``cls`` or an imported library,
    e.g. ``mha._split_heads(x)`` or ``multihead._helper``.
    """
    tree = ast.parse(source, filename=filename)
    libraries = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            libraries |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                          if not alias.name.startswith("mha_course")}
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("mha_course"):
            libraries |= {alias.asname or alias.name for alias in node.names}
    found = []
    for node in ast.walk(tree):
        private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
        if isinstance(node, ast.Attribute) and private(node.attr):
            own = (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) or (
                isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "super")  # the method a class overrides, as its parent has it
            if not own and _root_name(node.value) not in libraries:
                found.append((node.lineno, node.col_offset, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("mha_course")):
            found += [(node.lineno, node.col_offset, f"import {alias.name}") for alias in node.names
                      if private(alias.name)]
    return [f"{filename}:{line}: {text}" for line, _, text in sorted(found)]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_reaches_into_another_modules_private_names(path):
    """A public helper beats a private reach-in (CONTRIBUTING.md): make it public where it belongs."""
    hits = private_reach_ins(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert not hits, "private names of other modules, used here (make them public where they belong):\n" + "\n".join(hits)


def test_the_reach_in_check_runs_over_every_module_and_can_fail():
    checked = {module_name(path) for path in MODULES}
    assert {f"mha_course.{name}" for name in LAYERS["core"]} <= checked and len(checked) >= 40
    source = (
        "import os\nimport torch\nfrom torch import nn\nfrom . import multihead\n"
        "from .multihead import _helper, transfer_weights\nfrom mha_course.cost import _kv_heads\n"
        "def f(mha, x):\n"
        "    os._exit(0); torch._C.TensorBase; nn._reduction  # libraries' privates: fine\n"
        "    return mha._split_heads(x), multihead._helper, self_like.bar._lock\n"
        "class C:\n"
        "    def g(self):\n"
        "        return self._own, cls._own, self.bar._lock\n"
    )
    assert private_reach_ins(source, "bad.py") == [
        "bad.py:5: import _helper",
        "bad.py:6: import _kv_heads",
        "bad.py:9: mha._split_heads",
        "bad.py:9: multihead._helper",
        "bad.py:9: self_like.bar._lock",
        "bad.py:12: self.bar._lock",
    ]


#: The most lines of Python the grading package may hold (``wc -l mha_course/grading/*.py``, subfolders too).
GRADING_LINES = 1600


def test_the_grading_code_stays_short_enough_to_read_and_trust():
    counts = {path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
              for path in sorted((PACKAGE / "grading").rglob("*.py"))}
    assert "grading/grader.py" in counts and sum(counts.values()) <= GRADING_LINES, (
        f"mha_course/grading/ holds {sum(counts.values())} lines of Python, over {GRADING_LINES} ({counts}). "
        "Grading decides a learner's marks and runs their code: a maintainer must be able to read all of it and "
        "trust it. Make the code shorter (plain data, the standard library, fewer one-use helpers) rather than "
        "raising the limit or moving grading code elsewhere.")
