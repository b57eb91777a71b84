"""Work-around: the search page's summaries fail on a book opened from disk.

Upstream: sphinx-doc/sphinx#10407 (https://github.com/sphinx-doc/sphinx/issues/10407), open (see
also sphinx-doc/sphinx#9156): the search page shows a summary under each result by fetching the
result's page, which browsers refuse on ``file://`` pages, with an error per result in the
console. Delete this extension (and its line in ``_config.yml``) once Sphinx skips the summaries
where it cannot fetch them.

Opened from disk, the search page lists the results without summaries; served over HTTP it keeps
them.
"""

from __future__ import annotations

# Runs on the search page after documentation_options.js defines DOCUMENTATION_OPTIONS.
_NO_SUMMARIES_FROM_DISK = (
    'if (location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") '
    "{ DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false; }"
)


def _search_page_from_disk(app, pagename, templatename, context, doctree) -> None:
    if pagename == "search" and app.builder.format == "html":
        app.builder.add_js_file("", body=_NO_SUMMARIES_FROM_DISK)


def setup(app):
    app.connect("html-page-context", _search_page_from_disk)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
