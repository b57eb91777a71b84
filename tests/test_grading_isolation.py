"""No notebook can change another notebook's grade, nor what later gradings use (grading's threat model:
the docstring of mha_course.grading).

Each attack of tests/notebooks/ is graded before a victim, in one run of the grade command: raises.ipynb
(one answer right, one wrong, one not done: a forged record or a judge that passes everything would
show) and a notebook whose right answer imports a small library, ``course_helper``, inside the answer,
as chapter 8's answers import transformers. Each victim must get, in that run, exactly the grade it gets
alone. The attacks:

* daemon_outlives_its_kernel: two daemons that leave the kernel's session (one starts again with an
  empty environment) and kill every later kernel and answer process they can see;
* reaches_the_next_kernel: finds the next notebook's kernel, started while it runs, and registers a hook
  there that exits before its first cell; and tries MPTCP and TCP Fast Open on a port this test listens on;
* plants_bytecode: an unchecked-hash ``.pyc`` of the checks' framework, whose judge passes everything,
  planted in every ``__pycache__`` it can reach (the installed package: a copy made here);
* edits_a_library: rewrites ``course_helper`` (installed in a folder made here) to return a wrong mask;
* reads_other_gradings: graded beside another student's submission (``--jobs 2``), reads what it can
  of that student's folder, of the grading's folders and of the grader's command line.

With the sandbox switched off (a switch for these tests only), the daemon and the next-kernel attack do
change the victim's grade: the tests can fail. Everything runs on copies under ``tmp_path``: the attacks
are told the test's folders (and a marker that keeps them to the test's own processes), never the
repository's or the virtual environment's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest

from conftest import POSIX_GRADING, SANDBOXED, all_ended
from mha_course.grading.sandbox import NO_SANDBOX, TEST_SWITCH

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = Path(__file__).parent / "notebooks"

pytestmark = [pytest.mark.kernel, POSIX_GRADING]

HELPER = "import torch\n\n\ndef future_mask(n, device=None):\n    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)\n"
USES_A_LIBRARY = [
    "from mha_course import check",
    "def build_causal_mask(num_tokens, device=None):\n    from course_helper import future_mask\n"
    "    return future_mask(num_tokens, device)",
    'check("1.1", build_causal_mask)',
]
VICTIMS = ["raises.ipynb", "01_uses_a_library.ipynb"]
ATTACKS = ["daemon_outlives_its_kernel.ipynb", "reaches_the_next_kernel.ipynb", "plants_bytecode.ipynb",
           "edits_a_library.ipynb", "reads_other_gradings.ipynb"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("isolation")
    shutil.copytree(ROOT / "mha_course", folder / "installed" / "mha_course",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "site" / "course_helper").mkdir(parents=True)
    (folder / "site" / "course_helper" / "__init__.py").write_text(HELPER, encoding="utf-8")
    notebooks = folder / "notebooks"
    notebooks.mkdir()
    for name in ["raises.ipynb", *ATTACKS]:
        shutil.copy(NOTEBOOKS / name, notebooks / name)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in USES_A_LIBRARY]),
                   notebooks / "01_uses_a_library.ipynb")
    marker = f"isolation-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder / "installed"), str(folder / "site")]),
           "PYTHONDONTWRITEBYTECODE": "1", "MHA_COURSE_CHECK_SEED": "1234", "MHA_COURSE_TEST_MARKER": marker,
           "MHA_COURSE_TEST_TARGETS": str(folder / "installed")}
    env.pop(TEST_SWITCH, None)
    return folder, notebooks, env, marker


def grade(folder: Path, arguments: list[str], env: dict[str, str], name: str) -> tuple[dict[str, dict], str]:
    """Run the grade command; each notebook's grade (its exercises' id, status, checks and line; its events;
    its sandbox), and the command's stderr."""
    out = folder / f"{name}.json"
    process = subprocess.run([sys.executable, "-m", "mha_course", "grade", *arguments, "--json", str(out),
                              "--timeout", "600", "--cell-timeout", "300", "--check-timeout", "120"],
                             cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             timeout=1800)
    assert process.returncode in (0, 1), process.stderr  # 1: not every exercise passed
    reports = json.loads(out.read_text(encoding="utf-8"))["notebooks"]
    return {Path(r["notebook"]).name: {"exercises": [(e["id"], e["status"], e["checks_passed"], e["line"])
                                                     for e in r["exercises"]], "events": r["events"],
                                       "sandbox": r["sandbox"]}
            for r in reports}, process.stderr


