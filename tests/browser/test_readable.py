"""The book is readable on every screen and by every reader: measured in chromium.

At desktop width (1280 px) and at a phone's (390 px), on every page of ``_toc.yml``: the page never
scrolls sideways; no display equation is cut off (on a desktop, every one fits the column); code
and output blocks hold 80 characters and no block is wider than its box (desktop); tables are
HTML tables with numbers right-aligned in human units, each scrolling inside its own box; figures
are shown at the size they were drawn for on a desktop (so their text can be read) from images with
twice their pixels, and on a phone scaled to the column, seen whole, each opening full size on a
tap, with alt text that says what they show; punctuation stays with its inline math; the left sidebar opens on a phone; axe-core finds no serious or
critical accessibility problem; and the screenshots start at the page's left edge.

Everything is measured once per page and width, during the page's single visit
(``conftest.visit`` and ``layout.js``). A failure lists every offender with the page, the
section (``#id``), the widths involved and, for equations and figures, how far down the page's
screenshot it is (``y``), which says what to change.
"""

from __future__ import annotations

import re

import pytest

from book_pages import CODE_COLUMN, DOCNAMES, PHONE, fail_if
from mha_course.plots import BOOK_COLUMN_PX, FIGURE_DPI, MIN_TEXT_PX, SMALLEST_PT

#: How far a figure may be shrunk below the size it was drawn for: its smallest text (SMALLEST_PT,
#: 9.7 px as drawn) then stays at MIN_TEXT_PX at least.
SMALLEST_TEXT_SHRINK = MIN_TEXT_PX / (SMALLEST_PT * FIGURE_DPI / 72)

pytestmark = pytest.mark.browser

WIDTHS = ("desktop", "phone")
PAGES_AND_WIDTHS = [(name, width) for name in DOCNAMES for width in WIDTHS]

# Blocks that may be wider than their box on a desktop: (page, kind of block) and why.
WIDE_BLOCKS_ALLOWED = {
    ("book/api", "doctest"): "the API reference shows the package's docstrings as they are written; their "
                             "examples follow the package's source, whose lines are not held to 80 characters",
}


# --------------------------------------------------------------------------------------------
# The page, equations and punctuation
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("docname, width", PAGES_AND_WIDTHS)
def test_page_never_scrolls_sideways(visit, docname, width):
    overflow = visit(docname).layout[width]["overflow"]
    assert overflow <= 0, (
        f"{docname}.html scrolls {overflow} px sideways at {width} width: something is wider than the "
        f"screen and not inside a box that scrolls (see the {width} screenshot)"
    )


@pytest.mark.parametrize("docname, width", PAGES_AND_WIDTHS)
def test_no_display_equation_is_clipped(visit, docname, width):
    """An equation wider than its box scrolls inside it; none is cut off by a box that hides it."""
    fail_if([
        f"{eq['where']} (y {eq['y']}): {eq['tex']!r}: {eq['content']} px of equation in a {eq['box']} px box"
        + (f", cut off by {eq['clipped_by']}" if eq["clipped_by"] else ", which does not scroll")
        for eq in visit(docname).layout[width]["equations"] if eq["clipped"]
    ], f"{docname}.html at {width} width: display equations cut off (break them with aligned, or shorten):")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_display_equations_fit_the_column_on_a_desktop(visit, docname):
    """On a phone a long equation may scroll in its box; on a desktop every one fits the column."""
    fail_if([
        f"{eq['where']} (y {eq['y']}): {eq['tex']!r}: {eq['content']} px of equation in a {eq['box']} px box"
        for eq in visit(docname).layout["desktop"]["equations"] if eq["content"] > eq["box"] + 1
    ], f"{docname}.html at desktop width: display equations wider than the column (break them with aligned):")


@pytest.mark.parametrize("docname, width", PAGES_AND_WIDTHS)
def test_punctuation_stays_with_its_inline_math(visit, docname, width):
    layout = visit(docname).layout[width]
    fail_if(
        [f"{p['where']}: '{p['text']}' breaks across lines" for p in layout["broken_punctuation"]]
        + [f"{p['where']}: '{p['text']}' is not kept together (book/_ext/math_punctuation.py)"
           for p in layout["loose_punctuation"]],
        f"{docname}.html at {width} width: punctuation apart from its inline math:",
    )


