"""Attention modules side by side: the comparison tables and head-count sweeps of the book.

Chapter 2 compares one head with two heads on weights, outputs and cost, and then sweeps the
number of heads in the two regimes the book keeps apart:

* **head width fixed** - every head keeps ``head_dim`` columns, so the model grows by one head's
  weights and one head's work per head added (the reading of the source texts);
* **model width fixed** - the total width ``d_model`` is split as ``head_dim = d_model // num_heads``,
  so parameters and multiply-adds stay put while the number of heads changes.

Nothing here re-derives a cost: parameter counts are counted on the built modules (and agree with
:func:`mha_course.cost.parameter_count`), multiply-adds come from :func:`mha_course.cost.multiply_adds`,
score memory from :func:`mha_course.cost.score_memory_bytes`, and times from the course's one timing
policy, :func:`mha_course.timing.time_interleaved`. The sweeps build the implementations of
:mod:`mha_course.implementations` by their registry names, and every table is a
:class:`mha_course.tables.Table`. A teaching aid: it imports the core and the other aids only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import torch
from torch import nn

from .attention._validation import validate_input, validate_positive_int
from .attention.causal_attention import CausalAttention
from .cost import (HEAD_WIDTH_FIXED, REGIME_LABELS, REGIMES, cost_by_heads, count_parameters, multiply_adds,
                   validate_regime)
from .data import random_batch
from .implementations import IMPLEMENTATIONS, build_implementations, validate_names
from .attention.multihead import MultiHeadAttention
from .tables import Table
from .timing import Timing, time_interleaved
from .attention.wrapper import MultiHeadAttentionWrapper



def _kind(module: nn.Module) -> str:
    """The cost formulas' name for a module's stage, or an error naming what is accepted."""
    if isinstance(module, CausalAttention):
        return "causal"
    if isinstance(module, MultiHeadAttentionWrapper):
        return "wrapper"
    if isinstance(module, MultiHeadAttention):
        return "batched"
    raise TypeError(
        f"module must be a CausalAttention, MultiHeadAttentionWrapper or MultiHeadAttention, "
        f"got {type(module).__name__}."
    )


@torch.no_grad()
def head_outputs(module: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Each head's own context vectors ``Z_1 ... Z_h`` for input ``x``, before any merge.

    Args:
        module: a ``CausalAttention`` (one head), ``MultiHeadAttentionWrapper`` or
            ``MultiHeadAttention``.
        x: input of shape ``(batch, num_tokens, d_in)``.

    Returns:
        A list with one ``(batch, num_tokens, head_dim)`` tensor per head. For the batched module
        these are the per-head slices of the context tensor before the heads are merged and the
        output projection is applied.

    Example:
        >>> wrapper = MultiHeadAttentionWrapper(3, 2, context_length=3, dropout=0.0, num_heads=2)
        >>> [tuple(z.shape) for z in head_outputs(wrapper, torch.rand(1, 3, 3))]
        [(1, 3, 2), (1, 3, 2)]
    """
    kind = _kind(module)
    if kind == "causal":
        return [module(x)]
    if kind == "wrapper":
        validate_input(x, module.d_in, module.context_length)
        return [head(x) for head in module.heads]
    # The merged heads are what the output projection receives: read them there, in the module's
    # own forward pass, and cut them back into one slice of head_dim columns per head.
    merged = []
    hook = module.out_proj.register_forward_pre_hook(lambda _, args: merged.append(args[0]))
    try:
        module(x)
    finally:
        hook.remove()
    return list(merged[0].split(module.head_dim, dim=-1))  # h tensors of (B, T, hd)


@torch.no_grad()
def _forward_no_grad(forward, x: torch.Tensor) -> torch.Tensor:
    """Call a module (or any ``x -> output`` callable) without autograd, as the timings do."""
    return forward(x)


def _weight_matrices(module: nn.Module) -> tuple[tuple[int, ...], ...]:
    """The shapes of the module's weight matrices (biases left out), in the module's own order."""
    return tuple(tuple(p.shape) for name, p in module.named_parameters() if name.endswith("weight"))


