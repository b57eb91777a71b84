"""The machine a run measures: its matmul ceiling, its load, and whether they held still.

A benchmark is only as good as the machine's quiet. On a shared machine, timings under load
moved ratios by up to 30 % and the matmul ceiling by 3x. So a run measures the ceiling and the
machine's load at its start and at its end, stores both, and :func:`stability_warnings` says the
run is not trustworthy when either moved by more than :data:`TOLERANCE`.

The load is measured directly where Linux's ``/proc/stat`` exists: the cores that other programs
keep busy during one second in which the run itself sleeps (:func:`other_work_cores`). The
1-minute load average, which lags by about a minute and so still holds a previous run's threads
when the next run starts, is recorded too, and judged only where the direct measure is missing.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..timing import measure

#: A run whose matmul ceiling or load moved by more than this fraction gets a warning.
TOLERANCE = 0.10

#: Time constant of the kernel's 1-minute load average, in seconds.
LOAD_AVERAGE_S = 60.0

#: Seconds over which :func:`other_work_cores` watches the machine while the run sleeps.
OTHER_WORK_WINDOW_S = 1.0


def matmul_ceiling(device, n: int | None = None, min_run_time: float = 0.3) -> dict:
    """FLOP/s of one square float32 matrix product on ``device``: the ceiling for this run.

    Attention is mostly matrix products, so no implementation can do its products faster than
    ``torch.mm`` does a large square one on the same device, threads and precision. (A kernel
    that skips work, such as the causal fused kernel skipping masked tiles, can still show more
    than 100% when its FLOP/s are computed from the full count of multiply-adds.)

    Example:
        >>> matmul_ceiling("cpu", n=64, min_run_time=0.01)["flops_per_s"] > 0
        True
    """
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(3):  # warm up: the first products start the thread pool and fault in the memory
        torch.mm(a, b)
    timing = measure(torch.mm, a, b, min_run_time=min_run_time)
    return {"n": n, "median_s": timing.median, "flops_per_s": 2 * n**3 / timing.median}


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages, or ``None`` where the platform has none (Windows)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _busy_cpu_seconds() -> float | None:
    """CPU seconds every core of the machine has spent busy since boot, from ``/proc/stat`` (Linux)."""
    try:
        lines = Path("/proc/stat").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    fields = lines[0].split() if lines else []
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy.
    ticks = [int(v) for v in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def other_work_cores(window: float | None = None) -> float | None:
    """How many cores other programs keep busy now: watched over ``window`` seconds (default
    ``OTHER_WORK_WINDOW_S``) while this process sleeps, its own CPU time taken out. ``None`` where the platform has no ``/proc/stat``.

    Example:
        >>> cores = other_work_cores(0.05)
        >>> cores is None or cores >= 0
        True
    """
    before, own_before, started = _busy_cpu_seconds(), _own_cpu_seconds(), time.monotonic()
    if before is None:
        return None
    time.sleep(OTHER_WORK_WINDOW_S if window is None else window)
    after, own_after, elapsed = _busy_cpu_seconds(), _own_cpu_seconds(), time.monotonic() - started
    if after is None or elapsed <= 0:
        return None
    return round(max(0.0, (after - before) - (own_after - own_before)) / elapsed, 2)


@dataclass(frozen=True)
class MachineState:
    """The ceiling and the load at one moment of a run."""

    ceiling: dict  # matmul_ceiling(...)
    load: list[float] | None  # load_average()
    others: float | None = None  # other_work_cores(): cores other programs kept busy, measured directly


def observe(device, ceiling_size: int | None, min_run_time: float) -> MachineState:
    """Measure the ceiling and the load now (the load first, while the machine is not busy with the ceiling)."""
    others, load = other_work_cores(), load_average()
    return MachineState(ceiling=matmul_ceiling(device, ceiling_size, min_run_time=min_run_time),
                        load=load, others=others)


def stability(start: MachineState, end: MachineState, *, threads: int, seconds: float) -> dict:
    """The metadata of a run's stability: both observations, and the warnings they call for.

    The ceiling recorded for the run is the faster of the two; both are kept.
    """
    ceiling = {**max(start.ceiling, end.ceiling, key=lambda c: c["flops_per_s"]),
               "flops_per_s_start": start.ceiling["flops_per_s"], "flops_per_s_end": end.ceiling["flops_per_s"]}
    return {
        "matmul_ceiling": ceiling,
        "load": {"start": start.load, "end": end.load},
        "other_work_cores": {"start": start.others, "end": end.others},
        "stability_warnings": stability_warnings(start, end, threads=threads, seconds=seconds),
    }


def stability_warnings(start: MachineState, end: MachineState, *, threads: int, seconds: float,
                       tolerance: float = TOLERANCE, cpus: int | None = None) -> list[str]:
    """Why a run is not trustworthy: its ceiling or the machine's load moved by more than ``tolerance``,
    or other work already needed the cores the run's threads wanted.

    The ceiling is compared as measured. Where both observations measured the other work directly
    (``others``, Linux), the run is busy when that work plus the run's threads needs more than the
    ``cpus`` cores, and the load moved when that work changed by more than ``tolerance`` of the cores.
    Elsewhere the load is the 1-minute load average, which by the end
    includes the run's own ``threads`` busy threads: they are taken out (weighted by how much of
    the average's minute they had to fill it, ``1 - exp(-seconds / 60)``) so that only the other
    work on the machine is compared, and a change is measured against one busy core at least, so
    that an idle machine going from 0.01 to 0.05 is no warning. A machine whose other work at the
    start, plus the run's threads, needs more than its ``cpus`` cores (default ``os.cpu_count()``) is
    busy however steady it stays.

    Example:
        >>> quiet = MachineState({"flops_per_s": 20e9}, [0.1, 0.1, 0.1])
        >>> stability_warnings(quiet, MachineState({"flops_per_s": 21e9}, [1.1, 0.8, 0.4]), threads=1, seconds=600,
        ...                    cpus=2)
        []
        >>> busy = MachineState({"flops_per_s": 57.4e9}, [2.5, 1.0, 0.5])
        >>> for warning in stability_warnings(quiet, busy, threads=1, seconds=600, cpus=2):
        ...     print(warning)
        the matmul ceiling moved from 20.0 to 57.4 GFLOP/s (+187%) between the start and the end of the run: the machine's speed changed while it was being measured
        the machine's load from other work moved from 0.10 to 1.50 (1-minute load average, the run's own 1 thread taken out): other programs competed for the cores during the run
    """
    warnings = []
    before, after = start.ceiling["flops_per_s"], end.ceiling["flops_per_s"]
    change = after / before - 1
    if abs(change) > tolerance:
        warnings.append(f"the matmul ceiling moved from {before / 1e9:.1f} to {after / 1e9:.1f} GFLOP/s "
                        f"({change:+.0%}) between the start and the end of the run: the machine's speed "
                        "changed while it was being measured")
    cpus = cpus or os.cpu_count() or 1
    if start.others is not None and end.others is not None:
        return warnings + _other_work_warnings(start.others, end.others, threads, cpus, tolerance)
    if start.load is not None and start.load[0] + threads > cpus * (1 + tolerance):
        warnings.append(f"the machine was busy: other work kept {start.load[0]:.2f} of its {cpus} cores busy "
                        f"(1-minute load average) when the run started, so its {threads} "
                        f"thread{'s' if threads != 1 else ''} had to share them")
    if start.load is not None and end.load is not None:
        own = threads * (1 - math.exp(-max(seconds, 0.0) / LOAD_AVERAGE_S))
        others_before, others_after = start.load[0], max(end.load[0] - own, 0.0)
        if abs(others_after - others_before) > tolerance * max(others_before, 1.0):
            warnings.append(f"the machine's load from other work moved from {others_before:.2f} to "
                            f"{others_after:.2f} (1-minute load average, the run's own {threads} "
                            f"thread{'s' if threads != 1 else ''} taken out): other programs competed for "
                            "the cores during the run")
    return warnings


def _other_work_warnings(before: float, after: float, threads: int, cpus: int, tolerance: float) -> list[str]:
    """The load warnings from the direct measure: other work busy at the start, or changed by more than
    ``tolerance`` of the machine's cores between the start and the end."""
    plural = "s" if threads != 1 else ""
    warnings = []
    if before + threads > cpus * (1 + tolerance):
        warnings.append(f"the machine was busy: other work kept {before:.2f} of its {cpus} cores busy "
                        f"(measured over {OTHER_WORK_WINDOW_S:g} s) when the run started, so its {threads} "
                        f"thread{plural} had to share them")
    if abs(after - before) > tolerance * cpus:
        warnings.append(f"the cores kept busy by other work moved from {before:.2f} to {after:.2f} of {cpus} "
                        f"(more than {tolerance:.0%} of the cores): other programs competed for the cores "
                        "during the run")
    return warnings