# --------------------------------------------------------------------------------------------
# Code and output blocks
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("docname", DOCNAMES)
def test_code_blocks_hold_80_characters_on_a_desktop(visit, docname):
    """The book's styles give every code and output block room for an 80-character line."""
    fail_if([
        f"{block['where']}: a {block['kind']} block {block['box']} px wide holds {block['fits']} characters "
        f"at {block['font_px']:.1f} px"
        for block in visit(docname).layout["desktop"]["blocks"] if block["fits"] < CODE_COLUMN
    ], f"{docname}.html at desktop width: blocks that hold fewer than {CODE_COLUMN} characters a line:")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_code_and_output_fit_their_boxes_on_a_desktop(visit, docname):
    """A desktop reader never scrolls sideways inside a code or output block (but the allowed few)."""
    fail_if([
        f"{block['where']}: {block['kind']} line of {block['chars']} characters, {block['content']} px in a "
        f"{block['box']} px box: {block['line']!r}"
        for block in visit(docname).layout["desktop"]["blocks"]
        if block["content"] > block["box"] + 1 and (docname, block["kind"]) not in WIDE_BLOCKS_ALLOWED
    ], f"{docname}.html at desktop width: blocks wider than their box (keep lines to "
       f"{CODE_COLUMN} characters):")


def test_wide_blocks_allowed_are_still_there(visit):
    """Each entry of WIDE_BLOCKS_ALLOWED still excuses some block; remove the entries that do not."""
    used = {
        (name, block["kind"])
        for name in DOCNAMES
        for block in visit(name).layout["desktop"]["blocks"]
        if block["content"] > block["box"] + 1
    }
    fail_if([f"{entry}: {reason}" for entry, reason in WIDE_BLOCKS_ALLOWED.items() if entry not in used],
             "WIDE_BLOCKS_ALLOWED excuses blocks that are no longer wide; remove:")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_code_and_output_scroll_inside_their_box_on_a_phone(visit, docname):
    layout = visit(docname).layout["phone"]
    fail_if([
        f"{block['where']}: {block['kind']} block from {block['left']} to {block['right']} px"
        + (f", cut off by {block['cut']}" if block["cut"] else "")
        + ("" if block["scrolls"] or block["content"] <= block["box"] + 1 else ", its content wider and not scrolling")
        for block in layout["blocks"]
        if block["left"] < -1 or block["right"] > layout["width"] + 1 or block["cut"]
        or (block["content"] > block["box"] + 1 and not block["scrolls"])
    ], f"{docname}.html at {PHONE['width']} px: blocks that do not scroll inside their own box on the screen:")


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("docname", DOCNAMES)
def test_results_are_html_tables_not_text(visit, docname):
    """A table is shown as a table (mha_course.tables.Table, displayed), never printed as text."""
    fail_if([
        f"{table['where']}: printed as text: {table['line']!r}"
        for table in visit(docname).layout["desktop"]["text_tables"]
    ], f"{docname}.html: tables printed as text (display a mha_course.tables.Table instead of printing it):")


@pytest.mark.parametrize("docname, width", PAGES_AND_WIDTHS)
def test_tables_scroll_inside_their_own_box(visit, docname, width):
    layout = visit(docname).layout[width]
    problems = []
    for table in layout["tables"]:
        name = f"{table['where']}: table {table['label']!r}" if table["label"] else f"{table['where']}: table"
        if table["left"] < -1 or table["right"] > layout["width"] + 1 or table["cut"]:
            problems.append(f"{name} spans {table['left']}..{table['right']} px, beyond the screen or cut off")
        if table["table"] > table["box"] + 1 and not (table["scrolls"] and table["focusable"]):
            problems.append(f"{name} is {table['table']} px in a {table['box']} px box that "
                            + ("does not scroll" if not table["scrolls"] else "the keyboard cannot reach"))
    fail_if(problems, f"{docname}.html at {width} width: tables that do not scroll inside their own box:")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_table_numbers_right_aligned_in_human_units(visit, docname):
    problems = []
    for table in visit(docname).layout["desktop"]["tables"]:
        problems += [f"{table['where']}: column {column!r} holds numbers aligned left" for column in table["misaligned"]]
        problems += [f"{table['where']}: {cell!r} in exponent notation (format it: µs/ms/s, KiB/MiB/GiB, "
                     "or three significant digits)" for cell in table["exponents"]]
    fail_if(problems, f"{docname}.html: table numbers that are hard to read:")


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------