@dataclass(frozen=True)
class ModuleReport:
    """What one module owns, returns and costs, as :func:`compare_modules` reports it."""

    name: str
    num_heads: int
    head_dim: int
    weight_matrices: tuple[tuple[int, ...], ...]  # shape of every weight matrix, biases left out
    parameters: int  # counted on the module
    head_output_shapes: tuple[tuple[int, ...], ...]  # one shape per head: Z_1 ... Z_h
    output_shape: tuple[int, ...]  # the merged Z
    multiply_adds: int  # matrix products of one forward pass, from mha_course.cost
    time: Timing | None  # forward pass without autograd, or None when not measured


def describe_module(module: nn.Module, x: torch.Tensor, name: str | None = None,
                    measure_time: bool = True, min_run_time: float = 0.2, rounds: int = 3,
                    num_threads: int | None = 1) -> ModuleReport:
    """Report a module's weights, outputs and cost on input ``x``.

    Args:
        module: a ``CausalAttention``, ``MultiHeadAttentionWrapper`` or ``MultiHeadAttention``.
        x: input of shape ``(batch, num_tokens, d_in)``.
        name: the label for the report (default: the class name).
        measure_time: whether to time the forward pass (no autograd) with
            :func:`mha_course.timing.time_interleaved`.
        min_run_time: seconds to keep timing for, over all rounds.
        rounds: how many times to time it; the median over the rounds is kept.
        num_threads: torch threads while timing; one thread by default, because a single
            thread is far less disturbed by other work on a shared machine than two that must
            wait for each other (``None``: torch's current setting).

    Example:
        >>> head = CausalAttention(3, 2, context_length=3, dropout=0.0)
        >>> report = describe_module(head, torch.rand(1, 3, 3), measure_time=False)
        >>> report.parameters, report.head_output_shapes, report.multiply_adds
        (18, ((1, 3, 2),), 90)
    """
    kind = _kind(module)
    validate_input(x, module.d_in, module.context_length)
    batch, num_tokens, d_in = x.shape
    zs = head_outputs(module, x)
    output = _forward_no_grad(module, x)
    num_heads = len(zs)
    return ModuleReport(
        name=name or type(module).__name__,
        num_heads=num_heads,
        head_dim=zs[0].shape[-1],
        weight_matrices=_weight_matrices(module),
        parameters=count_parameters(module),
        head_output_shapes=tuple(tuple(z.shape) for z in zs),
        output_shape=tuple(output.shape),
        multiply_adds=multiply_adds(kind, batch, num_tokens, d_in, module.d_out, num_heads).total,
        time=_time_modules({"module": module}, x, rounds, min_run_time, num_threads)["module"] if measure_time else None,
    )


def _time_modules(modules: Mapping[str, nn.Module], x: torch.Tensor, rounds: int, min_run_time: float,
                  num_threads: int | None) -> dict[str, Timing]:
    """Forward passes without autograd, timed by the course's policy (interleaved rounds, median)."""
    calls = {name: (lambda m=module: _forward_no_grad(m, x)) for name, module in modules.items()}
    return time_interleaved(calls, rounds=rounds, min_run_time=min_run_time, num_threads=num_threads)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _count_shapes(shapes: Sequence[tuple[int, ...]]) -> str:
    """``[(2, 3), (2, 3), (4, 4)]`` -> ``"2 x (2, 3) + 1 x (4, 4)"``, in order of first appearance."""
    seen = list(dict.fromkeys(shapes))
    return " + ".join(f"{shapes.count(s)} x {_shape(s)}" for s in seen)


def compare_modules(modules: Mapping[str, nn.Module], x: torch.Tensor, measure_time: bool = True,
                    min_run_time: float = 0.15, rounds: int = 3, num_threads: int | None = 1) -> Table:
    """One table comparing modules on weights, outputs and cost, all measured on input ``x``.

    Columns: heads, the module's weight matrices (count x shape, biases left out), parameters,
    each head's output ``Z_m``, the merged output ``Z``, multiply-adds of one forward pass, and,
    when ``measure_time`` is true, the median forward time and its ratio to the first module's
    time. The modules are timed in turn, ``rounds`` times over, in the same run, by
    :func:`mha_course.timing.time_interleaved` (see :func:`describe_module` for ``num_threads``).

    Example:
        >>> x = torch.rand(1, 3, 3)
        >>> table = compare_modules({"one head": CausalAttention(3, 2, 3, 0.0),
        ...     "two heads": MultiHeadAttentionWrapper(3, 2, 3, 0.0, num_heads=2)}, x, measure_time=False)
        >>> table.column("weight matrices"), table.column("parameters"), table.column("multiply-adds")
        (['3 x (2, 3)', '6 x (2, 3)'], [18, 36], [90, 180])
    """
    if not modules:
        raise ValueError("modules is empty; pass a mapping such as {'one head': head, 'two heads': wrapper}.")
    reports = [describe_module(m, x, name, measure_time=False) for name, m in modules.items()]
    if measure_time:
        timings = _time_modules(modules, x, rounds, min_run_time, num_threads)
        reports = [replace(report, time=timings[name]) for report, name in zip(reports, modules)]
    columns = ["module", "heads", "weight matrices", "parameters", "head outputs Z_m", "merged output Z",
               "multiply-adds"]
    if measure_time:
        columns += ["time", "time ratio"]
    rows = []
    for report in reports:
        row = [report.name, report.num_heads, _count_shapes(report.weight_matrices), report.parameters,
               _count_shapes(report.head_output_shapes), _shape(report.output_shape), report.multiply_adds]
        if measure_time:
            row += [report.time.median, report.time.median / reports[0].time.median]
        rows.append(row)
    formats = {"time": "time", "time ratio": ".2f"} if measure_time else {}
    return Table(columns, rows, formats=formats)


