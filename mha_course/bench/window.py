"""The window benchmark (chapter 11): attention under a sliding window, against the window, at long lengths.

``python -m mha_course bench --window`` runs the middle of causal attention on the same ``(B, h, T,
d_h)`` queries, keys and values, at every length of :data:`WINDOW_CONFIGS` (8k and 16k tokens) and
every window of :data:`WINDOWS` (``None``: the causal mask alone), two ways
(:data:`~mha_course.bench.tiled_steps.WINDOW_IMPLEMENTATIONS`):

* ``tiled``: :func:`mha_course.tiled_attention` with ``window``, whose loop skips every tile wholly
  outside the window, as FlashAttention's local attention does;
* ``sdpa``: ``scaled_dot_product_attention`` given the window's mask, built in the call (with no
  window, ``is_causal=True`` and no mask).

It runs them forward (mode ``"window"``) and, up to ``training_max_tokens`` (8k), forward with
backward (``"window-training"``), checks
that the two agree (``max_abs_diff``), times every window of a length in the same interleaved rounds
(:func:`mha_course.timing.time_interleaved`), so that the ratios to the full causal mask
(``vs_full``) are measured in one run, counts the tiles the loop computes (``tiles``, from
:func:`~mha_course.attention.tiled.tile_counts`), and measures each call's peak memory in a fresh child
process (:mod:`mha_course.bench.memory`). Written as ``bench-window-DEVICE.json`` and ``.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..attention.tiled import COMPUTED, CUT, tile_counts
from ..tables import Table
from ..timing import time_interleaved, time_once
from .results import run_header, select, threads_text
from .run import memory_probe, observed_run, prepare_run
from .settings import RunSettings
from .sizes import BenchConfig
from .tiled_steps import WINDOW_IMPLEMENTATIONS, WINDOW_MODE, WINDOW_TRAINING_MODE, window_calls

#: The modes of a window run: forward only, and forward with backward.
WINDOW_MODES = (WINDOW_MODE, WINDOW_TRAINING_MODE)

#: The windows of the full run: Gemma 3's 1024 and Mistral 7B's 4096 among them; None is the causal mask alone.
WINDOWS = (256, 1024, 4096, None)

#: The windows of ``bench --window --quick``.
QUICK_WINDOWS = (8, 32, None)


def _window(num_tokens: int, num_heads: int = 4, head_dim: int = 64, prefix: str = "window") -> BenchConfig:
    return BenchConfig(f"{prefix}-{num_tokens}", 1, num_tokens, num_heads * head_dim, num_heads, head_dim,
                       f"one sequence of {num_tokens} tokens, {num_heads} heads of {head_dim}")


#: The lengths of the window run: one sequence of 8k and of 16k tokens, 4 heads of 64.
WINDOW_CONFIGS = {c.name: c for c in (_window(8192), _window(16384))}

#: The lengths of ``bench --window --quick``: 2 heads of 8, for CI.
QUICK_WINDOW_CONFIGS = {c.name: c for c in (_window(64, 2, 8, "window-tiny"), _window(128, 2, 8, "window-tiny"))}

#: Every window size by name, full and quick.
ALL_WINDOW_CONFIGS = {**WINDOW_CONFIGS, **QUICK_WINDOW_CONFIGS}


@dataclass(frozen=True)
class WindowSettings(RunSettings):
    """How to run the window benchmark (``bench --window``): lengths, windows and the loop's ``block_size``.

    Example:
        >>> s = WindowSettings.for_command(quick=True)
        >>> [c.name for c in s.configs], s.windows, s.block_size
        (['window-tiny-64', 'window-tiny-128'], (8, 32, None), 8)
    """

    windows: tuple = WINDOWS  # None: the causal mask alone
    block_size: int = 128  # queries and keys per tile of the tiled loop
    # The longest sequence timed with the backward pass too (seconds a call at 16k: kept short)
    training_max_tokens: int = 8192
    memory: bool = True  # peak memory of each call, in a fresh child process (CPU)

    def __post_init__(self):
        super().__post_init__()
        from ..attention._validation import validate_positive_int, validate_window

        validate_positive_int("block_size", self.block_size)
        validate_positive_int("training_max_tokens", self.training_max_tokens)
        windows = tuple(self.windows)
        if not windows or None not in windows:
            raise ValueError(f"windows must hold None (the causal mask alone, which every time is compared with) "
                             f"and the windows to measure, got {self.windows!r}; e.g. windows=(256, 1024, None).")
        object.__setattr__(self, "windows", tuple(validate_window(w) for w in windows))

    @classmethod
    def for_command(cls, *, quick: bool = False, configs=None, min_run_time=None, rounds=None, threads=None,
                    **options) -> "WindowSettings":
        """The settings of ``python -m mha_course bench --window``, with the defaults of ``bench``."""
        if quick:
            options.setdefault("block_size", 8)
            options.setdefault("windows", QUICK_WINDOWS)
        return cls._for_command(ALL_WINDOW_CONFIGS, QUICK_WINDOW_CONFIGS if quick else WINDOW_CONFIGS, quick=quick,
                                configs=configs, min_run_time=min_run_time, rounds=rounds, threads=threads,
                                **options)


def run_window_benchmark(settings: WindowSettings) -> dict:
    """Time and measure both ways at every length, window and mode of ``settings``.

    Returns:
        ``{"meta": {...}, "configs": [...], "implementations": {...}, "rows": [...]}`` with
        ``meta["benchmark"] == "window"``, ``meta["block_size"]`` and ``meta["windows"]``; each row is
        one (length, window, implementation, mode) with ``num_tokens``, ``window`` (``None``: the causal
        mask alone), ``median_s``, ``iqr_s``, ``runs``, ``vs_full`` (its time over the same
        implementation's without a window), ``visible`` (the scores the mask leaves), ``tiles`` (those
        the loop computes, for ``tiled``), ``max_abs_diff`` (between the two ways) and, when memory is
        measured, ``peak_bytes`` and ``peak_method``.
    """
    device = prepare_run(settings, WindowSettings, "WindowSettings.for_command(...)")
    steps = [(mode, config) for mode in WINDOW_MODES for config in settings.configs
             if mode == WINDOW_MODE or config.num_tokens <= settings.training_max_tokens]
    bar = tqdm(total=2 + len(steps), desc="bench --window", disable=not settings.progress)

    def measure() -> list[dict]:
        rows = []
        for mode, config in steps:
            bar.set_postfix_str(f"{config.name}, {mode}: every window, tiled and sdpa")
            rows += _length(config, device, settings, probe if memory else None, mode)
            bar.update()
        return rows

    with memory_probe(settings.memory, device) as (probe, skipped_because):
        memory = settings.memory and not skipped_because
        results = observed_run(settings, device, bar, measure, dict(WINDOW_IMPLEMENTATIONS), memory=memory,
                               benchmark="window")
    results["meta"]["block_size"] = settings.block_size
    results["meta"]["windows"] = list(settings.windows)
    results["meta"]["training_max_tokens"] = settings.training_max_tokens
    if skipped_because:
        results["meta"]["memory_skipped"] = skipped_because
    return results


def visible_scores(num_tokens: int, window: int | None) -> int:
    """How many scores the causal mask and the window leave: ``sum_i min(i + 1, window)``.

    Example:
        >>> visible_scores(4, None), visible_scores(4, 2)
        (10, 7)
    """
    reach = num_tokens if window is None else min(window, num_tokens)
    return reach * (reach + 1) // 2 + (num_tokens - reach) * reach


def _length(config: BenchConfig, device: torch.device, settings: WindowSettings, probe, mode: str) -> list[dict]:
    calls, outputs, one_call = {}, {}, {}
    for window in settings.windows:
        for name, call in window_calls(config, settings.block_size, window, device, settings.seed + 1, mode).items():
            calls[(name, window)] = call
            one_call[(name, window)], outputs[(name, window)] = time_once(call)  # the check is the warm-up
    timings = time_interleaved(calls, rounds=settings.rounds, min_run_time=settings.min_run_time,
                               call_seconds=one_call)
    t = config.num_tokens
    rows = []
    for (name, window), timing in timings.items():
        counts = tile_counts(t, settings.block_size, window)
        row = {"config": config.name, "implementation": name, "mode": mode, "num_tokens": t, "window": window,
               "median_s": timing.median, "iqr_s": timing.iqr, "runs": timing.runs,
               "vs_full": timing.median / timings[(name, None)].median, "visible": visible_scores(t, window),
               "tiles": counts[COMPUTED] + counts[CUT] if name == "tiled" else None,
               "max_abs_diff": float((outputs[("tiled", window)] - outputs[("sdpa", window)]).abs().max())}
        if probe is not None:
            row.update(probe.measure(config, name, mode, torch.get_num_threads(), 0, benchmark="window",
                                     block_size=settings.block_size, window=window))
        elif device.type == "cuda":
            from .steps import cuda_peak_memory

            row.update(cuda_peak_memory(calls[(name, window)], device))
        rows.append(row)
    return rows


def window_rows(results: dict, mode: str = WINDOW_MODE, num_tokens: int | None = None) -> list[dict]:
    """The rows of a window run in ``mode`` (at ``num_tokens``, if given), by length, then window (the
    causal mask alone last), then implementation.

    Example:
        >>> rows = [{"mode": "window", "num_tokens": 8, "window": w, "implementation": n}
        ...         for w in (None, 4) for n in ("sdpa", "tiled")]
        >>> [(r["window"], r["implementation"]) for r in window_rows({"rows": rows})]
        [(4, 'tiled'), (4, 'sdpa'), (None, 'tiled'), (None, 'sdpa')]
    """
    order = list(WINDOW_IMPLEMENTATIONS)
    rows = [r for r in select(results, mode=mode) if num_tokens is None or r["num_tokens"] == num_tokens]
    if not rows:
        raise ValueError(f"these results hold no {mode} rows{'' if num_tokens is None else f' at {num_tokens} tokens'}. "
                         "Write them with `python -m mha_course bench --window`.")
    return sorted(rows, key=lambda r: (r["num_tokens"], r["window"] is None, r["window"] or 0,
                                       order.index(r["implementation"])))


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def window_table(results: dict, mode: str = WINDOW_MODE) -> Table:
    """Median time, its ratio to the causal mask alone, the tiles computed and the peak memory of both
    ways at every length and window of a window run, in ``mode``."""
    rows = window_rows(results, mode)
    has_memory = all("peak_bytes" in r for r in rows)
    by_key = {(r["num_tokens"], r["window"], r["implementation"]): r for r in rows}
    lines = []
    for t, window in dict.fromkeys((r["num_tokens"], r["window"]) for r in rows):
        tiled, sdpa = by_key[(t, window, "tiled")], by_key[(t, window, "sdpa")]
        line = [t, "none" if window is None else window, tiled["tiles"], tiled["median_s"], tiled["vs_full"],
                sdpa["median_s"], sdpa["vs_full"]]
        if has_memory:
            line += [tiled["peak_bytes"], sdpa["peak_bytes"]]
        lines.append(line)
    columns = ["tokens T", "window", "tiles computed", "tiled time", "tiled vs none", "sdpa time", "sdpa vs none"]
    formats = {"tiled time": "time", "sdpa time": "time", "tiled vs none": _ratio, "sdpa vs none": _ratio}
    if has_memory:
        columns += ["tiled peak", "sdpa peak"]
        formats.update({"tiled peak": "bytes", "sdpa peak": "bytes"})
    meta = results["meta"]
    passes = "forward and backward" if mode == WINDOW_TRAINING_MODE else "forward"
    title = (f"Attention under a sliding window, blocks of {meta.get('block_size')}, {passes}: median time on "
             f"{meta['device_name']} ({meta['device']}, {threads_text(meta)})")
    notes = ["none: the causal mask alone (tiled: no window; sdpa: is_causal=True, no mask).",
             "vs none: the time over the same way's without a window, measured in the same rounds."]
    if has_memory:
        notes.append("peak: the growth of the peak memory during one call, in a fresh process.")
    return Table(columns, lines, title=title, formats=formats, notes=notes)


def window_summary(results: dict) -> str:
    """A plain-text summary of a window run: the machine, then the table of each mode."""
    return "\n\n".join([run_header(results["meta"]), *(str(window_table(results, mode)) for mode in WINDOW_MODES)])
