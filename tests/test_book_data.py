"""The package's copy of the book's stored results (mha_course/book_data/) is the book's data/ folder's JSON, byte
for byte, so that a chapter run without its data/ folder reads the same numbers (book/data is the source)."""

from __future__ import annotations

from pathlib import Path

from mha_course import bench
from mha_course.notebook_files import PACKAGED_DATA, find_data

ROOT = Path(__file__).resolve().parents[1]
BOOK_DATA = ROOT / "book" / "data"
PACKAGE_DATA = ROOT / "mha_course" / PACKAGED_DATA


def test_the_package_holds_every_json_file_of_the_book_data_folder_unchanged():
    book = {p.name: p.read_bytes() for p in BOOK_DATA.glob("*.json")}
    packaged = {p.name: p.read_bytes() for p in PACKAGE_DATA.glob("*.json")}
    stale = sorted(name for name in book.keys() | packaged.keys() if book.get(name) != packaged.get(name))
    assert not stale, (f"mha_course/{PACKAGED_DATA}/ differs from book/data/ in {stale}: copy the book's files over "
                       f"(cp book/data/*.json mha_course/{PACKAGED_DATA}/) and delete those the book no longer has")


def test_a_path_under_data_is_read_from_the_package_where_there_is_no_data_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_data("data/bench-cpu.json") == PACKAGE_DATA / "bench-cpu.json"
    assert bench.load_results("data/bench-cpu.json") == bench.load_results(BOOK_DATA / "bench-cpu.json")
    # A data/ folder beside the notebook comes first; other paths are left as they are.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bench-cpu.json").write_text("{}", encoding="utf-8")
    assert find_data("data/bench-cpu.json") == Path("data/bench-cpu.json")
    assert find_data("data/not-stored.json") == Path("data/not-stored.json")
    assert find_data("elsewhere/bench-cpu.json") == Path("elsewhere/bench-cpu.json")