@dataclass(frozen=True)
class SweepPoint:
    """One module of a head-count sweep: its sizes, its cost and (optionally) its time."""

    regime: str  # one of mha_course.cost.REGIMES
    implementation: str  # a name of mha_course.implementations.IMPLEMENTATIONS, e.g. "stacked"
    num_heads: int
    head_dim: int
    width: int  # num_heads * head_dim: the merged output's width
    parameters: int  # counted on the built module
    multiply_adds: int  # one forward pass, from mha_course.cost.multiply_adds
    score_bytes: int  # all heads' (batch, T, T) float32 score matrices, from score_memory_bytes
    time: Timing | None


def head_count_sweep(head_counts: Sequence[int] = (1, 2, 4, 8, 16), *, regimes: Sequence[str] = REGIMES,
                     implementations: Sequence[str] = ("stacked",), d_in: int = 256, head_dim: int = 32,
                     d_model: int = 256, batch: int = 4, num_tokens: int = 128, measure_time: bool = True,
                     min_run_time: float = 0.09, rounds: int = 3, num_threads: int | None = 1,
                     seed: int = 0) -> list[SweepPoint]:
    """Build modules with more and more heads in each regime and report their cost.

    Args:
        head_counts: the numbers of heads to try.
        regimes: ``"head_width_fixed"`` (every head ``head_dim`` wide, total width grows) and/or
            ``"model_width_fixed"`` (total width ``d_model``, ``head_dim = d_model // num_heads``;
            every head count must divide ``d_model``).
        implementations: names from :data:`mha_course.implementations.IMPLEMENTATIONS`, e.g.
            ``"stacked"`` (:class:`MultiHeadAttentionWrapper`) and ``"batched"``
            (:class:`MultiHeadAttention`).
        d_in: input width.
        head_dim: head width in the head-width-fixed regime.
        d_model: total width in the model-width-fixed regime.
        batch, num_tokens: size of the random input the modules are timed on.
        measure_time: whether to time each forward pass (no autograd) with
            :func:`mha_course.timing.time_interleaved`; all points are timed in one run, so their
            ratios are meaningful even though the absolute times depend on the machine.
        min_run_time: seconds to time each point for, over all rounds.
        rounds: the points are timed in turn this many times over; each keeps its median.
        num_threads: torch threads while timing (default one; ``None``: torch's current setting).
        seed: seeds the weights and the input.

    Returns:
        One :class:`SweepPoint` per (regime, implementation, head count), in that order.

    Example:
        >>> points = head_count_sweep((1, 2), regimes=["model_width_fixed"], d_in=8, d_model=8,
        ...                           batch=1, num_tokens=4, measure_time=False)
        >>> [(p.num_heads, p.head_dim, p.parameters) for p in points]
        [(1, 8, 192), (2, 4, 192)]
    """
    for regime in regimes:
        validate_regime(regime)
    implementations = validate_names(implementations, IMPLEMENTATIONS, "implementations")
    head_counts = [validate_positive_int("head_counts entry", h) for h in head_counts]
    if not head_counts:
        raise ValueError("head_counts is empty; pass the numbers of heads to try, e.g. (1, 2, 4, 8).")
    for name, value in (("d_in", d_in), ("head_dim", head_dim), ("d_model", d_model), ("batch", batch),
                        ("num_tokens", num_tokens)):
        validate_positive_int(name, value)
    # The formulas first, for every point: a head count that does not divide d_model is explained
    # before any module is built.
    costs = [(regime, implementation, cost_by_heads(
                 regime, head_counts, batch=batch, num_tokens=num_tokens, d_in=d_in,
                 width=head_dim if regime == HEAD_WIDTH_FIXED else d_model,
                 kind=IMPLEMENTATIONS[implementation].cost_kind))
             for regime in regimes for implementation in implementations]
    x = random_batch(batch, num_tokens, d_in, seed=seed)
    points, modules = [], {}
    for regime, implementation, rows in costs:
        for row in rows:
            h, width_per_head = row["num_heads"], row["head_dim"]
            built, skipped = build_implementations(d_in=d_in, num_heads=h, head_dim=width_per_head,
                                                   context_length=num_tokens, names=[implementation], seed=seed)
            if implementation in skipped:
                raise ValueError(f"implementation {implementation!r} cannot run with {h} heads of width "
                                 f"{width_per_head}: {skipped[implementation]}.")
            impl = built[implementation]
            points.append(SweepPoint(
                regime=regime,
                implementation=implementation,
                num_heads=h,
                head_dim=width_per_head,
                width=row["d_out"],
                parameters=sum(count_parameters(m) for m in impl.modules),
                multiply_adds=row["multiply_adds"],
                score_bytes=row["score_bytes"],
                time=None,
            ))
            modules[len(points) - 1] = impl.forward
    if measure_time:
        calls = {index: (lambda f=forward: _forward_no_grad(f, x)) for index, forward in modules.items()}
        timings = time_interleaved(calls, rounds=rounds, min_run_time=min_run_time, num_threads=num_threads)
        points = [replace(point, time=timings[index]) for index, point in enumerate(points)]
    return points


