"""The built book, opened in a real browser: fixtures for the browser tests.

The tests drive the system chromium through Python playwright (never ``playwright install``) over
``_build/html``, straight from disk (``file://``), the way a reader opens the book offline. Every
request that is not ``file://`` is blocked and recorded, so a page that needs the network fails.

Each page of the table of contents is opened once (:func:`visit`); the tests then assert on what
that visit recorded. The visit opens every solution, then, at desktop width (1280 px), measures
what a reader sees (``layout.js``: equations, code and output blocks, figures, tables), runs
axe-core's accessibility rules and saves a full-page screenshot; it then narrows the same page to
a phone's width (390 px), measures and screenshots it again and opens the left sidebar from its
button. The screenshots, in ``_build/screenshots``, are reported at the end of the test run.

Skips, with the reason printed at the end of the run: chromium is not installed (``make test``
installs it when run as root), or the book has not been built since its sources last changed
(``make test`` builds it first). With ``MHA_COURSE_REQUIRE_BOOK=1``, which ``make test`` sets,
a missing or stale build is an error instead; with ``MHA_COURSE_REQUIRE_BROWSER=1``, which
``.ci/run`` sets, so is a missing chromium.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from book_pages import (
    CHROMIUM_CANDIDATES,
    CHROMIUM_FLAGS,
    DESKTOP,
    DOCNAMES,
    ENABLE_HINT,
    HTML,
    PHONE,
    REPO,
    SCREENSHOTS,
    open_page,
    page_file,
    source_of,
    where_screenshot_shows_title,
)

REQUIRE_BOOK = os.environ.get("MHA_COURSE_REQUIRE_BOOK") == "1"
REQUIRE_BROWSER = os.environ.get("MHA_COURSE_REQUIRE_BROWSER") == "1"  # set by .ci/run
# Every URL that is not a file on this machine. A regular expression is matched inside the browser
# driver, so the book's own files load without a round trip through Python.
LEAVES_THE_MACHINE = re.compile(r"^(?!file://)")

_skip_reasons: set[str] = set()
_screenshots_taken: list[Path] = []


# --------------------------------------------------------------------------------------------
# Skips that say how to enable the tests
# --------------------------------------------------------------------------------------------

def _skip(reason: str):
    _skip_reasons.add(reason)
    pytest.skip(reason)


def _find_chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    return next((path for path in CHROMIUM_CANDIDATES if Path(path).exists()), None)


@pytest.fixture(scope="session")
def built_book() -> Path:
    """``_build/html``, checked to exist and to be newer than every page's source."""
    problems = [f"{name}.html is missing" for name in DOCNAMES if not page_file(name).exists()]
    if not problems:
        problems = [
            f"{source_of(name).relative_to(REPO)} changed after {name}.html was built"
            for name in DOCNAMES
            if source_of(name).stat().st_mtime > page_file(name).stat().st_mtime
        ]
    if problems:
        reason = (
            "browser tests need a fresh build of the book (" + "; ".join(problems[:3])
            + "): run `make test`, which builds it first, or `make book`"
        )
        if REQUIRE_BOOK:
            pytest.fail(reason)
        _skip(reason)
    return HTML


@pytest.fixture(scope="session")
def browser(built_book):
    executable = _find_chromium()
    if executable is None:
        if REQUIRE_BROWSER:
            pytest.fail(f"chromium is not installed and MHA_COURSE_REQUIRE_BROWSER=1; {ENABLE_HINT}")
        _skip(f"chromium is not installed, so the browser tests are skipped; {ENABLE_HINT}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


# --------------------------------------------------------------------------------------------
# Offline pages with everything they log recorded
# --------------------------------------------------------------------------------------------

@dataclass
class Recorder:
    """What a browser context logged: console errors and warnings, failed and blocked requests."""

    console: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    blocked_requests: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.console + self.failed_requests + self.blocked_requests

    def watch(self, page) -> None:
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.console.append(f"uncaught exception: {error}"))
        page.on("requestfailed", lambda request: self.failed_requests.append(
            f"request failed: {request.url} ({request.failure})"))

    def _on_console(self, message) -> None:
        if message.type in ("error", "warning"):
            where = message.location.get("url", "") if message.location else ""
            self.console.append(f"console {message.type}: {message.text} [{where}]")

    def guard(self, route) -> None:
        self.blocked_requests.append(f"request that leaves the machine: {route.request.url}")
        route.abort()


def _offline_context(browser):
    """A fresh context (fresh storage) at desktop width that may load only ``file://`` URLs, and its recorder."""
    context = browser.new_context(viewport=DESKTOP)
    recorder = Recorder()
    context.route(LEAVES_THE_MACHINE, recorder.guard)
    return context, recorder


