"""The benchmark run: every implementation at every size, checked, timed and measured.

Before timing, every implementation's output is compared with the textbook module's, so a table
never compares functions that differ. Each is then timed forward (under ``torch.no_grad``) and
forward+backward (a training step without the optimiser) by the course's one timing policy,
:func:`mha_course.timing.time_interleaved`: the implementations take turns in rotated rounds, so
that the drifting speed of a shared machine affects them alike, and each reports the median over
the rounds. The run also records, per implementation: its peak memory (on CUDA the caching
allocator's statistics; on the CPU the growth of the peak resident memory of a fresh child
process, see :mod:`mha_course.bench.memory`) and, on the CPU, the minor page faults per call in
that child; its multiply-adds (from :mod:`mha_course.cost`) and the FLOP/s they imply, next to
the ceiling of a plain matrix product measured at the start and the end of the same run
(:mod:`mha_course.bench.machine`, which also says when the machine moved too much to trust it).
"""

from __future__ import annotations

from contextlib import contextmanager

import sys
import time
from dataclasses import asdict

import torch

from ..cost import class_d_out, multiply_adds
from ..data import random_batch
from ..device import get_device
from ..implementations import IMPLEMENTATIONS
from tqdm import tqdm
from ..timing import SLOW_CALL_S, time_interleaved, time_once
from .machine import cpu_memory_unsupported_reason, metadata, observe, stability
from .results import FORMAT_VERSION, add_ratios
from .settings import BenchSettings
from .sizes import BenchConfig
from .steps import build_for, cuda_peak_memory, make_step


@contextmanager
def memory_probe(wanted: bool, device: torch.device):
    """The probe a run on the CPU measures peak memory with, open for the run and closed after it.

    Yields ``(probe, skipped_because)``: the :class:`~mha_course.bench.memory.CpuMemoryProbe`, or
    ``None`` when memory is not wanted, on a GPU (the allocator's statistics serve there) or where the
    platform cannot measure it, and then the reason, printed once.
    """
    probe, skipped_because = None, None
    if wanted and device.type == "cpu":
        skipped_because = cpu_memory_unsupported_reason()
        if skipped_because:
            print(f"peak memory is not measured: {skipped_because}.", file=sys.stderr)
        else:
            from .memory import CpuMemoryProbe  # POSIX only: imported where it runs

            probe = CpuMemoryProbe()
    try:
        yield probe, skipped_because
    finally:
        if probe is not None:
            probe.close()


def run_benchmark(settings: BenchSettings) -> dict:
    """Time every implementation of ``settings`` at every size; return the results as a JSON-ready dict.

    Returns:
        ``{"meta": {...}, "configs": [...], "implementations": {...}, "rows": [...]}``; each row is
        one (config, implementation, mode) with ``median_s``, ``iqr_s``, ``runs``, ``vs_batched``,
        ``vs_raw_sdpa``, ``multiply_adds``, ``flops_per_s``, ``ceiling_fraction``, ``max_abs_diff``
        (against the textbook module's output) and, when memory is measured, ``peak_bytes``,
        ``memory_vs_raw_sdpa``, ``minor_faults_per_call`` and ``peak_method`` (how the peak was
        read); or ``skipped`` with the reason. ``meta`` holds the machine, the settings, the
        ceiling and load at the start and end, and ``stability_warnings``.
    """
    device = prepare_run(settings, BenchSettings, "BenchSettings(configs=(CONFIGS['small-4'],), ...) or "
                         "BenchSettings.for_command(...)")
    with memory_probe(settings.memory, device) as (probe, skipped_because):
        results = _Run(settings, device, settings.memory and not skipped_because, probe).results()
    if skipped_because:
        results["meta"]["memory_skipped"] = skipped_because
    return results


def prepare_run(settings, kind: type, example: str) -> torch.device:
    """Check that ``settings`` is a ``kind``, set its thread count; return its device."""
    if not isinstance(settings, kind):
        raise TypeError(f"settings must be a {kind.__name__}, got {type(settings).__name__}; build one with "
                        f"{example}.")
    device = get_device(settings.device)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    return device


