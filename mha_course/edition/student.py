"""The student edition: the chapter notebooks with every solution replaced by a stub.

In the source notebooks each solution sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``,
inside the body of the function the learner writes (the ``def`` line stays as the book shows it).
The student edition keeps everything else and, for each solution:

* replaces the lines between the markers by a body that raises ``NotImplementedError``, at the
  markers' indentation, so the notebook still runs top to bottom and the check that follows
  prints "not implemented yet";
* drops everything between a ``{solution-start}`` and its ``{solution-end}`` fence in the Markdown
  cells (a solution's prose as well as the fences), every ``{solution}`` directive, and any code cell
  inside a gated solution that has no markers.

The edition for Jupyter (the default) also turns the book's MyST Markdown into plain Markdown (see
:mod:`mha_course.edition.jupyter_markdown`): each exercise statement becomes a heading with its
number and title, roles become their text. The ``book`` edition keeps the MyST, so that
``jupyter-book`` builds the book without solutions from it. The Jupyter edition also copies the
``data/`` folder next to the chapters, which the chapters read, so the folder stands alone.

The cells before the chapter's exercises keep the outputs the book shows (its tables and figures),
so the learner reads the page as the book shows it before running anything; from the exercises on,
outputs are cleared (a check's verdict or a solution's result would give the answer away), and so are
all execution counts. A cell the book removes (``remove-cell``: the assertions that back the prose's
numbers) is dropped, unless it binds a name a later cell reads or changes the kernel's state (a seed,
the print options): such a cell stays, folded, so the notebook still runs top to bottom. Existing
notebooks are never overwritten unless asked (``force``), so a learner's work is not lost by
regenerating the edition.

Command line::

    python -m mha_course student [--out DIR] [--force] [--book] [NOTEBOOKS...]
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import shutil
import sys
from pathlib import Path

import nbformat

from . import jupyter_markdown
from ..exercises.framework import STUB_MESSAGE
from .jupyter_markdown import SOLUTION_DIRECTIVES, BookIndex, Fence
from ..notebook_files import SOLUTION_BEGIN, DATA_FOLDER, course_root, data_files, default_notebooks, in_tool_folder

BEGIN = SOLUTION_BEGIN
END = "### END SOLUTION"
STUB_COMMENT = "# YOUR CODE HERE"


class SolutionMarkerError(ValueError):
    """A ``### BEGIN SOLUTION`` without its ``### END SOLUTION`` (or the other way round)."""


def _stub_body(indent: str) -> list[str]:
    return [f"{indent}{STUB_COMMENT}", f'{indent}raise NotImplementedError("{STUB_MESSAGE}")']