@pytest.fixture
def offline_page(browser):
    """A new page in a fresh context (fresh storage) that may load only ``file://`` URLs.

    Yields ``(page, recorder)``.
    """
    context, recorder = _offline_context(browser)
    yield _new_page(context, recorder, DESKTOP), recorder
    context.close()


# --------------------------------------------------------------------------------------------
# One visit per page
# --------------------------------------------------------------------------------------------

@dataclass
class Solution:
    label: str
    is_dropdown: bool
    hidden_at_first: bool
    shown_after_click: bool


@dataclass
class Violation:
    """One accessibility rule that axe-core found broken on a page, and where."""

    rule: str
    impact: str  # "critical", "serious", "moderate" or "minor"
    help: str
    targets: list[str]  # CSS selectors of the elements that break it


@dataclass
class Visit:
    """What opening one page of the book showed."""

    docname: str
    title: str
    problems: list[str]
    math_total: int  # elements Sphinx marked as math
    math_rendered: int  # of those, how many MathJax turned into an mjx-container
    math_errors: list[str]  # TeX that MathJax could not typeset
    images: list[tuple[str, int]]  # (src, naturalWidth)
    exercises: int
    solutions: list[Solution]
    asides: list[Solution]  # the optional asides, opened like the solutions
    # What tests/browser/layout.js measured, by width ("desktop", "phone"), with the solutions open.
    layout: dict[str, dict]
    accessibility: list[Violation]  # axe-core's findings at desktop width, solutions open
    contrast_checked_everywhere: bool  # axe's slow rules (colour contrast, target size) ran too (see _axe)
    phone_sidebar: dict  # the left sidebar opened from its button on a phone (see _open_phone_sidebar)
    # Where each screenshot shows the page's title, against where the page has it (px from the left).
    screenshot_margins: dict[str, tuple[int | None, int]]
    screenshots: tuple[Path, Path]


COLLECT = """() => {
  const maths = [...document.querySelectorAll("article .math")];
  return {
    title: document.querySelector("article h1")?.textContent.replace(/#$/, "").trim() ?? document.title,
    math_total: maths.length,
    math_rendered: maths.filter((m) => m.querySelector("mjx-container")).length,
    math_errors: [...document.querySelectorAll("mjx-merror")].map((e) => e.getAttribute("data-mjx-error") || e.textContent),
    images: [...document.images].map((img) => [img.currentSrc || img.src, img.naturalWidth]),
    exercises: [...document.querySelectorAll("article h3")].filter(
      (h) => /^Exercise \\d/.test(h.textContent.trim())).length,
  };
}"""


#: The button of a folded block that a reader opens: an exercise's solution, or an optional aside.
SOLUTION_LABEL, ASIDE_LABEL = "Solution to exercise", "Optional: "


def _open_folds(page) -> tuple[list[Solution], list[Solution]]:
    """Click every solution's and every optional aside's toggle, as a reader would, and record whether
    it opened. A solution is a folded block whose button names its exercise: the code cell's
    (myst-nb's ``hide-input``, its prompt "Solution to exercise 1.1") or a solution in prose
    (``<details class="solution">``). An aside's button starts "Optional: ": prose in
    ``<details class="aside">`` or a cell whose output the book folds (``hide-output``)."""
    solutions, asides = [], []
    for element in page.locator("article details").all():
        summary = element.locator(":scope > summary").first
        label = (summary.locator(".collapsed").first if summary.locator(".collapsed").count() else summary)
        label = label.inner_text().strip()
        if not label.startswith((SOLUTION_LABEL, ASIDE_LABEL)):
            continue  # a figure's or a table's folded code
        body = element.locator(":scope > :not(summary)").first
        is_dropdown = True  # a <details> element is folded until opened
        hidden_at_first = not body.is_visible() and element.get_attribute("open") is None
        summary.scroll_into_view_if_needed()
        summary.click()
        body.wait_for(state="visible", timeout=5_000)
        shown = body.is_visible() and element.get_attribute("open") is not None
        found = Solution(label, is_dropdown, hidden_at_first, shown)
        (solutions if label.startswith(SOLUTION_LABEL) else asides).append(found)
    # Back to the top, where a screenshot expects the page's sticky header.
    page.evaluate("() => window.scrollTo({left: 0, top: 0, behavior: 'instant'})")
    return solutions, asides


# After a resize: let the layout and style update run (two frames), then wait for the transitions
# they start (the theme slides its sidebars away) to end.
SETTLE_AFTER_RESIZE = """async () => {
  await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
  await Promise.all(document.getAnimations().map((animation) => animation.finished.catch(() => null)));
  window.scrollTo({left: 0, top: 0, behavior: "instant"});
}"""

