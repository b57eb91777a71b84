"""The package off Linux, and without its tools: what `import mha_course` loads, and a platform
without ``resource``, ``os.fork``, ``/proc`` or a load average (Windows), simulated in a subprocess.

There, the package imports, the benchmark's results load and render as tables, the experiment
imports, and a benchmark run skips the POSIX-only memory measurement with a message instead of
failing on an import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json, os, pathlib, sys

    # A platform without the tools' packages installed (only the core's dependencies), and without
    # the POSIX pieces the memory measurement needs.
    sys.modules["resource"] = None
    for name in ("fork", "getloadavg"):
        if hasattr(os, name):
            delattr(os, name)
    real_read, real_exists = pathlib.Path.read_text, pathlib.Path.exists
    def no_proc(method):
        def patched(self, *args, **kwargs):
            if str(self).startswith("/proc"):
                if method is real_exists:
                    return False
                raise FileNotFoundError(str(self))
            return method(self, *args, **kwargs)
        return patched
    pathlib.Path.read_text, pathlib.Path.exists = no_proc(real_read), no_proc(real_exists)

    import mha_course
    report = {"after_import": sorted(m for m, module in sys.modules.items() if module is not None and m.startswith(
        ("mha_course.exercises", "mha_course.grading", "mha_course.edition", "mha_course.notebook_files",
         "mha_course.bench", "mha_course.experiments", "nbclient", "nbformat")))}

    from mha_course import bench
    from mha_course.experiments import specialisation
    results = bench.load_results("book/data/bench-cpu.json")
    table = bench.results_table(results, "small-4", "forward")
    report["table"] = str(table).splitlines()[1]
    report["html"] = table._repr_html_()[:30]
    report["summary_rows"] = len(specialisation.accuracy_by_heads(specialisation.load_results()))

    size = bench.BenchConfig("tiny", 1, 8, 4, 2, 2, "a test size")
    run = bench.run_benchmark(bench.BenchSettings(configs=(size,), implementations=("batched", "fast"),
                                                  modes=("forward",), min_run_time=0.002, rounds=1,
                                                  progress=False, ceiling_size=16))
    report["meta"] = {k: run["meta"].get(k) for k in ("memory_measured", "memory_skipped", "load",
                                                        "other_work_cores")}
    report["peak"] = [r.get("peak_bytes") for r in run["rows"]]
    report["memory_module_loaded"] = "mha_course.bench.memory" in sys.modules
    print(json.dumps(report))
''')


def test_without_posix_or_tools_the_package_works_and_memory_is_skipped_with_a_message():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    # `import mha_course` loads the core and the example data only: no tool, no tool dependency.
    assert report["after_import"] == []
    assert report["table"].split()[:3] == ["implementation", "median", "IQR"]
    assert report["html"].startswith('<div class="mha-table-block">')
    assert report["summary_rows"] == 4
    assert report["meta"]["memory_measured"] is False and report["meta"]["load"] == {"start": None, "end": None}
    assert report["meta"]["other_work_cores"] == {"start": None, "end": None}  # no /proc/stat to read
    assert "lacks os.fork and the resource module" in report["meta"]["memory_skipped"]
    assert report["peak"] == [None, None] and report["memory_module_loaded"] is False
    assert "peak memory is not measured: this platform" in done.stderr


# One fresh interpreter for the two tests below: `import torch`, `import mha_course`, then the command
# line's parser, then the exercise registry, noting the modules each step loads.
LOADING = textwrap.dedent('''
    import sys
    def loaded(*prefixes):
        return sorted(m for m in sys.modules if m.startswith(prefixes))
    import torch
    before = set(sys.modules)
    import mha_course
    added = sorted(set(sys.modules) - before)
    from mha_course.cli import build_parser
    build_parser().parse_args(["grade", "x.ipynb"])
    parser = loaded("mha_course.exercises", "mha_course.edition", "mha_course.grading.grader", "nbformat", "nbclient")
    import mha_course.exercises as exercises
    chapters_before = loaded("mha_course.exercises.chapter")
    count = len(exercises.EXERCISES)
    print([added, parser, chapters_before, loaded("mha_course.exercises.chapter"), count])
''')


@pytest.fixture(scope="module")
def loading():
    done = subprocess.run([sys.executable, "-c", LOADING], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    added, parser, before, after, count = eval(done.stdout.splitlines()[-1])  # lists of module names, a count
    return SimpleNamespace(added=added, parser=parser, before=before, after=after, count=count)


def test_import_loads_no_tool_beyond_what_torch_loads(loading):
    """With every dependency installed, `import mha_course` adds no tool module to what `import torch` loads.

    (torch itself may import tqdm, which the course's progress bars use, in ``torch.hub``: that is torch's
    doing, so tqdm counts only when ``import mha_course`` adds it.)
    """
    added = loading.added
    assert not [m for m in added if m.startswith(("mha_course.exercises", "mha_course.grading", "mha_course.edition",
                                                   "mha_course.notebook_files", "mha_course.bench", "mha_course.experiments",
                                                   "tqdm", "nbclient", "nbformat", "ipykernel"))], added
    # Only the core and the example data: the layers are read from pyproject.toml, as the layer test reads them.
    core = set(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mha_course"]["layers"]["core"])
    assert {m.split(".")[1] for m in added if m.startswith("mha_course.")} <= core | {"data"}


def test_the_command_line_and_the_exercise_registry_load_the_checks_only_when_used(loading):
    """Building the command line's parser imports no check, grader or notebook library; importing the
    exercises package imports no chapter's checks until the registry is read."""
    assert loading.parser == [] and loading.before == []
    chapters = {p.stem for p in (REPO / "mha_course" / "exercises").glob("chapter*.py")
                if p.stem.removeprefix("chapter").isdigit()}
    assert set(loading.after) == {f"mha_course.exercises.{name}" for name in chapters}
    assert loading.count >= len(chapters)