def student_source(source: str) -> str:
    """Replace every solution region of one code cell's source by its stub.

    Example:
        >>> print(student_source("def double(x):\\n    ### BEGIN SOLUTION\\n    return 2 * x\\n    ### END SOLUTION"))
        def double(x):
            # YOUR CODE HERE
            raise NotImplementedError("Replace this line with your solution.")
    """
    out: list[str] = []
    indent: str | None = None  # the markers' indentation while inside a solution
    for number, line in enumerate(source.splitlines(), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if indent is not None:
                raise SolutionMarkerError(f"line {number}: {BEGIN} inside another solution")
            indent = line[: len(line) - len(line.lstrip())]
        elif marker == END:
            if indent is None:
                raise SolutionMarkerError(f"line {number}: {END} without a {BEGIN} before it")
            out += _stub_body(indent)
            indent = None
        elif indent is None:
            out.append(line)
    if indent is not None:
        raise SolutionMarkerError(f"{BEGIN} without a matching {END}")
    return "\n".join(out)


def has_solution(cell) -> bool:
    return cell.cell_type == "code" and any(line.strip() == BEGIN for line in cell.source.splitlines())


def is_solution_markdown(cell) -> bool:
    """True for a Markdown cell that holds a solution directive (``{solution}``, ``-start``, ``-end``)
    or a solution in prose (``<details class="solution">``)."""
    return cell.cell_type == "markdown" and (bool(PROSE_SOLUTION.search(cell.source)) or any(
        name in SOLUTION_DIRECTIVES for name in jupyter_markdown.directive_names(cell.source)))


def _show_as_a_stub(cell) -> None:
    """A solution cell's stub is for the learner to fill: shown, not folded away like the solution."""
    tags = cell.metadata.get("tags", [])
    if "hide-input" in tags:
        tags.remove("hide-input")
    for key in ("mystnb", "jupyter"):
        cell.metadata.pop(key, None)


def _as_the_book_shows_it(cell, keep_outputs: bool) -> None:
    """Outputs kept where ``keep_outputs`` (a cell before the exercises) and cleared otherwise, and
    what the book hides hidden in Jupyter too: a cell the book removes (``remove-cell``, kept only
    where a later cell needs it) or folds whole (``hide-cell``, an optional aside's code) is folded
    away, input and output; a cell whose input the book folds (``hide-input``) or removes
    (``remove-input``) has its input folded, and one whose output it folds (``hide-output``) its
    output. A ``remove-input`` cell is a listing of the package's source: its output, that source,
    stays wherever it is, so the edition shows every listing before it is run."""
    tags = cell.metadata.get("tags", [])
    if not keep_outputs and "remove-input" not in tags:
        cell.outputs = []
    for output in cell.outputs:
        if "execution_count" in output:
            output["execution_count"] = None
    cell.execution_count = None
    cell.metadata.pop("execution", None)
    jupyter = cell.metadata.get("jupyter", {})
    if {"remove-cell", "hide-cell"} & set(tags):
        jupyter.update(source_hidden=True, outputs_hidden=True)
    else:
        if {"hide-input", "remove-input"} & set(tags):
            jupyter["source_hidden"] = True
        if "hide-output" in tags:
            jupyter["outputs_hidden"] = True
    if jupyter:
        cell.metadata["jupyter"] = jupyter


#: Calls that change what later cells print although they bind no name: the random generators'
#: state (seeding them, or drawing from them), the print options, matplotlib's settings. A removed
#: cell that makes one stays in the student edition.
STATE_CHANGES = re.compile(r"manual_seed|seed|set_printoptions|set_default_dtype|set_default_device|"
                           r"use_deterministic_algorithms|set_rng_state|set_num_threads|rc|rcParams|"
                           r"style\.use|use|rand\w*|[Dd]ropout|multinomial|normal_|uniform_|bernoulli_?")


def _changes_state(tree: ast.AST) -> bool:
    """Whether Python code calls one of :data:`STATE_CHANGES` or touches matplotlib's ``rcParams``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
            if STATE_CHANGES.fullmatch(name):
                return True
        elif isinstance(node, (ast.Name, ast.Attribute)) and "rcParams" in (getattr(node, "id", ""), getattr(node, "attr", "")):
            return True
    return False


class _Names(ast.NodeVisitor):
    """The names a cell binds, and those it reads before binding them, in the order Python runs it:
    an assignment's value before its targets, a loop's iterable before its variable, a
    comprehension's loops before its element, a function's parameters before its body."""

    def __init__(self):
        self.bound: set[str] = set()
        self.read: set[str] = set()

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            if node.id not in self.bound:
                self.read.add(node.id)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name) and node.target.id not in self.bound:
            self.read.add(node.target.id)
        self.visit(node.value)
        self.visit(node.target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def _comprehension(self, node, *parts):
        for generator in node.generators:
            self.visit(generator)
        for part in parts:
            self.visit(part)

    def visit_ListComp(self, node):
        self._comprehension(node, node.elt)

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self._comprehension(node, node.key, node.value)

    def visit_arg(self, node):
        self.bound.add(node.arg)

    def _definition(self, node):
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.bound.add(node.name)
        for field in ("args", "bases", "keywords", "body"):
            for child in (lambda value: value if isinstance(value, list) else [value])(getattr(node, field, [])):
                self.visit(child)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _definition

    def visit_Import(self, node):
        self.bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)

    visit_ImportFrom = visit_Import


def _names(source: str) -> tuple[set[str], set[str]] | None:
    """(names a code cell binds, names it reads before binding them), or None where Python cannot
    parse it (a magic)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names = _Names()
    names.visit(tree)
    return names.bound, names.read


def needed_later(cells: list, index: int, dropped: set[int] = frozenset()) -> bool:
    """Whether the code cell ``cells[index]`` must run for the cells after it to run as they do: it
    binds a name a later code cell (not one of ``dropped``) reads without binding it itself (a loop's
    variable is bound anew), changes the kernel's state (:data:`STATE_CHANGES`), or cannot be read
    as Python (then nobody can tell)."""
    names = _names(cells[index].source)
    if names is None or _changes_state(ast.parse(cells[index].source)):
        return True
    bound = names[0]
    for later_index in range(index + 1, len(cells)):
        cell = cells[later_index]
        if cell.cell_type != "code" or later_index in dropped or not bound:
            continue
        later = _names(cell.source)
        if later is None or bound & later[1]:  # read before that cell binds it
            return True
        bound -= later[0]  # bound again: the cells after this one read the new value
    return False


def dropped_cells(cells: list) -> set[int]:
    """The indices of the cells the book removes (``remove-cell``) that no cell after them needs
    (:func:`needed_later`), taken from the last: a removed cell needed only by removed cells that
    are dropped is dropped too."""
    dropped: set[int] = set()
    for index in reversed(range(len(cells))):
        cell = cells[index]
        if (cell.cell_type == "code" and "remove-cell" in cell.metadata.get("tags", [])
                and not has_solution(cell) and not needed_later(cells, index, dropped)):
            dropped.add(index)
    return dropped


def exercises_start(cells: list) -> int:
    """The index of the cell where the chapter's exercises begin (its ``## Exercises`` heading, or
    else its first exercise statement), or ``len(cells)`` where it has none."""
    for number, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        lines = [line.strip() for line in cell.source.splitlines()]
        if "## Exercises" in lines or any(line.startswith(("```{exercise}", "### Exercise ")) for line in lines):
            return number
    return len(cells)


#: A solution written as prose (an exercise answered in words), folded in the book.
PROSE_SOLUTION = re.compile(r'<details class="solution">.*?</details>\s*', re.DOTALL)


def _without_solutions(source: str, gated: bool) -> tuple[str, bool]:
    """A Markdown cell's source without its solutions; ``gated`` says whether the cell starts inside
    a gated solution (between ``{solution-start}`` and ``{solution-end}``). Returns the kept text and
    whether the cell ends inside one."""
    source = PROSE_SOLUTION.sub("", source)
    lines = source.splitlines()
    kept: list[str] = []
    for block in jupyter_markdown.blocks(source):
        name = block.name if isinstance(block, Fence) else None
        if gated:
            gated = name != "solution-end"
        elif name == "solution-start":
            gated = True
        elif name not in SOLUTION_DIRECTIVES:
            kept += lines[block.start:block.end]
    return "\n".join(kept).strip("\n"), gated


def student_notebook(notebook: nbformat.NotebookNode, name: str = "notebook", book: bool = False,
                     index: BookIndex | None = None, folder: Path | None = None) -> nbformat.NotebookNode:
    """A student copy of ``notebook``: solutions stubbed or dropped, the hidden assertions dropped,
    outputs kept before the exercises and cleared from them on.

    Args:
        notebook: the source notebook (not changed).
        name: what error messages call it.
        book: keep the book's MyST Markdown (for ``jupyter-book``); otherwise the Markdown is turned
            into plain Markdown for Jupyter.
        index: the book's labels and page titles, for references without their own text.
        folder: the source notebook's folder (``{literalinclude}`` paths start there).
    """
    student = copy.deepcopy(notebook)
    cells = []
    gated = False
    anchors: dict[str, int] = {}  # the page's heading anchors so far, for the Jupyter edition's links
    exercises = exercises_start(student.cells)
    dropped = dropped_cells(student.cells)
    for index_in_notebook, cell in enumerate(student.cells):
        if cell.cell_type == "markdown":
            source, gated = _without_solutions(cell.source, gated)
            if not source.strip():
                continue
            if not book:
                source = jupyter_markdown.to_jupyter(source, index, folder, anchors)
            if source != cell.source.strip("\n"):
                cell.source = source
        elif cell.cell_type == "code":
            if has_solution(cell):
                try:
                    cell.source = student_source(cell.source)
                except SolutionMarkerError as error:
                    raise SolutionMarkerError(f"{name}, cell {index_in_notebook + 1}: {error}") from None
                _show_as_a_stub(cell)
            elif gated:
                continue  # solution code without markers: never shown to the learner
            elif index_in_notebook in dropped:
                continue  # an assertion behind the prose: the book removes it, nothing after it needs it
            _as_the_book_shows_it(cell, keep_outputs=index_in_notebook < exercises and not has_solution(cell))
        cells.append(cell)
    if gated:
        raise SolutionMarkerError(f"{name}: a {{solution-start}} without its {{solution-end}}")
    student.cells = cells
    return student


def _targets(notebooks: list[Path], out: Path, root: Path, book: bool) -> dict[Path, Path]:
    targets = {}
    for path in notebooks:
        if book:
            try:
                relative = path.resolve().relative_to(root.resolve())
            except ValueError:
                raise ValueError(f"{path} is not inside the book's root {root}; with --book every "
                                 "notebook must belong to the book.") from None
            targets[path] = out / relative
        else:
            targets[path] = out / path.name
    return targets


def page_notebook(text: str, index: BookIndex, folder: Path) -> nbformat.NotebookNode:
    """A page of the book (``glossary.md``) as a notebook of Markdown for Jupyter, one cell per
    section, so that the chapters' links to it (``glossary.ipynb#term-mask``) open it rendered."""
    anchors: dict[str, int] = {}
    sections, current = [], []
    for block in jupyter_markdown.blocks(text):
        lines = text.splitlines()[block.start:block.end]
        if isinstance(block, jupyter_markdown.Prose):
            for line in lines:
                if line.startswith("## ") and any(part.strip() for part in current):
                    sections.append(current)
                    current = []
                current.append(line)
        else:
            current += lines
    sections.append(current)
    cells = [nbformat.v4.new_markdown_cell(jupyter_markdown.to_jupyter("\n".join(part), index, folder, anchors))
             for part in sections if any(line.strip() for line in part)]
    return nbformat.v4.new_notebook(cells=cells, metadata={"language_info": {"name": "python"}})


def _pages(notebooks: list[Path], out: Path) -> dict[Path, Path]:
    """The book's other pages (``glossary.md``, ``notation.md`` ...) next to the notebooks, and
    where their notebooks go in the Jupyter edition: the chapters link to them."""
    pages: dict[Path, Path] = {}
    for folder in sorted({path.parent for path in notebooks}):
        for page in sorted(folder.glob("*.md")):
            pages.setdefault(page, out / page.with_suffix(".ipynb").name)
    return pages


def _data_files(notebooks: list[Path], out: Path) -> dict[Path, Path]:
    """The files of the ``data/`` folders next to the source notebooks, and where they go in ``out``."""
    files: dict[Path, Path] = {}
    for folder in sorted({path.parent for path in notebooks}):
        for relative, path in data_files(folder).items():
            files.setdefault(path, out / DATA_FOLDER / relative)
    return files


def write_student_edition(notebooks: list[Path], out: Path, force: bool = False, book: bool = False,
                          root: Path = Path("."), keep_existing: bool = False) -> list[Path]:
    """Write the student edition of ``notebooks`` into ``out`` and return the files written.

    Args:
        notebooks: the source notebooks.
        out: the folder to write into (created if needed).
        force: overwrite files that already exist (otherwise nothing is written and a
            ``FileExistsError`` lists them).
        book: write the edition the book is built from: keep the MyST Markdown and copy the book
            around the notebooks (``_config.yml``, ``_toc.yml`` and every other file under
            ``root/book``), keeping their paths relative to ``root``, so that
            ``jupyter-book build OUT`` builds the book without solutions. Otherwise the Markdown is
            made plain for Jupyter and the ``data/`` folder next to the notebooks is copied to
            ``out/data/``.
        root: the repository root the book lives in.
        keep_existing: write only the notebooks (and data files) that are not in ``out`` yet, and
            leave the others as they are - the learner's work - instead of raising.
    """
    targets = _targets(notebooks, out, root, book)
    extra: dict[Path, Path] = {}
    if book:
        for name in ("_config.yml", "_toc.yml", *sorted(p.name for p in root.glob("*.bib"))):
            extra[root / name] = out / name
        for path in sorted((root / "book").rglob("*")):
            if path.is_file() and path.suffix != ".ipynb" and not in_tool_folder(path.relative_to(root)):
                extra[path] = out / path.relative_to(root)
    data = {} if book else _data_files(notebooks, out)
    pages = {} if book else _pages(notebooks, out)
    existing = [t for t in [*targets.values(), *extra.values()] if t.exists()]
    if keep_existing and not force:
        targets = {source: target for source, target in targets.items() if not target.exists()}
        extra = {source: target for source, target in extra.items() if not target.exists()}
    elif existing and not force:
        listed = ", ".join(str(p) for p in existing[:5]) + (" ..." if len(existing) > 5 else "")
        raise FileExistsError(f"{len(existing)} file(s) already exist: {listed}. They may hold a learner's "
                              "work, so nothing was written. Choose another --out, or pass --force to "
                              "overwrite them.")
    if not force:  # data files and pages are the course's, not the learner's: only the missing ones are written
        data = {source: target for source, target in data.items() if not target.exists()}
        pages = {source: target for source, target in pages.items() if not target.exists()}
    # Convert everything before writing anything, so a broken notebook leaves no half-written edition.
    index = jupyter_markdown.book_index(root / "book") if (root / "book").is_dir() else BookIndex()
    converted = {target: student_notebook(nbformat.read(source, as_version=4), str(source), book=book,
                                          index=index, folder=source.parent)
                 for source, target in targets.items()}
    converted.update({target: page_notebook(source.read_text(encoding="utf-8"), index, source.parent)
                      for source, target in pages.items()})
    written = []
    for source, target in {**extra, **data}.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    for target, notebook in converted.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
        written.append(target)
    return written


def main(args: argparse.Namespace) -> int:
    root = course_root()  # the current folder's book/, else the repository the package was installed from
    notebooks = args.notebooks or default_notebooks(root)
    if not notebooks:
        print("No notebooks found: run from the repository root, or name the notebooks.", file=sys.stderr)
        return 2
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        print(f"No such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        written = write_student_edition(notebooks, args.out, force=args.force, book=args.book, root=root)
    except (FileExistsError, SolutionMarkerError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    stubbed = sum(1 for p in written if p.suffix == ".ipynb")
    print(f"Wrote the student edition of {stubbed} notebook(s) to {args.out}/"
          + (" with the book around them; build it with "
             f"`jupyter-book build {args.out}`." if args.book else "."))
    return 0
