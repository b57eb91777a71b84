"""The exercises of chapter 9, positions and padding: Llama's rotation of queries and keys (9.1) and
attention over a padded batch (9.2). Their checks and catalogues of mistakes live in
:mod:`mha_course.exercises.positions`.
"""

from __future__ import annotations

from .positions import PADDED, ROTATE

EXERCISES = (ROTATE, PADDED)

__all__ = ["EXERCISES"]
