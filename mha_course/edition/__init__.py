"""The student edition: the chapter notebooks without their solutions, and JupyterLab opened on it.

* :mod:`~mha_course.edition.student` - ``python -m mha_course student``: solutions replaced by
  stubs, the exercises' outputs cleared, the hidden assertions dropped;
* :mod:`~mha_course.edition.jupyter_markdown` - the book's MyST Markdown rewritten as Markdown that
  Jupyter shows (listings, citations, admonitions);
* :mod:`~mha_course.edition.lab` - ``python -m mha_course lab``.

Importing this package imports none of them.
"""
