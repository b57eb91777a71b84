"""No notebook can change another notebook's grade, nor what later gradings use.

Each attack of tests/notebooks/ is graded before two victims, in one run of the grade command:
raises.ipynb (one answer right, one wrong, one not done: a forged record or a judge that passes
everything would show) and a notebook whose right answer imports a small library, ``course_helper``,
inside the answer, as chapter 8's answers import transformers. The victims must get, in that run and
in a later one, exactly the grade they get alone. The attacks:

* daemon_outlives_its_kernel: two daemons that leave the kernel's session (one starts again with an
  empty environment) and kill every kernel and answer process after it;
* plants_bytecode: an unchecked-hash ``.pyc`` of the checks' framework, whose judge passes everything,
  planted in every ``__pycache__`` it can reach (the installed package: a copy made here);
* edits_a_library: rewrites ``course_helper`` (installed in a folder made here) to return a wrong mask;
* forges_frames: writes forged records into every file descriptor of the answer processes (and the
  grader) it can open through ``/proc``, graded beside a victim (``--jobs 2``) so that the victim's
  answer process runs while it tries: it keeps at it until the victim is graded (the test then makes
  the file it waits for), or for four minutes at most.

Everything runs on copies under ``tmp_path``: the attacks are told the test's folders (and a marker
that keeps them to the test's own processes), never the repository's or the virtual environment's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from conftest import POSIX_GRADING
from mha_course.grading.confinement import landlock_version

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = Path(__file__).parent / "notebooks"

#: The attacks are refused by Landlock (writes; TCP connections from version 4, signals from 6);
#: elsewhere the grader runs unconfined and says so.
CONFINED = pytest.mark.skipif(landlock_version() < 1, reason="the grader confines notebooks with Landlock (Linux 5.13)")

HELPER = "import torch\n\n\ndef future_mask(n, device=None):\n    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)\n"
USES_A_LIBRARY = [
    "from mha_course import check",
    "def build_causal_mask(num_tokens, device=None):\n    from course_helper import future_mask\n"
    "    return future_mask(num_tokens, device)",
    'check("1.1", build_causal_mask)',
]
VICTIMS = ["raises.ipynb", "01_uses_a_library.ipynb"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("isolation")
    shutil.copytree(ROOT / "mha_course", folder / "installed" / "mha_course",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "site" / "course_helper").mkdir(parents=True)
    (folder / "site" / "course_helper" / "__init__.py").write_text(HELPER, encoding="utf-8")
    notebooks = folder / "notebooks"
    notebooks.mkdir()
    for name in ["raises.ipynb", "daemon_outlives_its_kernel.ipynb", "plants_bytecode.ipynb",
                 "edits_a_library.ipynb", "forges_frames.ipynb"]:
        shutil.copy(NOTEBOOKS / name, notebooks / name)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in USES_A_LIBRARY]),
                   notebooks / "01_uses_a_library.ipynb")
    marker = f"isolation-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder / "installed"), str(folder / "site")]),
           "PYTHONDONTWRITEBYTECODE": "1", "MHA_COURSE_CHECK_SEED": "1234", "MHA_COURSE_TEST_MARKER": marker,
           "MHA_COURSE_TEST_TARGETS": str(folder / "installed")}
    return folder, notebooks, env, marker


def grade(folder: Path, notebooks: list[Path], env: dict[str, str], name: str, *options: str,
          stop: Path | None = None) -> dict[str, dict]:
    """Run the grade command; each notebook's grade: its exercises' (id, status, checks, line) and events.
    ``stop``: a file made as soon as the first notebook is graded (its progress line says 1/N)."""
    out, errors = folder / f"{name}.json", folder / f"{name}.stderr"
    with errors.open("w", encoding="utf-8") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "mha_course", "grade", *map(str, notebooks), "--json",
                                    str(out), "--timeout", "600", "--cell-timeout", "300", "--check-timeout", "120",
                                    *options], cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 1800
            while stop and not stop.exists() and process.poll() is None and time.monotonic() < deadline:
                if f"1/{len(notebooks)}" in errors.read_text(encoding="utf-8", errors="replace"):
                    stop.touch()
                time.sleep(0.2)
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode in (0, 1), errors.read_text(encoding="utf-8")  # 1: not every exercise passed
    reports = json.loads(out.read_text(encoding="utf-8"))["notebooks"]
    return {Path(r["notebook"]).name: {"exercises": [(e["id"], e["status"], e["checks_passed"], e["line"])
                                                     for e in r["exercises"]], "events": r["events"]}
            for r in reports}


@pytest.fixture(scope="module")
def alone(setup):
    """The victims' grades, graded on their own (one run for both tests, before either's attacks)."""
    folder, notebooks, env, _ = setup
    grades = grade(folder, [notebooks / name for name in VICTIMS], env, "alone")
    assert [status for _, status, _, _ in grades["raises.ipynb"]["exercises"]] == ["passed", "failed",
                                                                                   "not implemented"]
    assert [status for _, status, _, _ in grades["01_uses_a_library.ipynb"]["exercises"]][0] == "passed"
    return grades


def marked_processes(marker: str) -> list[int]:
    """The processes still running whose command line holds ``marker`` (the daemons carry it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@POSIX_GRADING
@CONFINED
def test_no_attack_changes_a_later_notebooks_grade_in_the_same_run_or_a_later_one(setup, alone):
    folder, notebooks, env, marker = setup
    victims = [notebooks / name for name in VICTIMS]
    attacks = [notebooks / name for name in ["daemon_outlives_its_kernel.ipynb", "plants_bytecode.ipynb",
                                             "edits_a_library.ipynb"]]
    attacked = grade(folder, [*attacks, *victims], env, "attacked")
    for name in VICTIMS:
        assert attacked[name] == alone[name], name
    # The attacks failed: nothing they started runs on, nothing they wrote is left.
    assert marked_processes(marker) == []
    assert (folder / "site" / "course_helper" / "__init__.py").read_text(encoding="utf-8") == HELPER
    assert not list((folder / "installed").rglob("__pycache__"))
    later = grade(folder, victims, env, "later")
    assert later == alone


@POSIX_GRADING
@CONFINED
def test_frames_forged_through_proc_reach_no_answer_process(setup, alone):
    folder, notebooks, env, marker = setup
    victim = notebooks / "raises.ipynb"
    # The forgery goes on until the victim is graded (or for 240 s at most): the victim's answer
    # processes all run while it tries.
    stop = folder / "forged-enough"
    beside = grade(folder, [notebooks / "forges_frames.ipynb", victim],
                   {**env, "MHA_COURSE_TEST_FORGE_SECONDS": "240", "MHA_COURSE_TEST_FORGE_STOP": str(stop)},
                   "frames", "--jobs", "2", stop=stop)
    assert beside["raises.ipynb"] == alone["raises.ipynb"]
    assert marked_processes(marker) == []


#: What the grader never reaches for: CPython's and torch's private internals, and the interpreter's
#: hooks into other code (the grader owns its answer process: it needs none of them).
FORBIDDEN = ["sys._getframe", "_bootstrap_inner", "torch._C", "torch._ops", "sys._current_frames", "gc.get_objects",
             "gc.get_referrers", "gc.get_referents", "__closure__", "f_back", "f_globals", "sys.setprofile",
             "sys.settrace", "sys.addaudithook", "threading.setprofile", "co_code", "_thread"]


def test_the_grader_reads_no_private_internals():
    found = [(path.name, name) for path in sorted((ROOT / "mha_course" / "grading").glob("*.py"))
             for name in FORBIDDEN if name in path.read_text(encoding="utf-8")]
    assert found == []


def test_an_answer_whose_import_cell_ran_out_of_time_is_timed_out_not_failed():
    """On a slow machine the cell importing torch may run past its limit: the answer that reads
    torch then raises NameError in the grader, and the verdict says what happened, not "failed"."""
    from types import SimpleNamespace

    from mha_course.exercises import EXERCISES
    from mha_course.exercises.framework import probe
    from mha_course.grading.answer_process import RECORD
    from mha_course.grading.answer_probing import to_message
    from mha_course.grading.report import verdict

    namespace: dict = {}
    exec("def head_shapes(batch, num_tokens, d_in, d_out, context_length):\n    return torch.Size([batch])",
         namespace)
    record = to_message(probe(EXERCISES["1.3"], namespace["head_shapes"], seed=5))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch"),
                                               nbformat.v4.new_code_cell("def head_shapes(...): ...")])
    run = SimpleNamespace(ran={1}, timed_out={0}, not_run={0: "cell 1 (`import torch`) timed out after 20 s"},
                          name=lambda i: f"cell {i + 1} (`{notebook.cells[i].source}`)")
    score = verdict("1.3", (RECORD, record), run, {0: {"torch"}, 1: {"head_shapes"}}, 30.0)
    assert score.status == "timed out", score.line
    assert score.line == ("✗ 1.3: timed out: cell 1 (`import torch`) timed out after 20 s; head_shapes reads torch, "
                          "which is defined in cell 1 (`import torch`), which did not run to its end")
    ran = SimpleNamespace(ran={0, 1}, timed_out=set(), not_run={}, name=run.name)  # torch was simply never imported
    assert verdict("1.3", (RECORD, record), ran, {0: set(), 1: {"head_shapes"}}, 30.0).status == "failed"


