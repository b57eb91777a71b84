"""The exercise registry: every ``chapterN`` module's exercises, found by the module's name, in the
order of the book, and an id given twice refused with a message that says where."""

from __future__ import annotations

import pytest

import mha_course.exercises as exercises


def test_the_registry_gathers_every_chapter_module_in_the_order_of_the_book():
    modules = exercises.chapter_modules()
    assert modules == sorted(modules, key=lambda name: int(name.rpartition("chapter")[2]))
    assert modules[:6] == [f"mha_course.exercises.chapter{n}" for n in range(1, 7)]
    chapters = [exercise.chapter for exercise in exercises.EXERCISES.values()]
    assert chapters == sorted(chapters) and set(chapters) >= set(range(1, 7))


def test_an_id_given_twice_is_refused_with_where_it_is(monkeypatch):
    monkeypatch.setattr(exercises, "chapter_modules", lambda: ["mha_course.exercises.chapter1"] * 2)
    with pytest.raises(ValueError, match=r"two exercises have the id '1\.1' \(in mha_course\.exercises\.chapter1 and "
                                         r"mha_course\.exercises\.chapter1\): give each its own\."):
        exercises._registry()
