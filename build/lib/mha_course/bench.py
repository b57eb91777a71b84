"""The course's benchmark: what each implementation of causal multi-head attention costs.

``python -m mha_course bench`` times, in one process and one run, every way the course computes
causal multi-head attention, on the same weights and the same input:

========================  ==================================================================
``stacked``               :class:`MultiHeadAttentionWrapper`: the heads one after another
``batched``               :class:`MultiHeadAttention`: the textbook batched module
``fused_qkv``             :class:`FastMultiHeadAttention` with ``use_sdpa = False``: one fused
                          QKV projection, then the explicit scores, mask and softmax
``fast``                  :class:`FastMultiHeadAttention`: fused QKV + ``scaled_dot_product_attention``
``raw_sdpa``              :func:`sdpa_forward`: the textbook module's own three projections
                          around a bare ``scaled_dot_product_attention`` call
``torch_mha_weights``     ``torch.nn.MultiheadAttention(need_weights=True)``
``torch_mha``             ``torch.nn.MultiheadAttention(need_weights=False)``
========================  ==================================================================

Each is timed forward (under ``torch.no_grad``) and forward+backward (a training step without
the optimiser), with ``torch.utils.benchmark`` through :func:`mha_course.timing.measure`, in
rounds: the implementations take turns, so that the drifting speed of a shared machine affects
them alike and their ratios stay fair (see :func:`_interleaved_samples`). The run
also records, per implementation: the ratio of its median time to the textbook batched module's
and to raw SDPA's; its peak memory (on CUDA the caching allocator's statistics; on the CPU the
growth of the peak resident memory of a fresh child process that runs the call once) and, on
the CPU, the minor page faults per call in that child; its multiply-adds (from
:mod:`mha_course.cost`) and the FLOP/s they imply, next to the FLOP/s of a plain matrix product
measured in the same run. Before timing, every implementation's output is compared with the
textbook module's, so the table never compares functions that differ.

Results go to ``--out`` as JSON (everything), CSV (one row per measurement) and a PNG plot.
"""

from __future__ import annotations

import csv
import datetime as _dt
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from .cost import multiply_adds
from .data import random_batch
from .device import get_device
from .fast import FastMultiHeadAttention
from .interop import sdpa_forward, to_torch_multihead
from .masking import causal_mask
from .multihead import MultiHeadAttention
from .timing import Timing, measure
from .wrapper import MultiHeadAttentionWrapper

#: Version of the results format; bumped when a field changes meaning.
FORMAT_VERSION = 1

MODES = ("forward", "forward+backward")

#: Calls slower than this (seconds) are timed once in each of two rounds, and their training
#: steps get no page-fault count, so that the GPT-2-small size finishes in minutes on 2 cores.
SLOW_CALL_S = 1.0


@dataclass(frozen=True)
class BenchConfig:
    """One benchmarked size: an input ``(batch, num_tokens, d_in)`` and ``num_heads`` heads."""

    name: str
    batch: int
    num_tokens: int
    d_in: int
    num_heads: int
    head_dim: int
    description: str

    @property
    def d_out(self) -> int:
        """Total width of all heads (``d_out`` of :class:`MultiHeadAttention`)."""
        return self.num_heads * self.head_dim


#: The sizes of the full run, in the order the book shows them.
CONFIGS = {
    c.name: c
    for c in (
        BenchConfig("textbook", 2, 6, 3, 2, 2, "the running example: 2 x 6 tokens, d_in 3, 2 heads of width 2"),
        BenchConfig("small-4", 8, 256, 256, 4, 64, "batch 8, 256 tokens, width 256, 4 heads of 64"),
        BenchConfig("small-16", 8, 256, 256, 16, 16, "batch 8, 256 tokens, width 256, 16 heads of 16"),
        BenchConfig("gpt2-small", 8, 1024, 768, 12, 64, "GPT-2 small: batch 8, 1024 tokens, width 768, 12 heads of 64"),
    )
}

#: The sizes of ``--quick``: small enough for CI.
QUICK_CONFIGS = {
    c.name: c
    for c in (
        CONFIGS["textbook"],
        BenchConfig("tiny", 2, 32, 32, 4, 8, "batch 2, 32 tokens, width 32, 4 heads of 8"),
    )
}

