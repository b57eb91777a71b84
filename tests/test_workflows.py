"""The hosted CI workflows (.github/workflows/) and the pre-commit hooks agree with the README and Makefile.

A fork's CI is only worth having if it runs what the README tells a reader to run. These tests read the
workflow files and check that:

- each is YAML with what the checks below read (``on``, ``jobs``, each job's ``runs-on`` and ``steps``
  unless it calls a reusable workflow, each step one ``uses`` or one ``run``); which keys and events GitHub
  accepts is left to its own schema, which the pre-commit hook ``check-github-workflows`` applies;
- every ``run`` step is a README command (``make test``, ``make check``, ``make book``,
  ``make book-student``), a matrix job's naming its Python as the set-up page says
  (``make check PYTHON=python${{ matrix.python }}``), except on Windows, which has no dependable ``make``: there the steps must be
  the Makefile's own recipe lines, with the virtual environment's Windows path;
- every job pins a Python the README states (and ``pyproject.toml`` requires): a job without a matrix
  the oldest, the one the stored outputs come from; a matrix any of them. Every job caches pip's
  downloads keyed on ``requirements.txt``;
- every Python the README states runs the package's tests on Linux, macOS and Windows;
- the publishing job builds both books, assembles the edition the repository variable ``BOOK_EDITION``
  names with ``make pages``, and deploys ``_build/pages`` with the permissions and environment GitHub
  Pages needs; ``make pages`` puts each edition where it belongs.

Each check returns a list of problems, so the last tests can show that a drifted copy of a workflow is
caught. Nothing here runs GitHub: whether the hosted runners accept the files is only known there.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
README = (REPO / "README.md").read_text(encoding="utf-8")
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")

# Which keys, events and values GitHub accepts is its workflow schema's to say: the pre-commit hook
# check-github-workflows holds each file against it. The checks here are only what the schema cannot know.
# A published action at a version, an action in this repository, or a container image.
ACTION = re.compile(r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(/[A-Za-z0-9_./-]+)?@[A-Za-z0-9_.-]+|\./\S+|docker://\S+)$")
# A Windows job runs the Makefile's recipes with the virtual environment's programs in Scripts\.
WINDOWS_VARIABLES = {"PYTHON": "python", "BIN": ".venv/Scripts"}
# Where `make book-student` writes the book without solutions.
STUDENT_HTML = "_build/student-book/_build/html"
# Where `make pages` assembles the site that GitHub Pages publishes, and the setting that chooses it.
PAGES_HTML = "_build/pages"
EDITION_SETTING = "${{ vars.BOOK_EDITION || 'solutions' }}"


# --------------------------------------------------------------------------------------------
# Reading the files
# --------------------------------------------------------------------------------------------

def load_workflows() -> dict[str, dict]:
    """Every workflow file, parsed, by file name; YAML reads the key ``on`` as True, put back as "on"."""
    workflows = {}
    for path in sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")]):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and True in data:
            data["on"] = data.pop(True)
        workflows[path.name] = data
    return workflows


PYTHON_RANGE = re.compile(r"Python 3\.(\d+) to 3\.(\d+)")


def pythons_in(readme: str) -> list[str]:
    """The Python versions the README supports, oldest first ("Python 3.11 to 3.13" gives 3.11, 3.12, 3.13).

    >>> pythons_in("You need Python 3.11 to 3.13 and make.")
    ['3.11', '3.12', '3.13']
    """
    found = set(PYTHON_RANGE.findall(readme))
    assert len(found) == 1, f"the README should state one range of Python versions, found {sorted(found)}"
    [(oldest, newest)] = found
    return [f"3.{minor}" for minor in range(int(oldest), int(newest) + 1)]


def readme_pythons() -> list[str]:
    return pythons_in(README)


def requires_python(versions: list[str]) -> str:
    """The ``requires-python`` line of ``pyproject.toml`` that allows exactly ``versions``."""
    newest = versions[-1].split(".")
    return f'requires-python = ">={versions[0]},<{newest[0]}.{int(newest[1]) + 1}"'


def read_makefile(text: str, overrides: dict[str, str] | None = None) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The Makefile's variables and each target's recipe lines, expanded; silent ``@`` lines are left out.

    >>> variables, rules = read_makefile(
    ...     "BIN := v/bin\\nX ?= $(BIN)/x\\n$(X): a\\n\\t@echo hi\\n\\t$(BIN)/python -c 1 \\\\\\n\\t  -q\\n")
    >>> variables["X"], rules
    ('v/bin/x', {'v/bin/x': ['v/bin/python -c 1 -q']})
    """
    text = re.sub(r"\\\n\s*", "", text)  # join continued lines
    variables: dict[str, str] = {}
    raw_rules: dict[str, list[str]] = {}
    target = None
    for line in text.splitlines():
        if line.startswith("\t"):
            if target is not None and not line.strip().startswith("@"):
                raw_rules[target].append(line.strip())
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assignment = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?::=|\?=|=)\s*(.*)$", line)
        rule = re.match(r"^([^\s:=#][^:=#]*?)\s*:(?!=)", line)
        if assignment:
            variables[assignment.group(1)] = assignment.group(2).strip()
            target = None
        elif rule:
            target = rule.group(1).strip()
            raw_rules.setdefault(target, [])
        else:
            target = None
    variables.update(overrides or {})

    def expand(value: str) -> str:
        for _ in range(10):
            value = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), value)
        return value

    rules = {
        expand(name): [expand(line) for line in lines]
        for name, lines in raw_rules.items()
        if not name.startswith(".")
    }
    return {name: expand(value) for name, value in variables.items()}, rules


