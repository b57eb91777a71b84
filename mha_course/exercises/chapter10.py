"""The exercises of chapter 10, storing less: what a latent layer caches (10.1) and its scores taken in
the latent space (10.2). Their checks and catalogues of mistakes live in
:mod:`mha_course.exercises.latent`.
"""

from __future__ import annotations

from .latent import ABSORBED, COMPRESS

EXERCISES = (COMPRESS, ABSORBED)

__all__ = ["EXERCISES"]
