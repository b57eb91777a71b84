"""Choosing where the course's tensors live: CUDA, then Apple's MPS, then the CPU."""

from __future__ import annotations

import os

import torch

#: Environment variable that overrides the automatic choice, e.g. ``MHA_COURSE_DEVICE=cpu``.
DEVICE_ENV_VAR = "MHA_COURSE_DEVICE"


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def get_device(prefer: str | None = None, name: str = "prefer") -> torch.device:
    """Return the device the course runs on.

    The choice is, in order: ``prefer`` if given, else the ``MHA_COURSE_DEVICE`` environment
    variable if set, else CUDA if available, else Apple MPS if available, else the CPU. A device
    that is asked for but not available raises a ``RuntimeError`` saying what is available.

    Args:
        prefer: a device name such as ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or ``"mps"``, or
            ``None`` for the automatic choice.
        name: where ``prefer`` came from, for the error messages: ``"prefer"``, or a command's
            option such as ``"--device"``.

    Raises:
        ValueError: if the name is not a torch device.
        RuntimeError: if the device is not available on this machine.

    Example:
        >>> get_device("cpu")
        device(type='cpu')
    """
    source, fix = name, "Use 'cpu' instead."
    requested = prefer
    if requested is None:
        requested = os.environ.get(DEVICE_ENV_VAR) or None
        source, fix = DEVICE_ENV_VAR, f"Use 'cpu', or unset {DEVICE_ENV_VAR} for the automatic choice."
    if requested is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"{source} must name a torch device such as 'cpu', 'cuda' or 'mps', got {requested!r}."
        ) from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"{source}={requested!r} asks for CUDA, but torch sees no CUDA device on this machine "
            f"(torch {torch.__version__}). {fix}"
        )
    if device.type == "mps" and not _mps_available():
        raise RuntimeError(
            f"{source}={requested!r} asks for Apple MPS, which is not available here. {fix}"
        )
    return device