VARIABLES, RULES = read_makefile(MAKEFILE)


def windows_recipe(makefile: str) -> list[str]:
    """What a Windows job runs instead of ``make check``: the set-up and the target's recipe."""
    variables, rules = read_makefile(makefile, WINDOWS_VARIABLES)
    return [line for target in (variables["STAMP"], "check") for line in rules[target]]


def jobs_of(workflow: dict) -> dict[str, dict]:
    jobs = workflow.get("jobs") if isinstance(workflow, dict) else None
    return jobs if isinstance(jobs, dict) else {}


def steps_of(job: dict) -> list[dict]:
    steps = job.get("steps") if isinstance(job, dict) else None
    return [step for step in steps if isinstance(step, dict)] if isinstance(steps, list) else []


def run_lines(job: dict) -> list[str]:
    """The commands of a job's ``run`` steps, one per line, in order."""
    return [
        line.strip()
        for step in steps_of(job)
        if "run" in step
        for line in str(step["run"]).splitlines()
        if line.strip()
    ]


def runner(job: dict) -> str:
    labels = job.get("runs-on", "")
    return " ".join(labels) if isinstance(labels, list) else str(labels)


def uses(step: dict, action: str) -> bool:
    return str(step.get("uses", "")).split("@")[0] == action


# --------------------------------------------------------------------------------------------
# The checks: each returns the problems it finds
# --------------------------------------------------------------------------------------------

def structure_problems(name: str, workflow) -> list[str]:
    """What the other checks stand on: events, jobs with a runner and steps, each step one action or command.

    Unknown keys and events are the workflow schema's business (the check-github-workflows hook), not a
    copy of it here that would refuse what GitHub accepts.
    """
    if not isinstance(workflow, dict):
        return [f"{name}: not a YAML mapping"]
    problems = []
    if not workflow.get("on"):
        problems.append(f"{name}: no `on` (the events that start it)")
    jobs = workflow.get("jobs")
    if not isinstance(jobs, dict) or not jobs:
        return problems + [f"{name}: no `jobs`"]
    for job_id, job in jobs.items():
        where = f"{name}: job {job_id!r}"
        if not isinstance(job, dict):
            problems.append(f"{where} is not a mapping")
            continue
        needs = job.get("needs", [])
        for needed in [needs] if isinstance(needs, str) else needs:
            if needed not in jobs:
                problems.append(f"{where} needs {needed!r}, which is not a job of this workflow")
        if "uses" in job:  # a call to a reusable workflow: its runner and steps are in the called file
            continue
        if not job.get("runs-on"):
            problems.append(f"{where} has no `runs-on`")
        steps = job.get("steps")
        if not isinstance(steps, list) or not steps:
            problems.append(f"{where} has no `steps`")
            continue
        for number, step in enumerate(steps, start=1):
            step_where = f"{where}, step {number}"
            if not isinstance(step, dict):
                problems.append(f"{step_where} is not a mapping")
                continue
            if ("uses" in step) == ("run" in step):
                problems.append(f"{step_where} needs exactly one of `uses` and `run`")
            elif "uses" in step and not ACTION.match(str(step["uses"])):
                problems.append(f"{step_where}: `uses: {step['uses']}` is not owner/repository@version")
            if "with" in step and not isinstance(step["with"], dict):
                problems.append(f"{step_where}: `with` is not a mapping")
    return problems


MATRIX_KEY = re.compile(r"^\$\{\{\s*matrix\.([\w-]+)\s*\}\}$")


