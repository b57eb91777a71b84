"""Grading: running completed chapter notebooks and judging their exercises.

The grader's promise: no notebook can change another notebook's grade, nor the package and the
libraries later gradings use, and no correct answer is failed or accused. Each notebook's kernel and
answer processes may write only in that notebook's temporary folder (Landlock, Linux 5.13 or later;
from Linux 6.12 they cannot signal or reach into processes outside it either), and every process
they started, ``setsid`` daemons included, is ended before the next notebook starts. The answers are
judged on what the notebook bound to each exercise's name, however it bound it. A notebook can
still spoil its own grade from inside its own answer process (that is not a proctor's room); for
marks that count, grade each submission in a container of its own.

* :mod:`~mha_course.grading.grader` - ``python -m mha_course grade``: run each notebook on a copy,
  against a private copy of the package, and score its exercises;
* :mod:`~mha_course.grading.notebook_run` - one notebook's cells in a Jupyter kernel, with time limits;
* :mod:`~mha_course.grading.answer_process` and :mod:`~mha_course.grading.answer_probing` - the
  fresh process that replays a notebook's definitions and probes its answers, and the grader's side
  of it;
* :mod:`~mha_course.grading.package_files` - the package's files as grading found them: private
  copies, and the check that nothing changed them;
* :mod:`~mha_course.grading.confinement` - the confinement of a notebook's processes, and the sweep
  that ends them;
* :mod:`~mha_course.grading.report` - verdicts, the score table and its JSON;
* :mod:`~mha_course.grading.gradebook` - ``python -m mha_course grade``: notebooks or a class's folder
  of submissions in; the score table, a gradebook (CSV) and the exit status out;
* :mod:`~mha_course.grading.gradescope` and :mod:`~mha_course.grading.autograder` - Gradescope's
  ``results.json``, and the autograder zip (``python -m mha_course autograder``);
* :mod:`~mha_course.grading.seeds` - the seeds of a grading, recorded so that a regrade replays it;
* :mod:`~mha_course.grading.progress` - ``python -m mha_course progress``, the learner's view;
* :mod:`~mha_course.grading.grading_setup` - the time limits and the platform check (imports
  nothing heavy: the command line reads its defaults).

Importing this package imports none of them.
"""
