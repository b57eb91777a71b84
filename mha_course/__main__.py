"""The course's command line: ``python -m mha_course COMMAND`` (or ``mha-course COMMAND``).

Each command lives in its own module; this file only dispatches to them.
"""

from __future__ import annotations

import argparse
import sys


def _info(args: argparse.Namespace) -> int:
    import torch

    from . import __version__
    from .device import get_device

    print(f"mha_course {__version__}, torch {torch.__version__}, device {get_device()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mha_course", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = commands.add_parser("info", help="print the package, torch and device in use")
    info.set_defaults(handler=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
