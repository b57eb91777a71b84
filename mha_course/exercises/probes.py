"""The probes and checks that many exercises share: random inputs drawn from the run's seed, the
device probe, the "change the future tokens" causality probe, the dropout probe, gradients, numbers
and classes.

Each helper comes as a pair: a probe side that runs the learner's code and records what it did,
and a check that reads the record. Inputs are drawn from the run's seed (``rec.seed``, or
:func:`~mha_course.exercises.records.seed_of` in a check) and a *salt* naming the case, so the probe
and the judge, in different processes, draw the same tensors.
"""

from __future__ import annotations

import functools
import random
import zlib
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..data import random_batch
from ..device import get_device
from .records import Failed, Recorder, describe, error_summary, plain, raised, same, tensor_of, value_of

#: The device every device check asks for: PyTorch's ``meta`` device holds shapes but no data,
#: exists on every machine, and refuses to mix with CPU tensors, exactly as a GPU does.
META = torch.device("meta")


# ----------------------------------------------------------------------------------------------
# Random inputs from the run's seed


def case_seed(seed: int, salt: str) -> int:
    """A seed for one case of one run: the same for the same ``(seed, salt)`` in any process."""
    return (int(seed) * 1_000_003 + zlib.crc32(salt.encode())) % 2**31


def generator(seed: int, salt: str) -> torch.Generator:
    return torch.Generator().manual_seed(case_seed(seed, salt))


def chooser(seed: int, salt: str) -> random.Random:
    """Choices among given values (``choice``, ``sample``, ``randint``) for one case of one run, the
    same for the same ``(seed, salt)`` in any process."""
    return random.Random(case_seed(seed, salt))


def draw(seed: int, salt: str, ranges: dict[str, tuple[int, int]], distinct: bool = True) -> dict[str, int]:
    """Whole numbers named by ``ranges`` (``name -> (low, high)``, both included), pairwise
    different when ``distinct``, so that a mix-up of two sizes shows in the result."""
    g = generator(seed, salt)
    for _ in range(1000):
        values = {name: int(torch.randint(low, high + 1, (1,), generator=g)) for name, (low, high) in ranges.items()}
        if not distinct or len(set(values.values())) == len(values):
            return values
    raise ValueError(f"cannot draw distinct values from {ranges}")  # ranges too narrow: a bug in a check


def batch(seed: int, salt: str, num_sequences: int, num_tokens: int, d_in: int) -> tuple[torch.Tensor, str]:
    """A random input batch and the call that rebuilds it, for messages."""
    s = case_seed(seed, salt)
    return random_batch(num_sequences, num_tokens, d_in, seed=s), f"random_batch({num_sequences}, {num_tokens}, {d_in}, seed={s})"


def matrices(seed: int, salt: str, count: int, rows: int, columns: int, scale: float = 0.5) -> tuple:
    """``count`` random ``(rows, columns)`` matrices, e.g. a head's weights."""
    g = generator(seed, salt)
    return tuple(scale * torch.randn(rows, columns, generator=g) for _ in range(count))


# ----------------------------------------------------------------------------------------------
# Devices


@functools.cache
def prepare_meta() -> None:
    """Run one operation on the meta device now (once a process; later calls return at once).

    The first operation whose meta kernel is written in Python (``triu``, ``masked_fill``...) makes
    PyTorch import its whole meta machinery, which takes a second or more. The grader's answer process
    and kernels pay it before any answer runs, so it never counts against the time an answer is given;
    elsewhere the first device probe pays it. A process that only judges records never does.
    """
    try:
        torch.ones(2, 2, device=META).triu(1).masked_fill(torch.ones(2, 2, dtype=torch.bool, device=META), 0.0)
    except Exception:  # a torch without the meta device: the device probes will say so
        pass


