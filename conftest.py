"""pytest's set-up for the whole repository (the tests' own fixtures are in tests/conftest.py).

pytest imports every module of the package to run its docstring examples. The benchmark's memory
probe, ``mha_course/bench/memory.py``, imports the POSIX-only ``resource`` module and is imported by
nothing on a platform without it (Windows): it is not collected there either.
"""

from mha_course.bench.machine import cpu_memory_unsupported_reason

collect_ignore = ["mha_course/bench/memory.py"] if cpu_memory_unsupported_reason() else []
