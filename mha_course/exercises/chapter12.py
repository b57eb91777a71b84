"""The exercises of chapter 12, a state that does not grow: causal linear attention (12.1), one step of the gated
delta rule (12.2) and one chunk of its chunked form (12.3). Their checks and catalogues of mistakes live in
:mod:`mha_course.exercises.state`.
"""

from __future__ import annotations

from .state import CHUNK, LINEAR, STEP

EXERCISES = (LINEAR, STEP, CHUNK)

__all__ = ["EXERCISES"]