def job_pythons(where: str, job: dict, versions: list[str]) -> tuple[list[str], list[str]]:
    """The Python versions a job runs, and the problems with how it pins them.

    A job without a matrix pins the oldest of ``versions`` (the README's); a job whose
    ``python-version`` is ``${{ matrix.KEY }}`` runs each version its matrix lists, each one of
    ``versions``. Every version is a quoted string: YAML reads 3.10 as 3.1.
    """
    oldest = versions[0]
    container = job.get("container")
    image = str(container.get("image", "") if isinstance(container, dict) else container or "")
    image_version = re.match(r"^python:(\d+\.\d+)(?:[.-]|$)", image)
    setups = [step for step in steps_of(job) if uses(step, "actions/setup-python")]
    problems = []
    if image_version and not setups:
        if image_version.group(1) != oldest:
            problems.append(f"{where} runs in {image}, not Python {oldest} as the README states")
        caches = [step for step in steps_of(job) if uses(step, "actions/cache")]
        if not any("hashFiles('requirements.txt')" in str(step.get("with", {}).get("key")) for step in caches):
            problems.append(f"{where} does not cache pip's downloads keyed on requirements.txt")
        return [image_version.group(1)], problems
    if len(setups) != 1:
        return [], [f"{where} pins no Python (one actions/setup-python step, or a python:X.Y container)"]
    settings = setups[0].get("with") or {}
    if settings.get("cache") != "pip" or settings.get("cache-dependency-path") != "requirements.txt":
        problems.append(f"{where} does not cache pip's downloads keyed on requirements.txt")
    pinned = settings.get("python-version")
    key = MATRIX_KEY.match(pinned) if isinstance(pinned, str) else None
    if key is None:
        if not isinstance(pinned, str) or pinned != oldest:
            problems.append(f"{where} sets up Python {pinned!r}, not {oldest!r} as the README states "
                            "(quote it: YAML reads 3.10 as 3.1)")
        return [pinned] if isinstance(pinned, str) else [], problems
    matrix = (job.get("strategy") or {}).get("matrix") or {}
    listed = matrix.get(key.group(1)) if isinstance(matrix, dict) else None
    if not isinstance(listed, list) or not listed:
        return [], problems + [f"{where} sets up Python from matrix key {key.group(1)!r}, which its matrix "
                               "does not list"]
    for version in listed:
        if not isinstance(version, str):
            problems.append(f"{where}: the matrix lists Python {version!r} (quote it: YAML reads 3.10 as 3.1)")
        elif version not in versions:
            problems.append(f"{where}: the matrix lists Python {version!r}, not a Python the README supports "
                            f"({versions[0]} to {versions[-1]})")
    return [version for version in listed if isinstance(version, str)], problems


def python_problems(name: str, workflow: dict, versions: list[str]) -> list[str]:
    """Every job that runs commands pins a Python of ``versions``, and caches pip's downloads keyed on requirements.txt."""
    return [
        problem
        for job_id, job in jobs_of(workflow).items()
        if run_lines(job)
        for problem in job_pythons(f"{name}: job {job_id!r}", job, versions)[1]
    ]


def matrix_problems(workflows: dict[str, dict], makefile: str, versions: list[str]) -> list[str]:
    """Every Python of ``versions`` runs the package's tests on Linux, macOS and Windows.

    ``make test`` runs them too (its pytest runs everything ``make check`` does), and on
    Windows the Makefile's recipe stands for ``make check``.
    """
    windows = windows_recipe(makefile)
    ran: set[tuple[str, str]] = set()  # (platform, version)
    for name, workflow in workflows.items():
        for job_id, job in jobs_of(workflow).items():
            lines = run_lines(job)
            if not ({"make test", "make check"} & {readme_command(line)[0] for line in lines}
                    or lines == windows):
                continue
            runs, _ = job_pythons(f"{name}: job {job_id!r}", job, versions)
            ran |= {(platform, version) for platform in PLATFORMS if platform in runner(job) for version in runs}
    return [
        f"no job runs the package's tests with Python {version} on {platform}"
        for platform in PLATFORMS
        for version in versions
        if (platform, version) not in ran
    ]


PLATFORMS = ("ubuntu", "macos", "windows")
# A README command, which may name the interpreter for .venv as the set-up page says: `make check
# PYTHON=python${{ matrix.python }}` in a job that sets up each Python of its matrix.
COMMAND = re.compile(r"make ([\w-]+)(?: PYTHON=(python\$\{\{ matrix\.[\w-]+ \}\}|\S+))?")


def readme_command(line: str) -> tuple[str | None, str | None]:
    """``("make target", the PYTHON it names or None)``, or ``(None, None)`` if the line is no such command."""
    found = COMMAND.fullmatch(line)
    return (f"make {found.group(1)}", found.group(2)) if found else (None, None)


def python_set_up(job: dict) -> str | None:
    """The ``python-version`` the job's actions/setup-python step sets up, as written (``"3.11"`` or
    ``"${{ matrix.python }}"``), or None."""
    setups = [step for step in steps_of(job) if uses(step, "actions/setup-python")]
    pinned = (setups[0].get("with") or {}).get("python-version") if len(setups) == 1 else None
    return pinned if isinstance(pinned, str) else None


