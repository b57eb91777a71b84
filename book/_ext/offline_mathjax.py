"""Serve MathJax 3 from the built book instead of a CDN, so equations render offline.

MathJax comes from the ``django-static-mathjax`` wheel (a pinned dependency; import name
``mathjax``). Only the parts a page loads are copied into ``_static/mathjax`` after the build:
the combined TeX/MathML-to-HTML script, its web fonts, and the components it loads on demand
(TeX extensions, the menu, accessibility). The whole distribution would add about 40 MB.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# Paths inside MathJax's es5/ folder that the combined script needs at run time.
NEEDED = (
    "tex-mml-chtml.js",
    "output/chtml/fonts/woff-v2",
    "input/tex/extensions",
    "ui",
    "a11y",
)


def _mathjax_es5() -> Path:
    import mathjax

    return Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"


def _set_path(app, config) -> None:
    # Relative to the built site's _static folder.
    config.mathjax_path = "mathjax/es5/tex-mml-chtml.js"


def _copy_mathjax(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    source = _mathjax_es5()
    target = Path(app.outdir) / "_static" / "mathjax" / "es5"
    for relative in NEEDED:
        src, dst = source / relative, target / relative
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def setup(app):
    if not (_mathjax_es5() / NEEDED[0]).is_file():
        raise RuntimeError(
            "MathJax not found: install the pinned requirements (pip install -r requirements.txt), "
            "which include django-static-mathjax."
        )
    app.connect("config-inited", _set_path)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