def sweep_table(points: Sequence[SweepPoint]) -> Table:
    """Tabulate a :func:`head_count_sweep`, with each quantity also as a ratio to the fewest heads.

    The ``fixed`` column names the regime (:data:`mha_course.cost.REGIME_LABELS`). The ratios
    compare a point with the point of the same regime and implementation that has the fewest
    heads, so 2.00 in the ratio of parameters means twice the parameters of the fewest heads. A sweep
    of one implementation names it, by class and name, in the title instead of in a column of one
    repeated value.
    """
    if not points:
        raise ValueError("points is empty; pass the result of head_count_sweep(...).")
    timed = all(p.time is not None for p in points)
    # The ratios and the score memory, which the chapters read, before the raw counts.
    columns = ["fixed", "implementation", "heads", "head_dim", "width", "ratio of parameters",
               "ratio of multiply-adds", "score memory", "parameters", "multiply-adds"]
    if timed:
        columns += ["time", "time ratio"]
    base: dict[tuple[str, str], SweepPoint] = {}
    for p in points:
        key = (p.regime, p.implementation)
        if key not in base or p.num_heads < base[key].num_heads:
            base[key] = p
    implementations = list(dict.fromkeys(p.implementation for p in points))
    one = len(implementations) == 1
    rows = []
    for p in points:
        b = base[(p.regime, p.implementation)]
        row = [REGIME_LABELS[p.regime].removesuffix(" fixed"), p.implementation, p.num_heads, p.head_dim,
               p.width, p.parameters / b.parameters, p.multiply_adds / b.multiply_adds, p.score_bytes,
               p.parameters, p.multiply_adds]
        if timed:
            row += [p.time.median, p.time.median / b.time.median]
        rows.append(row[:1] + row[2:] if one else row)
    formats = {"ratio of parameters": ".2f", "ratio of multiply-adds": ".2f", "score memory": "bytes"}
    if timed:
        formats.update({"time": "time", "time ratio": ".2f"})
    if one:
        columns.remove("implementation")
        name = implementations[0]
        regimes = list(dict.fromkeys(p.regime for p in points))
        where = "both regimes" if len(regimes) > 1 else f"the {REGIME_LABELS[regimes[0]]} regime"
        title = (f"{IMPLEMENTATIONS[name].description.split(':')[0]} ({name}) with more and more heads, in "
                 f"{where}; each ratio is to the fewest heads of the same regime")
        return Table(columns, rows, key_columns=2, formats=formats, title=title)
    return Table(columns, rows, key_columns=3, formats=formats)