def command_problems(workflows: dict[str, dict], makefile: str, readme: str) -> list[str]:
    """Every ``run`` step is a README command, or on Windows the Makefile's recipe; the commands CI needs are there."""
    problems = []
    _, rules = read_makefile(makefile)
    windows = windows_recipe(makefile)
    ran: dict[str, set[str]] = {}  # command -> the runners of the jobs that run it
    for name, workflow in workflows.items():
        for job_id, job in jobs_of(workflow).items():
            where = f"{name}: job {job_id!r}"
            lines = run_lines(job)
            if "windows" in runner(job) and not all(COMMAND.fullmatch(line) for line in lines):
                if lines == windows:
                    ran.setdefault("make check", set()).add(runner(job))
                else:
                    problems.append(
                        f"{where} runs {lines}, not the Makefile's set-up and `check` recipe with the "
                        f"Windows path: {windows}"
                    )
                continue
            pinned = python_set_up(job)
            for line in lines:
                command, python = readme_command(line)
                target = (command or "").removeprefix("make ")
                if command is None:
                    problems.append(f"{where} runs `{line}`: a workflow step is a README command (`make ...`)")
                elif target not in rules:
                    problems.append(f"{where} runs `{line}`, but the Makefile has no target {target!r}")
                elif not re.search(rf"{re.escape(command)}(?![\w-])", readme):
                    problems.append(f"{where} runs `{line}`, which the README does not mention")
                elif pinned is not None and MATRIX_KEY.match(pinned) and python != f"python{pinned}":
                    problems.append(f"{where} runs `{line}` for each Python of its matrix: pick it as the set-up "
                                    f"page says, `{command} PYTHON=python{pinned}`")
                elif python is not None and python != f"python{pinned}":
                    problems.append(f"{where} runs `{line}`, naming another Python than the {pinned!r} it sets up")
                else:
                    ran.setdefault(command, set()).add(runner(job))
    for command, platform in [
        ("make test", "ubuntu"), ("make check", "macos"), ("make check", "windows"),
        ("make book", "ubuntu"), ("make book-student", "ubuntu"),
    ]:
        if not any(platform in labels for labels in ran.get(command, ())):
            problems.append(f"no workflow runs `{command}` on {platform}")
    return problems


def pages_problems(workflows: dict[str, dict]) -> list[str]:
    """One workflow builds both books, assembles the edition ``BOOK_EDITION`` names (``make pages``) and hands
    ``_build/pages`` to Pages; a job deploys it as Pages requires."""
    problems = []
    for name, workflow in workflows.items():
        jobs = jobs_of(workflow)
        uploads = {
            job_id: step
            for job_id, job in jobs.items()
            for step in steps_of(job)
            if uses(step, "actions/upload-pages-artifact")
        }
        if not uploads:
            continue
        for job_id, step in uploads.items():
            if (step.get("with") or {}).get("path") != PAGES_HTML:
                problems.append(f"{name}: job {job_id!r} hands Pages something other than {PAGES_HTML}")
            lines = run_lines(jobs[job_id])
            if "make book" not in lines:
                problems.append(f"{name}: job {job_id!r} publishes without running `make book`")
            if "make pages" not in lines or lines.index("make pages") < max(
                    lines.index(line) for line in ("make book", "make book-student") if line in lines):
                problems.append(f"{name}: job {job_id!r} does not assemble the site with `make pages` after both books")
            env = {**(workflow.get("env") or {}), **(jobs[job_id].get("env") or {})}
            if env.get("BOOK_EDITION") != EDITION_SETTING:
                problems.append(f"{name}: job {job_id!r} does not read the edition from the repository variable "
                                f"(env BOOK_EDITION: {EDITION_SETTING})")
            student = [
                s for s in steps_of(jobs[job_id])
                if uses(s, "actions/upload-artifact") and (s.get("with") or {}).get("path")
            ]
            if "make book-student" not in lines or not any(s["with"]["path"] == STUDENT_HTML for s in student):
                problems.append(f"{name}: job {job_id!r} does not keep {STUDENT_HTML} from `make book-student`")
        deploys = [
            (job_id, job) for job_id, job in jobs.items() if any(uses(s, "actions/deploy-pages") for s in steps_of(job))
        ]
        if not deploys:
            problems.append(f"{name}: uploads a Pages artifact but no job deploys it (actions/deploy-pages)")
        for job_id, job in deploys:
            where = f"{name}: job {job_id!r}"
            permissions = job.get("permissions") or workflow.get("permissions") or {}
            for scope in ("pages", "id-token"):
                if not isinstance(permissions, dict) or permissions.get(scope) != "write":
                    problems.append(f"{where} deploys to Pages without `permissions: {scope}: write`")
            environment = job.get("environment")
            environment_name = environment.get("name") if isinstance(environment, dict) else environment
            if environment_name != "github-pages":
                problems.append(f"{where} deploys outside the `github-pages` environment")
            needs = job.get("needs", [])
            if not set(uploads) <= set([needs] if isinstance(needs, str) else needs) | {job_id}:
                problems.append(f"{where} does not wait for the job that uploads the book (`needs`)")
    if not any(
        uses(step, "actions/upload-pages-artifact")
        for workflow in workflows.values()
        for job in jobs_of(workflow).values()
        for step in steps_of(job)
    ):
        problems.append("no workflow publishes the book on GitHub Pages")
    return problems


