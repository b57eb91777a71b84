"""The built book as readers see it, in chromium, offline.

Every page of ``_toc.yml`` (so a new chapter is covered as soon as it is listed) must load without
console errors, failed requests or requests that leave the machine; render its equations with
the book's own MathJax; load every image; and open every exercise's solution dropdown (what a
reader sees at desktop and phone widths is measured in test_readable.py). Search and
next/previous navigation are tested as a reader uses them, and MathJax's menu and accessibility
tools are tried on a page with equations.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from book_pages import DOCNAMES, HTML, accepted_targets, fail_if, markdown_of, open_page, page_file, source_of

pytestmark = pytest.mark.browser

CHAPTERS = DOCNAMES[1:]  # every page after the root

# An exercise in the sources is a heading; a solution is a code cell folded behind a button that
# names its exercise (myst-nb's hide-input, prompt "Solution to exercise 1.1"), or prose in
# <details class="solution">.
EXERCISE_HEADING = re.compile(r"^### Exercise \d", re.MULTILINE)
PROSE_SOLUTION = re.compile(r'<details class="solution">')


def _solutions_in_source(docname: str) -> int:
    path = source_of(docname)
    prose = len(PROSE_SOLUTION.findall(markdown_of(docname)))
    if path.suffix != ".ipynb":
        return prose
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return prose + sum(c["metadata"].get("mystnb", {}).get("code_prompt_show", "").startswith("Solution to exercise")
                       for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_page_loads_without_errors_and_offline(visit, docname):
    fail_if(visit(docname).problems, f"{docname}.html:")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_equations_render(visit, docname):
    page = visit(docname)
    assert page.math_rendered == page.math_total, (
        f"{docname}.html: MathJax rendered {page.math_rendered} of {page.math_total} equations"
    )
    fail_if(page.math_errors, f"{docname}.html: TeX errors:")


def test_the_book_has_equations(visit):
    """Guards the test above against passing because no page had any math left to check."""
    assert sum(visit(name).math_total for name in DOCNAMES) > 0, "no page of the book has an equation"


@pytest.mark.parametrize("docname", DOCNAMES)
def test_images_load(visit, docname):
    broken = [src for src, width in visit(docname).images if width == 0]
    fail_if(broken, f"{docname}.html: images that did not load:")


def test_the_book_has_images(visit):
    assert sum(len(visit(name).images) for name in DOCNAMES) > 0, "no page of the book has an image"


@pytest.mark.parametrize("docname", DOCNAMES)
def test_every_solution_is_a_dropdown_that_opens(visit, docname):
    page = visit(docname)
    source = markdown_of(docname)
    in_source = len(EXERCISE_HEADING.findall(source)), _solutions_in_source(docname)
    assert (page.exercises, len(page.solutions)) == in_source, (
        f"{docname}: the source has {in_source[0]} exercises and {in_source[1]} solutions but the page "
        f"shows {page.exercises} and {len(page.solutions)}"
    )
    for solution in page.solutions:
        assert solution.is_dropdown, f"{docname}: '{solution.label}' is not a dropdown"
        assert solution.hidden_at_first, f"{docname}: '{solution.label}' is open before the reader asks"
        assert solution.shown_after_click, f"{docname}: '{solution.label}' did not open when clicked"


def _asides_in_source(docname: str) -> int:
    path = source_of(docname)
    prose = markdown_of(docname).count('<details class="aside">')
    if path.suffix != ".ipynb":
        return prose
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return prose + sum(c["metadata"].get("mystnb", {}).get("code_prompt_show", "").startswith("Optional: ")
                       for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_every_optional_aside_is_folded_until_the_reader_opens_it(visit, docname):
    page = visit(docname)
    assert len(page.asides) == _asides_in_source(docname), (
        f"{docname}: the source has {_asides_in_source(docname)} optional asides, the page {len(page.asides)}")
    for aside in page.asides:
        assert aside.hidden_at_first, f"{docname}: '{aside.label}' is open before the reader asks"
        assert aside.shown_after_click, f"{docname}: '{aside.label}' did not open when clicked"


def test_the_book_has_optional_asides(visit):
    """Guards the test above against passing on a book with no aside to open."""
    assert sum(len(visit(name).asides) for name in DOCNAMES) >= 3


@pytest.mark.parametrize("docname", DOCNAMES)
def test_screenshots_saved(visit, docname):
    for path in visit(docname).screenshots:
        assert path.is_file() and path.stat().st_size > 10_000, f"no screenshot at {path}"


def _search_word(title: str) -> str:
    """The longest word of a chapter's title: specific enough to find that chapter."""
    return max(re.findall(r"[A-Za-z]{4,}", title), key=len).lower()


