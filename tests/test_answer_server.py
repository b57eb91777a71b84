"""The answer server (mha_course.grading.answer_server): answer processes forked from one process that
imported torch and the checks once.

A fork must answer exactly as a process started afresh does, carry the notebook's token where the
grader's sweep looks for it (so that what it forks is ended with it), hold nothing of an earlier
fork, and the grader must fall back to fresh processes when the server is gone or its copy of the
package was edited. Each test waits for ``answer_records`` on a thread with a generous bound, so that
a grader that hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import POSIX_GRADING, on_a_thread, process_running
from mha_course.grading import answer_server
from mha_course.grading.answer_process import RECORD, answer_records
from mha_course.grading.answer_server import AnswerServer
from mha_course.grading.confinement import holders
from mha_course.grading.package_files import PackageSnapshot

pytestmark = [POSIX_GRADING, pytest.mark.skipif(not answer_server.available(), reason="answer servers need Linux")]

GUARD = 240.0  # a grader that has not answered by then is stuck, not slow
START = 120.0
CHECK = 60.0

MASK = ("import torch\n"
        "def build_causal_mask(num_tokens, device=None):\n"
        "    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)\n")
# An answer that forks a daemon (a process of its own session that starts no new program), once,
# and notes its number: only the environment block it inherits can name the notebook's token.
DAEMON = ("import os, time\n"
          "def build_causal_mask(num_tokens, device=None):\n"
          "    if not os.path.exists('daemon.pid'):\n"
          "        if os.fork() == 0:\n"
          "            os.setsid()\n"
          "            with open('daemon.pid', 'w') as file:\n"
          "                file.write(str(os.getpid()))\n"
          "            time.sleep(600)\n"
          "            os._exit(0)\n"
          "        while not os.path.exists('daemon.pid'):\n"
          "            time.sleep(0.01)\n"
          "    raise ValueError('no mask here')\n")
# An answer that leaves a mark in the process (a module's attribute, a global of torch) and reports
# whether it found one left by an earlier answer.
MARKS = ("import torch\n"
         "def build_causal_mask(num_tokens, device=None):\n"
         "    seen = getattr(torch, 'left_by_an_answer', False)\n"
         "    torch.left_by_an_answer = True\n"
         "    mask = torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)\n"
         "    return ~mask if seen else mask\n")


@pytest.fixture(scope="module")
def snapshot():
    return PackageSnapshot()


@pytest.fixture(scope="module")
def server(snapshot, tmp_path_factory):
    server = AnswerServer(snapshot, tmp_path_factory.mktemp("server"))
    yield server
    server.close()


def records(snapshot, folder: Path, code: str, server, token: str = "answer-server-test") -> dict[str, tuple]:
    """Exercise 1.1's record for ``code``, drawn from seed 5, in processes of ``server`` (or fresh ones)."""
    return on_a_thread(lambda: answer_records(snapshot, folder, [(1, code)], [("1.1", "build_causal_mask")], CHECK,
                                              start_timeout=START, token=token, seeds={"1.1": 5}, server=server),
                       GUARD)


def test_a_fork_records_what_a_fresh_process_records(snapshot, server, tmp_path):
    served = records(snapshot, tmp_path / "served", MASK, server)
    fresh = records(snapshot, tmp_path / "fresh", MASK, None)
    assert served["1.1"][0] == RECORD
    assert served == fresh
    assert not list((tmp_path / "served").glob("process-*/package")), "the fork wrote a copy of the package"


def test_a_fork_holds_nothing_an_earlier_fork_did(snapshot, server, tmp_path):
    first = records(snapshot, tmp_path / "first", MARKS, server)
    second = records(snapshot, tmp_path / "second", MARKS, server)
    assert first["1.1"][0] == RECORD and first == second


def test_a_fork_and_what_it_forks_carry_the_token_and_are_ended_with_it(server, tmp_path):
    token = "served-daemon-test"
    folder = tmp_path / "work"
    folder.mkdir()
    process = server.start(folder, token, time.monotonic() + START)
    assert process is not None
    daemon = None
    try:
        assert process.ready(time.monotonic() + START)
        assert holders(token) == [process.pid]
        process.send({"cells": [(1, DAEMON)], "answers": [("1.1", "build_causal_mask")], "seeds": {"1.1": 5}})
        assert process.frames.next(time.monotonic() + START) == ("replayed", [])
        assert process.frames.next(time.monotonic() + START) == ("start", "1.1")
        assert process.frames.next(time.monotonic() + CHECK)[:2] == (RECORD, "1.1")
        daemon = int((folder / "daemon.pid").read_text(encoding="utf-8"))
        assert daemon in holders(token), "a process forked by the answer does not carry the token"
    finally:
        process.close()
    assert holders(token) == []
    assert daemon is not None and not process_running(daemon), "the daemon outlived the answer process's close()"


def test_an_edited_copy_or_a_dead_server_leaves_answers_to_fresh_processes(snapshot, tmp_path):
    server = AnswerServer(snapshot, tmp_path / "server")
    try:
        assert records(snapshot, tmp_path / "before", MASK, server)["1.1"][0] == RECORD
        (server.package / "mha_course" / "_validation.py").write_text("# edited\n", encoding="utf-8")
        assert server.changed() == ["_validation.py"]
        assert server.start(tmp_path, "t", time.monotonic() + START) is None
        results = records(snapshot, tmp_path / "after", MASK, server)
        assert results["1.1"][0] == RECORD
        assert list((tmp_path / "after").glob("process-*/package")), "the answer was not found afresh"
    finally:
        server.close()
    assert server.process.poll() is not None


def test_a_server_killed_from_outside_is_not_waited_for(snapshot, tmp_path):
    server = AnswerServer(snapshot, tmp_path / "server")
    try:
        os.kill(server.process.pid, 9)
        server.process.wait()
        results = records(snapshot, tmp_path / "answers", MASK, server)
        assert results["1.1"][0] == RECORD
        assert list((tmp_path / "answers").glob("process-*/package"))
    finally:
        server.close()
