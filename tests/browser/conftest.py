"""The built book, opened in a real browser: fixtures for the browser tests.

The tests drive the system chromium through Python playwright (never ``playwright install``) over
``_build/html``, straight from disk (``file://``), the way a reader opens the book offline. Every
request that is not ``file://`` is blocked and recorded, so a page that needs the network fails.

Each page of the table of contents is opened once (:func:`visit`); the tests then assert on what
that visit recorded. The visit also saves a full-page screenshot at desktop and at phone width
into ``_build/screenshots``, reported at the end of the test run.

Skips, with the reason printed at the end of the run: chromium is not installed (``make test``
installs it when run as root), or the book has not been built since its sources last changed
(``make test`` builds it first). With ``MHA_COURSE_REQUIRE_BOOK=1``, which ``make test`` sets,
a missing or stale build is an error instead; with ``MHA_COURSE_REQUIRE_BROWSER=1``, which
``.ci/run`` sets, so is a missing chromium.
"""

from __future__ import annotations

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


@pytest.fixture
def offline_page(browser):
    """A new page in a fresh context (fresh storage) that may load only ``file://`` URLs.

    Yields ``(page, recorder)``.
    """
    context = browser.new_context(viewport=DESKTOP)
    recorder = Recorder()
    context.route(LEAVES_THE_MACHINE, recorder.guard)
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
    phone_overflow_px: int  # how far the page scrolls sideways on a phone (0 = not at all)
    screenshots: tuple[Path, Path]


COLLECT = """() => {
  const maths = [...document.querySelectorAll("article .math")];
  return {
    title: document.querySelector("article h1")?.textContent.replace(/#$/, "").trim() ?? document.title,
    math_total: maths.length,
    math_rendered: maths.filter((m) => m.querySelector("mjx-container")).length,
    math_errors: [...document.querySelectorAll("mjx-merror")].map((e) => e.getAttribute("data-mjx-error") || e.textContent),
    images: [...document.images].map((img) => [img.currentSrc || img.src, img.naturalWidth]),
    exercises: document.querySelectorAll("article div.exercise").length,
  };
}"""


def _open_solutions(page) -> list[Solution]:
    """Click every solution's toggle, as a reader would, and record whether it opened."""
    solutions = []
    for element in page.locator("article div.solution").all():
        label = element.locator(".admonition-title").first.inner_text().strip()
        body = element.locator(":scope > section, :scope > :not(.admonition-title)").first
        is_dropdown = "dropdown" in (element.get_attribute("class") or "")
        hidden_at_first = not body.is_visible()
        button = element.locator("button.toggle-button").first
        if button.count():
            button.scroll_into_view_if_needed()
            button.click()
            body.wait_for(state="visible", timeout=5_000)
        shown = body.is_visible() and button.count() > 0 and button.get_attribute("aria-expanded") == "true"
        solutions.append(Solution(label, is_dropdown, hidden_at_first, shown))
    # Back to the top, where a screenshot expects the page's sticky header.
    page.evaluate("() => window.scrollTo(0, 0)")
    return solutions


# After a resize: let the layout and style update run (two frames), then wait for the transitions
# they start (the theme slides its sidebars away) to end.
SETTLE_AFTER_RESIZE = """async () => {
  await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
  await Promise.all(document.getAnimations().map((animation) => animation.finished.catch(() => null)));
  window.scrollTo(0, 0);
}"""


def _screenshot_path(kind: str, docname: str) -> Path:
    return SCREENSHOTS / kind / f"{docname.replace('/', '_')}.png"


def _new_page(context, recorder: Recorder, viewport: dict):
    page = context.new_page()
    page.set_viewport_size(viewport)
    page.set_default_timeout(20_000)
    recorder.watch(page)
    return page


def _visit(browser, docname: str) -> Visit:
    context = browser.new_context(viewport=DESKTOP)
    recorder = Recorder()
    context.route(LEAVES_THE_MACHINE, recorder.guard)
    try:
        page = _new_page(context, recorder, DESKTOP)
        open_page(page, page_file(docname).as_uri())
        facts = page.evaluate(COLLECT)
        # Solutions open before the screenshots, so the screenshots show what is inside them too.
        solutions = _open_solutions(page)
        desktop, phone = _screenshot_path("desktop", docname), _screenshot_path("phone", docname)
        desktop.parent.mkdir(parents=True, exist_ok=True)
        phone.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=desktop, full_page=True)
        # The same page narrowed to a phone's width (the same pixels as loading it on a phone,
        # once the theme's sidebars have finished their transitions, and a second faster).
        page.set_viewport_size(PHONE)
        page.evaluate(SETTLE_AFTER_RESIZE)
        overflow = page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth")
        page.screenshot(path=phone, full_page=True)
        _screenshots_taken.extend([desktop, phone])
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
        phone_overflow_px=overflow,
        screenshots=(desktop, phone),
    )


@pytest.fixture(scope="session")
def visit(browser):
    """``visit(docname)``: open that page once (later calls reuse the result) and report what it showed."""
    if SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)  # no screenshot of a page that no longer exists
    visits: dict[str, Visit] = {}

    def get(docname: str) -> Visit:
        if docname not in visits:
            visits[docname] = _visit(browser, docname)
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