CONFINED_CHILD = """
import os, socket, sys
from pathlib import Path
from mha_course.grading.confinement import confine
confine([Path(sys.argv[1])])
(Path(sys.argv[1]) / "mine").write_text("allowed")
for name, attempt in [("write", lambda: Path(sys.argv[2]).write_text("refused")),
                      ("connect", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=30)),
                      ("signal", lambda: os.kill(int(sys.argv[4]), 0))]:
    try:
        attempt()
        print(name, "allowed")
    except OSError as error:
        print(name, "refused", type(error).__name__)
"""


@POSIX_GRADING
@CONFINED
def test_a_confined_process_writes_only_in_its_folder_connects_nowhere_and_signals_nothing_outside(tmp_path):
    import socket

    (tmp_path / "own").mkdir()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", CONFINED_CHILD, str(tmp_path / "own"), str(tmp_path / "outside"),
                              str(port), str(os.getpid())], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    version = landlock_version()
    assert out.stdout.splitlines() == ["write refused PermissionError",
                                       f"connect {'refused PermissionError' if version >= 4 else 'allowed'}",
                                       f"signal {'refused PermissionError' if version >= 6 else 'allowed'}"]
    assert (tmp_path / "own" / "mine").read_text(encoding="utf-8") == "allowed" and not (tmp_path / "outside").exists()


@POSIX_GRADING
def test_grading_refuses_to_start_over_compiled_code_planted_in_the_package(tmp_path):
    """Where nothing confined an earlier notebook, compiled code it planted in the installed package
    would grade every later run: the grader names the file and stops before grading anything."""
    import importlib.util
    import py_compile

    shutil.copytree(ROOT / "mha_course", tmp_path / "installed" / "mha_course",
                    ignore=shutil.ignore_patterns("__pycache__"))
    framework = tmp_path / "installed" / "mha_course" / "exercises" / "framework.py"
    forged = tmp_path / "framework.py"
    forged.write_text(framework.read_text(encoding="utf-8") + "\nFORGED = True\n", encoding="utf-8")
    py_compile.compile(str(forged), cfile=importlib.util.cache_from_source(str(framework)), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "installed"), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-m", "mha_course", "grade", str(NOTEBOOKS / "raises.ipynb")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and out.stdout == ""
    assert "error: the package's compiled files exercises/__pycache__/framework." in out.stderr, out.stderr
    assert "Delete the package's __pycache__ folders" in out.stderr