def test_search_finds_every_chapter(visit, offline_page):
    """Search each chapter's longest title word, as a reader does: Ctrl+K, type, Enter."""
    page, recorder = offline_page
    open_page(page, page_file(DOCNAMES[0]).as_uri())
    misses = []
    for docname in CHAPTERS:
        word = _search_word(visit(docname).title)
        page.keyboard.press("Control+k")
        box = page.locator("form.bd-search input[name=q]:visible").first
        box.fill(word)
        with page.expect_navigation(wait_until="domcontentloaded"):
            box.press("Enter")
        assert re.search(r"/search\.html\?q=", page.url), f"the search box went to {page.url}"
        page.wait_for_function("() => /Search finished/.test(document.querySelector('#search-results').textContent)")
        found = page.locator("#search-results ul.search li a").evaluate_all("links => links.map((a) => a.href)")
        if not any(href.endswith(f"/{docname}.html") for href in found):
            misses.append(f"{word!r} (from the title of {docname}) found {found or 'nothing'}")
    fail_if(misses, "search did not find the chapter:")
    fail_if(recorder.problems, "while searching:")


class _PrevNextLinks(HTMLParser):
    """The 'previous' and 'next' links in a built page's footer."""

    def __init__(self):
        super().__init__()
        self.links: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for kind in ("left-prev", "right-next"):
            if tag == "a" and kind in (attributes.get("class") or "").split():
                self.links[kind] = attributes.get("href", "")


def _neighbours(docname: str) -> dict[str, str]:
    """``{"left-prev": docname, "right-next": docname}`` as the page's footer links them."""
    parser = _PrevNextLinks()
    parser.feed(page_file(docname).read_text(encoding="utf-8"))
    folder = page_file(docname).parent
    return {
        kind: (folder / href.split("#")[0]).resolve().relative_to(HTML).as_posix().removesuffix(".html")
        for kind, href in parser.links.items()
    }


def test_next_and_previous_follow_the_table_of_contents(offline_page):
    """Every page links to its neighbours in table-of-contents order, and clicking the links works."""
    expected = {
        name: {kind: other for kind, other in (("left-prev", before), ("right-next", after)) if other}
        for name, before, after in zip(DOCNAMES, [None, *DOCNAMES[:-1]], [*DOCNAMES[1:], None])
    }
    wrong = [
        f"{name}: links {_neighbours(name)}, expected {expected[name]}"
        for name in DOCNAMES
        if _neighbours(name) != expected[name]
    ]
    fail_if(wrong, "'previous' and 'next' do not follow _toc.yml:")

    page, recorder = offline_page

    def click(kind: str, start: str, arrive: str) -> None:
        open_page(page, page_file(start).as_uri())
        with page.expect_navigation():
            page.locator(f".prev-next-area a.{kind}").first.click()
        assert page.url.endswith(f"/{arrive}.html"), f"'{kind}' on {start} went to {page.url}"

    click("right-next", DOCNAMES[0], DOCNAMES[1])
    click("left-prev", DOCNAMES[-1], DOCNAMES[-2])
    fail_if(recorder.problems, "while following next and previous:")


# A citation as sphinxcontrib-bibtex writes it in the text: "Vaswani <em>et al.</em> [<a href=
# "references.html#id5" ...>2017</a>]" ({cite:t}) or "[<a ...>Shazeer, 2019</a>]" ({cite:p}).
_CITATION = re.compile(
    r'<span class="bibtex-citation"[^>]*>(?P<authors>[^\[]*)\[<a class="reference internal" '
    r'href="(?:[^"#]*/)?references\.html#(?P<target>[^"]+)"[^>]*>(?P<shown>[^<]+)</a>'
)
_REFERENCE_LABEL = re.compile(
    r'<div class="citation" id="(?P<id>[^"]+)"[^>]*>\s*<span class="label"><span class="fn-bracket">\[</span>'
    r'(?P<label>(?:(?!<span).)*)<span class="fn-bracket">\]',
    re.DOTALL,
)


