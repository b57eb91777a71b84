"""The kernel's imports, started while the answer process imports its own.

A notebook's first cell runs only once the answer process has imported everything
(:mod:`mha_course.grading.answer_process`): no notebook code may run before then. The kernel,
started meanwhile, would sit idle for those seconds, then spend as many importing torch and the
checks in the notebook's first cells. :func:`warm_up` asks the kernel for those imports as soon as
it has started, so both processes import at the same time. It is the grader's code, not the
notebook's, so it may run before the answer process is ready; it binds no name in the notebook's
namespace, prints nothing and stores no history. The notebook's first cell waits for it in the
kernel's queue, and that cell's own imports then find the modules loaded.

Measured on one notebook, this takes the kernel's imports off the grading's critical path (see the
teaching page of the book for the times).
"""

from __future__ import annotations

#: What the kernel imports before the notebook's first cell: torch, the package, and the checks with
#: every chapter's exercises (what the first ``check(...)`` of a notebook loads).
WARM_UP = '__import__("torch"); __import__("mha_course.exercises", fromlist=["EXERCISES"]).EXERCISES'


def warm_up(client) -> None:
    """Ask the kernel of ``client`` (an nbclient ``NotebookClient`` whose kernel has started) to run
    :data:`WARM_UP` silently; return at once. Never raises: a kernel that cannot take the request
    simply imports in the notebook's own cells."""
    try:
        client.kc.execute(WARM_UP, silent=True, store_history=False, allow_stdin=False)
    except Exception:  # noqa: BLE001 - a speed-up only: the notebook runs the same without it
        pass


__all__ = ["warm_up", "WARM_UP"]
