"""Serve MathJax 3 from the built book instead of a CDN, so equations render offline.

MathJax comes from the ``django-static-mathjax`` wheel (a pinned dependency; import name
``mathjax``). Only the parts a page can load are copied into ``_static/mathjax`` after the build
(about 4 MB instead of the whole 43 MB distribution):

* the combined TeX/MathML-to-HTML script and its web fonts;
* the components it loads on demand: TeX extensions (``\\require``, autoloaded macros), the
  right-click menu, the SVG renderer the menu can switch to, and the accessibility components
  (assistive MathML, collapsible math, the explorer that reads equations aloud);
* the speech rule engine's English rules, which the explorer needs.

The speech rules ship as JSON that the engine fetches with ``XMLHttpRequest``, which browsers
refuse on ``file://`` pages, so a book opened straight from disk could not read its equations
aloud. They are therefore also written as small scripts, and ``speech_rules_loader.js`` tells the
engine to load them with ``<script>`` tags, which work from disk and from a server alike.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Paths inside MathJax's es5/ folder that a page may load at run time.
NEEDED = (
    "tex-mml-chtml.js",
    "output/chtml/fonts/woff-v2",
    "input/tex/extensions",
    "ui",
    "a11y",
    "output/svg.js",
    "output/svg/fonts",
)

# Speech rule engine locales to ship: "base" is always loaded, "en" is the book's language.
# Choosing another language in MathJax's menu falls back to English with a console message.
SPEECH_LOCALES = ("base", "en")

MATHJAX_SCRIPT = "mathjax/es5/tex-mml-chtml.js"  # relative to the built site's _static folder
SETUP_SCRIPT = "mathjax_setup.js"
SPEECH_RULES_DIR = "mathjax/es5/sre/mathmaps"


def _mathjax_es5() -> Path:
    import mathjax

    return Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"


def _set_path(app, config) -> None:
    config.mathjax_path = MATHJAX_SCRIPT


def _add_setup_script(app, pagename, templatename, context, doctree) -> None:
    # The same condition sphinx.ext.mathjax uses to put MathJax on a page.
    if app.builder.format != "html":
        return
    if app.registry.html_assets_policy == "always" or app.env.get_domain("math").has_equations(pagename):
        # After Sphinx's inline MathJax configuration (priority 500), which it amends.
        app.builder.add_js_file(f"mathjax/{SETUP_SCRIPT}", priority=510)


def _copy_mathjax(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    source = _mathjax_es5()
    static = Path(app.outdir) / "_static"
    target = static / "mathjax" / "es5"
    for relative in NEEDED:
        src, dst = source / relative, target / relative
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    rules = static / SPEECH_RULES_DIR
    rules.mkdir(parents=True, exist_ok=True)
    for locale in SPEECH_LOCALES:
        text = (source / "sre" / "mathmaps" / f"{locale}.json").read_text(encoding="utf-8")
        json.loads(text)  # fail the build here, not in a reader's browser, if the file is broken
        (rules / f"{locale}.js").write_text(
            f"(window.SpeechRuleMaps = window.SpeechRuleMaps || {{}})[{json.dumps(locale)}] = {json.dumps(text)};\n",
            encoding="utf-8",
        )
    shutil.copy2(Path(__file__).with_name(SETUP_SCRIPT), static / "mathjax" / SETUP_SCRIPT)


def setup(app):
    if not (_mathjax_es5() / NEEDED[0]).is_file():
        raise RuntimeError(
            "MathJax not found: install the pinned requirements (pip install -r requirements.txt), "
            "which include django-static-mathjax."
        )
    app.connect("config-inited", _set_path)
    app.connect("html-page-context", _add_setup_script)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
