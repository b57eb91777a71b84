"""Keep the built pages free of script errors that the toolchain would otherwise put in them.

Sphinx 7.4 writes every inline ``<script>`` that an extension registers after the builder starts
twice: ``app.add_js_file`` stores it in the builder with ``filename=None`` and, just before
writing, the builder re-adds it from the registry with ``filename=''``; the two compare unequal,
so both are written. For ``sphinx-thebe``'s configuration (``const THEBE_JS_URL = ...``) the
second copy is a ``SyntaxError`` in the console of every page. This extension drops the builder's
copy of each such script before the pages are written, so the registry's copy is the only one.

An incremental build rewrites only the pages whose sources changed, so adding, removing or moving
a chapter in ``_toc.yml`` left its neighbours with stale "previous" and "next" links. This
extension remembers every page's neighbours and also rewrites the pages whose neighbours changed.

Sphinx copies the static files (``html_static_path``, e.g. ``book/_static/book.css``) only when
some page is rewritten, so an edit to a stylesheet alone never reached the built book. This
extension rewrites every page when a static file differs from its copy in the build.

The search page shows a summary under each result by fetching the result's page, which browsers
refuse on ``file://`` pages (an error per result). Opened from disk, the search page lists the
results without summaries; served over HTTP it keeps them.
"""

from __future__ import annotations

import filecmp
from pathlib import Path


def _drop_duplicate_inline_scripts(app, env) -> None:
    builder = app.builder
    scripts = getattr(builder, "_js_files", None)
    if scripts is None:
        return
    registered_inline = [
        (attributes.get("priority", 500), {k: v for k, v in attributes.items() if k != "priority"})
        for filename, attributes in app.registry.js_files
        if not filename
    ]

    def readded_from_registry(script) -> bool:
        return script.filename is None and (script.priority, dict(script.attributes)) in registered_inline

    scripts[:] = [script for script in scripts if not readded_from_registry(script)]


def _pages_with_new_neighbours(app, env) -> list[str]:
    relations = {name: list(links) for name, links in env.collect_relations().items()}  # parent, prev, next
    before = getattr(env, "_book_relations", None)
    env._book_relations = relations  # pickled with the environment, for the next build
    if before is None:
        return []
    return sorted(name for name, links in relations.items() if before.get(name) != links and name in env.all_docs)


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


# Runs on the search page after documentation_options.js defines DOCUMENTATION_OPTIONS.
_NO_SUMMARIES_FROM_DISK = (
    'if (location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") '
    "{ DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false; }"
)


def _search_page_from_disk(app, pagename, templatename, context, doctree) -> None:
    if pagename == "search" and app.builder.format == "html":
        app.builder.add_js_file("", body=_NO_SUMMARIES_FROM_DISK)


def setup(app):
    # env-updated runs after every extension has registered its scripts and before pages are written.
    app.connect("env-updated", _drop_duplicate_inline_scripts)
    app.connect("env-get-outdated", _pages_if_static_files_changed)
    app.connect("env-get-updated", _pages_with_new_neighbours)
    app.connect("html-page-context", _search_page_from_disk)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