def observed_run(settings, device: torch.device, bar: tqdm, measure, implementations: dict,
                 memory: bool = False, benchmark: str | None = None) -> dict:
    """The frame of every run: the matmul ceiling and the load observed at the start, the rows of
    ``measure()``, the ceiling and load again at the end; then each measured row's fraction of the
    ceiling and the run's metadata. Returns the results dict (``meta``, ``configs``,
    ``implementations``, ``rows``), with ``meta["benchmark"]`` when ``benchmark`` is given.
    """
    threads = torch.get_num_threads()
    started = time.perf_counter()
    ceiling_time = min(settings.min_run_time, 0.5)
    bar.set_postfix_str("matmul ceiling and load, at the start")
    start = observe(device, settings.ceiling_size, ceiling_time)
    bar.update()
    rows = measure()
    bar.set_postfix_str("matmul ceiling and load, at the end")
    end = observe(device, settings.ceiling_size, ceiling_time)
    bar.update()
    bar.close()
    seconds = time.perf_counter() - started
    stable = stability(start, end, threads=threads, seconds=seconds)
    for row in rows:
        if "flops_per_s" in row:  # a skipped row has none
            row["ceiling_fraction"] = row["flops_per_s"] / stable["matmul_ceiling"]["flops_per_s"]
    meta = metadata(device, threads, settings, seconds, memory, stable, FORMAT_VERSION)
    return {
        "meta": meta if benchmark is None else {"benchmark": benchmark, **meta},
        "configs": [asdict(c) for c in settings.configs],
        "implementations": implementations,
        "rows": rows,
    }


class _Run:
    """One run's state: its settings, device, progress bar and memory probe."""

    def __init__(self, settings: BenchSettings, device: torch.device, memory: bool, probe):
        self.settings, self.device, self.memory, self.probe = settings, device, memory, probe
        self.threads = torch.get_num_threads()
        total = 2 + len(settings.configs) * len(settings.modes) * len(settings.implementations)
        self.bar = tqdm(total=total, desc="bench", disable=not settings.progress)

    def results(self) -> dict:
        s = self.settings
        results = observed_run(s, self.device, self.bar, lambda: [row for c in s.configs for row in self._size(c)],
                               {n: IMPLEMENTATIONS[n].description for n in s.implementations}, memory=self.memory)
        add_ratios(results["rows"])
        return results

    def _size(self, config: BenchConfig) -> list[dict]:
        s = self.settings
        impls, skipped = build_for(config, self.device, s.implementations, seed=s.seed)
        x = random_batch(config.batch, config.num_tokens, config.d_in, seed=1, device=self.device)
        with torch.no_grad():
            reference = impls["batched"].forward(x) if "batched" in impls else None
        checked, forward_time = {}, {}  # name -> max |output - textbook output|, and that call's seconds
        for name, impl in impls.items():  # the check is also the first (warm-up) forward call
            self.bar.set_postfix_str(f"{config.name}: checking {name}")
            for module in impl.modules:
                module.eval()
            with torch.no_grad():
                forward_time[name], out = time_once(lambda impl=impl: impl.forward(x))
            checked[name] = float((out.float() - reference.float()).abs().max()) if reference is not None else None
            del out
        rows = []
        for mode in s.modes:
            steps, one_call = {}, {}
            for name, impl in impls.items():
                steps[name] = make_step(impl, mode, x)
                one_call[name] = forward_time[name]
                if mode != "forward":
                    # A warm-up, untimed: the first training step in a process also loads code (the
                    # first backward pass with a given gradient imports sympy). A step costs about
                    # three forward passes.
                    self.bar.set_postfix_str(f"{config.name} {mode}: warming up {name}")
                    steps[name]()
                    one_call[name] *= 3
            label = f"{config.name} {mode}"
            timings = time_interleaved(
                steps, rounds=s.rounds, min_run_time=s.min_run_time, call_seconds=one_call,
                on_call=lambda r, name, label=label: self.bar.set_postfix_str(f"{label}: round {r + 1}/{s.rounds}, {name}"))
            for name in s.implementations:
                row = {"config": config.name, "implementation": name, "mode": mode}
                if name in skipped:
                    rows.append({**row, "skipped": skipped[name]})
                else:
                    rows.append(self._row(row, config, impls[name], mode, timings[name], steps[name],
                                          one_call[name], checked[name]))
                self.bar.update()
        return rows

    def _row(self, row, config, impl, mode, timing, step, one_call, max_abs_diff) -> dict:
        macs = multiply_adds(impl.cost_kind, config.batch, config.num_tokens, config.d_in,
                             class_d_out(impl.cost_kind, config.num_heads, config.head_dim), config.num_heads)
        work = macs.total if mode == "forward" else macs.forward_backward
        row.update(median_s=timing.median, iqr_s=timing.iqr, runs=timing.runs, multiply_adds=work,
                   flops_per_s=2 * work / timing.median, max_abs_diff=max_abs_diff)
        if self.memory:
            self.bar.set_postfix_str(f"{config.name} {mode}: memory of {impl.name}")
            if self.probe is not None:
                # Page faults of a slow training step are skipped: one more call of many seconds.
                slow = one_call >= SLOW_CALL_S and mode != "forward"
                calls = 0 if slow else self.settings.memory_calls
                row.update(self.probe.measure(config, impl.name, mode, self.threads, calls))
            else:
                row.update(cuda_peak_memory(step, self.device))
        return row