def _plain(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()


def test_references_are_labelled_as_the_text_cites_them():
    """A reader who follows "Vaswani et al. (2017)" lands on the entry labelled "Vaswani et al., 2017"."""
    references = page_file("book/references").read_text(encoding="utf-8")
    labels = {m["id"]: _plain(m["label"]) for m in _REFERENCE_LABEL.finditer(references)}
    assert labels, "no labelled work found on the References page"
    wrong, seen = [], 0
    for name in DOCNAMES:
        for m in _CITATION.finditer(page_file(name).read_text(encoding="utf-8")):
            seen += 1
            authors = _plain(m["authors"])
            cited = f"{authors}, {m['shown']}" if authors else m["shown"]
            if labels.get(m["target"]) != cited:
                wrong.append(f"{name}: the text cites {cited!r}, the References page labels it {labels.get(m['target'])!r}")
    assert seen, "no citation found in the book"
    fail_if(wrong, "citations and References labels disagree:")


def _first_page_with_math(visit) -> str:
    for name in DOCNAMES:
        if visit(name).math_total:
            return name
    pytest.fail("no page of the book has an equation")


def _use_menu(page, math, *path: str) -> None:
    """Right-click an equation and choose ``path`` in MathJax's menu, e.g. ("Accessibility", "Activate")."""
    math.click(button="right")
    for depth, item in enumerate(path):
        menu = page.locator(".CtxtMenu_Menu:visible").last
        entry = menu.locator(".CtxtMenu_MenuItem", has_text=re.compile(rf"^\s*{re.escape(item)}")).first
        if depth < len(path) - 1:
            entry.hover()
        else:
            entry.click()


def test_mathjax_menu_accessibility_and_renderers_work_offline(visit, offline_page):
    """The parts of MathJax loaded on demand are in the book: speech, collapsible math, SVG output."""
    docname = _first_page_with_math(visit)
    count = visit(docname).math_rendered
    page, recorder = offline_page
    open_page(page, page_file(docname).as_uri())
    rendered = page.locator("article .math mjx-container")

    def all_rendered(condition: str = "true") -> None:
        page.wait_for_function(
            f"n => document.querySelectorAll('article .math mjx-container').length === n && ({condition})",
            arg=count,
        )

    _use_menu(page, rendered.first, "Accessibility", "Activate")
    # The explorer enriches every equation with speech, from the speech rules shipped in the book.
    all_rendered("document.querySelector('article .math [data-semantic-speech]') !== null")
    speech = page.locator("article .math [data-semantic-speech]").first.get_attribute("data-semantic-speech")
    assert speech and speech.strip(), "the explorer produced no speech for the first equation"

    _use_menu(page, rendered.first, "Math Settings", "Math Renderer", "SVG")
    all_rendered("document.querySelectorAll('article .math mjx-container[jax=\"SVG\"]').length === n")

    _use_menu(page, rendered.first, "Accessibility", "Collapsible Math")
    all_rendered("MathJax._.a11y.complexity !== undefined")
    fail_if(recorder.problems, "while using MathJax's menu:")


def test_api_page_shows_every_public_name_with_its_docstring(offline_page):
    import mha_course

    api = "book/api"
    assert api in DOCNAMES, "the API reference (book/api.md) is not in _toc.yml"
    page, recorder = offline_page
    open_page(page, page_file(api).as_uri())
    missing = []
    for name in mha_course.__all__:
        ids = sorted(accepted_targets(name))
        entry = page.locator(", ".join(f'dt[id="{target}"]' for target in ids)).first
        if not entry.count() or not entry.is_visible():
            missing.append(f"{name}: no entry with id {' or '.join(ids)}")
            continue
        description = entry.evaluate("dt => dt.nextElementSibling ? dt.nextElementSibling.innerText : ''")
        if len(description.split()) < 5:
            missing.append(f"{name}: its entry shows no docstring")
    fail_if(missing, "the API page does not show:")
    fail_if(recorder.problems, "while opening the API page:")
