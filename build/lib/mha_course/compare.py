"""Attention modules side by side: the comparison tables and head-count sweeps of the book.

Chapter 2 compares one head with two heads on weights, outputs and cost, and then sweeps the
number of heads in the two regimes the book keeps apart:

* **head width fixed** - every head keeps ``head_dim`` columns, so the model grows by one head's
  weights and one head's work per head added (the reading of the source texts);
* **model width fixed** - the total width ``d_model`` is split as ``head_dim = d_model // num_heads``,
  so parameters and multiply-adds stay put while the number of heads changes.

Nothing here re-derives a cost: parameter counts are counted on the built modules (and agree with
:func:`mha_course.cost.parameter_count`), multiply-adds come from :func:`mha_course.cost.multiply_adds`,
score memory from :func:`mha_course.cost.score_memory_bytes`, and times from
:func:`mha_course.timing.measure`. A teaching aid: it imports the core and the other aids only.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

import torch
from torch import nn

from ._validation import check_divisible, check_input, check_positive_int
from .causal_attention import CausalAttention
from .cost import count_parameters, multiply_adds, score_memory_bytes
from .multihead import MultiHeadAttention
from .timing import Timing, measure
from .wrapper import MultiHeadAttentionWrapper

#: The two ways of adding heads that the book measures.
REGIMES = ("head_width_fixed", "model_width_fixed")

#: The two multi-head implementations a sweep can build: stacked heads and batched heads.
IMPLEMENTATIONS = ("wrapper", "batched")


class Table:
    """A small table that prints as aligned text and renders as HTML in a notebook.

    Args:
        columns: the column headings.
        rows: one sequence of cells per row, in column order (numbers or strings).
        title: an optional caption, printed above the table.
        formats: format specs for some columns, e.g. ``{"ratio": ".2f"}``; other numbers print
            with thousands separators (integers) or three significant digits (floats).

    Example:
        >>> print(Table(["heads", "parameters"], [[1, 18], [2, 36]]))
        heads  parameters
        -----  ----------
            1          18
            2          36
    """

    def __init__(self, columns: Sequence[str], rows: Iterable[Sequence], title: str | None = None,
                 formats: Mapping[str, str] | None = None):
        self.columns = list(columns)
        self.rows = [list(row) for row in rows]
        self.title = title
        self.formats = {name: spec for name, spec in (formats or {}).items() if name in self.columns}
        for number, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"row {number} has {len(row)} cells but the table has {len(self.columns)} columns "
                    f"({', '.join(self.columns)}); give one cell per column."
                )

    def column(self, name: str) -> list:
        """The cells of the column headed ``name``, top to bottom."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r}; the columns are {', '.join(map(repr, self.columns))}.")
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    @staticmethod
    def _cell(value, spec: str | None = None) -> str:
        if spec is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            return format(value, spec)
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
        return str(value)

    def _text_cells(self) -> list[list[str]]:
        specs = [self.formats.get(name) for name in self.columns]
        return [[self._cell(value, spec) for value, spec in zip(row, specs)] for row in self.rows]

    def __str__(self) -> str:
        cells = self._text_cells()
        widths = [max([len(heading)] + [len(row[i]) for row in cells]) for i, heading in enumerate(self.columns)]
        numeric = [all(isinstance(row[i], (int, float)) for row in self.rows) for i in range(len(self.columns))]

        def line(values):
            return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

        out = [self.title] if self.title else []
        out += [line(self.columns), line(["-" * w for w in widths])]
        out += [line(row) for row in cells]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        numeric = [all(isinstance(row[i], (int, float)) for row in self.rows) for i in range(len(self.columns))]
        align = ['style="text-align:right"' if num else 'style="text-align:left"' for num in numeric]
        head = "".join(f"<th {a}>{html.escape(c)}</th>" for c, a in zip(self.columns, align))
        body = "".join(
            "<tr>" + "".join(f"<td {a}>{html.escape(v)}</td>" for v, a in zip(row, align)) + "</tr>"
            for row in self._text_cells()
        )
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        # Wide tables scroll sideways instead of wrapping every cell onto several lines.
        return (f'<div style="overflow-x:auto"><table class="table" style="font-size:0.8em; white-space:nowrap">'
                f"{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


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
        check_input(x, module.d_in, module.context_length)
        return [head(x) for head in module.heads]
    weights, values = module._weights_and_values(x)  # (B, h, T, T), (B, h, T, hd)
    context = module.dropout(weights) @ values  # (B, h, T, hd)
    return list(context.unbind(dim=1))  # h tensors of (B, T, hd)


@torch.no_grad()
def _forward_no_grad(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


def _time_interleaved(calls: Sequence[tuple], rounds: int, min_run_time: float,
                      num_threads: int | None) -> list[Timing]:
    """Time every ``(fn, *args)`` in ``calls``, round-robin, keeping each call's fastest median.

    On a shared machine another process can slow one measurement down; it never speeds one up.
    Measuring all calls in turn, several times over, and keeping the fastest median of each makes
    a burst of outside load hit every call alike instead of one of them, so the ratios hold.
    """
    rounds = check_positive_int("rounds", rounds)
    best: list[Timing | None] = [None] * len(calls)
    for _ in range(rounds):
        for i, (fn, *args) in enumerate(calls):
            timing = measure(fn, *args, min_run_time=min_run_time, num_threads=num_threads)
            if best[i] is None or timing.median < best[i].median:
                best[i] = timing
    return best


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
                    measure_time: bool = True, min_run_time: float = 0.2, rounds: int = 1,
                    num_threads: int | None = 1) -> ModuleReport:
    """Report a module's weights, outputs and cost on input ``x``.

    Args:
        module: a ``CausalAttention``, ``MultiHeadAttentionWrapper`` or ``MultiHeadAttention``.
        x: input of shape ``(batch, num_tokens, d_in)``.
        name: the label for the report (default: the class name).
        measure_time: whether to time the forward pass (no autograd) with
            :func:`mha_course.timing.measure`.
        min_run_time: seconds to keep timing for, per round.
        rounds: how many times to time it; the fastest median is kept.
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
    check_input(x, module.d_in, module.context_length)
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
        time=(_time_interleaved([(_forward_no_grad, module, x)], rounds, min_run_time, num_threads)[0]
              if measure_time else None),
    )


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _count_shapes(shapes: Sequence[tuple[int, ...]]) -> str:
    """``[(2, 3), (2, 3), (4, 4)]`` -> ``"2 x (2, 3) + 1 x (4, 4)"``, in order of first appearance."""
    seen = list(dict.fromkeys(shapes))
    return " + ".join(f"{shapes.count(s)} x {_shape(s)}" for s in seen)


def compare_modules(modules: Mapping[str, nn.Module], x: torch.Tensor, measure_time: bool = True,
                    min_run_time: float = 0.05, rounds: int = 3, num_threads: int | None = 1) -> Table:
    """One table comparing modules on weights, outputs and cost, all measured on input ``x``.

    Columns: heads, the module's weight matrices (count x shape, biases left out), parameters,
    each head's output ``Z_i``, the merged output ``Z``, multiply-adds of one forward pass, and,
    when ``measure_time`` is true, the median forward time in milliseconds and its ratio to the
    first module's time. The modules are timed in turn, ``rounds`` times over, in the same run,
    keeping each one's fastest median (see :func:`describe_module` for ``num_threads``).

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
        calls = [(_forward_no_grad, m, x) for m in modules.values()]
        timings = _time_interleaved(calls, rounds, min_run_time, num_threads)
        reports = [replace(report, time=timing) for report, timing in zip(reports, timings)]
    columns = ["module", "heads", "weight matrices", "parameters", "head outputs Z_i", "merged output Z",
               "multiply-adds"]
    if measure_time:
        columns += ["time (ms)", "time ratio"]
    rows = []
    for report in reports:
        row = [report.name, report.num_heads, _count_shapes(report.weight_matrices), report.parameters,
               _count_shapes(report.head_output_shapes), _shape(report.output_shape), report.multiply_adds]
        if measure_time:
            row += [report.time.median_ms, report.time.median / reports[0].time.median]
        rows.append(row)
    return Table(columns, rows, formats={"time ratio": ".2f"})


@dataclass(frozen=True)
class SweepPoint:
    """One module of a head-count sweep: its sizes, its cost and (optionally) its time."""

    regime: str  # "head_width_fixed" or "model_width_fixed"
    implementation: str  # "wrapper" (stacked heads) or "batched" (MultiHeadAttention)
    num_heads: int
    head_dim: int
    width: int  # num_heads * head_dim: the merged output's width
    parameters: int  # counted on the built module
    multiply_adds: int  # one forward pass, from mha_course.cost.multiply_adds
    score_bytes: int  # all heads' (batch, T, T) float32 score matrices, from score_memory_bytes
    time: Timing | None


def _build(implementation: str, d_in: int, head_dim: int, num_heads: int, context_length: int) -> nn.Module:
    if implementation == "wrapper":
        return MultiHeadAttentionWrapper(d_in, head_dim, context_length, 0.0, num_heads)
    return MultiHeadAttention(d_in, num_heads * head_dim, context_length, 0.0, num_heads)


def head_count_sweep(head_counts: Sequence[int] = (1, 2, 4, 8, 16), *, regimes: Sequence[str] = REGIMES,
                     implementations: Sequence[str] = ("wrapper",), d_in: int = 256, head_dim: int = 32,
                     d_model: int = 256, batch: int = 4, num_tokens: int = 128, measure_time: bool = True,
                     min_run_time: float = 0.03, rounds: int = 3, num_threads: int | None = 1,
                     seed: int = 0) -> list[SweepPoint]:
    """Build modules with more and more heads in each regime and report their cost.

    Args:
        head_counts: the numbers of heads to try.
        regimes: ``"head_width_fixed"`` (every head ``head_dim`` wide, total width grows) and/or
            ``"model_width_fixed"`` (total width ``d_model``, ``head_dim = d_model // num_heads``;
            every head count must divide ``d_model``).
        implementations: ``"wrapper"`` (stacked :class:`MultiHeadAttentionWrapper`) and/or
            ``"batched"`` (:class:`MultiHeadAttention`).
        d_in: input width.
        head_dim: head width in the head-width-fixed regime.
        d_model: total width in the model-width-fixed regime.
        batch, num_tokens: size of the random input the modules are timed on.
        measure_time: whether to time each forward pass (no autograd) with
            :func:`mha_course.timing.measure`; all points are timed in one run, so their ratios
            are meaningful even though the absolute times depend on the machine.
        min_run_time: seconds to time each point for, per round.
        rounds: the points are timed in turn this many times over; each keeps its fastest median.
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
        if regime not in REGIMES:
            raise ValueError(f"regime must be one of {', '.join(map(repr, REGIMES))}, got {regime!r}.")
    for implementation in implementations:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"implementation must be one of {', '.join(map(repr, IMPLEMENTATIONS))}, got {implementation!r}."
            )
    head_counts = [check_positive_int("head_counts entry", h) for h in head_counts]
    if not head_counts:
        raise ValueError("head_counts is empty; pass the numbers of heads to try, e.g. (1, 2, 4, 8).")
    for name, value in (("d_in", d_in), ("head_dim", head_dim), ("d_model", d_model), ("batch", batch),
                        ("num_tokens", num_tokens)):
        check_positive_int(name, value)
    if "model_width_fixed" in regimes:
        for h in head_counts:
            check_divisible(d_model, h)  # explains the fix when a head count does not divide d_model
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, num_tokens, d_in, generator=generator)
    points, modules = [], []
    for regime in regimes:
        for implementation in implementations:
            for h in head_counts:
                width_per_head = head_dim if regime == "head_width_fixed" else d_model // h
                torch.manual_seed(seed)
                module = _build(implementation, d_in, width_per_head, h, num_tokens).eval()
                d_out = width_per_head if implementation == "wrapper" else h * width_per_head
                kind = "wrapper" if implementation == "wrapper" else "batched"
                points.append(SweepPoint(
                    regime=regime,
                    implementation=implementation,
                    num_heads=h,
                    head_dim=width_per_head,
                    width=h * width_per_head,
                    parameters=count_parameters(module),
                    multiply_adds=multiply_adds(kind, batch, num_tokens, d_in, d_out, h).total,
                    score_bytes=score_memory_bytes(batch, h, num_tokens),
                    time=None,
                ))
                modules.append(module)
    if measure_time:
        calls = [(_forward_no_grad, module, x) for module in modules]
        timings = _time_interleaved(calls, rounds, min_run_time, num_threads)
        points = [replace(point, time=timing) for point, timing in zip(points, timings)]
    return points


def sweep_table(points: Sequence[SweepPoint]) -> Table:
    """Tabulate a :func:`head_count_sweep`, with each quantity also as a ratio to the fewest heads.

    The ``fixed`` column names the regime (``head width`` or ``model width`` fixed). The ratios
    compare a point with the point of the same regime and implementation that has the fewest
    heads, so 2.00 in the parameters ratio means twice the parameters of the fewest heads.
    """
    if not points:
        raise ValueError("points is empty; pass the result of head_count_sweep(...).")
    timed = all(p.time is not None for p in points)
    columns = ["fixed", "module", "heads", "head_dim", "width", "parameters", "params ratio",
               "multiply-adds", "MACs ratio", "score MiB"]
    if timed:
        columns += ["time (ms)", "time ratio"]
    base: dict[tuple[str, str], SweepPoint] = {}
    for p in points:
        key = (p.regime, p.implementation)
        if key not in base or p.num_heads < base[key].num_heads:
            base[key] = p
    rows = []
    for p in points:
        b = base[(p.regime, p.implementation)]
        row = [p.regime.replace("_fixed", "").replace("_", " "), p.implementation, p.num_heads, p.head_dim, p.width, p.parameters,
               p.parameters / b.parameters, p.multiply_adds, p.multiply_adds / b.multiply_adds,
               p.score_bytes / 2**20]
        if timed:
            row += [p.time.median_ms, p.time.median / b.time.median]
        rows.append(row)
    return Table(columns, rows, formats={"params ratio": ".2f", "MACs ratio": ".2f", "time ratio": ".2f"})