@pytest.fixture(scope="module")
def alone(setup):
    """The victims' grades, graded on their own (one run for every test, before any attack)."""
    folder, notebooks, env, _ = setup
    grades, _ = grade(folder, [str(notebooks / name) for name in VICTIMS], env, "alone")
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


def attack_said(grades: dict, attack: str) -> str:
    """What an attack notebook reported finding (the error its last attack cell raised)."""
    return next(event for event in grades[attack]["events"] if "RuntimeError" in event)


@SANDBOXED
def test_no_attack_changes_a_later_notebooks_grade_and_nothing_outlives_the_grading(setup, alone):
    folder, notebooks, env, marker = setup
    attacks = ["daemon_outlives_its_kernel.ipynb", "reaches_the_next_kernel.ipynb", "plants_bytecode.ipynb",
               "edits_a_library.ipynb"]
    with socket.create_server(("127.0.0.1", 0)) as listening:  # a kernel on TCP, as Jupyter's default would be
        listening.settimeout(0.5)
        attacked, _ = grade(folder, [str(notebooks / name) for name in [*attacks, *VICTIMS]],
                            {**env, "MHA_COURSE_TEST_PORT": str(listening.getsockname()[1])}, "attacked")
        with pytest.raises(TimeoutError):
            listening.accept()  # neither MPTCP nor TCP Fast Open reached it
    for name in VICTIMS:
        assert attacked[name] == alone[name], name
    assert attack_said(attacked, "reaches_the_next_kernel.ipynb").endswith("raised RuntimeError: reached nothing")
    assert {r["sandbox"] for r in attacked.values()} == {"bubblewrap"}
    # The attacks failed: nothing they started runs on, nothing they wrote is left.
    assert all_ended(marked_processes(marker), guard=0.5)
    assert (folder / "site" / "course_helper" / "__init__.py").read_text(encoding="utf-8") == HELPER
    assert not list((folder / "installed").rglob("__pycache__"))


@SANDBOXED
def test_a_notebook_graded_beside_another_students_reads_nothing_of_it(setup, alone):
    folder, notebooks, env, _ = setup
    submissions = folder / "submitted"
    for student, name in [("alice", "reads_other_gradings.ipynb"), ("bob", "raises.ipynb")]:
        (submissions / student).mkdir(parents=True)
        shutil.copy(notebooks / name, submissions / student / name)
    beside, _ = grade(folder, ["--submissions", str(submissions), "--jobs", "2"],
                      {**env, "MHA_COURSE_TEST_TARGETS": str(submissions / "bob")}, "beside")
    assert attack_said(beside, "reads_other_gradings.ipynb").endswith(
        "raised RuntimeError: read 0 file(s) of other gradings: none")
    assert beside["raises.ipynb"] == alone["raises.ipynb"]


@pytest.mark.parametrize("attack", ["daemon_outlives_its_kernel.ipynb", "reaches_the_next_kernel.ipynb"])
def test_without_the_sandbox_the_same_attack_changes_the_victims_grade(setup, alone, attack):
    folder, notebooks, env, marker = setup
    try:
        graded, stderr = grade(folder, [str(notebooks / attack), str(notebooks / "raises.ipynb")],
                               {**env, TEST_SWITCH: "1"}, f"unsandboxed-{attack}")
    finally:
        for pid in marked_processes(marker):  # the daemons outlive the grading here: the test ends its own
            os.kill(pid, signal.SIGKILL)
    assert f"note: {NO_SANDBOX}" in stderr and stderr.count(NO_SANDBOX) == 1
    assert {r["sandbox"] for r in graded.values()} == {"none"}
    assert graded["raises.ipynb"]["exercises"] != alone["raises.ipynb"]["exercises"]
    assert graded["raises.ipynb"]["exercises"][0][1] != "passed", graded["raises.ipynb"]  # its right answer lost
