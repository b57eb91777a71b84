"""Grading: running completed chapter notebooks and judging their exercises.

The threat model
----------------

*What is judged.* In a notebook, ``check("1.1", answer)`` is feedback: the learner's kernel can do
anything to it, and the grader does not read its verdict (it only reports where it disagrees). The
grade comes from a fresh *answer process* that replays the notebook's definitions and probes its
answers, and from the grader's own process, which runs no notebook code and judges what the answer
process recorded against the package's reference.

*What the sandbox guarantees* (bubblewrap, on Linux: :mod:`~mha_course.grading.sandbox`). Every
process that runs a learner's code - the notebook's kernel, and each answer process, in a fresh
sandbox of its own started while the kernel runs but given the notebook's code only once the
kernel's sandbox has ended - runs in a sandbox that

* writes only in its own folder: the interpreter, the virtual environment, the folders of
  ``PYTHONPATH`` and the grading's copy of the package are read-only, so no notebook changes the
  package, a library, a ``.pth`` or a compiled ``.pyc`` that a later notebook imports;
* sees no other folder of the grading, nor the learner's submissions, nor any other process (a PID
  namespace of its own: not the grader, nor its command line, nor another notebook's kernel or
  answer process, which it can therefore neither signal, trace nor read);
* has no network at all (a network namespace of its own: TCP, MPTCP and TCP Fast Open reach
  nothing; the kernel talks to the grader over IPC sockets in its folder, the answer process over a
  socket pair);
* ends with everything in it: when the kernel is stopped (killed once its last cell has run) or the answer
  process is closed, every process it started, ``setsid`` daemons included, ends; and every sandbox ends
  with the grader.

So no notebook can change another notebook's grade, nor what later gradings use, and no grading
process outlives ``grade``.

*What it does not guarantee.* A notebook's code runs in its own answer process, so it can spoil -
or, written for that purpose, forge - its own records: the checks are feedback, not a proctor
(:mod:`mha_course.exercises.guard`). A notebook can use the processor and the memory until its time
limits stop it (no cgroup limits). Grading runs on the CPU: the sandbox has no GPU. Where
bubblewrap cannot start (macOS, Windows' WSL or a Linux that refuses user namespaces) the notebooks
run without a sandbox: grading then says once "no sandbox here: another notebook in this run can
change this grade; grade in a container", each report records ``sandbox: none``, and
``grade --require-sandbox`` refuses to start. Gradescope grades each submission in a container of
its own (``sandbox: container``). The package and environment are trusted as they are when grading
starts.

CONTRIBUTING.md ("How grading works") draws the processes and says which module does what.
"""
