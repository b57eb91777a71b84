"""``python -m mha_course COMMAND``: runs the course's command line, :mod:`mha_course.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
