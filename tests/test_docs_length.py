"""The README reads in a few minutes, and no sentence of the course's guides is too long to follow.

The README holds at most ``README_WORDS`` words; no sentence of ``README.md``, ``CONTRIBUTING.md`` or the
book's "Using the course" page holds more than ``SENTENCE_WORDS``. What counts, for Markdown:

- fenced code blocks (```` ``` ```` or ``~~~``), HTML comments and MyST target lines such as ``(setup)=``
  are not prose and are left out; a link counts by its text, not its address;
- a heading, a list item and a table cell each stand alone: they end a sentence whether or not a full
  stop does; a table's separator row holds no words; the other lines run on into one paragraph until a
  blank line;
- inside those, a sentence ends at ``.``, ``!`` or ``?`` followed by white space or the end of the text
  (so ``book/intro.md`` or ``3.11`` does not end one);
- a word is a run of characters between white space that holds a letter or a digit (so ``—`` and ``|``
  are not words, and ```make test``` is two).

The last tests give the counters crafted texts, a sentence one word too long and a README one word too
long among them, to show that the limits can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README_WORDS = 1200
SENTENCE_WORDS = 40
GUIDES = ["README.md", "CONTRIBUTING.md", "book/using_the_course.md"]

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
MYST_TARGET = re.compile(r"^\s*\([\w.-]+\)=\s*$")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
WORD = re.compile(r"[^\W_]")


def prose_blocks(markdown: str) -> list[str]:
    """The text that stands alone, in order: each heading, list item, table cell and paragraph."""
    markdown = re.sub(r"<!--.*?-->", " ", markdown, flags=re.DOTALL)
    blocks: list[str] = []
    current: list[str] = []
    fence = None

    def close() -> None:
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            continue
        if opening:
            close()
            fence = opening.group(1)
        elif not line.strip() or MYST_TARGET.match(line) or TABLE_SEPARATOR.match(line):
            close()
        elif HEADING.match(line):
            close()
            blocks.append(HEADING.sub("", line))
        elif line.lstrip().startswith("|"):
            close()
            blocks.extend(cell for cell in re.split(r"(?<!\\)\|", line.strip()) if cell.strip())
        elif LIST_ITEM.match(line):
            close()
            current.append(LIST_ITEM.sub("", line))
        else:
            current.append(line.strip())
    close()
    return [LINK.sub(r"\1", block) for block in blocks]


def words(text: str) -> list[str]:
    """The words of ``text``: runs between white space that hold a letter or a digit."""
    return [token for token in text.split() if WORD.search(token)]


def sentences(markdown: str) -> list[str]:
    """Every sentence of ``markdown``'s prose that holds a word."""
    return [
        sentence.strip()
        for block in prose_blocks(markdown)
        for sentence in SENTENCE_END.split(block)
        if words(sentence)
    ]


def word_count(markdown: str) -> int:
    return sum(len(words(block)) for block in prose_blocks(markdown))


def long_sentences(markdown: str, limit: int = SENTENCE_WORDS) -> list[str]:
    """The sentences over ``limit`` words, each shown by its length and first words."""
    return [
        f"{len(words(sentence))} words: {' '.join(sentence.split()[:12])} ..."
        for sentence in sentences(markdown)
        if len(words(sentence)) > limit
    ]


def _text(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# The guides as committed
# --------------------------------------------------------------------------------------------

def test_the_readme_reads_in_a_few_minutes():
    count = word_count(_text("README.md"))
    assert count <= README_WORDS, (
        f"README.md holds {count} words, more than {README_WORDS}: move reference detail to CONTRIBUTING.md "
        "or the book's page book/using_the_course.md"
    )


@pytest.mark.parametrize("name", GUIDES)
def test_no_sentence_is_too_long(name):
    too_long = long_sentences(_text(name))
    assert not too_long, f"{name}: sentences over {SENTENCE_WORDS} words (split them):\n  " + "\n  ".join(too_long)


def test_the_using_page_is_in_the_book():
    assert "file: book/using_the_course" in _text("_toc.yml")


# --------------------------------------------------------------------------------------------
# The counters, on crafted texts
# --------------------------------------------------------------------------------------------

def _sentence(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n)) + "."


def test_a_sentence_one_word_too_long_is_caught_and_one_at_the_limit_is_not():
    assert long_sentences(_sentence(SENTENCE_WORDS)) == []
    [caught] = long_sentences("A short one. " + _sentence(SENTENCE_WORDS + 1) + " Another short one.")
    assert caught.startswith(f"{SENTENCE_WORDS + 1} words: w0 w1")


def test_a_readme_one_word_too_long_is_caught():
    at_limit = "\n\n".join(_sentence(20) for _ in range(README_WORDS // 20))
    assert word_count(at_limit) == README_WORDS
    assert word_count(at_limit + " one") == README_WORDS + 1


def test_code_blocks_comments_and_targets_are_not_prose():
    text = f"(setup)=\n# Title\n\n```bash\n{_sentence(50)}\n```\n\n~~~\n{_sentence(50)}\n~~~\n<!-- {_sentence(50)} -->\nEnd."
    assert sentences(text) == ["Title", "End."]
    assert word_count(text) == 2


def test_headings_list_items_and_table_cells_stand_alone():
    half = " ".join(["word"] * 30)
    text = "\n".join([
        f"# {half}", f"- {half}", f"- {half}", f"  {half}.",  # the second item runs on to the next line
        "", "| a | b |", "| --- | ---: |", f"| {half} | {half} |", "", half, half,  # a paragraph of two lines
    ])
    lengths = [len(words(s)) for s in sentences(text)]
    assert lengths == [30, 30, 60, 1, 1, 30, 30, 60]
    assert len(long_sentences(text)) == 2


def test_sentences_end_at_a_stop_followed_by_space_not_inside_a_name_or_number():
    text = "Open `_build/html/book/intro.html` with Python 3.11. Then run it! Does it work? Yes"
    assert sentences(text) == [
        "Open `_build/html/book/intro.html` with Python 3.11.", "Then run it!", "Does it work?", "Yes",
    ]


def test_words_hold_a_letter_or_a_digit_and_links_count_by_their_text():
    assert words("`make test` — runs | every test, 3 times") == ["`make", "test`", "runs", "every", "test,", "3", "times"]
    assert word_count("See [the book's page](https://example.org/a/very/long/address.html).") == 4
