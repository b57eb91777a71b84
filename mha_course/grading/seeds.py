"""The seeds of a grading: one per notebook, and one per exercise drawn from it.

Every check probes the answer on random inputs drawn from a seed. The grader draws one seed per
notebook (:func:`grading_seed`: fresh, or the one in ``MHA_COURSE_CHECK_SEED``, or the one given as
``grade --seed SEED``) and gives each exercise a seed of its own, derived from it and the exercise's
id (:func:`exercise_seeds`). The report keeps both: grading the same notebook again with
``--seed`` set to the notebook's seed draws the same inputs, so it gives the same verdicts and lines.

The answer process gets the exercises' seeds with the work, before any of the notebook's code runs
there, so that code cannot choose them.

Example:
    >>> exercise_seeds(1234, ["1.1", "1.2"]) == exercise_seeds(1234, ["1.1", "1.2"])
    True
    >>> len(set(exercise_seeds(1234, ["1.1", "1.2"]).values()))
    2
"""

from __future__ import annotations

import hashlib

from ..exercises.framework import run_seed

#: Seeds are below this bound, as :func:`mha_course.exercises.framework.run_seed` draws them.
SEED_BOUND = 1_000_000


def grading_seed(seed: int | None = None) -> int:
    """The seed of one notebook's grading: ``seed`` if given, else a fresh one (see ``run_seed``)."""
    return run_seed() if seed is None else seed % SEED_BOUND


def exercise_seeds(seed: int, exercise_ids: list[str]) -> dict[str, int]:
    """The seed of each exercise's inputs, derived from the grading's ``seed`` and the exercise's id."""
    seeds = {}
    for exercise_id in exercise_ids:
        digest = hashlib.sha256(f"{seed}:{exercise_id}".encode()).digest()
        seeds[exercise_id] = int.from_bytes(digest[:8], "big") % SEED_BOUND
    return seeds


__all__ = ["grading_seed", "exercise_seeds", "SEED_BOUND"]
