"""Work-around: Sphinx 7.4 copies the static files only when some page is rewritten.

Upstream: sphinx-doc/sphinx#1810 (https://github.com/sphinx-doc/sphinx/issues/1810), fixed by
sphinx-doc/sphinx#13236 in Sphinx 8.2. Delete this extension (and its line in ``_config.yml``)
once the book builds with a Sphinx that has the fix; jupyter-book 1.0.4 pins Sphinx 7.4.

Without it, an edit to a stylesheet alone (``book/_static/book.css``) never reached the built
book. This rewrites every page when a static file differs from its copy in the build, which also
copies the static files again.
"""

from __future__ import annotations

import filecmp
from pathlib import Path


def _pages_if_static_files_changed(app, env, added, changed, removed) -> list[str]:
    if app.builder.format != "html":
        return []
    built = Path(app.outdir) / "_static"
    # The book's own folders are relative; extensions add theirs as absolute paths (and templates).
    for folder in (f for f in app.config.html_static_path if not Path(f).is_absolute()):
        source = Path(app.confdir) / folder
        for path in source.rglob("*") if source.is_dir() else []:
            copy = built / path.relative_to(source)
            if path.is_file() and not (copy.exists() and filecmp.cmp(path, copy, shallow=False)):
                return sorted(env.found_docs)
    return []


def setup(app):
    app.connect("env-get-outdated", _pages_if_static_files_changed)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