def all_problems(workflows: dict[str, dict], makefile: str = MAKEFILE, readme: str = README) -> list[str]:
    versions = pythons_in(readme)
    problems = []
    for name, workflow in workflows.items():
        problems += structure_problems(name, workflow)
        problems += python_problems(name, workflow, versions)
    return (problems + command_problems(workflows, makefile, readme) + matrix_problems(workflows, makefile, versions)
            + pages_problems(workflows))


WORKFLOW_FILES = load_workflows()


# --------------------------------------------------------------------------------------------
# The workflows as committed
# --------------------------------------------------------------------------------------------

def test_the_test_and_publish_workflows_are_there():
    assert {"test.yml", "publish.yml"} <= set(WORKFLOW_FILES)


@pytest.mark.parametrize("name", sorted(WORKFLOW_FILES))
def test_each_workflow_has_the_keys_github_requires(name):
    assert structure_problems(name, WORKFLOW_FILES[name]) == []


def test_pyproject_requires_the_pythons_the_readme_states():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert requires_python(readme_pythons()) in pyproject, "pyproject.toml and the README disagree on Python"
    assert requires_python(["3.11", "3.12", "3.13"]) == 'requires-python = ">=3.11,<3.14"'


def test_every_job_pins_a_python_the_readme_states_and_caches_pip():
    versions = readme_pythons()
    assert [p for name, wf in WORKFLOW_FILES.items() for p in python_problems(name, wf, versions)] == []


def test_every_python_runs_the_package_tests_on_every_platform():
    assert matrix_problems(WORKFLOW_FILES, MAKEFILE, readme_pythons()) == []
    assert len(readme_pythons()) >= 3, "the README states fewer Pythons than the course supports (3.11 to 3.13)"


def test_every_step_is_a_readme_command_or_the_makefiles_recipe():
    assert command_problems(WORKFLOW_FILES, MAKEFILE, README) == []


def test_the_windows_steps_are_the_makefiles_recipe_line_for_line():
    assert windows_recipe(MAKEFILE) == [
        "python -m venv .venv",
        ".venv/Scripts/python -m pip install --quiet --disable-pip-version-check -r requirements.txt",
        ".venv/Scripts/python -m pip install --quiet --disable-pip-version-check --no-deps -e .",
        ".venv/Scripts/ruff check .",
        ".venv/Scripts/python -m pytest -n 2 --dist worksteal -m 'not kernel and not book and not browser and not sweep'",
    ]


def test_the_browser_tests_cannot_skip_in_ci():
    workflow = WORKFLOW_FILES["test.yml"]
    [job] = [job for job in jobs_of(workflow).values() if "make test" in run_lines(job)]
    [step] = [step for step in steps_of(job) if step.get("run") == "make test"]
    env = {**(workflow.get("env") or {}), **(job.get("env") or {}), **(step.get("env") or {})}
    assert env.get("MHA_COURSE_REQUIRE_BROWSER") == "1"


def test_the_book_is_published_on_github_pages_with_the_student_book_beside_it():
    assert STUDENT_HTML in MAKEFILE, "the Makefile no longer writes the student book where publish.yml looks"
    assert pages_problems(WORKFLOW_FILES) == []


def test_the_readme_badges_name_workflows_that_exist():
    badges = re.findall(r"actions/workflows/([\w.-]+)/badge\.svg", README)
    assert sorted(set(badges)) == sorted(WORKFLOW_FILES)


def make_dry_run(target: str, variables: dict[str, str]) -> subprocess.CompletedProcess:
    """What ``make -n -B target NAME=value ...`` prints, in an environment that sets none of the Makefile's
    variables and is no sub-make's: make and the reader are then told exactly the same things."""
    own = set(VARIABLES) | {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}
    env = {name: value for name, value in os.environ.items() if name not in own}
    return subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target, *(f"{k}={v}" for k, v in variables.items())],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )


