"""Measure the Gradescope autograder: what its setup.sh installs, and the memory grading a submission needs.

Writes ``book/data/autograder.json``, whose numbers the teaching page states (tests/test_gradebook.py checks
that the two agree). Run from the repository's root, on a quiet machine, in the course's environment:
``.venv/bin/python .ci/measure_autograder.py`` (a few minutes).

1. The zip (``python -m mha_course autograder``) is unpacked as Gradescope lays it out and its ``setup.sh`` runs
   with ``MHA_COURSE_AUTOGRADER_ROOT`` set to a temporary folder, from the package indexes pip is configured
   with. Its virtual environment's size on disk (``du``) and its packages are counted, beside this script's own
   environment: the course's full ``requirements.txt``, which ``setup.sh`` installed before it took the
   package's ``grading`` extra.
2. Each chapter's book notebook (solutions in: every exercise answered) is graded as one submission by
   ``run_autograder`` in that environment. Every 20 ms the script sums the proportional set size (PSS,
   ``/proc/PID/smaps_rollup``) of the grader and every process under it, and reads each one's peak resident
   size (``VmHWM``); it keeps the peaks and checks that every exercise passed.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "data" / "autograder.json"


def disk_mb(folder: Path) -> float:
    return int(subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True, check=True).stdout.split()[0]) / 1024


def packages(venv: Path) -> list[str]:
    return sorted(p.name.split("-")[0].lower() for p in venv.glob("lib/python*/site-packages/*.dist-info"))


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parent = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def _kb(path: str, key: str) -> int:
    try:
        return next(int(line.split()[1]) for line in Path(path).read_text().splitlines() if line.startswith(key))
    except (OSError, StopIteration):
        return 0


def peak_memory(command: list[str], env: dict[str, str]) -> dict:
    """Run ``command``; the peak of its process tree's summed PSS and the largest process's peak RSS, in MB."""
    start = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_pss = peak_rss = 0
    while process.poll() is None:
        tree, todo, seen = _children(), [process.pid], []
        while todo:
            pid = todo.pop()
            seen.append(pid)
            todo += tree.get(pid, [])
        peak_pss = max(peak_pss, sum(_kb(f"/proc/{pid}/smaps_rollup", "Pss:") for pid in seen))
        peak_rss = max([peak_rss, *(_kb(f"/proc/{pid}/status", "VmHWM:") for pid in seen)])
        time.sleep(0.02)
    output = process.stdout.read()
    if process.returncode:
        raise SystemExit(f"{command} failed:\n{output}")
    return {"peak_pss_mb": round(peak_pss / 1024), "peak_rss_largest_process_mb": round(peak_rss / 1024),
            "wall_s": round(time.monotonic() - start, 1)}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="mha-autograder-"))
    try:
        bundle = work / "autograder.zip"
        subprocess.run([sys.executable, "-m", "mha_course", "autograder", "--out", str(bundle)], check=True,
                       capture_output=True)
        source = work / "source"
        with zipfile.ZipFile(bundle) as archive:
            for info in archive.infolist():
                Path(archive.extract(info, source)).chmod((info.external_attr >> 16) & 0o777)
        env = {**os.environ, "MHA_COURSE_AUTOGRADER_ROOT": str(work), "PIP_RETRIES": "0", "PIP_TIMEOUT": "10"}
        for variable in ("PYTHONPATH", "VIRTUAL_ENV", "MHA_COURSE_CHECK_SEED"):
            env.pop(variable, None)
        started = time.monotonic()
        subprocess.run([str(source / "setup.sh")], env=env, check=True, stdout=sys.stderr)
        install_s = time.monotonic() - started
        venv, full = work / "venv", Path(sys.prefix)
        chapters = {}
        for notebook in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
            shutil.rmtree(work / "submission", ignore_errors=True)
            shutil.rmtree(work / "results", ignore_errors=True)
            (work / "submission").mkdir()
            shutil.copy(notebook, work / "submission")
            measured = peak_memory([str(source / "run_autograder")], env)
            results = json.loads((work / "results" / "results.json").read_text(encoding="utf-8"))
            passed = all(test["status"] == "passed" for test in results["tests"]) and results["tests"]
            chapters[notebook.name] = {**measured, "score": results["score"], "all_passed": bool(passed)}
            print(notebook.name, chapters[notebook.name], flush=True)
        torch_version = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                                       capture_output=True, text=True, check=True).stdout.strip()
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor())
        result = {
            "meta": {"date": datetime.date.today().isoformat(), "device_name": cpu, "cpus": os.cpu_count(),
                     "python": platform.python_version(), "torch": torch_version, "command": ".venv/bin/python "
                     ".ci/measure_autograder.py", "install_s": round(install_s)},
            "bundle": {"disk_mb": round(disk_mb(venv)), "packages": packages(venv)},
            "full_requirements": {"disk_mb": round(disk_mb(full)), "packages": packages(full)},
            "submissions": chapters,
        }
        for out in (OUT, ROOT / "mha_course" / "book_data" / OUT.name):  # the book's file and the package's copy
            out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"bundle {result['bundle']['disk_mb']} MB ({len(result['bundle']['packages'])} packages), full "
              f"{result['full_requirements']['disk_mb']} MB ({len(result['full_requirements']['packages'])}); "
              f"peak PSS {max(c['peak_pss_mb'] for c in chapters.values())} MB; written to {OUT}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