def test_the_column_is_as_wide_as_figures_assume(visit):
    """mha_course.plots sizes figures and their text for a column BOOK_COLUMN_PX wide: measure it."""
    columns = {name: visit(name).layout["desktop"]["column"] for name in DOCNAMES if visit(name).layout["desktop"]["figures"]}
    assert columns, "no page of the book shows a figure"
    wrong = [f"{name}: {width} px" for name, width in columns.items() if abs(width - BOOK_COLUMN_PX) > 1]
    fail_if(wrong, f"the book's column is not mha_course.plots.BOOK_COLUMN_PX = {BOOK_COLUMN_PX} px wide at "
                    "desktop width; update the constant (figures' text sizes are computed from it):")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_figures_take_most_of_the_column_on_a_desktop(visit, docname):
    layout = visit(docname).layout["desktop"]
    fail_if([
        f"{figure['where']} (y {figure['y']}): {figure['drawn_by'] or figure['src']!r} shown {figure['shown']} px wide "
        f"({figure['shown'] / layout['column']:.0%} of the {layout['column']} px column)"
        for figure in layout["figures"] if figure["shown"] < 0.6 * layout["column"]
    ], f"{docname}.html at desktop width: figures shown narrower than 60 % of the column "
       "(draw them wider: mha_course.plots.book_figsize):")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_figures_are_shown_at_their_drawn_size_and_sharp_on_a_desktop(visit, docname):
    """On a desktop a figure is shown at the size it was drawn for (so its text is as large as
    tests/test_figure_style.py measures it, 9 px at least), from a PNG with twice its pixels."""
    layout = visit(docname).layout["desktop"]
    fail_if([
        f"{figure['where']} (y {figure['y']}): {figure['drawn_by'] or figure['src']!r} shown {figure['shown']} px wide"
        + (f", drawn for {figure['drawn_for']} px" if figure["drawn_for"] else ", with no size (draw it in the "
           "house style: mha_course.plots.house_style makes the notebook's figures sharp)")
        + f", from a {figure['natural']} px image"
        for figure in layout["figures"]
        # A figure drawn a little wider than the room its output gives it (a little less than the
        # column) is shrunk to fit, but never so far that its smallest text falls under 9 px.
        if not figure["drawn_for"] or figure["shown"] > figure["drawn_for"] + 1
        or figure["shown"] < min(figure["drawn_for"], figure["room"]) - 1
        or figure["shown"] < SMALLEST_TEXT_SHRINK * figure["drawn_for"]
        or figure["natural"] < 2 * figure["drawn_for"] - 2
    ], f"{docname}.html at desktop width: figures not shown at their size, or not sharp (twice their pixels):")


@pytest.mark.parametrize("docname", DOCNAMES)
def test_figures_are_seen_whole_on_a_phone_and_open_full_size(visit, docname):
    """On a phone every figure is scaled to the column and seen whole: nothing of it beyond the screen
    or its box, no sideways scrolling to see the rest; a tap opens it full size (its link)."""
    layout = visit(docname).layout["phone"]
    problems = []
    for figure in layout["figures"]:
        name = f"{figure['where']} (y {figure['y']}): {figure['drawn_by'] or figure['src']!r}"
        if figure["left"] < -1 or figure["right"] > layout["width"] + 1 or figure["cut"] or figure["wider_than_box"]:
            problems.append(f"{name}: spans {figure['left']}..{figure['right']} px of a {layout['width']} px screen"
                            + (f", cut off by {figure['cut']}" if figure["cut"] else "")
                            + (", wider than its box, which scrolls" if figure["wider_than_box"] else ""))
        if figure["link"] != figure["src"]:
            problems.append(f"{name}: a tap does not open the full-size image (its link: {figure['link']!r})")
    fail_if(problems, f"{docname}.html at {PHONE['width']} px: figures not seen whole ({len(problems)} of "
                      f"{len(layout['figures'])} cut or without their full-size link):")


def test_every_chapter_figure_is_measured_on_a_phone(visit):
    """The phone check above sees the figures: the chapters show them (a guard against measuring none)."""
    counted = sum(len(visit(name).layout["phone"]["figures"]) for name in DOCNAMES)
    assert counted >= 20, f"only {counted} figures measured at {PHONE['width']} px in the whole book"


FILE_NAME = re.compile(r"(^|/)[^ ]+\.(png|jpe?g|gif|svg|webp)$", re.IGNORECASE)


@pytest.mark.parametrize("docname", DOCNAMES)
def test_figures_have_alt_text_that_says_what_they_show(visit, docname):
    """A screen reader reads a figure's alt text: a sentence about the figure, not its file's path."""
    fail_if([
        f"{figure['where']} (y {figure['y']}): {figure['drawn_by'] or figure['src']!r} has alt text {figure['alt']!r}"
        for figure in visit(docname).layout["desktop"]["figures"]
        if FILE_NAME.search(figure["alt"].strip()) or len(figure["alt"].split()) < 3
    ], f"{docname}.html: figures without alt text that describes them (give the cell "
       '{"mystnb": {"image": {"alt": "..."}}} metadata):')


