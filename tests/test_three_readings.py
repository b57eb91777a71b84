"""One page in three readings: JupyterLab on the book's notebooks, JupyterLab on the student edition, and the HTML.

Jupyter renders CommonMark and nothing of MyST: a directive shows there as a code block, a role as
raw text, a ``(label)=`` target as a line of text. So the chapters write links as Markdown links
(which MyST resolves too, ``book/_ext/markdown_anchors.py``), show code with listing cells, keep
figure captions in Markdown, and write exercises as headings. These tests render every notebook's
Markdown as Jupyter does, in both editions, and find no MyST left; they follow every link of the
student edition to its notebook and anchor; and they check that what the HTML hides is hidden there.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import nbformat
import pytest
from markdown_it import MarkdownIt

from book_pages import DOCNAMES, NOTEBOOKS, REPO, source_of

from mha_course.edition.bibliography import author_year, read_bib
from mha_course.edition.student import (dropped_cells, exercises_start, has_solution, needed_later,
                                          write_student_edition)
from mha_course.notebook_files import default_notebooks

# What MyST left unrendered looks like in CommonMark's HTML: a code block whose language is a
# directive ({exercise}), a ::: fence, a role ({term} before a code span, or as text), a target line.
LEFT = re.compile(r'class="language-\{|^<p>:{3,}|\{[\w:+-]+\}<code>|\{[\w:+-]+\}`|^<p>\([^()\s]+\)=</p>$',
                  re.MULTILINE)
RENDERER = MarkdownIt("commonmark")


def _markdown(notebook) -> list[str]:
    return [c.source for c in notebook.cells if c.cell_type == "markdown"]


def _left(sources: list[str]) -> list[str]:
    return [m.group(0) for text in sources for m in LEFT.finditer(RENDERER.render(text))]


def _links(text: str) -> list[tuple[str, str]]:
    """Every link of Markdown ``text``: (its text, where it points)."""
    found = []
    for token in RENDERER.parse(text):
        children = token.children or []
        for number, child in enumerate(children):
            if child.type == "link_open":
                closing = next(i for i in range(number, len(children)) if children[i].type == "link_close")
                found.append(("".join(c.content for c in children[number + 1:closing]), child.attrGet("href")))
    return found


@functools.cache
def _works() -> dict:
    """The works of references.bib, read once (pybtex takes seconds)."""
    return read_bib((REPO / "book" / "references.bib").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    """The student edition of every page, written once: the tests that read it are marked ``book``."""
    out = tmp_path_factory.mktemp("student")
    write_student_edition(default_notebooks(REPO), out, root=REPO)
    return out


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_the_books_notebook_has_no_myst_jupyter_would_show_raw(docname):
    notebook = nbformat.read(source_of(docname), as_version=4)
    left = _left(_markdown(notebook))
    assert not left, f"{docname}: MyST that JupyterLab shows as raw text: {left[:5]}"
    assert not any(c.metadata.get("mystnb", {}).get("figure") for c in notebook.cells), (
        f"{docname}: a figure caption in cell metadata, which Jupyter does not show: write it in Markdown")


def _swallowed(text: str) -> list[str]:
    """Lines of ``text`` that CommonMark puts inside a block quote though they do not start with ``>``.

    A paragraph line right after a ``>`` line continues the quote ("lazy continuation"): the sentence
    meant to follow a warning box ends up inside it. A blank line ends the quote.
    """
    lines = text.splitlines()
    found = []
    for token in RENDERER.parse(text):
        if token.type == "blockquote_open" and token.map:
            start, end = token.map
            found += [lines[n].strip() for n in range(start, end)
                      if lines[n].strip() and not lines[n].lstrip().startswith(">")]
    return found


def test_swallowed_finds_a_sentence_after_a_block_quote():
    assert _swallowed("> **Warning.** careful.\nThe next sentence.") == ["The next sentence."]
    assert _swallowed("> **Warning.** careful.\n> still the warning.\n\nThe next sentence.") == []


@pytest.mark.parametrize("docname", DOCNAMES)
def test_no_paragraph_is_swallowed_by_the_block_quote_before_it(docname):
    path = source_of(docname)
    if path.suffix == ".ipynb":
        sources = _markdown(nbformat.read(path, as_version=4))
    else:
        sources = [path.read_text(encoding="utf-8")]
    swallowed = [line for text in sources for line in _swallowed(text)]
    assert not swallowed, (f"{docname}: a line right after a '>' line joins the block quote; "
                           f"put a blank line before it: {swallowed[:5]}")


@pytest.mark.book
def test_the_student_edition_has_no_myst_left_on_any_page(student):
    pages = sorted(student.glob("*.ipynb"))
    assert len(pages) == len(NOTEBOOKS) + len(list((REPO / "book").glob("*.md")))
    for path in pages:
        left = _left(_markdown(nbformat.read(path, as_version=4)))
        assert not left, f"{path.name}: MyST left in the student edition: {left[:5]}"


@pytest.mark.book
def test_every_link_of_the_student_edition_opens_a_page_at_its_anchor(student):
    anchors = {}
    for path in student.glob("*.ipynb"):
        text = "\n".join(_markdown(nbformat.read(path, as_version=4)))
        anchors[path.name] = set(re.findall(r'<a id="([^"]+)"></a>', text))
    broken, followed = [], 0
    for page, _ in anchors.items():
        for text in _markdown(nbformat.read(student / page, as_version=4)):
            for _, href in _links(text):
                if re.match(r"[a-z]+:", href):
                    continue  # a web address
                target, _, anchor = href.partition("#")
                target = target or page
                followed += 1
                if target not in anchors or (anchor and anchor not in anchors[target]):
                    broken.append(f"{page}: {href}")
    assert followed > 200, f"only {followed} links followed: the test would pass on a book without links"
    assert not broken, "links of the student edition that lead nowhere:\n" + "\n".join(broken[:20])


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_the_books_links_point_at_its_pages_and_name_the_works_they_cite(docname):
    """Sphinx checks each anchor at build time (-n); here, that each page exists, and that a
    citation reads as the References list names the work."""
    works = _works()
    for text in _markdown(nbformat.read(source_of(docname), as_version=4)):
        for label, href in _links(text):
            if re.match(r"[a-z]+:", href) or href.startswith("#"):
                continue
            target, _, anchor = href.partition("#")
            assert (REPO / "book" / target).is_file(), f"{docname}: a link to {href}, which is not a page"
            if anchor.startswith("cite-"):
                work = works[anchor.removeprefix("cite-")]
                assert label in (f"{work.authors()} ({work.year})", author_year(work.surnames, work.year)), (
                    f"{docname}: the citation {label!r} does not name {anchor}")


@pytest.mark.book
def test_what_the_html_hides_is_hidden_in_the_student_edition(student):
    hidden = dropped = listings = outputs = 0
    for docname in NOTEBOOKS:
        path = source_of(docname)
        source = nbformat.read(path, as_version=4)
        edition = nbformat.read(student / path.name, as_version=4)
        by_source = {c.source: c for c in edition.cells if c.cell_type == "code"}
        for number, cell in enumerate(source.cells):
            tags = cell.metadata.get("tags", [])
            if cell.cell_type == "code" and "remove-cell" in tags and not has_solution(cell):
                # the hidden assertions: gone, unless a later cell needs the cell, which is then folded away
                needed = needed_later(source.cells, number, dropped_cells(source.cells))
                assert (cell.source in by_source) == needed, f"{path.name}: {cell.source[:60]}"
                dropped += not needed
            if cell.cell_type != "code" or cell.source not in by_source:
                continue
            shown = by_source[cell.source]
            folded = shown.metadata.get("jupyter", {})
            if "remove-cell" in tags:
                assert folded.get("source_hidden") and folded.get("outputs_hidden"), f"{path.name}: {cell.source[:60]}"
                hidden += 1
            if "remove-input" in tags:  # a listing: its input folded, its output (the source) kept
                kept = [o.get("data") for o in shown.outputs] == [o.get("data") for o in cell.outputs]
                assert folded.get("source_hidden") and kept, f"{path.name}: {cell.source[:60]}"
                listings += 1
            if {"hide-cell", "hide-output"} & set(tags):  # an optional aside's code: folded as in the book
                assert folded.get("outputs_hidden"), f"{path.name}: {cell.source[:60]}"
                assert folded.get("source_hidden") or "hide-output" in tags, f"{path.name}: {cell.source[:60]}"
        # The page before the exercises shows what the book shows: the same outputs, cell for cell.
        start = exercises_start(edition.cells)
        for cell in (c for c in edition.cells[:start] if c.cell_type == "code"):
            [book_cell] = [c for c in source.cells if c.cell_type == "code" and c.source == cell.source][:1]
            assert [o.get("data", o.get("text")) for o in cell.outputs] == [
                o.get("data", o.get("text")) for o in book_cell.outputs], f"{path.name}: {cell.source[:60]}"
            outputs += bool(cell.outputs)
        assert all(not c.outputs for c in edition.cells[start:] if c.cell_type == "code"
                   and "remove-input" not in c.metadata.get("tags", [])), f"{path.name}: an exercise's output shows"
        text = "\n".join(_markdown(edition))
        assert '<details class="solution"' not in text, f"{path.name}: a solution in prose reaches the student edition"
    assert dropped > 50 and hidden and listings > 10 and outputs > 100, (dropped, hidden, listings, outputs)


#: An optional aside in prose: folded, its button saying so. Markdown inside it is rendered by
#: Jupyter and by MyST alike when blank lines set it apart from the tags.
ASIDE = re.compile(r'<details class="aside">\s*<summary>(.*?)</summary>\n\n(.*?)\n\n</details>', re.DOTALL)


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_an_optional_aside_is_folded_and_says_so_in_every_reading(docname):
    """A detour a first reader may skip is folded in the HTML, in JupyterLab and in the student edition,
    behind a button that starts "Optional": prose in ``<details class="aside">``, code in a cell whose
    output (``hide-output``) or whole self (``hide-cell``) the book folds and Jupyter folds too."""
    notebook = nbformat.read(source_of(docname), as_version=4)
    for cell in notebook.cells:
        text = cell.source
        if cell.cell_type == "markdown" and 'class="aside"' in text:
            found = ASIDE.findall(text)
            assert len(found) == text.count("<details"), f"{docname}: an aside not written as {ASIDE.pattern}"
            assert all(summary.startswith("Optional: ") for summary, _ in found), (docname, found)
            assert not _left([body for _, body in found]), f"{docname}: MyST inside an aside"
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type == "code" and {"hide-cell", "hide-output"} & tags:
            prompt = cell.metadata.get("mystnb", {}).get("code_prompt_show", "")
            assert prompt.startswith("Optional: "), f"{docname}: a folded cell whose button says {prompt!r}"
            jupyter = cell.metadata.get("jupyter", {})
            assert jupyter.get("outputs_hidden") and (jupyter.get("source_hidden") or "hide-output" in tags), (
                f"{docname}: an aside's cell that JupyterLab shows unfolded: {cell.source[:60]}")


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_what_the_html_hides_is_folded_in_jupyterlab(docname):
    """On the book's own notebooks, a cell the HTML leaves out (remove-cell: a hidden check) is folded whole in
    JupyterLab, and one whose code the HTML hides (hide-input: a figure's code; remove-input: a listing's call)
    shows its output under a folded input, as the set-up page promises."""
    for cell in nbformat.read(source_of(docname), as_version=4).cells:
        tags = set(cell.metadata.get("tags", []))
        jupyter = cell.metadata.get("jupyter", {})
        if cell.cell_type == "code" and "remove-cell" in tags:
            assert jupyter.get("source_hidden") and jupyter.get("outputs_hidden"), (
                f"{docname}: a hidden check shows in JupyterLab: {cell.source[:60]}")
        elif cell.cell_type == "code" and tags & {"hide-input", "remove-input"}:
            assert jupyter.get("source_hidden"), f"{docname}: code the HTML hides shows in JupyterLab: {cell.source[:60]}"


def test_the_chapters_have_asides():
    """Guards the test above against passing on a book with no aside left to check."""
    asides = sum('<details class="aside">' in cell.source or "hide-output" in cell.metadata.get("tags", [])
                 for docname in NOTEBOOKS for cell in nbformat.read(source_of(docname), as_version=4).cells)
    assert asides >= 3, asides


@pytest.mark.book
def test_a_stub_is_shown_where_the_book_folds_its_solution(student):
    for docname in NOTEBOOKS:
        path = source_of(docname)
        for cell in nbformat.read(student / path.name, as_version=4).cells:
            if "NotImplementedError" in cell.source and "YOUR CODE HERE" in cell.source:
                assert "hide-input" not in cell.metadata.get("tags", []) and "jupyter" not in cell.metadata, (
                    f"{path.name}: the stub of a solution is folded away: {cell.source[:60]}")


def test_a_solution_is_folded_behind_a_button_that_names_its_exercise():
    for docname in NOTEBOOKS:
        notebook = json.loads(source_of(docname).read_text(encoding="utf-8"))
        exercises = [re.match(r"### Exercise (\S+)", "".join(c["source"])) for c in notebook["cells"]
                     if c["cell_type"] == "markdown"]
        exercises = [m.group(1) for m in exercises if m]
        solutions = [c for c in notebook["cells"] if "### BEGIN SOLUTION" in "".join(c["source"])]
        for exercise, cell in zip(exercises, solutions):
            assert "hide-input" in cell["metadata"].get("tags", []), f"{docname}: the solution to {exercise} shows"
            assert cell["metadata"]["mystnb"]["code_prompt_show"] == f"Solution to exercise {exercise}"
            assert cell["metadata"]["jupyter"]["source_hidden"], f"{docname}: {exercise}'s solution is not folded"


def test_a_cite_role_names_only_a_work_whose_label_is_its_year():
    """Sphinx writes a ``{cite:p}`` as "Authors, year" from the entry itself; where one author has two
    works of a year the References list labels them "2024a" and "2024b", so such a work is cited by a
    Markdown link with the label's text, as the chapters do."""
    works = _works()
    assert any(w.year[-1].isalpha() for w in works.values()), "no work shares an author and a year"
    roles = wrong = 0
    for page in sorted((REPO / "book").glob("*.md")):
        for keys in re.findall(r"\{cite:[pt]\}`([^`]+)`", page.read_text(encoding="utf-8")):
            for key in keys.split(","):
                roles += 1
                if not works[key.strip()].year[:4].isdigit() or works[key.strip()].year[-1].isalpha():
                    wrong += 1
                    print(f"{page.name}: {{cite}}`{key}` would read without its letter")
    assert roles and not wrong