#: Every implementation, in the order of the course, with a one-line description.
IMPLEMENTATIONS = {
    "stacked": "MultiHeadAttentionWrapper: heads stacked, computed one after another",
    "batched": "MultiHeadAttention: the textbook batched module",
    "fused_qkv": "FastMultiHeadAttention(use_sdpa=False): fused QKV, explicit attention",
    "fast": "FastMultiHeadAttention: fused QKV + scaled_dot_product_attention",
    "raw_sdpa": "scaled_dot_product_attention on MultiHeadAttention's own projections",
    "torch_mha_weights": "torch.nn.MultiheadAttention, need_weights=True",
    "torch_mha": "torch.nn.MultiheadAttention, need_weights=False",
}

#: The references that every time is divided by.
BASELINES = {"vs_batched": "batched", "vs_raw_sdpa": "raw_sdpa"}


# --------------------------------------------------------------------------------------------
# Building the implementations
# --------------------------------------------------------------------------------------------


@dataclass
class Implementation:
    """A callable ``x -> output`` and the modules whose parameters it trains."""

    name: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    modules: list
    cost_kind: str  # which formula of mha_course.cost counts its multiply-adds
    out_features: int  # width of the output, to shape the gradient of a training step


def _check_names(names, known, what):
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}: choose from {', '.join(known)}.")
    return list(names)


def build_implementations(config: BenchConfig, device, names: Iterable[str] | None = None, seed: int = 0):
    """Build the implementations for ``config`` on ``device``, all computing the same function.

    The stacked wrapper is built first (seeded); the textbook module gets its weights by
    :meth:`MultiHeadAttention.from_wrapper`, the fast path by
    :meth:`FastMultiHeadAttention.from_multihead` and PyTorch's module by
    :func:`to_torch_multihead`. Returns ``(implementations, skipped)``: a dict name ->
    :class:`Implementation`, and a dict name -> the reason it cannot run at this size.

    Example:
        >>> impls, skipped = build_implementations(CONFIGS["textbook"], "cpu")
        >>> sorted(skipped)
        ['torch_mha', 'torch_mha_weights']
    """
    names = _check_names(names or IMPLEMENTATIONS, IMPLEMENTATIONS, "implementations")
    torch.manual_seed(seed)
    c = config
    wrapper = MultiHeadAttentionWrapper(c.d_in, c.head_dim, c.num_tokens, 0.0, c.num_heads).to(device)
    batched = MultiHeadAttention.from_wrapper(wrapper)
    fast = FastMultiHeadAttention.from_multihead(batched)
    fused = FastMultiHeadAttention.from_multihead(batched)
    fused.use_sdpa = False
    impls = {
        "stacked": Implementation("stacked", wrapper, [wrapper], "wrapper", c.d_out),
        "batched": Implementation("batched", batched, [batched], "batched", c.d_out),
        "fused_qkv": Implementation("fused_qkv", fused, [fused], "batched", c.d_out),
        "fast": Implementation("fast", fast, [fast], "batched", c.d_out),
        "raw_sdpa": Implementation("raw_sdpa", lambda x: sdpa_forward(batched, x), [batched], "batched", c.d_out),
    }
    skipped = {}
    if c.d_in == c.d_out:
        torch_mha = to_torch_multihead(batched)
        mask = causal_mask(c.num_tokens, device=device)
        impls["torch_mha_weights"] = Implementation(
            "torch_mha_weights", lambda x: torch_mha(x, x, x, attn_mask=mask, need_weights=True)[0],
            [torch_mha], "batched", c.d_out)
        impls["torch_mha"] = Implementation(
            "torch_mha", lambda x: torch_mha(x, x, x, attn_mask=mask, need_weights=False)[0],
            [torch_mha], "batched", c.d_out)
    else:
        reason = (f"torch.nn.MultiheadAttention needs d_in == d_out; this size has d_in={c.d_in}, "
                  f"d_out={c.d_out}")
        skipped = {"torch_mha_weights": reason, "torch_mha": reason}
    for impl in impls.values():
        for module in impl.modules:
            module.eval()
    return {n: impls[n] for n in names if n in impls}, {n: skipped[n] for n in names if n in skipped}


