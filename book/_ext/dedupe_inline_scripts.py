"""Work-around: Sphinx 7.4 writes each inline script an extension registers twice.

Upstream: sphinx-doc/sphinx#13402 (https://github.com/sphinx-doc/sphinx/pull/13402), fixed in
Sphinx 8.2. Delete this extension (and its line in ``_config.yml``) once the book builds with a
Sphinx that has the fix; jupyter-book 1.0.4 pins Sphinx 7.4.

``app.add_js_file`` stores an inline script in the builder with ``filename=None`` and, just
before writing, the builder re-adds it from the registry with ``filename=''``; the two compare
unequal, so both are written. For ``sphinx-thebe``'s configuration (``const THEBE_JS_URL = ...``)
the second copy is a ``SyntaxError`` in the console of every page. This drops the builder's copy
of each such script before the pages are written, so the registry's copy is the only one.
"""

from __future__ import annotations


def _drop_duplicate_inline_scripts(app, env) -> None:
    scripts = getattr(app.builder, "_js_files", None)
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


def setup(app):
    # env-updated runs after every extension has registered its scripts and before pages are written.
    app.connect("env-updated", _drop_duplicate_inline_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