def probe_devices() -> list[torch.device]:
    """The devices an answer is run on: ``meta`` always, and the course's device if not the CPU."""
    prepare_meta()
    devices = [META]
    try:
        device = get_device()
    except (RuntimeError, ValueError):  # MHA_COURSE_DEVICE names a device this machine lacks
        return devices
    if device.type not in ("cpu", "meta"):
        devices.append(device)
    return devices


def device_words(device: str) -> str:
    if torch.device(device).type == "meta":
        return "the meta device (PyTorch's device without data, which stands in for a GPU here)"
    return str(device)


#: The operations a GPU runs with some arguments on the CPU: copies between devices, and indexing
#: by a CPU tensor of indices.
MIXING_ALLOWED = frozenset({"aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::_to_copy",
                            "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
                            "aten::_unsafe_index", "aten::_unsafe_index_put", "aten::set_", "aten::lift_fresh"})


class DeviceMixWatch(TorchDispatchMode):
    """Notes the first operation that takes tensors on two devices (a CPU tensor of one number, which
    every GPU operation accepts, aside): on the ``meta`` device PyTorch lets some of them pass that a
    GPU refuses (``index_select`` with CPU indices), so the probe looks for them itself.

    Example:
        >>> kv = torch.zeros(1, 2, 3, 4, device=META)
        >>> with DeviceMixWatch() as watch:
        ...     _ = kv.index_select(1, torch.arange(4) // 2)
        >>> watch.mixed
        'index_select with tensors on cpu and meta'
    """

    def __init__(self):
        super().__init__()
        self.mixed: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name().split(".")[0]  # "aten::index.Tensor": the operator, without its overload
        if self.mixed is None and name not in MIXING_ALLOWED:
            devices = {t.device.type for t in tree_leaves((args, kwargs))
                       if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.dim() == 0)}
            if len(devices) > 1:
                self.mixed = f"{name.removeprefix('aten::')} with tensors on {' and '.join(sorted(devices))}"
        return func(*args, **kwargs)


def probe_on_devices(rec: Recorder, key: str, run: Callable[[torch.device], Any]) -> None:
    """Record ``run(device)`` for every device of :func:`probe_devices` (``run`` moves the inputs),
    and under ``<key>@<device>:mixed`` the first operation that mixed devices (see :class:`DeviceMixWatch`).

    On the meta device a ``NotImplementedError`` is torch's (an operation that needs the numbers, such
    as ``nonzero`` or a boolean index, has no meta kernel): it is recorded as that call's error, never
    taken for an answer not written yet."""
    devices = probe_devices()
    rec.note(f"{key}:devices", [str(d) for d in devices])
    for device in devices:
        watch = DeviceMixWatch()
        with watch:
            try:
                rec.call(f"{key}@{device.type}", run, device)
            except NotImplementedError as error:
                if device != META:
                    raise
                rec.record[f"{key}@meta"] = error_summary(error)
        if watch.mixed:
            rec.note(f"{key}@{device.type}:mixed", watch.mixed)


#: Fragments of torch's errors for an operation that needs numbers, which the meta device does not hold.
META_HAS_NO_NUMBERS = ("meta tensor", "Meta tensor", "register_meta", "'Meta' backend")


#: Fragments of torch's errors for tensors on two devices.
DEVICE_ERRORS = ("same device", "expected device", "Expected all tensors")
NEW_TENSOR_HINT = ("Make every new tensor on the inputs' device: pass device=x.device to torch.arange, torch.zeros, "
                   "torch.tensor..., or build it from the inputs.")


