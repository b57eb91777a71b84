"""Grading: running completed chapter notebooks and judging their exercises.

* :mod:`~mha_course.grading.grader` - ``python -m mha_course grade``: run each notebook on a copy,
  against a private copy of the package, and score its exercises;
* :mod:`~mha_course.grading.notebook_run` - one notebook's cells in a Jupyter kernel, with time limits;
* :mod:`~mha_course.grading.answer_process` and :mod:`~mha_course.grading.answer_probing` - the
  fresh process that replays a notebook's definitions and probes its answers, and the grader's side
  of it;
* :mod:`~mha_course.grading.package_files` - the package's files as grading found them: private
  copies, and the check that nothing changed them;
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
