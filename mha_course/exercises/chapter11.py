"""The exercises of chapter 11, looking at fewer keys: the sliding window's mask (11.1), decoding
through a ring of window slots (11.2), the sink column (11.3) and the indexer's top-k over the
visible keys (11.4). Their checks and catalogues of mistakes live in
:mod:`mha_course.exercises.sliding` (11.1, 11.2) and :mod:`mha_course.exercises.fewer_keys` (11.3, 11.4).
"""

from __future__ import annotations

from .fewer_keys import SINKS, TOPK
from .sliding import RING, WINDOW_MASK

EXERCISES = (WINDOW_MASK, RING, SINKS, TOPK)

__all__ = ["EXERCISES"]
