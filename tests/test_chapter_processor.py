"""The chapters' kernels under strict nbval run with PyTorch's vector code switched off (the repository's
``conftest.py``), so a stored output that holds only on one processor's vector unit fails on every machine.

Run on a one-cell notebook that prints the capability its kernel dispatches to, in a temporary folder
with a copy of the repository's ``conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _notebook(folder: Path, printed: str) -> Path:
    cell = nbformat.v4.new_code_cell(
        "import torch\nprint(torch.backends.cpu.get_cpu_capability())",
        execution_count=1,
        outputs=[nbformat.v4.new_output("stream", name="stdout", text=printed + "\n")],
    )
    path = folder / "capability.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    return path


def _nbval(folder: Path, notebook: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "ATEN_CPU_CAPABILITY"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "no:randomly", "-q", "--rootdir", str(folder), "-c", os.devnull,
         "--confcutdir", str(folder), str(notebook)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.kernel
def test_chapter_kernels_run_without_vector_code(tmp_path):
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    run = _nbval(tmp_path, _notebook(tmp_path, "DEFAULT"))
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.kernel
def test_without_the_set_up_the_kernel_uses_vector_code(tmp_path):
    """The control: the same notebook fails without the repository's conftest.py (where torch has vector
    code for this processor), so the test above cannot pass by accident."""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this processor has no vector code for PyTorch to switch off")
    run = _nbval(tmp_path, _notebook(tmp_path, "DEFAULT"))
    assert run.returncode != 0 and "DEFAULT" in run.stdout, run.stdout + run.stderr
