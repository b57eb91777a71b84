"""What Sphinx builds on the book's reference pages, written as Markdown for the Jupyter edition.

Three directives of the reference pages hold what Sphinx generates at build time, so a plain
Markdown reader would show nothing there: the glossary (``{glossary}``), the References list
(``{bibliography}``) and the API reference (``autoclass``, ``autofunction`` and ``autodata`` in
``{eval-rst}`` blocks). This module writes each as Markdown, with the anchors the book's links
point at (``glossary.ipynb#term-causal-mask``, ``references.ipynb#cite-vaswani2017attention``):

* :func:`glossary_markdown`: every term in bold, its other names beside it, then its definition;
* :func:`bibliography_markdown`: every work of a BibTeX file, formatted by pybtex, in author-year
  order;
* :func:`api_markdown`: each documented name's signature and docstring, read with :mod:`inspect`
  (a constant's ``#:`` comment with Sphinx's own ``ModuleAnalyzer``).

Example:
    >>> print(glossary_markdown(":sorted:\\n\\nmask\\nmask buffer\\n  What hides the future.", str))
    <a id="term-mask"></a><a id="term-mask-buffer"></a>
    <BLANKLINE>
    **mask** (also: mask buffer)
    <BLANKLINE>
    What hides the future.
"""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from typing import Callable

from .bibliography import author_year, read_bib


def term_anchor(term: str) -> str:
    """The anchor of a glossary term, as Sphinx names it: ``term-causal-mask``."""
    from sphinx.util.nodes import _make_id

    return _make_id(f"term-{term}")


def citation_anchor(key: str) -> str:
    """The anchor of a cited work in the References list (``bibtex_cite_id`` in ``_config.yml``)."""
    return f"cite-{key}"


def _anchors(ids: list[str]) -> str:
    return "".join(f'<a id="{anchor}"></a>' for anchor in ids)


def glossary_markdown(body: str, convert: Callable[[str], str]) -> str:
    """The body of a ``{glossary}`` directive as Markdown; ``convert`` turns a definition's MyST
    into Markdown (its roles into links)."""
    entries: list[tuple[list[str], list[str]]] = []
    sort = False
    for line in body.splitlines():
        if line.strip() == ":sorted:":
            sort = True
        elif not line.strip():
            if entries and entries[-1][1]:
                entries[-1][1].append("")
        elif line[:1].isspace():
            entries[-1][1].append(line)
        elif entries and not entries[-1][1]:
            entries[-1][0].append(line.strip())  # another name of the same term
        else:
            entries.append(([line.strip()], []))
    if sort:
        entries.sort(key=lambda entry: entry[0][0].lower())
    parts = []
    for terms, definition in entries:
        others = f" (also: {', '.join(terms[1:])})" if terms[1:] else ""
        text = convert(textwrap.dedent("\n".join(definition)).strip())
        parts.append(f"{_anchors([term_anchor(t) for t in terms])}\n\n**{terms[0]}**{others}\n\n{text}")
    return "\n\n".join(parts)


def bibliography_markdown(bib_text: str) -> str:
    """Every work of the BibTeX ``bib_text``, by its author-year name, formatted by pybtex."""
    from pybtex.database import parse_string
    from pybtex.plugin import find_plugin

    database = parse_string(bib_text, "bibtex")
    style = find_plugin("pybtex.style.formatting", "plain")()
    backend = find_plugin("pybtex.backends", "markdown")()
    formatted = {entry.key: entry.text.render(backend) for entry in style.format_entries(database.entries.values())}

    works = read_bib(bib_text)

    def label(key: str) -> str:
        return author_year(works[key].surnames, works[key].year)

    return "\n\n".join(f"{_anchors([citation_anchor(key)])}**{label(key)}**. {formatted[key]}"
                       for key in sorted(database.entries, key=label))


_AUTODOC = re.compile(r"^\.\. (autoclass|autofunction|autodata):: ([\w.]+)\s*$")
_MEMBERS = re.compile(r"^\s+:members:\s*(.*)$")


def _resolve(name: str):
    module, _, attribute = name.rpartition(".")
    while module:
        try:
            return importlib.import_module(module), attribute
        except ImportError:
            module, _, rest = module.rpartition(".")
            attribute = f"{rest}.{attribute}"
    raise ImportError(name)


def _documented(name: str, obj, level: int) -> str:
    signature = ""
    if callable(obj):
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):
            signature = "(...)"
    doc = inspect.getdoc(obj) or ""
    return f"{'#' * level} `{name}{signature}`\n\n```text\n{doc}\n```" if doc else f"{'#' * level} `{name}{signature}`"


def api_markdown(rst: str) -> str:
    """The autodoc directives of an ``{eval-rst}`` block as Markdown: each name's signature and
    docstring (a class's chosen ``:members:`` under it)."""
    from sphinx.pycode import ModuleAnalyzer

    parts = []
    lines = rst.splitlines()
    for number, line in enumerate(lines):
        match = _AUTODOC.match(line)
        if not match:
            continue
        kind, name = match.groups()
        module, attribute = _resolve(name)
        obj = module
        for part in attribute.split("."):
            obj = getattr(obj, part)
        if kind == "autodata":
            docs = ModuleAnalyzer.for_module(getattr(obj, "__module__", None) or module.__name__).find_attr_docs()
            home = next((key for key in docs if key[1] == attribute.split(".")[-1]), None)
            if home is None:  # a constant re-exported: look in the module that defines it
                source = next((m for m in _defining_modules(module, attribute)), None)
                docs = ModuleAnalyzer.for_module(source).find_attr_docs() if source else {}
                home = next((key for key in docs if key[1] == attribute), None)
            text = "\n".join(docs[home]).strip() if home else ""
            parts.append(f"### `{name}`\n\n{text}".strip())
            continue
        parts.append(_documented(name, obj, 3))
        options = []
        for option in lines[number + 1:]:
            if not option.strip() or not option[:1].isspace():
                break
            options.append(option)
        members = next((m.group(1) for m in map(_MEMBERS.match, options) if m), "")
        for member in (m.strip() for m in members.split(",") if m.strip()):
            parts.append(_documented(f"{name.rsplit('.', 1)[-1]}.{member}", getattr(obj, member), 4))
    return "\n\n".join(parts)


def _defining_modules(package, attribute: str):
    """The loaded modules of ``package`` whose source assigns ``attribute`` at the top level (a name
    the package re-exports was loaded with it)."""
    import sys

    for name, module in sorted(sys.modules.items()):
        if not name.startswith(package.__name__ + ".") or module is None:
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            continue
        if re.search(rf"^{re.escape(attribute)}\s*[:=]", source, re.MULTILINE):
            yield name


__all__ = ["term_anchor", "citation_anchor", "glossary_markdown", "bibliography_markdown", "api_markdown"]
