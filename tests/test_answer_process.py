"""The grader's side of the answer process (mha_course.grading.answer_process) and the frames both sides use.

The answer process is played here by a stand-in (a few lines of the standard library, started as the
real one is: ``python -I -S -B``, its end of the socket pair passed by number, in the sandbox grading
would use) that answers each exercise as its answer's name says: with a record, a frame larger than
the socket's buffer, a frame started and never finished, a payload that is not marshal data, a
pickle, or an exit half-way. Each test runs ``answer_records`` on a thread and waits for it with a
generous bound, so that a grader that hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import marshal
import os
import pickle
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import POSIX_GRADING, SANDBOXED, all_ended, on_a_thread
from mha_course.exercises.framework import ERROR
from mha_course.grading.answer_process import RECORD, TIMED_OUT, AnswerProcess, answer_records, receive, send
from mha_course.grading.sandbox import Sandbox, choose_sandbox, python_folders

pytestmark = POSIX_GRADING

# The stand-in's answers, by answer name. "unfinished" starts a frame of 1000 bytes, sends 7 and
# waits; "helper" does the same from a child of its own, which holds the socket too.
STAND_IN = r"""
import marshal, os, struct, subprocess, sys, time
fd = int(sys.argv[1])
def frame(payload):
    os.write(fd, struct.pack("!i", len(payload)) + payload)
def read(size):
    data = b""
    while len(data) < size:
        data += os.read(fd, size - len(data))
    return data
frame(marshal.dumps(("ready",)))
work = marshal.loads(read(struct.unpack("!i", read(4))[0]))
frame(marshal.dumps(("replayed", [])))
for exercise_id, name in work["answers"]:
    frame(marshal.dumps(("start", exercise_id)))
    if name == "passes":
        frame(marshal.dumps(("record", exercise_id, {"answer": name})))
    elif name == "large":
        frame(marshal.dumps(("record", exercise_id, {"values": list(range(200_000)), "text": "x" * 300_000})))
    elif name == "unfinished":
        os.write(fd, struct.pack("!i", 1000) + b"partial")
        time.sleep(600)
    elif name == "garbage":
        frame(b"\xff\xfe this is not marshal data")
        sys.exit(0)
    elif name == "pickled":
        frame(bytes.fromhex(sys.argv[2]))
        sys.exit(0)
    elif name == "exits":
        sys.stderr.write("the answer called exit\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "daemon":  # a process of its own session, which leaves the process group
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *sys.argv[2:]],
                                  start_new_session=True)
        with open("daemon.pid", "w", encoding="utf-8") as file:
            file.write(str(daemon.pid))
        frame(marshal.dumps(("record", exercise_id, {"answer": name})))
        time.sleep(600)
    elif name == "cut":
        os.write(fd, struct.pack("!i", 1000) + b"partial")
        os._exit(4)