def make_step(impl: Implementation, mode: str, x: torch.Tensor) -> Callable[[], None]:
    """A no-argument callable that runs ``impl`` once in ``mode`` (``forward`` or ``forward+backward``).

    ``forward`` runs in eval mode under ``torch.no_grad`` (inference). ``forward+backward`` runs in
    training mode with an input that needs a gradient, as attention inside a model does, and
    clears the gradients first, as ``optimizer.zero_grad()`` would.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
    if mode == "forward":
        for module in impl.modules:
            module.eval()

        def step():
            with torch.no_grad():
                impl.forward(x)

        return step
    for module in impl.modules:
        module.train()
    x_grad = x.detach().clone().requires_grad_(True)
    grad_output = torch.ones(*x.shape[:-1], impl.out_features, device=x.device, dtype=x.dtype)
    parameters = [p for module in impl.modules for p in module.parameters()]

    def step():
        for p in parameters:
            p.grad = None
        x_grad.grad = None
        impl.forward(x_grad).backward(grad_output)

    return step


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    timing = measure(torch.mm, a, b, min_run_time=min_run_time)
    return {"n": n, "median_s": timing.median, "flops_per_s": 2 * n**3 / timing.median}


def _peak_reset_supported() -> bool:
    return Path("/proc/self/clear_refs").exists() and Path("/proc/self/status").exists()


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _cpu_memory_child(config: BenchConfig, name: str, mode: str, threads: int, calls: int) -> dict:
    """Runs in a fresh child process: the peak memory of one call, then faults per later call."""
    torch.set_num_threads(threads)
    # Warm up on a 4-token input first: the first call in a process also starts the thread pool
    # and loads code (tens of MiB for the first backward pass), which is not the call's own memory.
    tiny = BenchConfig("warm-up", 1, 4, config.d_in, config.num_heads, config.head_dim, "")
    tiny_impls, _ = build_implementations(tiny, "cpu", [name])
    make_step(tiny_impls[name], mode, random_batch(1, 4, config.d_in))()
    del tiny_impls
    impls, _ = build_implementations(config, "cpu", [name])
    x = random_batch(config.batch, config.num_tokens, config.d_in, seed=1)
    step = make_step(impls[name], mode, x)
    gc.collect()
    exact = _peak_reset_supported()
    if exact:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
        before = _status_bytes("VmRSS")
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    step()  # the first call in this process: nothing is cached or reused from earlier calls
    if exact:
        peak = _status_bytes("VmHWM") - before
    else:
        scale = 1 if sys.platform == "darwin" else 1024
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale - before
    faults = None
    if calls:  # steady state: the faults of each later call
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(calls):
            step()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) / calls
    return {"peak_bytes": max(int(peak), 0), "minor_faults_per_call": faults,
            "peak_method": "VmHWM growth" if exact else "ru_maxrss growth"}


class CpuMemoryProbe:
    """Measures peak resident memory in fresh child processes, one per measurement.

    A server process (``python -m mha_course.bench --memory-server``) imports torch once and
    computes nothing; for each measurement it forks a child, which runs the call and reports. So
    every measurement starts in a process with no allocator history, without paying for a torch
    import each time. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self):
        self._server = subprocess.Popen(
            [sys.executable, "-m", "mha_course.bench", "--memory-server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )

    def measure(self, config: BenchConfig, name: str, mode: str, threads: int, calls: int) -> dict:
        request = {"config": asdict(config), "name": name, "mode": mode, "threads": threads, "calls": calls}
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


def _serve_memory_requests(requests=sys.stdin, replies=sys.stdout) -> None:
    """The memory server's loop: one JSON request per line in, one JSON reply per line out."""
    # Run every implementation once at a 4-token size here, single-threaded so that no thread
    # pool exists when the server forks: the code they load (autograd's first backward pass even
    # imports sympy, tens of MiB) is then loaded once, and each child starts warm but with a
    # fresh allocator.
    torch.set_num_threads(1)
    tiny = BenchConfig("warm-up", 1, 4, 4, 2, 2, "")
    impls, _ = build_implementations(tiny, "cpu")
    for impl in impls.values():
        for mode in MODES:
            make_step(impl, mode, random_batch(1, 4, 4))()
    del impls
    # Children inherit every Python object; freezing them keeps the children's garbage collector
    # from touching (and so copying) the whole inherited heap.
    gc.collect()
    gc.freeze()
    for line in requests:
        request = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report through the pipe, exit without cleanup
            os.close(read_end)
            try:
                request["config"] = BenchConfig(**request["config"])
                payload = {"result": _cpu_memory_child(**request)}
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


def _cuda_memory(step: Callable[[], None], device: torch.device) -> dict:
    _synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    _synchronize(device)
    return {"peak_bytes": int(torch.cuda.max_memory_allocated(device) - before),
            "minor_faults_per_call": None, "peak_method": "cuda max_memory_allocated growth"}


def _time_once(fn: Callable, device: torch.device):
    """Run ``fn()`` once; return (seconds, its result), synchronising CUDA around it."""
    _synchronize(device)
    start = time.perf_counter()
    result = fn()
    _synchronize(device)
    return time.perf_counter() - start, result


def _interleaved_samples(steps: dict, one_call: dict, device, min_run_time: float, min_runs: int,
                         bar, label: str) -> dict:
    """Time every step in rounds, one implementation after another, and return name -> samples.

    On a shared machine the speed drifts as neighbours come and go; timing the implementations
    in turns, a little each round (in a rotated order), lets every one of them see the same
    drift, so their ratios stay fair. A call under ``SLOW_CALL_S`` is measured each round by
    ``torch.utils.benchmark`` (:func:`mha_course.timing.measure`, the round's share of
    ``min_run_time``), which gives the round's median; a slower call is timed once per round in
    at most two rounds, as ``blocked_autorange`` would spend an extra untimed call sizing its
    blocks.
    """
    names = list(steps)
    samples = {name: [] for name in names}
    rounds = max(min_runs, 1)
    for round_index in range(rounds):
        shift = round_index % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            slow = one_call[name] >= SLOW_CALL_S
            if slow and round_index >= 2:
                continue
            bar.set_postfix_str(f"{label}: round {round_index + 1}/{rounds}, {name}")
            if slow:
                samples[name].append(_time_once(steps[name], device)[0])
            else:
                samples[name].append(measure(steps[name], min_run_time=min_run_time / rounds).median)
    return samples


def _summarise(samples: list[float]) -> Timing:
    """Median and interquartile range of per-round samples."""
    values = torch.tensor(samples, dtype=torch.float64)
    q1, median, q3 = torch.quantile(values, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return Timing(median=median, iqr=q3 - q1, runs=len(samples))


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def run_benchmark(configs: Iterable[BenchConfig], device="cpu", implementations: Iterable[str] | None = None,
                  modes: Iterable[str] = MODES, min_run_time: float = 1.0, min_runs: int = 3,
                  memory: bool = True, memory_calls: int = 2, threads: int | None = None,
                  progress: bool = True, quick: bool = False, ceiling_size: int | None = None) -> dict:
    """Time every implementation on every config; return the results as a JSON-ready dict.

    Args:
        configs: the sizes to run (:data:`CONFIGS` or :data:`QUICK_CONFIGS` values).
        device: ``"cpu"`` or ``"cuda"``.
        implementations: names from :data:`IMPLEMENTATIONS` (default: all).
        modes: any of ``"forward"``, ``"forward+backward"``.
        min_run_time: seconds ``torch.utils.benchmark`` spends on each implementation, spread over
            the rounds.
        min_runs: rounds: every implementation is timed once per round, in turns, so that all of
            them see the same drift of a shared machine; the median and spread are over rounds
            (at most 2 rounds, of one call each, for calls over ``SLOW_CALL_S``).
        memory: measure peak memory (and page faults on the CPU).
        memory_calls: calls over which page faults per call are averaged, after the first
            (none for training steps slower than ``SLOW_CALL_S``: their faults are ``None``).
        threads: torch threads (default: torch's current setting).
        progress: show a tqdm progress bar on stderr.
        quick: only recorded in the metadata.
        ceiling_size: side of the square matrix product timed as the ceiling.

    Returns:
        ``{"meta": {...}, "configs": [...], "rows": [...]}``; each row is one (config,
        implementation, mode) with ``median_s``, ``iqr_s``, ``runs``, ``vs_batched``,
        ``vs_raw_sdpa``, ``peak_bytes``, ``minor_faults_per_call``, ``multiply_adds``,
        ``flops_per_s``, ``ceiling_fraction``, ``max_abs_diff`` (against the textbook module's
        output), or ``skipped`` with the reason.
    """
    from tqdm.auto import tqdm

    configs = list(configs)
    device = get_device(str(device))
    names = _check_names(implementations or IMPLEMENTATIONS, IMPLEMENTATIONS, "implementations")
    modes = _check_names(modes, MODES, "modes")
    if threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    if memory_calls < 0:
        raise ValueError(f"memory_calls must be 0 or more, got {memory_calls}.")
    probe = CpuMemoryProbe() if memory and device.type == "cpu" else None
    try:
        return _run(configs, device, names, modes, min_run_time, min_runs, memory, memory_calls, threads,
                    progress, quick, ceiling_size, probe)
    finally:
        if probe is not None:
            probe.close()


def _run(configs, device, names, modes, min_run_time, min_runs, memory, memory_calls, threads, progress,
         quick, ceiling_size, probe):
    from tqdm.auto import tqdm

    started = time.perf_counter()

    bar = tqdm(total=1 + len(configs) * len(modes) * len(names), desc="bench", unit="step", disable=not progress,
               file=sys.stderr)
    bar.set_postfix_str("matmul ceiling")
    ceiling_time = min(min_run_time, 0.5)
    ceiling = matmul_ceiling(device, ceiling_size, min_run_time=ceiling_time)
    bar.update()
    rows = []
    for config in configs:
        impls, skipped = build_implementations(config, device, names)
        x = random_batch(config.batch, config.num_tokens, config.d_in, seed=1, device=device)
        with torch.no_grad():
            reference = impls["batched"].forward(x) if "batched" in impls else None
        checked = {}  # name -> max |output - textbook output|, computed once per implementation
        forward_time = {}  # name -> seconds of that first forward call
        for mode in modes:
            active = [name for name in names if name not in skipped]
            steps, one_call = {}, {}
            for name in active:  # check, warm up and size every implementation first
                bar.set_postfix_str(f"{config.name} {mode}: warming up {name}")
                impl = impls[name]
                if name not in checked:
                    # The check is also the first (warm-up) forward call, and its duration sizes the timing.
                    for module in impl.modules:
                        module.eval()
                    with torch.no_grad():
                        forward_time[name], out = _time_once(lambda: impl.forward(x), device)
                    checked[name] = _max_abs_diff(out, reference) if reference is not None else None
                    del out
                steps[name] = make_step(impl, mode, x)
                one_call[name] = forward_time[name]
                if mode != "forward":
                    # A warm-up, untimed: the first training step in a process also loads code (the
                    # first backward pass with a given gradient imports sympy). A step costs about
                    # three forward passes.
                    steps[name]()
                    one_call[name] *= 3
            samples = _interleaved_samples(steps, one_call, device, min_run_time, min_runs, bar,
                                           f"{config.name} {mode}")
            for name in names:
                row = {"config": config.name, "implementation": name, "mode": mode}
                if name in skipped:
                    rows.append({**row, "skipped": skipped[name]})
                    bar.update()
                    continue
                bar.set_postfix_str(f"{config.name} {mode}: memory of {name}")
                impl = impls[name]
                timing = _summarise(samples[name])
                macs = multiply_adds(impl.cost_kind, config.batch, config.num_tokens, config.d_in,
                                     config.head_dim if impl.cost_kind == "wrapper" else config.d_out,
                                     config.num_heads)
                work = macs.total if mode == "forward" else macs.forward_backward
                row.update(median_s=timing.median, iqr_s=timing.iqr, runs=timing.runs,
                           multiply_adds=work, flops_per_s=2 * work / timing.median,
                           max_abs_diff=checked[name])  # ceiling_fraction is added at the end
                if memory:
                    if probe is not None:
                        # Page faults of a slow training step are skipped: one more call of many seconds.
                        slow = one_call[name] >= SLOW_CALL_S
                        calls = 0 if slow and mode != "forward" else memory_calls
                        row.update(probe.measure(config, name, mode, threads, calls))
                    else:
                        row.update(_cuda_memory(steps[name], device))
                rows.append(row)
                bar.update()
            del steps
    # The ceiling again at the end: on a shared machine the two can differ; the faster one is the
    # ceiling, and both are recorded.
    again = matmul_ceiling(device, ceiling_size, min_run_time=ceiling_time)
    ceiling = {**max(ceiling, again, key=lambda c: c["flops_per_s"]),
               "flops_per_s_start": ceiling["flops_per_s"], "flops_per_s_end": again["flops_per_s"]}
    for row in rows:
        if "flops_per_s" in row:
            row["ceiling_fraction"] = row["flops_per_s"] / ceiling["flops_per_s"]
    bar.close()
    add_ratios(rows)
    return {
        "meta": _metadata(device, threads, quick, min_run_time, min_runs, ceiling,
                          time.perf_counter() - started, memory),
        "configs": [asdict(c) for c in configs],
        "implementations": {n: IMPLEMENTATIONS[n] for n in names},
        "rows": rows,
    }


def add_ratios(rows: list[dict]) -> list[dict]:
    """Add ``vs_batched``, ``vs_raw_sdpa`` and ``memory_vs_raw_sdpa`` to measured rows, in place.

    Each ratio divides a row's median time (or peak memory) by that of the reference
    implementation measured for the same config and mode in the same run; it is ``None`` when the
    reference was not measured (or used no memory at all).

    Example:
        >>> rows = [{"config": "c", "mode": "forward", "implementation": "batched", "median_s": 2.0},
        ...         {"config": "c", "mode": "forward", "implementation": "fast", "median_s": 1.0}]
        >>> [r["vs_batched"] for r in add_ratios(rows)]
        [1.0, 0.5]
    """
    measured = [r for r in rows if not r.get("skipped")]
    index = {(r["config"], r["mode"], r["implementation"]): r for r in measured}
    for row in measured:
        for key, base in BASELINES.items():
            reference = index.get((row["config"], row["mode"], base))
            row[key] = row["median_s"] / reference["median_s"] if reference else None
        reference = index.get((row["config"], row["mode"], "raw_sdpa"))
        if "peak_bytes" in row:
            row["memory_vs_raw_sdpa"] = (row["peak_bytes"] / reference["peak_bytes"]
                                         if reference and reference.get("peak_bytes") else None)
    return rows


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def _metadata(device, threads, quick, min_run_time, min_runs, ceiling, seconds, memory) -> dict:
    malloc_env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    return {
        "format_version": FORMAT_VERSION,
        "device": device.type,
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        "min_run_time_s": min_run_time,
        "min_runs": min_runs,
        "memory_measured": memory,
        "malloc_env": malloc_env,
        "matmul_ceiling": ceiling,
        "cuda_tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None,
        "wall_time_s": seconds,
    }


# --------------------------------------------------------------------------------------------
# Reading, writing, showing results
# --------------------------------------------------------------------------------------------

CSV_FIELDS = ["config", "implementation", "mode", "median_s", "iqr_s", "runs", "vs_batched", "vs_raw_sdpa",
              "peak_bytes", "memory_vs_raw_sdpa", "minor_faults_per_call", "multiply_adds", "flops_per_s",
              "ceiling_fraction", "max_abs_diff", "skipped"]


def results_stem(device: str, label: str | None = None) -> str:
    """File name stem of a results file: ``bench-cpu``, ``bench-cuda-quick``, ..."""
    return f"bench-{device}" + (f"-{label}" if label else "")


def write_results(results: dict, out_dir, label: str | None = None, plot: bool = True) -> list[Path]:
    """Write ``results`` to ``out_dir`` as JSON, CSV and (with ``plot``) PNG; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = results_stem(results["meta"]["device"], label)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.csv"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    with paths[1].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in results["rows"]:
            writer.writerow(row)
    if plot:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        figure = plot_results(results)
        paths.append(out_dir / f"{stem}.png")
        figure.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(figure)
    return paths


def load_results(path) -> dict:
    """Read a results file written by :func:`write_results`, checking its format version."""
    path = Path(path)
    results = json.loads(path.read_text())
    version = results.get("meta", {}).get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} has results format {version!r}; this package reads format "
                         f"{FORMAT_VERSION}. Rerun `python -m mha_course bench` to regenerate it.")
    return results


def select(results: dict, config: str | None = None, mode: str | None = None,
           implementation: str | None = None, measured_only: bool = True) -> list[dict]:
    """The rows of ``results`` matching the given config, mode and implementation."""
    return [r for r in results["rows"]
            if (config is None or r["config"] == config) and (mode is None or r["mode"] == mode)
            and (implementation is None or r["implementation"] == implementation)
            and not (measured_only and r.get("skipped"))]


def lookup(results: dict, config: str, mode: str, implementation: str) -> dict:
    """The one measured row for (config, mode, implementation); a clear error if absent."""
    rows = select(results, config, mode, implementation)
    if len(rows) != 1:
        raise KeyError(f"no measured row for config={config!r}, mode={mode!r}, "
                       f"implementation={implementation!r} in these results.")
    return rows[0]


def _fmt_time(seconds):
    return "-" if seconds is None else (f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs")


def compare(results: dict, config: str, mode: str, numerator: str, denominator: str) -> dict:
    """Compare two implementations' times: the ratio of medians, and whether it beats the spread.

    ``verdict`` is ``"tie"`` when the medians differ by no more than the mean of the two
    interquartile ranges (the difference is within the run's own noise), else the name of the
    faster implementation.

    Example:
        >>> rows = [{"config": "c", "mode": "forward", "implementation": n, "median_s": m, "iqr_s": 0.1}
        ...         for n, m in (("batched", 1.0), ("stacked", 2.0))]
        >>> compare({"rows": rows}, "c", "forward", "batched", "stacked")
        {'ratio': 0.5, 'verdict': 'batched'}
    """
    a, b = lookup(results, config, mode, numerator), lookup(results, config, mode, denominator)
    if abs(a["median_s"] - b["median_s"]) <= (a["iqr_s"] + b["iqr_s"]) / 2:
        verdict = "tie"
    else:
        verdict = numerator if a["median_s"] < b["median_s"] else denominator
    return {"ratio": a["median_s"] / b["median_s"], "verdict": verdict}


def format_bytes(n) -> str:
    """Bytes as B, KiB or MiB with one decimal place for MiB (``-`` for ``None``)."""
    return _fmt_bytes(n)


def _fmt_bytes(n):
    if n is None:
        return "-"
    if abs(n) >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.0f} KiB" if abs(n) >= 2**10 else f"{n} B"


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def format_table(header: list[str], rows: list[list[str]], fmt: str = "text") -> str:
    """Format cells as an aligned plain-text table (``fmt="text"``) or a Markdown table.

    Example:
        >>> print(format_table(["name", "ms"], [["fast", "1.5"], ["batched", "12"]]))
        name     ms
        -------  ---
        fast     1.5
        batched  12
    """
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    if fmt != "text":
        raise ValueError(f"fmt must be 'text' or 'markdown', got {fmt!r}.")
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    def line(cells):
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(row) for row in rows])


def results_table(results: dict, config: str, mode: str, fmt: str = "text") -> str:
    """A table of one config and mode: times, ratios, FLOP/s, memory, faults (text or Markdown)."""
    memory = results["meta"].get("memory_measured", True)
    header = ["implementation", "median", "IQR", "x batched", "x raw SDPA", "GFLOP/s", "% matmul"]
    if memory:
        header += ["peak memory", "faults/call"]
    rows, notes = [], []
    for row in select(results, config, mode, measured_only=False):
        if row.get("skipped"):
            rows.append([row["implementation"], "skipped"] + [""] * (len(header) - 2))
            if row["skipped"] not in notes:
                notes.append(row["skipped"])
            continue
        cells = [row["implementation"], _fmt_time(row["median_s"]), _fmt_time(row["iqr_s"]),
                 _fmt(row.get("vs_batched"), ".2f"), _fmt(row.get("vs_raw_sdpa"), ".2f"),
                 _fmt(row["flops_per_s"] / 1e9, ".3g"), _fmt(100 * row["ceiling_fraction"], ".0f")]
        if memory:
            faults = row.get("minor_faults_per_call")
            cells += [_fmt_bytes(row.get("peak_bytes")), "-" if faults is None else f"{faults:,.0f}"]
        rows.append(cells)
    return format_table(header, rows, fmt) + "".join(f"\n(skipped: {note})" for note in notes)


def plot_results(results: dict, metric: str = "median_s", configs: Iterable[str] | None = None):
    """Bar charts of one metric: a panel per (mode, config), one bar per implementation.

    ``metric`` is ``"median_s"`` (drawn in ms, with the spread as an error bar) or
    ``"peak_bytes"`` (drawn in MiB). Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    if metric not in ("median_s", "peak_bytes"):
        raise ValueError(f"metric must be 'median_s' or 'peak_bytes', got {metric!r}.")
    configs = list(configs or [c["name"] for c in results["configs"]])
    modes = [m for m in MODES if select(results, mode=m)]
    names = list(results["implementations"])
    figure, axes = plt.subplots(len(modes), len(configs), figsize=(3.4 * len(configs), 0.45 * len(names) * len(modes) + 1.2),
                                squeeze=False, sharey=True)
    colours = plt.get_cmap("tab10")
    scale, unit = (1e3, "ms") if metric == "median_s" else (1 / 2**20, "MiB")
    for i, mode in enumerate(modes):
        for j, config in enumerate(configs):
            ax = axes[i][j]
            for k, name in enumerate(names):
                rows = select(results, config, mode, name, measured_only=False)
                if rows and rows[0].get("skipped"):
                    ax.text(0, k, " n/a", va="center", fontsize=8, color="grey")
                if not rows or rows[0].get(metric) is None:
                    continue
                value = rows[0][metric] * scale
                error = rows[0]["iqr_s"] * scale / 2 if metric == "median_s" else None
                ax.barh(k, value, xerr=error, color=colours(k % 10))
            ax.set_yticks(range(len(names)), names)
            ax.set_title(f"{config}, {mode}", fontsize=9)
            ax.set_xlabel(unit)
            ax.grid(axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()  # the axes share y: invert once, so the course's order reads top-down
    meta = results["meta"]
    what = "median time per call" if metric == "median_s" else "peak memory of one call"
    figure.suptitle(f"{what}: {meta['device_name']} ({meta['device']}, {_threads(meta)}), "
                    f"torch {meta['torch']}, {meta['date']}", fontsize=10)
    figure.tight_layout()
    return figure


def _threads(meta: dict) -> str:
    return f"{meta['threads']} thread" + ("" if meta["threads"] == 1 else "s")


def summary(results: dict) -> str:
    """A plain-text summary of a run: one table per (config, mode)."""
    meta = results["meta"]
    parts = [f"{meta['device_name']} ({meta['device']}, {_threads(meta)}), torch {meta['torch']}, "
             f"{meta['date']}; matmul ceiling {meta['matmul_ceiling']['flops_per_s'] / 1e9:.1f} GFLOP/s; "
             f"run took {meta['wall_time_s']:.0f} s"]
    for config in results["configs"]:
        for mode in MODES:
            if select(results, config["name"], mode, measured_only=False):
                parts.append(f"\n{config['name']} ({config['description']}), {mode}\n"
                             + results_table(results, config["name"], mode))
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(args) -> int:
    """Entry point of ``python -m mha_course bench`` (arguments parsed in ``__main__``)."""
    pool = QUICK_CONFIGS if args.quick else CONFIGS
    names = args.configs.split(",") if args.configs else list(pool)
    every = {**CONFIGS, **QUICK_CONFIGS}
    configs = [every[n] for n in _check_names(names, every, "configs")]
    implementations = args.implementations.split(",") if args.implementations else None
    modes = args.modes.split(",") if args.modes else MODES
    min_run_time = args.min_run_time if args.min_run_time is not None else (0.02 if args.quick else 1.0)
    # One thread in quick mode: CI machines are shared, and a spinning second thread there makes
    # tiny timings swing by 10x; the full run uses torch's default unless --threads says otherwise.
    threads = args.threads if args.threads is not None else (1 if args.quick else None)
    try:
        get_device(args.device)
    except (ValueError, RuntimeError) as error:
        print(f"error: --device {args.device}: {error}", file=sys.stderr)
        return 2
    results = run_benchmark(
        configs, device=args.device, implementations=implementations, modes=modes, min_run_time=min_run_time,
        min_runs=2 if args.quick else args.min_runs, memory=not args.no_memory,
        memory_calls=1, threads=threads, progress=not args.no_progress,
        quick=args.quick, ceiling_size=256 if args.quick else None,
    )
    label = args.label if args.label is not None else ("quick" if args.quick else None)
    paths = write_results(results, args.out, label=label, plot=not args.no_plot)
    print(summary(results))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--memory-server"]:
        _serve_memory_requests()
    else:
        sys.exit("usage: python -m mha_course bench [options]  (see python -m mha_course bench --help)")
