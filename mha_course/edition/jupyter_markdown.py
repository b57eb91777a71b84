"""The book's MyST Markdown, read as blocks, and turned into plain Markdown that Jupyter renders.

The chapters' Markdown cells are written for Jupyter Book (MyST): exercises are ``{exercise}``
directives, solutions sit between ``{solution-start}`` and ``{solution-end}`` fences, notes are
``{note}`` admonitions, and words link to the glossary with ``{term}`` roles. Jupyter renders none of
this: a directive shows as a code block with its ``:label:`` lines, a role as raw text. This module

* splits Markdown into prose and fenced blocks (with markdown-it, so code spans, indented code and
  fences nested in lists are read as CommonMark reads them) - :func:`blocks`;
* turns MyST into plain Markdown for the student edition - :func:`to_jupyter`: an exercise becomes
  a heading with its number and title followed by its statement, an admonition a block quote, math
  stays math (``$...$``), ``{term}``, ``{ref}`` and ``{doc}`` roles become links to the pages'
  notebooks (a reference without text reads the title it points at, from :func:`book_index`),
  ``{cite:t}`` and ``{cite:p}`` become "Vaswani et al. (2017)" and "(Vaswani et al., 2017)"
  linked to the References (authors and years from the book's ``.bib`` file, :func:`read_bib`),
  links to a page ``page.md`` point at ``page.ipynb``, headings get the anchors MyST gives them,
  and ``(label)=`` targets go;
* writes what Sphinx generates on the reference pages (the glossary, the References list, the API
  reference) as Markdown, through :mod:`mha_course.edition.pages`.

Example:
    >>> print(to_jupyter("```{exercise} 1.1 · Build the mask\\n:label: ex-1-1\\n\\nUse the {term}`causal mask`.\\n```"))
    ### Exercise 1.1 · Build the mask
    <BLANKLINE>
    Use the [causal mask](glossary.ipynb#term-causal-mask).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..notebook_files import in_tool_folder
from . import pages
from .pages import citation_anchor, term_anchor
from .bibliography import Work, author_year, read_bib

# ``{name} argument`` in a fence's info string.
_DIRECTIVE_INFO = re.compile(r"^\{([\w:.-]+)\}\s*(.*)$")
# ``{name}`text``` (a role), not inside a code span that starts just before it.
_ROLE = re.compile(r"(?<!`)\{([a-zA-Z][\w:+.-]*)\}`([^`\n]+)`")
# ``(label)=`` on a line of its own: a MyST target.
_TARGET = re.compile(r"^\s*\(([^()\s]+)\)=\s*$")
_OPTION = re.compile(r"^:([\w-]+):\s*(.*)$")
# ``text <target>`` inside a role.
_EXPLICIT = re.compile(r"^(.*?)\s*<([^<>]+)>$", re.DOTALL)

ADMONITIONS = {"note", "warning", "tip", "important", "caution", "attention", "danger", "error", "hint",
               "seealso", "admonition"}
SOLUTION_DIRECTIVES = {"solution", "solution-start", "solution-end"}
# Directives that only mean something to Sphinx: dropped from the Jupyter edition with their body.
_SPHINX_ONLY = {"toctree", "tableofcontents", "index", "glue:figure", "raw"}


@dataclass
class Fence:
    """A fenced block: lines ``start`` to ``end`` (exclusive) of the text it came from."""

    start: int
    end: int
    name: str | None  # the directive's name, or None for a plain code fence
    argument: str
    options: dict[str, str]
    body: str
    prefix: str  # what precedes the fence marker on its opening line (list indent, "> ")
    info: str = ""


@dataclass
class Prose:
    """Lines ``start`` to ``end`` (exclusive) that are not a fence."""

    start: int
    end: int


@lru_cache(maxsize=1)
def _parser():
    from markdown_it import MarkdownIt
    from mdit_py_plugins.colon_fence import colon_fence_plugin

    return MarkdownIt("commonmark").use(colon_fence_plugin)


def _options_and_body(content: str) -> tuple[dict[str, str], str]:
    lines = content.splitlines()
    options: dict[str, str] = {}
    i = 0
    if lines and lines[0].strip() == "---":  # a YAML block of options
        end = next((j for j in range(1, len(lines)) if lines[j].strip() == "---"), None)
        if end is not None:
            for line in lines[1:end]:
                key, _, value = line.partition(":")
                if key.strip():
                    options[key.strip()] = value.strip()
            i = end + 1
    else:
        while i < len(lines) and _OPTION.match(lines[i]):
            key, value = _OPTION.match(lines[i]).groups()
            options[key] = value
            i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return options, "\n".join(lines[i:])


def blocks(text: str) -> list[Fence | Prose]:
    """``text`` as a list of prose runs and fenced blocks, in order, covering every line once."""
    lines = text.splitlines()
    fences = []
    for token in _parser().parse(text):
        if token.type not in ("fence", "colon_fence") or token.map is None:
            continue
        start, end = token.map
        opening = lines[start]
        marker = opening.lstrip(" >")[:1]
        prefix = opening[: opening.index(marker)] if marker in opening else ""
        match = _DIRECTIVE_INFO.match(token.info.strip())
        options, body = _options_and_body(token.content) if match else ({}, token.content.rstrip("\n"))
        fences.append(Fence(start, end, match.group(1) if match else None, match.group(2).strip() if match else "",
                            options, body, prefix, token.info.strip()))
    out: list[Fence | Prose] = []
    line = 0
    for fence in fences:
        if fence.start > line:
            out.append(Prose(line, fence.start))
        out.append(fence)
        line = fence.end
    if line < len(lines):
        out.append(Prose(line, len(lines)))
    return out


def directive_names(text: str) -> list[str]:
    """The names of the directives fenced in ``text`` (outermost only), in order."""
    return [b.name for b in blocks(text) if isinstance(b, Fence) and b.name]


# ----------------------------------------------------------------------------------------------
# Where references point: labels and documents of the book, with their titles.


@dataclass
class BookIndex:
    """Where ``{ref}`` and ``{doc}`` roles point, and what they read without their own text, and
    the works that ``{cite}`` roles name (by BibTeX key).

    ``labels`` maps a label to its title, page and anchor (``""`` for the page's top); ``docs`` a
    page (``book/glossary``'s ``glossary``) to its title.
    """

    labels: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    docs: dict[str, str] = field(default_factory=dict)
    works: dict[str, Work] = field(default_factory=dict)
    bib_files: list[Path] = field(default_factory=list)


def _heading_text(line: str) -> str:
    return plain_text(_plain_roles(line.lstrip("#").strip(), BookIndex()))


def plain_text(markdown: str) -> str:
    """The text of one line of Markdown as a heading shows it: code spans and math by their content.

    Example:
        >>> plain_text("The class: `CausalAttention`, heads $d_h$ wide")
        'The class: CausalAttention, heads d_h wide'
    """
    text = ""
    for token in _parser().parseInline(re.sub(r"\$([^$]+)\$", r"\1", markdown))[0].children or []:
        if token.type in ("text", "code_inline"):
            text += token.content
        elif token.type == "softbreak":
            text += " "
    return text


def heading_anchors(text: str, used: dict[str, int] | None = None) -> list[tuple[int, int, str, str]]:
    """The headings of Markdown ``text``: ``(line, level, title, anchor)`` each, the anchor as MyST
    makes it (``myst_heading_anchors``): a Markdown link ``[...](page#anchor)`` points at it.
    ``used`` counts the anchors already given on the page (a repeated title gets ``-1``, ``-2`` ...).

    Example:
        >>> heading_anchors("# Title\\n\\n## The head width $d_h$\\n\\n## Title")
        [(0, 1, 'Title', 'title'), (2, 2, 'The head width d_h', 'the-head-width-'), (4, 2, 'Title', 'title-1')]
    """
    from myst_parser.mdit_to_docutils.base import default_slugify

    used = {} if used is None else used
    found = []
    for token in _parser().parse(text):
        if token.type != "heading_open" or token.map is None:
            continue
        line = token.map[0]
        heading = _plain_roles(text.splitlines()[line].lstrip("#").strip(), BookIndex())
        title = plain_text(heading)
        # MyST's slug of the heading's text, which leaves its math out
        anchor = default_slugify(plain_text(re.sub(r"\$[^$]+\$", "", heading)))
        if anchor in used:
            used[anchor] += 1
            anchor = f"{anchor}-{used[anchor]}"
        else:
            used[anchor] = 0
        found.append((line, int(token.tag[1]), title, anchor))
    return found


def _index_markdown(text: str, index: BookIndex, doc: str, used: dict[str, int]) -> None:
    lines = text.splitlines()
    anchors = {line: (level, title, anchor) for line, level, title, anchor in heading_anchors(text, used)}
    for number, line in enumerate(lines):
        target = _TARGET.match(line)
        if target:
            following = next((i for i in range(number + 1, len(lines)) if lines[i].strip()), None)
            if following in anchors:
                level, title, anchor = anchors[following]
                index.labels.setdefault(target.group(1), (title, doc, "" if level == 1 else anchor))
        if line.startswith("# ") and doc not in index.docs:
            index.docs[doc] = _heading_text(line)
    for block in blocks(text):
        if isinstance(block, Fence) and block.name == "exercise" and "label" in block.options:
            index.labels.setdefault(block.options["label"], (f"Exercise {block.argument}".strip(), doc, ""))


def book_index(folder: Path) -> BookIndex:
    """The labels and document titles of every Markdown page and notebook under ``folder``, and the
    works of its BibTeX files."""
    index = BookIndex()
    for path in sorted(folder.rglob("*")):
        if in_tool_folder(path.relative_to(folder)):
            continue
        doc = path.relative_to(folder).with_suffix("").as_posix()
        used: dict[str, int] = {}
        if path.suffix == ".bib":
            index.works.update(read_bib(path.read_text(encoding="utf-8")))
            index.bib_files.append(path)
        elif path.suffix == ".md":
            _index_markdown(path.read_text(encoding="utf-8"), index, doc, used)
        elif path.suffix == ".ipynb":
            try:
                cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
            except (ValueError, OSError):
                continue
            for cell in cells:
                if cell.get("cell_type") == "markdown":
                    source = cell.get("source", "")
                    _index_markdown("".join(source) if isinstance(source, list) else source, index, doc, used)
    return index


# ----------------------------------------------------------------------------------------------
# MyST -> plain Markdown.


#: Where a page of the book is in the Jupyter edition: every page is a notebook there.
PAGE_SUFFIX = ".ipynb"


def _link(text: str, page: str, anchor: str = "") -> str:
    return f"[{text}]({page}{PAGE_SUFFIX}{'#' + anchor if anchor else ''})"


def _role_text(name: str, content: str, index: BookIndex) -> str:
    if name == "math":
        return f"${content}$"
    explicit = _EXPLICIT.match(content)
    text, target = (explicit.group(1), explicit.group(2)) if explicit else (None, content)
    if name == "term":
        return _link(text or target, "glossary", term_anchor(target))
    if name in ("ref", "numref"):
        title, page, anchor = index.labels.get(target, (target, "", ""))
        return _link(text or title, page, anchor) if page else (text or title)
    if name == "doc":
        page = target.strip("/").removesuffix(".md").removesuffix(".ipynb")
        return _link(text or index.docs.get(page, page), page)
    if name.startswith("cite"):
        return _citation(name, target, index)
    if text:
        return text
    if name in ("sub", "sup"):
        return f"<{name}>{target}</{name}>"
    return target.lstrip("~!")


def _citation(name: str, keys: str, index: BookIndex) -> str:
    """A ``{cite}`` role as it reads in print, linked to the References page: ``{cite:t}`` in the
    sentence, "Vaswani et al. (2017)"; any other (``{cite}``, ``{cite:p}``) in parentheses,
    "(Vaswani et al., 2017)". A key that the book's ``.bib`` file does not hold shows as itself."""
    works = [(key.strip(), index.works.get(key.strip())) for key in keys.split(",") if key.strip()]
    if name.split(":")[-1] in ("t", "ts", "ct", "cts"):
        return ", ".join(_link(f"{work.authors()} ({work.year})", "references", citation_anchor(key)) if work
                         else f"({key})" for key, work in works)
    return "(" + "; ".join(_link(author_year(work.surnames, work.year), "references", citation_anchor(key))
                           if work else key for key, work in works) + ")"


# A Markdown link to a page of the book (``glossary.md``, ``02_stacked_heads.ipynb#anchor``).
_PAGE_LINK = re.compile(r"\]\((?!\w+:)([\w./-]+?)\.(?:md|ipynb)(#[^)\s]*)?\)")


def _page_links(line: str) -> str:
    """Links to the book's pages pointed at their notebooks in the Jupyter edition."""
    return _PAGE_LINK.sub(lambda m: f"]({m.group(1)}{PAGE_SUFFIX}{m.group(2) or ''})", line)


def _plain_roles(text: str, index: BookIndex) -> str:
    return _ROLE.sub(lambda m: _role_text(m.group(1), m.group(2), index), text)


def _prose(lines: list[str], index: BookIndex) -> list[str]:
    return [_page_links(_plain_roles(line, index)) for line in lines if not _TARGET.match(line)]


def _quote(title: str, body: str) -> str:
    lines = [f"**{title}**", ""] + body.splitlines()
    return "\n".join(f"> {line}" if line.strip() else ">" for line in lines)


def _included_source(fence: Fence, folder: Path | None) -> str:
    """The code a ``{literalinclude}`` shows, as a fenced block (or a sentence if unreadable): read
    by Sphinx's own ``LiteralIncludeReader``, the reader the book's directive uses, so the Jupyter
    edition shows every line the book shows (``:pyobject:``, ``:lines:``, ``:prepend:`` ...)."""
    from types import SimpleNamespace

    from sphinx.directives.code import LiteralIncludeReader

    path = (folder / fence.argument) if folder else Path(fence.argument)
    # Options as the directive converts them: ``:dedent:`` and ``:lineno-start:`` are numbers, and
    # a bare ``:dedent:`` removes the common indentation (None).
    options = {key: (int(value) if value else None) if key in ("dedent", "lineno-start") else value
               for key, value in fence.options.items()}
    try:
        code, _ = LiteralIncludeReader(str(path), options, SimpleNamespace(source_encoding="utf-8")).read()
    except (OSError, ValueError):
        return f"*(The book shows the source of `{fence.argument}` here.)*"
    language = fence.options.get("language", "python")
    return f"```{language}\n{code.rstrip()}\n```"


def _directive(fence: Fence, index: BookIndex, folder: Path | None) -> str | None:
    """Plain Markdown for one directive; ``None`` drops it."""
    name, body = fence.name or "", to_jupyter(fence.body, index, folder)
    if name == "exercise":
        heading = f"### Exercise {_plain_roles(fence.argument, index)}".rstrip()
        return f"{heading}\n\n{body}".rstrip()
    if name in SOLUTION_DIRECTIVES or name in _SPHINX_ONLY:
        return None
    if name == "glossary":
        body = (":sorted:\n" if "sorted" in fence.options else "") + fence.body
        return pages.glossary_markdown(body, lambda text: to_jupyter(text, index, folder))
    if name == "bibliography":
        return "\n\n".join(pages.bibliography_markdown(path.read_text(encoding="utf-8"))
                             for path in index.bib_files) or None
    if name == "eval-rst":
        return pages.api_markdown(fence.body) or None
    if name in ADMONITIONS:
        title = _plain_roles(fence.argument, index) if name == "admonition" and fence.argument else (
            "See also" if name == "seealso" else name.capitalize())
        return _quote(title, body)
    if name == "math":
        return f"$$\n{fence.body.strip()}\n$$"
    if name in ("code", "code-block", "sourcecode", "code-cell"):
        return f"```{fence.argument}\n{fence.body}\n```"
    if name == "literalinclude":
        return _included_source(fence, folder)
    if name in ("figure", "image"):
        alt = fence.options.get("alt", "")
        return f"![{alt}]({fence.argument})" + (f"\n\n{body}" if body else "")
    title = _plain_roles(fence.argument, index)
    return (f"**{title}**\n\n{body}" if title else body).strip() or None


def to_jupyter(text: str, index: BookIndex | None = None, folder: Path | None = None,
               anchors: dict[str, int] | None = None) -> str:
    """Plain Markdown for Jupyter from the book's MyST Markdown ``text``.

    ``index`` resolves references without their own text; ``folder`` is where paths in
    ``{literalinclude}`` directives start from (the source notebook's folder). With ``anchors``
    (the anchors a page has given so far, shared by its cells), every heading gets the anchor
    that MyST gives it, so a link ``page.ipynb#anchor`` finds it in Jupyter as in the book.
    """
    index = index or BookIndex()
    lines = text.splitlines()
    if anchors is not None:
        for line, _, _, anchor in reversed(heading_anchors(text, anchors)):
            lines[line] = f'<a id="{anchor}"></a>\n\n{lines[line]}'
    out: list[str] = []
    for block in blocks(text):
        if isinstance(block, Prose):
            out += _prose([part for line in lines[block.start:block.end] for part in line.split("\n")], index)
        elif block.name is None:
            out += lines[block.start:block.end]  # a code block: left exactly as written
        else:
            converted = _directive(block, index, folder)
            if converted is not None:
                out.append("")  # a block of its own, never the end of the paragraph above
                out += [f"{block.prefix}{line}" if line else block.prefix.rstrip() for line in converted.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")


__all__ = ["blocks", "directive_names", "to_jupyter", "book_index", "read_bib", "BookIndex", "Work", "Fence",
           "Prose", "heading_anchors", "plain_text", "term_anchor", "citation_anchor", "PAGE_SUFFIX"]