def device_check(key: str, what: str, hint: str = "") -> Callable[[dict], None]:
    """The check of :func:`probe_on_devices`: each output lies on the device it was asked for."""
    def run(record: dict) -> None:
        for device in plain(value_of(record, f"{key}:devices")):
            asked = torch.device(device)
            mixed = plain(record.get(f"{key}@{asked.type}:mixed"))
            if asked.type == "meta" and not mixed and raised(record, f"{key}@meta", *META_HAS_NO_NUMBERS):
                continue  # an answer that reads its tensors' numbers: a GPU runs it, the meta device cannot
            try:
                got = value_of(record, f"{key}@{asked.type}", f"{what} on {device_words(device)}")
            except Failed as failure:
                if raised(record, f"{key}@{asked.type}", *DEVICE_ERRORS):
                    raise Failed(failure.expected, failure.got, hint or NEW_TENSOR_HINT) from None
                raise
            if got.get("kind") != "tensor":
                raise Failed("a torch.Tensor", describe(got))
            if torch.device(got["device"]).type != asked.type:
                raise Failed(f"an output on {device}, where the inputs are", f"one on {got['device']}", hint)
            if mixed:
                raise Failed(f"every tensor it computes with on {device}, where the inputs are",
                             f"{mixed}: a GPU refuses that",
                             hint or NEW_TENSOR_HINT)
    return run


def error_on_device(record: dict, key: str, *fragments: str) -> bool:
    """True if a device probe under ``key`` raised an error whose message holds a fragment."""
    return any(raised(record, f"{key}@{torch.device(device).type}", *fragments)
               for device in plain(record.get(f"{key}:devices")) or [])


# ----------------------------------------------------------------------------------------------
# Causality: change the future tokens, the past must not move

KEEP = 3  # the probe changes every token after the first KEEP and watches the first KEEP


def future_changed(x: torch.Tensor, seed: int, keep: int = KEEP) -> torch.Tensor:
    """``x`` with every token from position ``keep`` on replaced by other numbers."""
    changed = x.clone()
    changed[:, keep:] = random_batch(x.shape[0], x.shape[1] - keep, x.shape[2], seed=case_seed(seed, "future"))
    return changed


def causality_check(before_key: str, after_key: str, keep: int = KEEP) -> Callable[[dict], None]:
    """Tokens before ``keep`` give the same output when only later tokens change."""
    def run(record: dict) -> None:
        before = value_of(record, before_key)
        after = value_of(record, after_key, "the call with later tokens changed")
        if before.get("kind") != "tensor" or after.get("kind") != "tensor":
            raise Failed("a tensor from both calls", f"{describe(before)} and {describe(after)}")
        before, after = before["value"], after["value"]
        if before.shape != after.shape or before.dim() < 2:
            raise Failed("two outputs of one shape, one row per token", f"shapes {tuple(before.shape)} and {tuple(after.shape)}")
        for name, out in (("the first call", before), ("the call with later tokens changed", after)):
            if bool(out[:, :keep].isnan().any()):
                index = int(out[:, :keep].isnan().reshape(out.shape[0], keep, -1).any(dim=-1).any(dim=0).nonzero()[0])
                raise Failed(f"numbers for tokens 1-{keep}", f"NaN in token {index + 1}'s output in {name}")
        change = (after[:, :keep] - before[:, :keep]).abs().reshape(before.shape[0], keep, -1)
        if change.max() > 1e-5:
            index = int(change.amax(dim=(0, 2)).argmax())  # tokens are counted from 1, as in the book
            raise Failed(f"tokens 1-{keep} unchanged when only tokens {keep + 1} and later change",
                         f"token {index + 1} changed by {float(change.max()):.3g}")
    return run


# ----------------------------------------------------------------------------------------------
# Dropout: training mode from a known random state, then eval mode twice


def probe_dropout(rec: Recorder, module: Any, run: Callable, *args: Any) -> None:
    """Record ``run(*args)`` in training mode as ``dropout_train``, then in eval mode as
    ``dropout_eval`` and ``dropout_eval_again``.

    ``module`` is switched between the modes (when it is an ``nn.Module``). Training mode starts
    from the random state ``rec.seed``, so that the judge can replay the same draws.
    """
    if isinstance(module, nn.Module):
        module.train()
    torch.manual_seed(rec.seed)
    rec.call("dropout_train", run, *args)
    if isinstance(module, nn.Module):
        module.eval()
    rec.call("dropout_eval", run, *args)
    rec.call("dropout_eval_again", run, *args)