os._exit(0)
"""

#: Generous bounds: a grader that has not answered by then is stuck, not slow.
GUARD = 120.0
START = 30.0
CHECK = 3.0
SANDBOX = choose_sandbox(python_folders())


def records(folder: Path, answers: list[tuple[str, str]], arguments: list[str] = ()) -> dict[str, tuple]:
    """answer_records over stand-ins, each in a folder of its own under ``folder``, waited for at most GUARD seconds."""
    numbers = iter(range(1, 100))
    return on_a_thread(lambda: answer_records(lambda: AnswerProcess(SANDBOX, folder / str(next(numbers)), arguments,
                                                                    STAND_IN),
                                              [], answers, CHECK, START, {}), GUARD)


def test_a_frame_started_and_never_finished_times_out_and_the_rest_go_to_a_new_process(tmp_path):
    results = records(tmp_path, [("1.1", "unfinished"), ("1.2", "passes")])
    assert results == {"1.1": (TIMED_OUT,), "1.2": (RECORD, {"answer": "passes"})}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_a_frame_larger_than_the_socket_buffer_arrives_whole(tmp_path):
    results = records(tmp_path, [("1.1", "large"), ("1.2", "passes")])
    expected = {"values": list(range(200_000)), "text": "x" * 300_000}
    assert len(marshal.dumps(expected)) > 1 << 16
    assert results == {"1.1": (RECORD, expected), "1.2": (RECORD, {"answer": "passes"})}


def test_frames_cross_a_socket_pair_whole_with_a_deadline_even_in_the_middle_of_one():
    mine, theirs = socket.socketpair()
    message = ("record", "1.1", {"values": list(range(100_000)), "text": "é" * 100_000})
    writer = threading.Thread(target=lambda: (send(theirs, message), send(theirs, ("start", "1.2"))), daemon=True)
    writer.start()
    assert receive(mine, time.monotonic() + GUARD) == message
    assert receive(mine, time.monotonic() + GUARD) == ("start", "1.2")
    assert receive(mine, time.monotonic() + 0.3) == "timeout"
    theirs.sendall(b"\x00\x00\x10\x00partial")  # a frame of 4096 bytes, 7 of them sent
    assert receive(mine, time.monotonic() + 0.3) == "timeout"
    theirs.close()
    assert receive(mine, time.monotonic() + GUARD) is None  # the end of the socket
    writer.join(GUARD)


def test_a_payload_that_is_not_marshal_data_is_an_error(tmp_path):
    results = records(tmp_path, [("1.1", "garbage"), ("1.2", "passes")])
    assert results == {"1.1": (ERROR, "the process checking garbage ended (exit code 0); did the answer exit?"),
                       "1.2": (RECORD, {"answer": "passes"})}


def test_a_process_that_exits_half_way_is_an_error_that_names_its_exit_code(tmp_path):
    results = records(tmp_path, [("1.1", "exits"), ("1.2", "cut"), ("1.3", "passes")])
    assert results == {
        "1.1": (ERROR, "the process checking exits ended (exit code 3: the answer called exit); did the answer exit?"),
        "1.2": (ERROR, "the process checking cut ended (exit code 4); did the answer exit?"),
        "1.3": (RECORD, {"answer": "passes"}),
    }


class _Mkdir:
    """Unpickling it makes a folder: a pickle that runs code when it is read."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_the_grader_never_unpickles_a_frame(tmp_path):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Mkdir(marker))
    results = records(tmp_path / "processes", [("1.1", "pickled")], [payload.hex()])
    assert results == {"1.1": (ERROR, "the process checking pickled ended (exit code 0); did the answer exit?")}
    assert not marker.exists()
    pickle.loads(payload)  # the payload is live: read as a pickle, it runs
    assert marker.is_dir()


def test_a_process_that_never_gets_ready_times_out_though_its_work_would_fill_the_socket(tmp_path):
    # A process stuck before it reads its work: the work (more than a socket holds) is not sent,
    # since the write would wait for a reader that never comes.
    cells = [(1, "x = 1  # " + "a long cell " * 10_000)]
    results = on_a_thread(lambda: answer_records(lambda: AnswerProcess(SANDBOX, tmp_path, [], "import time; "
                                                                       "time.sleep(600)"),
                                                 cells, [("1.1", "passes")], CHECK, CHECK, {}), GUARD)
    [(status, why)] = results.values()
    assert status == TIMED_OUT and "had not imported the package" in why


@SANDBOXED
def test_closing_an_answer_process_ends_what_it_started_in_a_session_of_its_own(tmp_path):
    marker = f"daemon-{uuid.uuid4().hex}"
    process = AnswerProcess(SANDBOX, tmp_path, [marker], STAND_IN)
    try:
        assert process.next(time.monotonic() + START) == ("ready",)
        send(process.connection, {"cells": [], "answers": [("1.1", "daemon")]})
        for expected in [("replayed", []), ("start", "1.1"), ("record", "1.1", {"answer": "daemon"})]:
            assert process.next(time.monotonic() + START) == expected
        deadline = time.monotonic() + START  # its command line can show a moment after its parent goes on
        while not (daemons := _daemons(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemons, "the daemon did not start"
    finally:
        process.close()
    assert all_ended(daemons), "the daemon outlived the answer process's sandbox"


def _daemons(marker: str) -> list[str]:
    """The stand-in's daemons: processes that sleep with ``marker`` as their argument."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and f"time.sleep(600)\0{marker}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_the_answer_processs_end_of_the_socket_cannot_be_opened_through_proc(tmp_path):
    # A pipe's end could be opened again, for writing, by any process of the same user; a socket's cannot.
    process = AnswerProcess(Sandbox(None), tmp_path, [], STAND_IN)
    try:
        assert process.next(time.monotonic() + START) == ("ready",)
        folder = Path(f"/proc/{process.popen.pid}/fd")
        sockets = [fd for fd in folder.iterdir() if os.readlink(fd).startswith("socket:")]
        assert sockets
        for fd in sockets:
            with pytest.raises(OSError):
                os.open(fd, os.O_WRONLY | os.O_NONBLOCK)
    finally:
        process.close()
