"""Work-around: an incremental build leaves stale "previous" and "next" links when ``_toc.yml`` changes.

Upstream: sphinx-doc/sphinx#5506 (https://github.com/sphinx-doc/sphinx/issues/5506), open: a
change to the table of contents rewrites only the pages whose sources changed, so adding,
removing or moving a chapter left its neighbours linking to the old order. Delete this extension
(and its line in ``_config.yml``) once Sphinx rewrites the pages whose neighbours moved.

This remembers every page's neighbours in the build environment and, on the next build, also
rewrites the pages whose neighbours changed, and every page when a page was added or removed (each
page's sidebar lists them all).
"""

from __future__ import annotations


def _pages_with_new_neighbours(app, env) -> list[str]:
    relations = {name: list(links) for name, links in env.collect_relations().items()}  # parent, prev, next
    before = getattr(env, "_book_relations", None)
    env._book_relations = relations  # pickled with the environment, for the next build
    if before is None:
        return []
    if set(before) != set(relations):  # a page added or removed: every page's sidebar lists the pages
        return sorted(name for name in relations if name in env.all_docs)
    return sorted(name for name, links in relations.items() if before.get(name) != links and name in env.all_docs)


def setup(app):
    app.connect("env-get-updated", _pages_with_new_neighbours)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
