"""The grader's reading of the answer process's frames (mha_course.grading.answer_process).

The answer process is played here by a stand-in (a few lines of the standard library, started as the
real one is: ``python -I -S -B``, its end of the socket pair passed by number) that answers each exercise
as its answer's name says: with a record, a frame larger than the pipe's buffer, a frame started and
never finished, a payload that is not marshal data, a pickle, or an exit half-way. Each test runs
``answer_records`` (or ``AnswerProcess``) on a thread and waits for it with a generous bound, so that
a grader that hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import marshal
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import POSIX_GRADING, on_a_thread, process_running
from mha_course.exercises.framework import ERROR
from mha_course.grading import answer_process
from mha_course.grading.answer_process import RECORD, TIMED_OUT, AnswerProcess, answer_records
from mha_course.grading import confinement
from mha_course.grading.confinement import TOKEN_VARIABLE, holders

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
    elif name == "helper":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=(fd,))
        os.write(fd, struct.pack("!i", 1000) + b"partial")
        time.sleep(600)
    elif name == "garbage":
        frame(b"\xff\xfe this is not marshal data")
        sys.exit(0)
    elif name == "pickled":
        with open("../../payload.pickle", "rb") as file:
            frame(file.read())
        sys.exit(0)
    elif name == "exits":
        sys.stderr.write("the answer called exit\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "daemon":  # a process of its own session, which outlives the process group
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        with open("daemon.pid", "w", encoding="utf-8") as file:
            file.write(str(daemon.pid))
        frame(marshal.dumps(("record", exercise_id, {"answer": name})))
    elif name == "cut":
        os.write(fd, struct.pack("!i", 1000) + b"partial")
        os._exit(4)
os._exit(0)
"""

#: Generous bounds: a grader that has not answered by then is stuck, not slow.
GUARD = 120.0
START = 30.0
CHECK = 3.0


class FolderSnapshot:
    """What answer_records asks of the package's snapshot: a folder for each new process."""

    def write_copy(self, target: Path) -> Path:
        target.mkdir(parents=True)
        return target


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(AnswerProcess, "BOOT", STAND_IN)


def records(folder: Path, answers: list[tuple[str, str]]) -> dict[str, tuple]:
    """answer_records on a thread, waited for at most GUARD seconds."""
    return on_a_thread(lambda: answer_records(FolderSnapshot(), folder, [], answers, CHECK, start_timeout=START),
                       GUARD)


def test_a_frame_started_and_never_finished_times_out_and_the_rest_go_to_a_new_process(stand_in, tmp_path):
    results = records(tmp_path, [("1.1", "unfinished"), ("1.2", "passes")])
    assert results == {"1.1": (TIMED_OUT,), "1.2": (RECORD, {"answer": "passes"})}
    assert sorted(p.name for p in tmp_path.glob("process-*")) == ["process-1", "process-2"]


def test_closing_the_process_kills_its_children_too_so_the_reading_ends(stand_in, tmp_path):
    # The stand-in's child holds the socket's end and sleeps: the frames end only once it is
    # killed with its parent (the whole process group).
    (tmp_path / "package").mkdir()
    process = AnswerProcess(tmp_path / "package", tmp_path)
    try:
        assert process.ready(time.monotonic() + START)
        process.send({"cells": [], "answers": [("1.1", "helper")]})
        assert process.frames.next(time.monotonic() + START) == ("replayed", [])
        assert process.frames.next(time.monotonic() + START) == ("start", "1.1")
        assert process.frames.next(time.monotonic() + CHECK) == "timeout"
    finally:
        process.close()
    process.frames.thread.join(GUARD)
    assert not process.frames.thread.is_alive(), "the pipe is still held open: the child was not killed"
    assert process.frames.next(time.monotonic() + CHECK) is None


def test_a_frame_larger_than_the_pipe_buffer_arrives_whole(stand_in, tmp_path):
    results = records(tmp_path, [("1.1", "large"), ("1.2", "passes")])
    expected = {"values": list(range(200_000)), "text": "x" * 300_000}
    assert len(marshal.dumps(expected)) > 1 << 16
    assert results == {"1.1": (RECORD, expected), "1.2": (RECORD, {"answer": "passes"})}


def test_the_answer_process_writes_the_frames_multiprocessing_reads():
    # The real writer (kept-aside os.write, struct and marshal) against multiprocessing's reader,
    # with a frame larger than the pipe's buffer: the writer blocks until it is read.
    from mha_course.grading.answer_probing import _send

    message = ("record", "1.1", {"values": list(range(100_000)), "text": "é" * 100_000})
    reader, writer = multiprocessing.Pipe(duplex=False)

    def write() -> None:
        try:
            _send(writer.fileno(), message)
            _send(writer.fileno(), ("start", "1.2"))
        finally:
            writer.close()  # a frame that claimed more than it sent ends in an error, not a wait

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    with reader:
        assert reader.poll(GUARD)
        first = reader.recv_bytes()
        assert len(first) > 1 << 16 and marshal.loads(first) == message
        assert marshal.loads(reader.recv_bytes()) == ("start", "1.2")
        with pytest.raises(EOFError):
            reader.recv_bytes()
    thread.join(GUARD)


