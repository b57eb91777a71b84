"""Choose how the build executes the chapters from the environment: ``MHA_COURSE_BOOK_EXECUTE``.

``_config.yml`` sets ``execute_notebooks: cache``: a build re-runs only the chapters that changed.
``make test`` sets ``MHA_COURSE_BOOK_EXECUTE=off`` because its strict nbval run already executes
every chapter and checks that the outputs stored in the notebook are exactly what running it
prints; the build can then render those stored outputs instead of executing everything again.
Any mode myst-nb knows (``off``, ``auto``, ``cache``, ``force``, ``inline``) is accepted.
"""

from __future__ import annotations

import os

ENV_VAR = "MHA_COURSE_BOOK_EXECUTE"
MODES = ("off", "auto", "cache", "force", "inline")


def _override_execution_mode(app, config) -> None:
    mode = os.environ.get(ENV_VAR, "").strip()
    if not mode:
        return
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR} must be one of {', '.join(MODES)}, got {mode!r}; unset it to use _config.yml.")
    config.nb_execution_mode = mode


def setup(app):
    app.connect("config-inited", _override_execution_mode)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
