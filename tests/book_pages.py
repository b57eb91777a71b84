"""The book's pages: their sources, the built HTML and how to open it, and what the tests hold them to.

Shared by the tests that read the chapters' sources (code cells, listings, the API page) and by the
browser tests and their fixtures, which measure the built book.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
HTML = REPO / "_build" / "html"
SCREENSHOTS = REPO / "_build" / "screenshots"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# Chromium in a container: no sandbox (containers, root), no GPU, and no background traffic.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Characters a line of code or output may hold: the book's code boxes hold 80 at a 1280 px window
#: (``book/_static/book.css``).
CODE_COLUMN = 80
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
ENABLE_HINT = (
    "install chromium to run them: `sudo apt-get install -y chromium` "
    "(`make test` installs it itself when run as root, as CI does)"
)


# --------------------------------------------------------------------------------------------
# The table of contents
# --------------------------------------------------------------------------------------------

def _docname(entry: str) -> str:
    return re.sub(r"\.(md|ipynb|rst)$", "", entry)


def toc_docnames(toc_path: Path = REPO / "_toc.yml") -> list[str]:
    """Every page of ``_toc.yml`` in reading order: the root, then each part's chapters and sections."""
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8"))
    names = [_docname(toc["root"])]

    def walk(entries) -> None:
        for entry in entries or []:
            if "file" in entry:
                names.append(_docname(entry["file"]))
            elif "glob" in entry:
                raise ValueError(f"_toc.yml: glob entries are not supported by the browser tests: {entry}")
            walk(entry.get("sections"))
            for part in entry.get("parts") or []:
                walk(part.get("chapters"))

    for part in toc.get("parts") or []:
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    walk(toc.get("sections"))
    return names


def source_of(docname: str) -> Path:
    for suffix in (".ipynb", ".md"):
        path = REPO / f"{docname}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"_toc.yml lists {docname!r} but neither {docname}.ipynb nor {docname}.md exists")


def markdown_of(docname: str) -> str:
    """The page's markdown: the .md file, or the markdown cells of the notebook."""
    path = source_of(docname)
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8")
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return "\n\n".join(
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in notebook["cells"]
        if cell["cell_type"] == "markdown"
    )


def page_file(docname: str) -> Path:
    return HTML / f"{docname}.html"


DOCNAMES = toc_docnames()
#: The pages that are notebooks: the chapters, in reading order.
NOTEBOOKS = [name for name in DOCNAMES if source_of(name).suffix == ".ipynb"]


def fail_if(problems, message: str) -> None:
    """Fail with ``message`` and every problem on a line of its own, each once, in the order seen."""
    if problems:
        pytest.fail(message + "\n  " + "\n  ".join(dict.fromkeys(problems)), pytrace=False)


# --------------------------------------------------------------------------------------------
# The API page
# --------------------------------------------------------------------------------------------

API_PAGE = REPO / "book" / "api.md"
AUTODOC = re.compile(r"^\s*\.\. auto(class|function|data|exception|attribute|module)::\s*(\S+)", re.MULTILINE)


def documented_targets() -> set[str]:
    """The dotted names that the API page's autodoc directives document."""
    return {target for _, target in AUTODOC.findall(API_PAGE.read_text(encoding="utf-8"))}


def accepted_targets(name: str) -> set[str]:
    """Where a public name may be documented: ``mha_course.NAME``, or under the submodule that defines it."""
    import mha_course

    obj = getattr(mha_course, name)
    targets = {f"mha_course.{name}"}
    for module_info in pkgutil.iter_modules(mha_course.__path__):
        module = importlib.import_module(f"mha_course.{module_info.name}")
        if getattr(module, name, None) is obj:
            targets.add(f"{module.__name__}.{name}")
    return targets


# --------------------------------------------------------------------------------------------
# Opening a page
# --------------------------------------------------------------------------------------------

def open_page(page, url: str) -> None:
    """Go to ``url`` and wait until it is fully rendered: MathJax typeset, fonts and images loaded."""
    page.goto(url, wait_until="load")
    page.evaluate(WAIT_UNTIL_RENDERED)


# MathJax is deferred, so by the load event it has started; its startup promise resolves after the
# first typeset. Lazy images are made eager so that every image is fetched, not only those on screen.
WAIT_UNTIL_RENDERED = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  for (const img of document.images) { img.loading = "eager"; }
  await Promise.all([...document.images].map((img) => img.complete ? null :
    new Promise((resolve) => { img.addEventListener("load", resolve); img.addEventListener("error", resolve); })));
  await document.fonts.ready;
}"""


# --------------------------------------------------------------------------------------------
# Screenshots
# --------------------------------------------------------------------------------------------

def where_screenshot_shows_title(png: bytes, heading: dict, search_px: int = 150) -> int | None:
    """Where a screenshot shows the page's title: its leftmost dark pixel, in the title's rows.

    ``heading`` is where the page lays the title out (``left``, ``top``, ``bottom``, in pixels
    from the page's top left corner). The search runs from 40 px left of it to ``search_px`` right.

    A screenshot shifted sideways shows the title elsewhere: a dark pixel at the window's left
    edge (shifted left) or further right, or none at all.
    """
    top, bottom = heading["top"] + 2, heading["bottom"] - 2
    image = top_rows(png, bottom + 1).convert("L")
    # From a little left of the title (the sidebar's own text may share its rows further left).
    left, right = max(heading["left"] - 40, 0), min(heading["left"] + search_px, image.width)
    band = image.crop((left, top, right, bottom))
    columns = band.width
    pixels = band.load()
    for x in range(columns):
        if any(pixels[x, y] < 110 for y in range(band.height)):
            return left + x
    return None


def top_rows(png: bytes, rows: int):
    """The first ``rows`` rows of a PNG as a PIL image, without decoding the rest.

    A full-page screenshot is tens of megapixels; the title is near the top. PNG rows are stored
    one after another in one zlib stream, each filtered against the row above only, so the first
    rows decompress on their own and re-encode as a small PNG of their own.
    """
    import io
    import struct
    import zlib

    from PIL import Image

    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, header, compressed = 8, b"", []
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        body = png[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            compressed.append(body)
        elif kind == b"IEND":
            break
        position += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    assert depth == 8 and interlace == 0, "expected an 8-bit, non-interlaced PNG"
    rows = min(rows, height)
    raw = zlib.decompressobj().decompress(b"".join(compressed), rows * (1 + width * channels))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    small = (png[:8] + chunk(b"IHDR", struct.pack(">IIBBBBB", width, rows, 8, colour, 0, 0, 0))
             + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b""))
    return Image.open(io.BytesIO(small))
