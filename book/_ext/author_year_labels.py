"""Label the References list the way the text cites: "Vaswani et al., 2017", not "[VSP+17]".

With ``bibtex_reference_style: author_year`` the chapters cite "Vaswani et al. (2017)", but the
bibliography style still labels each work with pybtex's alpha key ("VSP+17", "ALTdJ+23"), so a
reader who follows a citation lands on a label that matches nothing on the page they came from.
This registers a pybtex label style that writes the same author-and-year text as the citations,
and a formatting style (pybtex's ``alpha``, which sorts by author, year and title) that uses it;
``_config.yml`` makes that style the default (``bibtex_default_style``).

Labels follow the citation rule: one author "Shazeer, 2019", two "Michel and Levy, 2019",
three or more "Vaswani et al., 2017"; works that would share a label get "a", "b", ... after
the year.
"""

from __future__ import annotations

from pybtex.plugin import register_plugin
from pybtex.style.formatting.alpha import Style as AlphaStyle
from pybtex.style.labels import BaseLabelStyle

# The one author-year rule, shared with the student edition's citations.
from mha_course.edition.bibliography import author_year, surnames, unique

LABEL_STYLE = "course_author_year"
FORMAT_STYLE = "course_author_year"


class AuthorYearLabels(BaseLabelStyle):
    """pybtex label style: "Vaswani et al., 2017", as the chapters cite the work."""

    def format_labels(self, sorted_entries):
        labels = [author_year(surnames(e), e.fields.get("year", "")) for e in sorted_entries]
        yield from unique(labels)


class AuthorYearStyle(AlphaStyle):
    """pybtex's alpha style (sorted by author, year, title) with author-and-year labels."""

    default_label_style = LABEL_STYLE


def setup(app):
    register_plugin("pybtex.style.labels", LABEL_STYLE, AuthorYearLabels)
    register_plugin("pybtex.style.formatting", FORMAT_STYLE, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
