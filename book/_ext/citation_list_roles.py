"""Give the References page's list of works the ARIA roles a screen reader expects.

Docutils' HTML writer (0.21) wraps the bibliography in ``<div role="list" class="citation-list">``
and marks each work ``role="doc-biblioentry"``. DPUB-ARIA 1.1 deprecated that role
(w3c/dpub-aria#22): a ``list`` must own ``listitem`` elements, so axe-core reports the list as
broken (``aria-required-children``, critical) and the role as deprecated. This rewrites the role
of each work to ``listitem`` in the HTML of every page, which is what DPUB-ARIA advises instead.

Delete this extension (and its line in ``_config.yml``) when docutils writes ``listitem`` itself:
``tests/browser/test_readable.py`` runs axe-core on the References page and fails if the role
comes back.
"""

from __future__ import annotations

import re

# A citation's opening tag, as docutils writes it: <div class="citation" id="..." role="doc-biblioentry">
_ENTRY_ROLE = re.compile(r'(<div class="citation"[^>]*?) role="doc-biblioentry"')


def listitem_roles(body: str) -> str:
    """``body`` with every bibliography entry's ``doc-biblioentry`` role replaced by ``listitem``.

    Example:
        >>> listitem_roles('<div role="list" class="citation-list">'
        ...                '<div class="citation" id="id8" role="doc-biblioentry">...</div></div>')
        '<div role="list" class="citation-list"><div class="citation" id="id8" role="listitem">...</div></div>'
    """
    return _ENTRY_ROLE.sub(r'\1 role="listitem"', body)


def _rewrite(app, pagename, templatename, context, doctree) -> None:
    if "body" in context and "doc-biblioentry" in context["body"]:
        context["body"] = listitem_roles(context["body"])


def setup(app):
    app.connect("html-page-context", _rewrite)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