def test_a_payload_that_is_not_marshal_data_is_an_error(stand_in, tmp_path):
    results = records(tmp_path, [("1.1", "garbage"), ("1.2", "passes")])
    assert results == {"1.1": (ERROR, "the process checking garbage ended (exit code 0); did the answer exit?"),
                       "1.2": (RECORD, {"answer": "passes"})}


def test_a_process_that_exits_half_way_is_an_error_that_names_its_exit_code(stand_in, tmp_path):
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


def test_the_grader_never_unpickles_a_frame(stand_in, tmp_path, monkeypatch):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Mkdir(marker))
    (tmp_path / "payload.pickle").write_bytes(payload)
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the grader unpickled a frame")

    monkeypatch.setattr(multiprocessing.reduction.ForkingPickler, "loads", refuse)
    monkeypatch.setattr(multiprocessing.connection, "_ForkingPickler", multiprocessing.reduction.ForkingPickler)
    results = records(tmp_path, [("1.1", "pickled")])
    assert results == {"1.1": (ERROR, "the process checking pickled ended (exit code 0); did the answer exit?")}
    assert calls == [] and not marker.exists()
    pickle.loads(payload)  # the payload is live: read as a pickle, it runs
    assert marker.is_dir()


def test_frames_come_with_a_deadline_and_end_with_the_pipe():
    # Frames is built on a multiprocessing connection (poll, recv_bytes), not on a reader of its own.
    reader, writer = multiprocessing.Pipe(duplex=False)
    frames = answer_process.Frames(reader)
    writer.send_bytes(marshal.dumps(("ready",)))
    assert frames.next(time.monotonic() + GUARD) == ("ready",)
    assert frames.next(time.monotonic() + 0.5) == "timeout"
    writer.close()
    assert frames.next(time.monotonic() + GUARD) is None


def test_a_process_that_never_gets_ready_times_out_though_its_work_would_fill_the_pipe(monkeypatch, tmp_path):
    # A process stuck before it reads its standard input: the work (more than a pipe holds) is not
    # written to it, since the write would wait for a reader that never comes.
    monkeypatch.setattr(AnswerProcess, "BOOT", "import time; time.sleep(600)")
    cells = [(1, "x = 1  # " + "a long cell " * 10_000)]
    results: dict[str, tuple] = {}
    thread = threading.Thread(daemon=True, target=lambda: results.update(
        answer_records(FolderSnapshot(), tmp_path, cells, [("1.1", "passes")], CHECK, start_timeout=CHECK)))
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), f"answer_records was still running after {GUARD:g} s: the grader hangs"
    [(status, why)] = results.values()
    assert status == TIMED_OUT and "had not imported the package" in why


def test_a_process_the_answer_started_in_a_session_of_its_own_is_ended_with_it(stand_in, tmp_path):
    (tmp_path / "package").mkdir()
    process = AnswerProcess(tmp_path / "package", tmp_path, token="answer-daemon-test")
    try:
        assert process.ready(time.monotonic() + START)
        process.send({"cells": [], "answers": [("1.1", "daemon")]})
        assert process.frames.next(time.monotonic() + START) == ("replayed", [])
        assert process.frames.next(time.monotonic() + START) == ("start", "1.1")
        assert process.frames.next(time.monotonic() + START) == ("record", "1.1", {"answer": "daemon"})
        daemon = int((tmp_path / "daemon.pid").read_text(encoding="utf-8"))  # it was started, in a session of its own
    finally:
        process.close()
    assert holders("answer-daemon-test") == []
    assert not process_running(daemon), "the daemon outlived the answer process's close()"


def test_the_answer_processs_end_of_the_socket_cannot_be_opened_through_proc(stand_in, tmp_path):
    # A pipe's end could be opened again, for writing, by any process of the same user; a socket's cannot.
    (tmp_path / "package").mkdir()
    process = AnswerProcess(tmp_path / "package", tmp_path)
    try:
        assert process.ready(time.monotonic() + START)
        folder = Path(f"/proc/{process.process.pid}/fd")
        sockets = [fd for fd in folder.iterdir() if os.readlink(fd).startswith("socket:")]
        assert sockets
        for fd in sockets:
            with pytest.raises(OSError):
                os.open(fd, os.O_WRONLY | os.O_NONBLOCK)
    finally:
        process.close()


# fork() in a process with threads warns: the children here only sleep and exec.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_process_forked_to_start_a_program_is_not_taken_for_an_orphan_but_one_that_stays_a_copy_is():
    # A child of this process that still runs its command and has no token yet, as a kernel has
    # between fork and exec (on another thread of the grader), is given time to start its program.
    starting = os.fork()
    if starting == 0:
        try:
            time.sleep(0.3)
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)"],
                      {**os.environ, TOKEN_VARIABLE: "orphan-test"})
        finally:
            os._exit(1)
    lingering = os.fork()
    if lingering == 0:
        time.sleep(60)
        os._exit(0)
    try:
        found = confinement._orphans(grace=20.0)  # room for a busy machine
        assert starting not in found, "a child about to start its program was taken for an orphan"
        assert lingering in found, "a tokenless copy of the grader that never started a program was spared"
    finally:
        for pid in (starting, lingering):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
