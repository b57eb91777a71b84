"""Peak memory of one call on the CPU, measured in a fresh child process (POSIX only).

Needs ``os.fork`` and the ``resource`` module (Linux, macOS), and reads ``/proc/self`` where the
kernel has it (Linux) for an exact peak. Nothing imports this module except the benchmark run,
and only when it measures memory on the CPU on a platform where
:func:`mha_course.bench.machine.cpu_memory_unsupported_reason` returns ``None``: elsewhere the run skips the measurement with a message, and the rest of
:mod:`mha_course.bench` works on any operating system.

A server process (``python -m mha_course.bench.memory``) imports torch once and computes nothing;
for each measurement it forks a child, which runs the call and reports. So every measurement
starts in a process with no allocator history, without paying for a torch import each time.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from ..data import random_batch
from .sizes import BenchConfig
from .steps import MODES, build_for, make_step
from .deltanet_steps import prompt_calls
from .tiled_steps import tiled_calls, window_calls

# ru_maxrss is in kilobytes on Linux and in bytes on macOS.
_MAXRSS_SCALE = 1 if sys.platform == "darwin" else 1024


def _peak_reset_supported() -> bool:
    return Path("/proc/self/clear_refs").exists() and Path("/proc/self/status").exists()


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _cpu_memory_child(config: BenchConfig, name: str, mode: str, threads: int, calls: int) -> dict:
    """Runs in a fresh child process: the peak memory of one call, then faults per later call."""
    torch.set_num_threads(threads)
    # Warm up on a 4-token input first: the first call in a process also starts the thread pool
    # and loads code (tens of MiB for the first backward pass), which is not the call's own memory.
    tiny = BenchConfig("warm-up", 1, 4, config.d_in, config.num_heads, config.head_dim, "")
    tiny_impls, _ = build_for(tiny, "cpu", [name])
    make_step(tiny_impls[name], mode, random_batch(1, 4, config.d_in))()
    del tiny_impls
    impls, _ = build_for(config, "cpu", [name])
    x = random_batch(config.batch, config.num_tokens, config.d_in, seed=1)
    step = make_step(impls[name], mode, x)
    result = first_call_peak(step)
    faults = None
    if calls:  # steady state: the faults of each later call
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(calls):
            step()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) / calls
    return {"peak_bytes": result["peak_bytes"], "minor_faults_per_call": faults, "peak_method": result["peak_method"]}


def first_call_peak(step) -> dict:
    """The growth of this process's peak resident memory during ``step()``: ``peak_bytes`` and
    ``peak_method``. Call it in a fresh child process, once, after a warm-up."""
    gc.collect()
    exact = _peak_reset_supported()
    if exact:
        Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")  # reset the peak (VmHWM) to the current RSS
        before = _status_bytes("VmRSS")
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_SCALE
    step()  # the first call in this process: nothing is cached or reused from earlier calls
    if exact:
        peak = _status_bytes("VmHWM") - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_SCALE - before
    return {"peak_bytes": max(int(peak), 0), "peak_method": "VmHWM growth" if exact else "ru_maxrss growth"}


#: The line the memory server writes once it has warmed up and waits for requests.
READY = '{"ready": true}'


class CpuMemoryProbe:
    """Measures peak resident memory in fresh child processes, one per measurement.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self):
        self._server = subprocess.Popen(
            [sys.executable, "-m", "mha_course.bench.memory"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        # Wait until the server has warmed up, so that its start-up work is over before the run
        # measures the machine's load (it would count as other programs' work).
        if self._server.stdout.readline().strip() != READY:
            raise RuntimeError(f"the memory server did not start (exit code {self._server.poll()}); see its stderr.")

    def measure(self, config: BenchConfig, name: str, mode: str, threads: int, calls: int, **request) -> dict:
        """The peak memory of one call; a ``benchmark="tiled"`` request goes to
        :func:`tiled_memory_child` with the rest of ``request``, a ``benchmark="deltanet"`` one to
        :func:`deltanet_memory_child`."""
        request = {"config": asdict(config), "name": name, "mode": mode, "threads": threads, "calls": calls,
                   **request}
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        line = self._server.stdout.readline()
        if not line:
            raise RuntimeError(f"the memory server stopped (exit code {self._server.poll()}); see its stderr.")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"measuring the memory of {name} ({config.name}, {mode}) failed: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        if self._server.poll() is None:
            self._server.stdin.close()
            self._server.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tiled_memory_child(config: BenchConfig, name: str, mode: str, threads: int, calls: int,
                       block_size: int) -> dict:
    """Runs in a fresh child process of the memory server: the peak memory of one call of ``name``."""
    torch.set_num_threads(threads)
    tiny = BenchConfig("warm-up", 1, 2 * block_size, 8, 1, 8, "")
    tiled_calls(tiny, block_size, mode=mode)[name]()  # loads the code paths once, as the main benchmark does
    step = tiled_calls(config, block_size, mode=mode)[name]
    return first_call_peak(lambda: step())


def deltanet_memory_child(config: BenchConfig, name: str, mode: str, threads: int, calls: int) -> dict:
    """Runs in a fresh child process of the memory server: the peak memory of one prompt call of ``name``
    (``bench --deltanet``)."""
    torch.set_num_threads(threads)
    tiny = BenchConfig("warm-up", 1, 70, 8, 1, 8, "")
    prompt_calls(tiny)[name]()  # loads the code paths once, as the main benchmark does
    step = prompt_calls(config)[name]
    return first_call_peak(lambda: step())


def window_memory_child(config: BenchConfig, name: str, mode: str, threads: int, calls: int, block_size: int,
                        window: int | None) -> dict:
    """Runs in a fresh child process of the memory server: the peak memory of one call of ``name``
    under ``window`` (``bench --window``)."""
    torch.set_num_threads(threads)
    tiny = BenchConfig("warm-up", 1, 2 * block_size, 8, 1, 8, "")
    window_calls(tiny, block_size, None if window is None else min(window, block_size), mode=mode)[name]()
    step = window_calls(config, block_size, window, mode=mode)[name]
    return first_call_peak(lambda: step())


def _child_for(request: dict):
    """The function that measures ``request`` (the ``benchmark`` key, if any, is taken out)."""
    benchmark = request.pop("benchmark", None)
    if benchmark == "tiled":
        return tiled_memory_child
    if benchmark == "deltanet":
        return deltanet_memory_child
    if benchmark == "window":
        return window_memory_child
    return _cpu_memory_child


def serve(requests=sys.stdin, replies=sys.stdout) -> None:
    """The memory server's loop: one JSON request per line in, one JSON reply per line out."""
    # Run every implementation once at a 4-token size here, single-threaded so that no thread
    # pool exists when the server forks: the code they load (autograd's first backward pass even
    # imports sympy, tens of MiB) is then loaded once, and each child starts warm but with a
    # fresh allocator.
    torch.set_num_threads(1)
    impls, _ = build_for(BenchConfig("warm-up", 1, 4, 4, 2, 2, ""), "cpu")
    for impl in impls.values():
        for mode in MODES:
            make_step(impl, mode, random_batch(1, 4, 4))()
    del impls
    # Children inherit every Python object; freezing them keeps the children's garbage collector
    # from touching (and so copying) the whole inherited heap.
    gc.collect()
    gc.freeze()
    replies.write(READY + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report through the pipe, exit without cleanup
            os.close(read_end)
            try:
                request["config"] = BenchConfig(**request["config"])
                payload = {"result": _child_for(request)(**request)}
            except BaseException as error:  # report every failure to the parent
                payload = {"error": f"{type(error).__name__}: {error}"}
            with os.fdopen(write_end, "w") as pipe:
                pipe.write(json.dumps(payload))
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            payload = pipe.read()
        os.waitpid(pid, 0)
        replies.write((payload or json.dumps({"error": "the child exited without a result"})) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()
