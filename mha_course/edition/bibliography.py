r"""The book's bibliography as the chapters cite it: the works of a BibTeX file, read by pybtex, and
the one author-year rule.

The book (its References list, through ``book/_ext/author_year_labels.py``) and the student
edition's Markdown (its citations, :mod:`mha_course.edition.jupyter_markdown`) both name a work by
:func:`author_year`: "Shazeer, 2019", "Michel and Levy, 2019", "Vaswani et al., 2017".

Example:
    >>> works = read_bib("@book{r24, author = {Raschka, Sebastian}, year = 2024}\n"
    ...                  "@misc{a23, author = {Ainslie, J. and Lebr{\\'o}n, F. and de Jong, M.},"
    ...                  " title = {{GQA}}, year = {2023}}")
    >>> works["r24"].authors(), works["r24"].year, works["a23"].surnames
    ('Raschka', '2024', ['Ainslie', 'Lebrón', 'de Jong'])
    >>> author_year(works["a23"].surnames, works["a23"].year)
    'Ainslie et al., 2023'
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cache

from pybtex.database import parse_string
from pybtex.plugin import find_plugin
from pybtex.richtext import Text


def author_year(surnames: list[str], year: str) -> str:
    """How the book names a work by ``surnames`` (in order) published in ``year``.

    Example:
        >>> author_year(["Shazeer"], "2019")
        'Shazeer, 2019'
        >>> author_year(["Michel", "Levy"], "2019")
        'Michel and Levy, 2019'
        >>> author_year(["Vaswani", "Shazeer", "Parmar"], "2017")
        'Vaswani et al., 2017'
        >>> author_year(["Vaswani", "Shazeer", "Parmar"], "")
        'Vaswani et al.'
    """
    if not surnames:
        names = "Anonymous"
    elif len(surnames) == 1:
        names = surnames[0]
    elif len(surnames) == 2:
        names = f"{surnames[0]} and {surnames[1]}"
    else:
        names = f"{surnames[0]} et al."
    return f"{names}, {year}" if year else names


@cache
def _plain_text():
    """pybtex's plain-text backend, found once: ``render_as("text")`` searches the installed packages'
    entry points on every call (about a hundredth of a second each, hundreds of calls per edition)."""
    return find_plugin("pybtex.backends", "text")()


def _as_text(latex: str) -> str:
    return Text.from_latex(latex).render(_plain_text())


def surnames(entry) -> list[str]:
    """The surnames of a pybtex entry's authors (else its editors), as plain Unicode: ``de Jong``,
    ``Lebrón`` (TeX accents applied, protecting braces dropped)."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    return [_as_text(" ".join(person.prelast_names + person.last_names)) for person in people]


def unique(labels: list[str]) -> list[str]:
    """``labels`` with a letter after the year wherever two works would share one.

    Example:
        >>> unique(["Shazeer, 2019", "Michel et al., 2019", "Shazeer, 2019"])
        ['Shazeer, 2019a', 'Michel et al., 2019', 'Shazeer, 2019b']
    """
    counts = Counter(labels)
    seen: Counter = Counter()
    result = []
    for label in labels:
        if counts[label] > 1:
            result.append(label + "abcdefghijklmnopqrstuvwxyz"[seen[label]])
            seen[label] += 1
        else:
            result.append(label)
    return result


def in_order(entries) -> list:
    """pybtex entries in the References list's order: by author, year and title (pybtex's own sort)."""
    return find_plugin("pybtex.style.sorting", "author_year_title")().sort(list(entries))


@dataclass
class Work:
    """A cited work, as far as a citation in the text names it: its authors' surnames and its year."""

    surnames: list[str]
    year: str

    def authors(self) -> str:
        """``Raschka``, ``Michel and Levy``, ``Vaswani et al.``"""
        return author_year(self.surnames, "")


def read_bib(text: str) -> dict[str, Work]:
    """The works of a BibTeX file's ``text``, by key (pybtex reads it).

    A work's year is the one its References label shows: "2024a" and "2024b" where one author has
    two works of 2024 (:func:`unique`, in the list's order).
    """
    entries = in_order(parse_string(text, "bibtex").entries.values())
    works = [Work(surnames(e), _as_text(e.fields.get("year", "n.d."))) for e in entries]
    labels = unique([author_year(w.surnames, w.year) for w in works])
    for work, label in zip(works, labels):
        work.year += label.removeprefix(author_year(work.surnames, work.year))
    return {entry.key: work for entry, work in zip(entries, works)}


__all__ = ["author_year", "surnames", "unique", "in_order", "Work", "read_bib"]
