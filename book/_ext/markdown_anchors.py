"""Markdown links to glossary terms and cited works: ``[mask](glossary.md#term-causal-mask)``.

The chapters link words to the glossary and citations to the References page with plain Markdown
links, which Jupyter renders as links too (a ``{term}`` or ``{cite}`` role shows there as raw
text). MyST resolves ``page.md#anchor`` only when the anchor is a heading of that page, and warns
otherwise. This extension adds two more kinds of anchor a page may be linked at: a glossary term's
(``term-`` and the term, as Sphinx names it) and a cited work's entry in a bibliography
(``cite-`` and its BibTeX key, ``bibtex_cite_id`` in ``_config.yml``). A link to an anchor that is
not there still fails the build under ``-n``.
"""

from __future__ import annotations

from docutils import nodes

PREFIXES = ("term-", "cite-")


def add_anchors(app, doctree: nodes.document) -> None:
    env = app.env
    slugs = env.metadata[env.docname].setdefault("myst_slugs", {})
    for anchor, node in doctree.ids.items():
        if anchor.startswith(PREFIXES) and anchor not in slugs:
            slugs[anchor] = (node.line or 0, anchor, node.astext() or anchor)


def setup(app):
    app.connect("doctree-read", add_anchors)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
