"""The course's experiments: small, seeded studies whose stored results a chapter reads.

* :mod:`mha_course.experiments.specialisation` - do several heads pay off? Tiny models with 1, 2
  and 4 heads trained on a task that needs two lookups at once (chapter 5;
  ``python -m mha_course specialise`` reruns it).

An experiment is a subpackage split by concern: the task and the model, training, evaluation,
results (files and tables) and plots. Its command line lives in :mod:`mha_course.cli`.
"""
