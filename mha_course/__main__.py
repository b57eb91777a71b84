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


def _bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main

    return bench_main(args)


def _specialise(args: argparse.Namespace) -> int:
    from .specialise import run_cli

    return run_cli(args)


def _student(args: argparse.Namespace) -> int:
    from .exercises import student

    return student.main(args)


def _grade(args: argparse.Namespace) -> int:
    from .exercises import grader

    return grader.main(args)


def _progress(args: argparse.Namespace) -> int:
    from .exercises import progress

    return progress.main(args)


def _lab(args: argparse.Namespace) -> int:
    from .exercises import lab

    return lab.main(args)


def _add_exercise_commands(commands) -> None:
    # The argument definitions live with the tools; importing them is cheap (no torch).
    from .exercises import cli_arguments

    student = commands.add_parser("student", help="write the student edition of the chapter notebooks "
                                  "(solutions replaced by stubs, outputs cleared)")
    cli_arguments.add_student_arguments(student)
    student.set_defaults(handler=_student)
    grade = commands.add_parser("grade", help="execute completed notebooks and score their exercises")
    cli_arguments.add_grade_arguments(grade)
    grade.set_defaults(handler=_grade)
    progress = commands.add_parser("progress", help="show which exercises of each chapter pass, fail or are not "
                                   "started (reuses the last grading of unchanged notebooks)")
    cli_arguments.add_progress_arguments(progress)
    progress.set_defaults(handler=_progress)
    lab = commands.add_parser("lab", help="write the student edition into student/ where a notebook is missing "
                              "(never overwriting your work) and open JupyterLab on it")
    cli_arguments.add_lab_arguments(lab)
    lab.set_defaults(handler=_lab)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mha_course", description="The course's command line.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = commands.add_parser("info", help="print the package, torch and device in use")
    info.set_defaults(handler=_info)
    bench = commands.add_parser(
        "bench", help="time every implementation of causal multi-head attention (writes JSON, CSV, PNG)",
        description="Time the stacked, batched, fused and SDPA implementations (forward and "
        "forward+backward), with peak memory, page faults, multiply-adds and FLOP/s.")
    bench.add_argument("--quick", action="store_true", help="tiny sizes and short timings (seconds; for CI)")
    bench.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    bench.add_argument("--out", default="bench-results", help="folder for the results (default: bench-results)")
    bench.add_argument("--label", default=None, help="suffix of the file names, e.g. bench-cpu-LABEL.json")
    bench.add_argument("--configs", default=None, help="comma-separated sizes (default: all of the mode)")
    bench.add_argument("--implementations", default=None, help="comma-separated implementations (default: all)")
    bench.add_argument("--modes", default=None, help="comma-separated: forward, forward+backward (default: both)")
    bench.add_argument("--min-run-time", type=float, default=None, help="seconds per measurement (default 1.0; quick 0.02)")
    bench.add_argument("--min-runs", type=int, default=3, help="timing rounds: the implementations take turns (default 3; calls over 1 s: 2)")
    bench.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice; quick: 1)")
    bench.add_argument("--no-memory", action="store_true", help="skip peak-memory and page-fault measurements")
    bench.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    bench.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    bench.set_defaults(handler=_bench)
    specialise = commands.add_parser(
        "specialise", help="train the tiny 1-, 2- and 4-head models of chapter 5 and write their results"
    )
    specialise.add_argument("--seeds", type=int, default=8, help="seeds per head count (default 8)")
    specialise.add_argument("--out", default="book/data/specialisation.json",
                            help="JSON file to write (default book/data/specialisation.json)")
    specialise.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    specialise.set_defaults(handler=_specialise)
    _add_exercise_commands(commands)
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