@pytest.mark.skipif(
    shutil.which("make") is None or sys.platform == "win32",
    reason="needs make (Windows runs the Makefile's recipe without it)",
)
@pytest.mark.parametrize("given", [{}, {"PYTHON": "/opt/pythons/python3.13"}, {"PYTHON": "python3.12"}],
                         ids=["as-is", "PYTHON=path", "PYTHON=name"])
def test_the_makefile_reader_agrees_with_make(given):
    """The checks above stand on this reader: its view of ``make check`` is what make runs, also when
    a user picks the interpreter on the command line as CONTRIBUTING and the set-up page say."""
    make = make_dry_run("check", given)
    printed = [line for line in make.stdout.splitlines() if not line.startswith(("echo ", "touch "))]
    assert make.returncode == 0, make.stderr
    variables, rules = read_makefile(MAKEFILE, given)
    assert printed == [*rules[variables["STAMP"]], *rules["check"]]
    if given:
        assert f"{given['PYTHON']} -m venv .venv" in printed


@pytest.mark.skipif(shutil.which("make") is None or sys.platform == "win32", reason="needs make")
def test_the_makefile_reader_test_fails_when_the_reader_is_told_less_than_make():
    """The comparison above can fail: a reader left unaware of a command-line PYTHON disagrees with make."""
    make = make_dry_run("check", {"PYTHON": "python3.12"})
    printed = [line for line in make.stdout.splitlines() if not line.startswith(("echo ", "touch "))]
    variables, rules = read_makefile(MAKEFILE)
    assert printed != [*rules[variables["STAMP"]], *rules["check"]]


@pytest.mark.skipif(shutil.which("make") is None or sys.platform == "win32", reason="needs make")
def test_the_suite_passes_under_a_command_line_python(tmp_path):
    """``make test PYTHON=python3.13`` runs pytest with PYTHON (and MAKEFLAGS) in its environment: this file's
    own tests, run that way, still pass (the documented way to pick a supported Python)."""
    env = {**os.environ, "PYTHON": "python3.13", "MAKEFLAGS": " -- PYTHON=python3.13", "MAKELEVEL": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", str(Path(__file__)),
         "-k", "makefile_reader_agrees", "--rootdir", str(REPO), "-o", "addopts="],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "3 passed" in run.stdout, run.stdout[-1000:]


# --------------------------------------------------------------------------------------------
# A drifted copy is caught
# --------------------------------------------------------------------------------------------

def _job(workflows, file, runs):
    """The job of ``file`` whose run steps include ``runs``, or whose runner label contains it."""
    for job in jobs_of(workflows[file]).values():
        if runs in {readme_command(line)[0] or line for line in run_lines(job)} or runs in runner(job):
            return job
    raise KeyError(runs)


def _step(job, action):
    return next(step for step in steps_of(job) if uses(step, action))


def _replace_run(job, old, new):
    for step in steps_of(job):
        if step.get("run") == old:
            step["run"] = new


