"""What a chapter's code cells show in the book: lines that fit the code column, output in order.

The book's styles give a code or output block room for 80 characters at a 1280 px window
(``book/_static/book.css``), so a longer line makes a desktop reader scroll sideways inside the
block. The browser tests measure the blocks on the built pages; these tests read the notebooks
themselves, so that they run without a browser and name the cell to change. They cover every cell
the book shows (``hide-input`` cells too, which a reader opens, and the exercises' solutions) and
every printed line; an output that has an HTML form (a :class:`mha_course.tables.Table`) is shown
as HTML, so its plain text is not held to the column.

The book gathers a cell's printed lines into one block where the first of them stood
(``nb_merge_streams``), so a cell that prints, shows a table or a figure, and prints again would
show its last lines above the table: a cell prints before its tables and figures or after them.
"""

from __future__ import annotations

import json

import pytest

from book_pages import CODE_COLUMN, NOTEBOOKS, source_of


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source


def shown_lines(notebook: dict) -> list[tuple[str, str, str]]:
    """``(cell id, "code" or "output", line)`` for every line of code and output the book shows."""
    lines = []
    for number, cell in enumerate(notebook["cells"], start=1):
        if cell["cell_type"] != "code":
            continue
        tags = set(cell.get("metadata", {}).get("tags", []))
        if "remove-cell" in tags:
            continue
        name = cell.get("id") or f"cell {number}"
        if "remove-input" not in tags:
            lines += [(name, "code", line) for line in _text(cell["source"]).splitlines()]
        if "remove-output" in tags:
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if output["output_type"] == "stream":
                text = _text(output["text"])
            elif output["output_type"] == "error":
                text = "\n".join(output.get("traceback", []))
            elif "text/plain" in data and not {"text/html", "image/png", "image/svg+xml"} & data.keys():
                text = _text(data["text/plain"])
            else:
                continue
            lines += [(name, "output", line) for line in text.splitlines()]
    return lines


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_code_and_printed_lines_fit_the_code_column(docname):
    notebook = json.loads(source_of(docname).read_text(encoding="utf-8"))
    too_long = [f"{cell} ({kind}, {len(line)} characters): {line.strip()[:70]!r}"
                for cell, kind, line in shown_lines(notebook) if len(line) > CODE_COLUMN]
    assert not too_long, (f"{docname}: lines wider than the book's code column ({CODE_COLUMN} characters); "
                          "wrap them:\n  " + "\n  ".join(too_long))


def test_the_check_reads_code_and_printed_output_but_not_hidden_cells_or_html_tables():
    """Guards the test above: what it reads from a notebook, and what it leaves out."""
    long = "x" * 81
    notebook = {"cells": [
        {"cell_type": "markdown", "source": long},
        {"cell_type": "code", "id": "shown", "metadata": {"tags": ["hide-input"]}, "source": [long],
         "outputs": [{"output_type": "stream", "name": "stdout", "text": ["short\n", long]},
                     {"output_type": "execute_result", "data": {"text/plain": long, "text/html": "<table/>"}},
                     {"output_type": "display_data", "data": {"text/plain": [long]}}]},
        {"cell_type": "code", "id": "hidden", "metadata": {"tags": ["remove-cell"]}, "source": long, "outputs": []},
    ]}
    found = [(cell, kind) for cell, kind, line in shown_lines(notebook) if len(line) > CODE_COLUMN]
    assert found == [("shown", "code"), ("shown", "output"), ("shown", "output")]


def _printed_on_both_sides(outputs: list[dict]) -> bool:
    """True when printed output comes both before and after a table or figure."""
    kinds = ["printed" if o["output_type"] == "stream" else "shown"
             for o in outputs if o["output_type"] == "stream" or o.get("data", {}).keys() - {"text/plain"}]
    if "shown" not in kinds:
        return False
    first, last = kinds.index("shown"), len(kinds) - 1 - kinds[::-1].index("shown")
    return "printed" in kinds[:first] and "printed" in kinds[last + 1:]


@pytest.mark.parametrize("docname", NOTEBOOKS)
def test_printed_lines_stay_on_one_side_of_the_tables_and_figures(docname):
    notebook = json.loads(source_of(docname).read_text(encoding="utf-8"))
    mixed = [cell.get("id") or f"cell {number}" for number, cell in enumerate(notebook["cells"], start=1)
             if cell["cell_type"] == "code" and _printed_on_both_sides(cell.get("outputs", []))]
    assert not mixed, (f"{docname}: cells that print before and after a table or figure; the book would "
                       f"show their last printed lines above it (print before or after, not both): {mixed}")


def test_the_order_check_sees_printing_on_both_sides():
    stream = {"output_type": "stream", "name": "stdout", "text": "x\n"}
    table = {"output_type": "display_data", "data": {"text/plain": "t", "text/html": "<table/>"}}
    plain = {"output_type": "execute_result", "data": {"text/plain": "3"}}
    assert _printed_on_both_sides([stream, table, stream])
    assert not _printed_on_both_sides([stream, table, table])
    assert not _printed_on_both_sides([table, stream, stream])
    assert not _printed_on_both_sides([stream, plain, stream])


# --------------------------------------------------------------------------------------------
# Chapter 4 tells one story: one table or figure per question, the rest on the measurements page
# --------------------------------------------------------------------------------------------

#: The most words of prose chapter 4 may hold.
CHAPTER_4_MAX_WORDS = 2200


def prose_words(notebook: dict) -> int:
    """Words of a notebook's Markdown prose, the story the chapter tells: fenced blocks (code), display
    equations, notes (block quotes), figure captions and the exercises (from the heading "## Exercises"
    on) are left out; headings, lists and tables count.

    Example:
        >>> prose_words({"cells": [{"cell_type": "markdown", "source": "Two words\\n\\n$$x = 1$$\\n> **Note.** not me"},
        ...                        {"cell_type": "markdown", "source": "**Figure.** Not me."},
        ...                        {"cell_type": "markdown", "source": "## Exercises\\n\\nNot me."}]})
        2
    """
    import re

    cells = [_text(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"]
    exercises = next((i for i, cell in enumerate(cells) if "## Exercises" in cell.splitlines()), len(cells))
    text = "\n".join(cell for cell in cells[:exercises] if not cell.startswith("**Figure.**"))
    text = re.sub(r"^>.*$", " ", text, flags=re.M)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    return len(text.split())


def test_chapter_4_tells_its_story_in_at_most_2200_words_of_prose():
    notebook = json.loads(source_of("book/04_what_heads_cost").read_text(encoding="utf-8"))
    words = prose_words(notebook)
    assert words <= CHAPTER_4_MAX_WORDS, (
        f"chapter 4 holds {words} words of prose, more than {CHAPTER_4_MAX_WORDS}: move a measurement that does not "
        "answer one of its questions to book/measurements.ipynb, or a side question to a deep dive")
    assert prose_words({"cells": notebook["cells"][:1]}) > 0  # the count reads the chapter's text