def untrustworthy_message(warnings: list[str]) -> str:
    """The warning the command prints: that the run is not trustworthy, why, and what to do."""
    reasons = "".join(f"\n  - {w}" for w in warnings)
    return ("WARNING: this run is not trustworthy; its times and ratios may not hold on a quiet machine:"
            f"{reasons}\nRerun it when the machine is quiet (check `uptime`), and keep the run without "
            "this warning.")


def cpu_memory_unsupported_reason() -> str | None:
    """Why peak memory on the CPU cannot be measured here, or ``None`` when it can.

    The measurement (:mod:`mha_course.bench.memory`) forks a fresh child per call and reads its
    peak with the ``resource`` module: both exist on Linux and macOS, not on Windows.
    """
    missing = [what for what, present in (("os.fork", hasattr(os, "fork")),
                                          ("the resource module", importlib.util.find_spec("resource") is not None))
               if not present]
    if missing:
        return (f"this platform ({sys.platform}) lacks {' and '.join(missing)}, which the fresh-process "
                "measurement of peak memory needs (Linux and macOS have both)")
    return None


#: Where :func:`cache_sizes` reads the processor's caches on Linux.
SYSFS_CPU = Path("/sys/devices/system/cpu")


def _size_bytes(text: str) -> int:
    """``48K``, ``2048K``, ``32M`` or ``49152`` (sysfs and lscpu's ways of writing a size) in bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    factor = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * factor)


def _cpu_count(cpu_list: str) -> int:
    """How many processors a list such as ``0-1,4`` names."""
    count = 0
    for part in cpu_list.strip().split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1 if low else 0
    return count


def cache_sizes(sysfs: Path = SYSFS_CPU, lscpu: str | None = None) -> dict:
    """The processor's data caches, as the operating system reports them: level, size, shared by how many cores.

    Read from Linux's ``sysfs`` (``cpu0/cache/index*``); where that is absent, from the output of
    ``lscpu --caches --bytes`` (``lscpu`` is that output, for a test; by default the command is run
    when present). Instruction caches are left out. Returns ``{"source": ..., "caches": [...]}``, each
    cache ``{"name": "L2", "level": 2, "bytes": ..., "shared_by": cores}``, smallest level first;
    ``source`` is ``"sysfs"``, ``"lscpu"`` or ``"unavailable"`` (macOS, Windows: ``caches`` is then empty).

    Example:
        >>> found = cache_sizes()
        >>> found["source"] in ("sysfs", "lscpu", "unavailable"), all(c["bytes"] > 0 for c in found["caches"])
        (True, True)
    """
    caches = []
    for index in sorted((Path(sysfs) / "cpu0" / "cache").glob("index*")):
        try:
            kind = (index / "type").read_text(encoding="utf-8").strip()
            level = int((index / "level").read_text(encoding="utf-8"))
            size = _size_bytes((index / "size").read_text(encoding="utf-8"))
            shared = _cpu_count((index / "shared_cpu_list").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if kind != "Instruction":
            caches.append({"name": f"L{level}" + ("d" if kind == "Data" else ""), "level": level, "bytes": size,
                           "shared_by": shared})
    if caches:
        return {"source": "sysfs", "caches": sorted(caches, key=lambda c: c["level"])}
    if lscpu is None:
        import shutil
        import subprocess

        command = shutil.which("lscpu")
        if command:
            try:
                lscpu = subprocess.run([command, "--caches", "--bytes"], capture_output=True, text=True,
                                       timeout=10, check=True).stdout
            except (OSError, subprocess.SubprocessError):
                lscpu = None
    caches = _lscpu_caches(lscpu or "")
    return {"source": "lscpu" if caches else "unavailable", "caches": caches}


def _lscpu_caches(output: str) -> list[dict]:
    """The data caches in the table ``lscpu --caches --bytes`` prints (NAME ONE-SIZE ALL-SIZE ... TYPE LEVEL)."""
    lines = [line.split() for line in output.splitlines() if line.strip()]
    if not lines or "NAME" not in lines[0]:
        return []
    header = lines[0]
    caches = []
    for fields in lines[1:]:
        row = dict(zip(header, fields))
        try:
            one, total, level = _size_bytes(row["ONE-SIZE"]), _size_bytes(row["ALL-SIZE"]), int(row["LEVEL"])
        except (KeyError, ValueError):
            continue
        if row.get("TYPE") != "Instruction":
            # ALL-SIZE adds up every instance: the cores over the instances share one.
            shared = max(1, round((os.cpu_count() or 1) * one / total)) if total else None
            caches.append({"name": row["NAME"], "level": level, "bytes": one, "shared_by": shared})
    return sorted(caches, key=lambda c: c["level"])


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name where the platform says it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def metadata(device: torch.device, threads: int, settings, seconds: float, memory: bool,
             stable: dict, format_version: int) -> dict:
    """Everything a results file says about how and where it was measured."""
    return {
        "format_version": format_version,
        "device": device.type,
        "device_name": device_name(device),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": settings.quick,
        "min_run_time_s": settings.min_run_time,
        "rounds": settings.rounds,
        "memory_measured": memory,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        **stable,
        "cuda_tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None,
        "wall_time_s": seconds,
    }