DRIFTS = {
    "make test replaced by a second recipe": (
        lambda w: _replace_run(_job(w, "test.yml", "make test"), "make test", ".venv/bin/python -m pytest"),
        "a workflow step is a README command",
    ),
    "a make target the Makefile lacks": (
        lambda w: _replace_run(_job(w, "test.yml", "make test"), "make test", "make verify"),
        "the Makefile has no target 'verify'",
    ),
    "Linux no longer runs make test": (
        lambda w: jobs_of(w["test.yml"]).pop("test"),
        "no workflow runs `make test` on ubuntu",
    ),
    "Python bumped in one workflow": (
        lambda w: _step(_job(w, "publish.yml", "make book"), "actions/setup-python")["with"].update(
            {"python-version": "3.12"}),
        "sets up Python '3.12', not '3.11'",
    ),
    "Python written as a YAML number": (
        lambda w: _step(_job(w, "test.yml", "macos"), "actions/setup-python")["with"].update({"python-version": 3.11}),
        "quote it",
    ),
    "the container's Python bumped": (
        lambda w: _job(w, "test.yml", "make test").update({"container": "python:3.12-bookworm"}),
        "runs in python:3.12-bookworm, not Python 3.11",
    ),
    "a Python dropped from the macOS matrix": (
        lambda w: _job(w, "test.yml", "macos")["strategy"]["matrix"]["python"].remove("3.13"),
        "no job runs the package's tests with Python 3.13 on macos",
    ),
    "the Linux matrix no longer runs the newest Python": (
        lambda w: _job(w, "test.yml", "make check")["strategy"]["matrix"]["python"].remove("3.13"),
        "no job runs the package's tests with Python 3.13 on ubuntu",
    ),
    "a matrix version written as a YAML number": (
        lambda w: _job(w, "test.yml", "windows")["strategy"]["matrix"]["python"].__setitem__(0, 3.11),
        "the matrix lists Python 3.11 (quote it",
    ),
    "a matrix with a Python the README does not state": (
        lambda w: _job(w, "test.yml", "macos")["strategy"]["matrix"]["python"].append("3.10"),
        "the matrix lists Python '3.10', not a Python the README supports",
    ),
    "setup-python reads a matrix key the matrix lacks": (
        lambda w: _step(_job(w, "test.yml", "windows"), "actions/setup-python")["with"].update(
            {"python-version": "${{ matrix.py }}"}),
        "matrix key 'py', which its matrix does not list",
    ),
    "the pip cache no longer keyed on requirements.txt": (
        lambda w: _step(_job(w, "test.yml", "windows"), "actions/setup-python")["with"].pop("cache-dependency-path"),
        "does not cache pip's downloads keyed on requirements.txt",
    ),
    "the Windows steps drift from the Makefile": (
        lambda w: steps_of(_job(w, "test.yml", "windows"))[-1].update(
            {"run": ".venv/Scripts/python -m pytest mha_course tests"}),
        "not the Makefile's set-up and `check` recipe",
    ),
    "a matrix job that leaves the Python to python3": (
        lambda w: _replace_run(_job(w, "test.yml", "macos"), "make check PYTHON=python${{ matrix.python }}",
                               "make check"),
        "pick it as the set-up page says, `make check PYTHON=python${{ matrix.python }}`",
    ),
    "a matrix job that names another Python": (
        lambda w: _replace_run(_job(w, "test.yml", "macos"), "make check PYTHON=python${{ matrix.python }}",
                               "make check PYTHON=python3.11"),
        "pick it as the set-up page says",
    ),
    "a job that names a Python it does not set up": (
        lambda w: _replace_run(_job(w, "test.yml", "make test-each"), "make test-each",
                               "make test-each PYTHON=python3.13"),
        "naming another Python than the '3.11' it sets up",
    ),
    "a job without runs-on": (
        lambda w: _job(w, "publish.yml", "make book").pop("runs-on"),
        "has no `runs-on`",
    ),
    "no `on`": (lambda w: w["publish.yml"].pop("on"), "publish.yml: no `on`"),
    "a step with both uses and run": (
        lambda w: steps_of(_job(w, "test.yml", "macos"))[0].update({"run": "echo"}),
        "needs exactly one of `uses` and `run`",
    ),
    "Pages deployed without id-token permission": (
        lambda w: jobs_of(w["publish.yml"])["deploy"]["permissions"].pop("id-token"),
        "without `permissions: id-token: write`",
    ),
    "Pages handed another folder": (
        lambda w: _step(_job(w, "publish.yml", "make book"), "actions/upload-pages-artifact")["with"].update(
            {"path": "_build"}),
        "hands Pages something other than _build/pages",
    ),
    "the edition no longer a setting": (
        lambda w: _job(w, "publish.yml", "make book")["env"].update({"BOOK_EDITION": "solutions"}),
        "does not read the edition from the repository variable",
    ),
    "the site assembled before the student book": (
        lambda w: _job(w, "publish.yml", "make book")["steps"].sort(key=lambda step: step.get("run") != "make pages"),
        "does not assemble the site with `make pages` after both books",
    ),
    "the student book no longer kept": (
        lambda w: _replace_run(_job(w, "publish.yml", "make book"), "make book-student", "make book"),
        "does not keep _build/student-book/_build/html",
    ),
}


def test_the_committed_workflows_have_no_problem():
    assert all_problems(WORKFLOW_FILES) == []


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_a_drifted_workflow_is_caught(drift):
    change, expected = DRIFTS[drift]
    workflows = copy.deepcopy(WORKFLOW_FILES)
    change(workflows)
    problems = all_problems(workflows)
    assert any(expected in problem for problem in problems), problems


def test_a_makefile_recipe_changed_without_the_windows_steps_is_caught():
    makefile = MAKEFILE.replace("-m 'not kernel and not book and not browser and not sweep'", "-m 'not kernel and not browser' -x")
    assert makefile != MAKEFILE
    assert any("not the Makefile's set-up" in problem for problem in all_problems(WORKFLOW_FILES, makefile=makefile))


def test_a_readme_that_moves_on_is_caught():
    newer = README.replace("Python 3.11 to 3.13", "Python 3.12 to 3.13")
    assert newer != README
    assert any("not '3.12'" in problem for problem in all_problems(WORKFLOW_FILES, readme=newer))
    wider = README.replace("Python 3.11 to 3.13", "Python 3.11 to 3.14")
    assert wider != README
    assert "no job runs the package's tests with Python 3.14 on windows" in all_problems(WORKFLOW_FILES, readme=wider)
    assert requires_python(pythons_in(wider)) == 'requires-python = ">=3.11,<3.15"'
    without = README.replace("make check", "make tests-of-the-package")
    assert any("which the README does not mention" in p for p in all_problems(WORKFLOW_FILES, readme=without))