# --------------------------------------------------------------------------------------------
# The sidebar on a phone
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("docname", DOCNAMES)
def test_the_sidebar_opens_and_fits_on_a_phone(visit, docname):
    sidebar = visit(docname).phone_sidebar
    assert sidebar.get("opened"), f"{docname}.html: the left sidebar did not open on a phone: {sidebar}"
    problems = []
    if sidebar["left"] < 0 or sidebar["right"] > PHONE["width"]:
        problems.append(f"it spans {sidebar['left']}..{sidebar['right']} px of a {PHONE['width']} px screen")
    if sidebar["sideways_px"] > 0:
        problems.append(f"it scrolls {sidebar['sideways_px']} px sideways")
    if not sidebar["scrolls_down"]:
        problems.append("it is taller than the screen and does not scroll")
    if sidebar["page_overflow"] > 0:
        problems.append(f"the page scrolls {sidebar['page_overflow']} px sideways while it is open")
    missing = [name for name in DOCNAMES if not any(link.split("#")[0].endswith(f"/{name}.html") for link in sidebar["links"])]
    if missing:
        problems.append(f"it does not link to {missing}")
    if not sidebar["visible_links"]:
        problems.append("it shows no link")
    if not sidebar["closed_with_escape"]:
        problems.append("Escape does not close it")
    fail_if(problems, f"{docname}.html at {PHONE['width']} px, the left sidebar:")


# --------------------------------------------------------------------------------------------
# Accessibility rules (axe-core)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("docname", DOCNAMES)
def test_no_serious_accessibility_problem(visit, docname):
    """axe-core (WCAG 2 A and AA, and best practices) finds nothing serious or critical."""
    found = visit(docname).accessibility
    fail_if([
        f"{v.rule} ({v.impact}): {v.help}: {', '.join(v.targets[:8])}" + (" ..." if len(v.targets) > 8 else "")
        for v in found if v.impact in ("serious", "critical")
    ], f"{docname}.html at desktop width, solutions open: accessibility problems (axe-core):")


def test_colour_contrast_and_target_size_are_checked_on_one_page(visit):
    """axe's two slow rules judge the theme's colours and controls: they run on one page, not all."""
    checked = [name for name in DOCNAMES if visit(name).contrast_checked_everywhere]
    assert len(checked) == 1, f"colour contrast and target size were checked on {checked or 'no page'}"


# --------------------------------------------------------------------------------------------
# Screenshots
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("docname, width", PAGES_AND_WIDTHS)
def test_screenshots_start_at_the_page_left_edge(visit, docname, width):
    """The screenshot shows the page's title where the page lays it out: nothing slid sideways."""
    page = visit(docname)
    found, expected = page.screenshot_margins[width]
    shot = page.screenshots[WIDTHS.index(width)]
    assert found is not None and abs(found - expected) <= 6, (
        f"{shot}: the page's title starts {expected} px from the left, but the screenshot shows "
        + (f"it at {found} px" if found is not None else "no title near there")
        + ": the screenshot was taken with the page shifted sideways"
    )


@pytest.mark.parametrize("shift_px", [-500, -71, 40])
def test_the_screenshot_check_sees_a_page_shifted_sideways(visit, shift_px):
    """A page's own screenshot, shifted sideways as chapter 3's once was, fails the check above."""
    import io

    from PIL import Image

    from book_pages import top_rows, where_screenshot_shows_title

    page = visit(DOCNAMES[1])
    heading = page.layout["desktop"]["heading"]
    found, expected = page.screenshot_margins["desktop"]
    assert found is not None and abs(found - expected) <= 6, "the unshifted screenshot must pass first"
    original = top_rows(page.screenshots[0].read_bytes(), heading["bottom"] + 1).convert("RGB")
    shifted = Image.new("RGB", original.size, "white")
    shifted.paste(original, (shift_px, 0))
    buffer = io.BytesIO()
    shifted.save(buffer, format="PNG")
    found = where_screenshot_shows_title(buffer.getvalue(), heading)
    assert found is None or abs(found - expected) > 6, (
        f"a screenshot shifted {shift_px} px still shows the title at {found} px, as if unshifted ({expected} px)"
    )