def eval_output(record: dict, what: str, hint: str = "") -> torch.Tensor:
    """The eval-mode output of :func:`probe_dropout`; :class:`Failed` unless both calls gave the same."""
    first = tensor_of(record, "dropout_eval", what)
    again = tensor_of(record, "dropout_eval_again", what)
    if not same(first, again):
        raise Failed("the same output from two calls in eval mode", "two different outputs", hint)
    return first


def dropout_lost(record: dict) -> bool:
    """The mistake "no dropout in training mode": the training-mode output is the eval-mode one."""
    return same(record["dropout_train"]["value"], record["dropout_eval"]["value"])


def dropout_in_eval(record: dict) -> bool:
    """The mistake "dropout in eval mode too": two calls in eval mode give different outputs."""
    return not same(record["dropout_eval"]["value"], record["dropout_eval_again"]["value"])


# ----------------------------------------------------------------------------------------------
# Gradients


def probe_backward(rec: Recorder, key: str, out: Any) -> None:
    """Backpropagate ``out.sum()`` if the output is connected to the graph, recording any error."""
    if isinstance(out, torch.Tensor) and out.requires_grad:
        rec.call(f"{key}_backward", lambda: out.sum().backward())


def connected_check(record: dict, key: str, hint: str = "") -> None:
    """Raise :class:`Failed` unless the output under ``key`` required grad and backward ran."""
    out = value_of(record, key)
    if out.get("kind") != "tensor" or not out["requires_grad"]:
        raise Failed("an output connected to the autograd graph", "an output that does not require grad",
                     hint or "Compute with torch operations on the given tensors: no torch.no_grad(), "
                     ".detach(), .item() or NumPy along the way.")
    value_of(record, f"{key}_backward", "backward()")


def parameters_with_gradients(module: nn.Module) -> dict[str, bool]:
    """For each named parameter: did backward give it a gradient that is not all zeros?"""
    return {name: p.grad is not None and bool(p.grad.abs().sum() > 0) for name, p in module.named_parameters()}


def gradients_check(key: str, flags_key: str, parameters: str = "every parameter") -> Callable[[dict], None]:
    """The output under ``key`` is connected (:func:`connected_check`) and every parameter's flag
    under ``flags_key`` (:func:`parameters_with_gradients`) is true."""
    def run(record: dict) -> None:
        connected_check(record, key)
        missing = [name for name, flag in plain(record[flags_key]).items() if not flag]
        if missing:
            raise Failed(f"a gradient for {parameters}", f"none for {', '.join(missing)}")
    return run


# ----------------------------------------------------------------------------------------------
# Numbers and classes


def agrees(got: float | None, expected: float, relative: float = 1e-6) -> bool:
    """``got`` equals ``expected`` up to rounding (relative to the larger of 1 and ``|expected|``)."""
    return got is not None and got == got and abs(got - expected) <= relative * max(1.0, abs(expected))


def module_class_check(example_call: str) -> Callable[[dict], None]:
    """The check of :func:`probe_module_class`: the answer is a class derived from ``nn.Module``."""
    def run(record: dict) -> None:
        if not plain(record.get("is_module_class")):
            raise Failed("a class derived from nn.Module", plain(record.get("answer_type")) or "something else",
                         f"Pass the class itself, e.g. {example_call}, not an instance or a function.")
    return run


def probe_module_class(rec: Recorder, answer: Any) -> None:
    rec.note("is_module_class", isinstance(answer, type) and issubclass(answer, nn.Module))
    rec.note("answer_type", "a class not derived from nn.Module" if isinstance(answer, type)
             else f"an object of type {type(answer).__name__}")


def state_of(module: Any, buffers: bool = False) -> dict[str, torch.Tensor]:
    """A module's parameters (and buffers, if asked) by name, as plain tensors."""
    if not isinstance(module, nn.Module):
        return {}
    named = dict(module.named_parameters())
    if buffers:
        named.update(dict(module.named_buffers()))
    return {name: value.detach() for name, value in named.items()}