def test_a_file_that_is_not_a_workflow_is_refused():
    assert structure_problems("x.yml", yaml.safe_load("- a list")) == ["x.yml: not a YAML mapping"]
    parsed = yaml.safe_load("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: checkout\n")
    assert parsed[True] == "push"  # the reason load_workflows puts the key back as "on"
    assert structure_problems("x.yml", {"on": parsed[True], "jobs": parsed["jobs"]}) == [
        "x.yml: job 'a', step 1: `uses: checkout` is not owner/repository@version"
    ]


def test_what_github_accepts_is_not_refused():
    """Events, keys and steps the course's workflows do not use yet are the schema's to judge, not these checks'."""
    workflows = copy.deepcopy(WORKFLOW_FILES)
    workflow = workflows["test.yml"]
    workflow["on"] = {**workflow["on"], "issues": {"types": ["opened"]}, "repository_dispatch": None}
    workflow["defaults"] = {"run": {"shell": "bash"}}
    job = _job(workflows, "test.yml", "make test")
    job["timeout-minutes"] = 30
    steps_of(job)[0]["working-directory"] = "."
    steps_of(job)[:0] = [{"uses": "./.github/actions/set-up"}, {"uses": "docker://alpine:3.20"}]
    workflow["jobs"]["reuse"] = {"needs": "test", "uses": "./.github/workflows/publish.yml", "secrets": "inherit"}
    assert all_problems(workflows) == []


# --------------------------------------------------------------------------------------------
# The pre-commit hooks
# --------------------------------------------------------------------------------------------

PRE_COMMIT = REPO / ".pre-commit-config.yaml"


def _hooks() -> dict[str, dict]:
    config = yaml.safe_load(PRE_COMMIT.read_text(encoding="utf-8"))
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_the_pre_commit_configuration_is_valid():
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-config", str(PRE_COMMIT)],
        capture_output=True, text=True, cwd=REPO, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_ruff_hook_uses_the_ruff_pinned_in_requirements():
    [pin] = [dep for dep in _hooks()["ruff"]["additional_dependencies"] if dep.startswith("ruff==")]
    requirements = (REPO / "requirements.txt").read_text(encoding="utf-8")
    pinned = re.search(r"^ruff==\S+", requirements, re.MULTILINE)
    assert pinned is not None, "requirements.txt pins no ruff: pin the version the ruff hook uses"
    assert pin == pinned.group(0)


def test_the_notebook_hook_checks_every_chapter_and_nothing_else():
    hook = _hooks()["chapter-notebooks-executed"]
    script = hook["entry"].split()[-1]
    assert (REPO / script).is_file()
    files = re.compile(hook["files"])
    chapters = [path.relative_to(REPO).as_posix() for path in (REPO / "book").glob("*.ipynb")]
    assert chapters and all(files.search(chapter) for chapter in chapters)
    graders_inputs = [path.relative_to(REPO).as_posix() for path in (REPO / "tests").rglob("*.ipynb")]
    assert not any(files.search(path) for path in graders_inputs)


def test_contributing_says_how_to_install_the_hooks():
    contributing = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "pre-commit install" in contributing


@pytest.mark.skipif(
    shutil.which("make") is None or sys.platform == "win32",
    reason="needs make (Windows runs the Makefile's recipe without it)",
)
def test_make_pages_publishes_the_edition_book_edition_names(tmp_path):
    """Two stand-in books, and what ``make pages`` assembles from them for each setting."""
    for folder, text in (("_build/html", "with solutions"), (STUDENT_HTML, "without solutions")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "index.html").write_text(text, encoding="utf-8")
    env = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}

    def pages(edition: str | None) -> subprocess.CompletedProcess:
        settings = {} if edition is None else {"BOOK_EDITION": edition}
        return subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "pages"], cwd=tmp_path,
                              env={**env, **settings}, capture_output=True, text=True, check=False)

    def site() -> dict[str, str]:
        root = tmp_path / PAGES_HTML
        return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in root.rglob("*.html")}

    assert pages(None).returncode == 0 and site() == {"index.html": "with solutions"}
    assert pages("student").returncode == 0 and site() == {"index.html": "without solutions"}
    assert pages("both").returncode == 0
    assert site() == {"index.html": "without solutions", "solutions/index.html": "with solutions"}
    wrong = pages("teachers")
    assert wrong.returncode != 0 and "BOOK_EDITION must be solutions, student or both, not 'teachers'" in wrong.stderr