# What a reader sees at the current width (see the file for what each entry means).
LAYOUT = (Path(__file__).parent / "layout.js").read_text(encoding="utf-8")


def _screenshot_path(kind: str, docname: str) -> Path:
    return SCREENSHOTS / kind / f"{docname.replace('/', '_')}.png"


def _new_page(context, recorder: Recorder, viewport: dict):
    page = context.new_page()
    page.set_viewport_size(viewport)
    page.set_default_timeout(20_000)
    recorder.watch(page)
    return page


# --------------------------------------------------------------------------------------------
# Screenshots, and where they show the page's title
# --------------------------------------------------------------------------------------------

def _screenshot(page, path: Path, heading: dict | None) -> tuple[int | None, int]:
    """Save a full-page screenshot from the page's top left corner, with every transition ended.

    Returns ``(found, expected)``: the left edge of the page's title as the screenshot shows it
    (``None`` if it shows no title where the page has it) and as the page lays it out, in pixels.
    """
    # Every transition ends first, and none runs during the capture (which lays the page out at its
    # full height): the theme's sidebar slides in with one, and a capture in mid-slide shifted the
    # whole page sideways.
    page.evaluate(SETTLE_AFTER_RESIZE)
    still = page.add_style_tag(content=NO_MOTION)
    try:
        data = _full_page_png(page)
    finally:
        still.evaluate("(style) => style.remove()")
    path.write_bytes(data)
    _screenshots_taken.append(path)
    if heading is None:
        return None, 0
    return where_screenshot_shows_title(data, heading), heading["left"]


#: What Playwright's ``animations="disabled"`` does for a capture, as a style: no transition or animation runs.
NO_MOTION = "*, *::before, *::after { transition: none !important; animation: none !important; }"


