"""The exercises of chapter 11, looking at fewer keys: the sink column (11.3) and the indexer's top-k
over the visible keys (11.4). Their checks and catalogues of mistakes live in
:mod:`mha_course.exercises.fewer_keys`.
"""

from __future__ import annotations

from .fewer_keys import SINKS, TOPK

EXERCISES = (SINKS, TOPK)

__all__ = ["EXERCISES"]
