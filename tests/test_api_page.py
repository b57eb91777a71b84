"""The API page (book/api.md) documents every public name of the package, from its docstring.

A name added to ``mha_course.__all__`` fails here until it has a docstring with an example and a
line on the API page; the browser tests then check that the built page shows it.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import mha_course
from book_pages import accepted_targets, documented_targets


@pytest.mark.parametrize("name", mha_course.__all__)
def test_every_public_name_is_on_the_api_page(name):
    if not documented_targets() & accepted_targets(name):
        kind = "class" if inspect.isclass(getattr(mha_course, name)) else (
            "function" if callable(getattr(mha_course, name)) else "data")
        pytest.fail(
            f"mha_course.{name} is public (in __all__) but book/api.md does not document it: add "
            f"'.. auto{kind}:: mha_course.{name}' to the section where it belongs.",
            pytrace=False,
        )


@pytest.mark.parametrize("name", [n for n in mha_course.__all__ if callable(getattr(mha_course, n))])
def test_every_public_class_and_function_has_a_docstring_with_an_example(name):
    doc = inspect.getdoc(getattr(mha_course, name)) or ""
    assert len(doc.split()) >= 5, f"mha_course.{name} needs a docstring: what it does, its arguments and shapes"
    assert ">>>" in doc, f"mha_course.{name}'s docstring needs an example (a doctest under 'Example:')"


def test_the_api_page_documents_only_what_exists():
    for target in documented_targets():
        module_name, _, attribute = target.rpartition(".")
        try:
            module = importlib.import_module(target)
        except ImportError:
            module = importlib.import_module(module_name)
            assert hasattr(module, attribute), f"book/api.md documents {target}, which does not exist"