def _full_page_png(page) -> bytes:
    """The whole page as a PNG, from chromium's DevTools protocol with the encoding made for speed
    (``optimizeForSpeed``, which Playwright's screenshot does not offer): the capture costs about a
    quarter less, for files about a quarter larger."""
    session = page.context.new_cdp_session(page)
    try:
        size = session.send("Page.getLayoutMetrics")["cssContentSize"]
        shot = session.send("Page.captureScreenshot", {
            "format": "png", "optimizeForSpeed": True, "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    finally:
        session.detach()
    return base64.b64decode(shot["data"])


# --------------------------------------------------------------------------------------------
# Accessibility: axe-core, bundled by axe-playwright-python, in the page
# --------------------------------------------------------------------------------------------

# Every rule of axe-core's default set (WCAG 2.x A and AA, and best practices) on every page, but
# two: colour contrast and target size measure every element with text or every control, which
# costs seconds a page (a chapter's code alone has thousands of highlighted tokens). What they
# judge is the theme's colours and controls, the same on every page, so they run on one page: the
# first with code, printed output and a table of the package (_contrast_page). No preloading:
# axe would fetch every stylesheet again with XMLHttpRequest, which browsers refuse on file://
# pages (only css-orientation-lock needs it, and the book's styles never lock the orientation).
SLOW_RULES = ["color-contrast", "target-size"]
AXE_RUN = """async ({slowRulesToo, slowRules}) => {
  const options = {resultTypes: ["violations"], preload: false};
  const off = Object.fromEntries(slowRules.map((rule) => [rule, {enabled: false}]));
  const found = [...(await axe.run(document, {...options, rules: off})).violations];
  if (slowRulesToo) {
    found.push(...(await axe.run(document, {...options, runOnly: {type: "rule", values: slowRules}})).violations);
  }
  return found.map((v) => ({
    rule: v.id, impact: v.impact, help: v.help, targets: v.nodes.map((n) => n.target.join(" ")),
  }));
}"""


def _axe(page, contrast_everywhere: bool) -> list[Violation]:
    from axe_playwright_python.base import AXE_SCRIPT

    page.evaluate(AXE_SCRIPT)
    arguments = {"slowRulesToo": contrast_everywhere, "slowRules": SLOW_RULES}
    return [Violation(**found) for found in page.evaluate(AXE_RUN, arguments)]


def _contrast_page() -> str:
    """The page axe checks for colour contrast and target size: the first with code, outputs and a table."""
    for name in DOCNAMES:
        html = page_file(name).read_text(encoding="utf-8") if page_file(name).exists() else ""
        if all(marker in html for marker in ('class="cell_input', 'class="cell_output', 'class="mha-table"')):
            return name
    return next((name for name in DOCNAMES if page_file(name).exists()), DOCNAMES[0])


# --------------------------------------------------------------------------------------------
# The left sidebar on a phone
# --------------------------------------------------------------------------------------------

SIDEBAR_OPEN = """() => {
  const dialog = document.querySelector("#pst-primary-sidebar-modal");
  const rect = dialog.getBoundingClientRect();
  const style = getComputedStyle(dialog);
  return {
    opened: dialog.open, left: Math.round(rect.left), right: Math.round(rect.right),
    scrolls_down: ["auto", "scroll"].includes(style.overflowY) || dialog.scrollHeight <= dialog.clientHeight,
    sideways_px: dialog.scrollWidth - dialog.clientWidth,
    links: [...dialog.querySelectorAll("a[href]")].map((a) => a.href),
    visible_links: [...dialog.querySelectorAll("a[href]")].filter((a) => a.getClientRects().length).length,
    page_overflow: document.scrollingElement.scrollWidth - window.innerWidth,
  };
}"""


def _open_phone_sidebar(page) -> dict:
    """Open the left sidebar with its button on a phone, measure it, and close it with Escape."""
    button = page.locator("button.primary-toggle:visible").first
    if not button.count():
        return {"opened": False, "problem": "no visible button opens the sidebar"}
    button.click()
    page.wait_for_function("() => document.querySelector('#pst-primary-sidebar-modal')?.open")
    page.evaluate(SETTLE_AFTER_RESIZE)
    found = page.evaluate(SIDEBAR_OPEN)
    page.keyboard.press("Escape")
    found["closed_with_escape"] = page.evaluate(
        "() => !document.querySelector('#pst-primary-sidebar-modal').open")
    return found


# --------------------------------------------------------------------------------------------
# One visit per page
# --------------------------------------------------------------------------------------------

def _visit(browser, docname: str, contrast_everywhere: bool) -> Visit:
    context, recorder = _offline_context(browser)
    desktop, phone = _screenshot_path("desktop", docname), _screenshot_path("phone", docname)
    desktop.parent.mkdir(parents=True, exist_ok=True)
    phone.parent.mkdir(parents=True, exist_ok=True)
    try:
        page = _new_page(context, recorder, DESKTOP)
        open_page(page, page_file(docname).as_uri())
        facts = page.evaluate(COLLECT)
        # Solutions and asides open before anything is measured, so they are measured and shown too.
        solutions, asides = _open_folds(page)
        layout = {"desktop": page.evaluate(LAYOUT)}
        accessibility = _axe(page, contrast_everywhere)
        margins = {"desktop": _screenshot(page, desktop, layout["desktop"]["heading"])}
        # The same page narrowed to a phone's width (the same pixels as loading it on a phone,
        # once the theme's sidebars have finished their transitions, and a second faster).
        page.set_viewport_size(PHONE)
        page.evaluate(SETTLE_AFTER_RESIZE)
        layout["phone"] = page.evaluate(LAYOUT)
        margins["phone"] = _screenshot(page, phone, layout["phone"]["heading"])
        sidebar = _open_phone_sidebar(page)
    finally:
        context.close()
    return Visit(
        docname=docname,
        title=facts["title"],
        problems=recorder.problems,
        math_total=facts["math_total"],
        math_rendered=facts["math_rendered"],
        math_errors=facts["math_errors"],
        images=[tuple(image) for image in facts["images"]],
        exercises=facts["exercises"],
        solutions=solutions,
        asides=asides,
        layout=layout,
        accessibility=accessibility,
        contrast_checked_everywhere=contrast_everywhere,
        phone_sidebar=sidebar,
        screenshot_margins=margins,
        screenshots=(desktop, phone),
    )


@pytest.fixture(scope="session")
def visit(browser):
    """``visit(docname)``: open that page once (later calls reuse the result) and report what it showed."""
    if SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)  # no screenshot of a page that no longer exists
    visits: dict[str, Visit] = {}
    contrast_page = _contrast_page()

    def get(docname: str) -> Visit:
        if docname not in visits:
            visits[docname] = _visit(browser, docname, contrast_everywhere=docname == contrast_page)
        return visits[docname]

    return get


# --------------------------------------------------------------------------------------------
# Where the screenshots are, and why tests were skipped
# --------------------------------------------------------------------------------------------

def pytest_terminal_summary(terminalreporter):
    if _screenshots_taken:
        pages = len({path.name for path in _screenshots_taken})
        terminalreporter.write_sep("-", "screenshots of the book")
        terminalreporter.write_line(
            f"{pages} pages at desktop ({DESKTOP['width']} px) and phone ({PHONE['width']} px) width, "
            f"solutions opened: {SCREENSHOTS}/desktop and {SCREENSHOTS}/phone"
        )
    for reason in sorted(_skip_reasons):
        terminalreporter.write_sep("-", "browser tests skipped")
        terminalreporter.write_line(reason)
